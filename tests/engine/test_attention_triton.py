"""The triton kernels, run by triton's CPU interpreter, against the torch backend / dense reference.

TRITON_INTERPRET=1 must be set before the kernels are decorated, so the kernel module is
(re)loaded inside a fixture after setting it.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from engine.attention import build_attention_metadata

from .test_attention import CASES, dense_reference, make_batch


@pytest.fixture(scope="module")
def kernels():
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        name = "engine.attention.triton_kernels"
        module = sys.modules.get(name)
        module = importlib.reload(module) if module else importlib.import_module(name)
        from triton.runtime.interpreter import InterpretedFunction

        assert isinstance(module._paged_attention_kernel, InterpretedFunction)
        yield module
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
        sys.modules.pop("engine.attention.triton_kernels", None)


TRITON_CASES = [
    *CASES[:6],
    ([3, 1, 20, 1], [0, 40, 70, 5], 16, 4, 2, 8, None),  # a prefill chunk > BLOCK_M rows
    ([1, 1], [130, 3], 8, 2, 1, 12, None),  # head_dim not a power of two
]


@pytest.mark.parametrize("case", TRITON_CASES, ids=[f"case{i}" for i in range(len(TRITON_CASES))])
def test_triton_matches_dense_reference(kernels, case):
    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        len(query_lens), query_lens, prefix_lens, bs, hq, hkv, d, groups
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, bs, cpu_plan=False)
    kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    torch.testing.assert_close(k_cache.view(-1, hkv, d)[meta.slot_mapping], k)
    torch.testing.assert_close(v_cache.view(-1, hkv, d)[meta.slot_mapping], v)
    out = torch.empty_like(q)
    kernels.paged_attention(q, k_cache, v_cache, out, meta, d**-0.5)
    ref = dense_reference(q, full_k, full_v, query_lens, d**-0.5)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_triton_store_kv_from_strided_views(kernels):
    # v as the model hands it over: a column slice of the fused qkv output
    qkv = torch.randn(5, 3 * 2 * 8)
    k, v = qkv[:, 16:32].view(5, 2, 8), qkv[:, 32:].view(5, 2, 8)
    k_cache, v_cache = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    slots = torch.tensor([15, 0, 7, 8, 3])
    kernels.store_kv(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache.view(-1, 2, 8)[slots], k)
    torch.testing.assert_close(v_cache.view(-1, 2, 8)[slots], v)


def test_triton_float16(kernels):
    query_lens, prefix_lens = [5, 1, 1], [9, 30, 0]
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        7, query_lens, prefix_lens, 8, 4, 2, 16
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, 8, cpu_plan=False)
    half = [x.half() for x in (q, k, v, k_cache, v_cache)]
    kernels.store_kv(*half[1:], meta.slot_mapping)
    out = torch.empty_like(half[0])
    kernels.paged_attention(half[0], half[3], half[4], out, meta, 16**-0.5)
    ref = dense_reference(q, full_k, full_v, query_lens, 16**-0.5)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)


def test_model_with_triton_backend_matches_torch_backend(kernels, tmp_path):
    import transformers

    from engine.attention import TorchAttention, compute_positions
    from engine.loader import load_model

    config = transformers.Qwen3Config(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = load_model(tmp_path)

    class Triton:
        def forward(self, q, k, v, k_cache, v_cache, meta, scale):
            kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            out = torch.empty_like(q)
            kernels.paged_attention(q, k_cache, v_cache, out, meta, scale)
            return out

    steps = [([9, 4], [9, 4]), ([1, 6], [10, 10]), ([1, 1], [11, 11])]
    tables = [[3, 1, 7], [0, 2, 5]]
    results = []
    for backend in (TorchAttention(), Triton()):
        model.attention = backend
        kv = model.make_kv_cache(8, 4)
        gen = torch.Generator().manual_seed(1)
        logits = []
        for query_lens, seq_lens in steps:
            meta = build_attention_metadata(query_lens, seq_lens, tables, 4)
            ids = torch.randint(0, 64, (sum(query_lens),), generator=gen)
            pos = torch.from_numpy(compute_positions(query_lens, seq_lens))
            logits.append(model.compute_logits(model(ids, pos, kv, meta)))
        results.append(torch.cat(logits))
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-4)
