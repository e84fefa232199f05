"""The triton kernels, run by triton's CPU interpreter, against the dense reference.

TRITON_INTERPRET=1 must be set before triton is first imported (torch or transformers may import
it early in a pytest process), so the checks run in one subprocess started with it set; each
check is reported as its own test.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from engine.attention import build_attention_metadata
from engine.kv.paged_cache import KVCache

from .row_ops_checks import ROW_OPS_CHECKS
from .test_attention import CASES, dense_reference, make_batch
from .test_attention_window import WINDOW_CASES, assert_window_matters, poisoned_batch
from .triton_interpreter import report, run_interpreted

TRITON_CASES = [
    *CASES[:6],
    ([3, 1, 20, 1], [0, 40, 70, 5], 16, 4, 2, 8, None),  # a prefill chunk > BLOCK_M rows
    ([1, 1], [130, 3], 8, 2, 1, 12, None),  # head_dim not a power of two
]


def check_case(kernels, case, window=None):
    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        len(query_lens), query_lens, prefix_lens, bs, hq, hkv, d, groups
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, bs)
    kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    torch.testing.assert_close(k_cache.view(-1, hkv, d)[meta.slot_mapping], k)
    torch.testing.assert_close(v_cache.view(-1, hkv, d)[meta.slot_mapping], v)
    out = torch.empty_like(q)
    kernels.paged_attention(q, k_cache, v_cache, out, meta, d**-0.5, window)
    ref = dense_reference(q, full_k, full_v, query_lens, d**-0.5, window)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    if window is not None:
        assert_window_matters(case, window, ref)


def check_blocks_before_the_window_are_not_read(kernels):
    for case in (WINDOW_CASES[1], WINDOW_CASES[2]):
        (q, k, v, k_cache, v_cache), meta, ref = poisoned_batch(case, 5)
        kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        kernels.paged_attention(q, k_cache, v_cache, out, meta, case[5] ** -0.5, 5)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def check_store_kv_from_strided_views(kernels):
    # v as the model hands it over: a column slice of the fused qkv output
    qkv = torch.randn(5, 3 * 2 * 8)
    k, v = qkv[:, 16:32].view(5, 2, 8), qkv[:, 32:].view(5, 2, 8)
    k_cache, v_cache = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    slots = torch.tensor([15, 0, 7, 8, 3])
    kernels.store_kv(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache.view(-1, 2, 8)[slots], k)
    torch.testing.assert_close(v_cache.view(-1, 2, 8)[slots], v)


def check_float16(kernels):
    query_lens, prefix_lens = [5, 1, 1], [9, 30, 0]
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        7, query_lens, prefix_lens, 8, 4, 2, 16
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, 8)
    half = [x.half() for x in (q, k, v, k_cache, v_cache)]
    kernels.store_kv(*half[1:], meta.slot_mapping)
    out = torch.empty_like(half[0])
    kernels.paged_attention(half[0], half[3], half[4], out, meta, 16**-0.5)
    ref = dense_reference(q, full_k, full_v, query_lens, 16**-0.5)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)


class KernelAttention:
    """The triton backend over a kernels object (the interpreted module, or compiled copies)."""

    def __init__(self, kernels) -> None:
        self.kernels = kernels

    def plan(self, meta):
        return meta

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, window=None, kv_stored=False):
        if not kv_stored:  # the layer's row ops stored them (RowOps.rope_store_kv)
            self.kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        self.kernels.paged_attention(q, k_cache, v_cache, out, meta, scale, window)
        return out


def tiny_model(window=None, device="cpu"):
    """A random 2-layer model of Qwen3's shapes; window: a Mistral of that sliding window."""
    import tempfile

    import transformers

    from engine.loader import load_model

    shapes = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=64,
        max_position_embeddings=128,
    )
    if window is None:
        config = transformers.Qwen3Config(**shapes)
    else:
        config = transformers.MistralConfig(**shapes, sliding_window=window)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        return load_model(tmp, device=device)


def check_model_with_triton_backend(kernels, window=None):
    """The Qwen3 shapes; window: a Mistral of that sliding window instead."""
    from engine.attention import TorchAttention, compute_positions

    model = tiny_model(window)
    steps = [([9, 4], [9, 4]), ([1, 6], [10, 10]), ([1, 1], [11, 11])]
    tables = [[3, 1, 7], [0, 2, 5]]
    results = []
    for backend in (TorchAttention(), KernelAttention(kernels)):
        model.attention = backend
        kv = KVCache.for_model(model, 8, 4).tensor
        gen = torch.Generator().manual_seed(1)
        logits = []
        for query_lens, seq_lens in steps:
            meta = build_attention_metadata(query_lens, seq_lens, tables, 4)
            ids = torch.randint(0, 64, (sum(query_lens),), generator=gen)
            pos = torch.from_numpy(compute_positions(query_lens, seq_lens))
            logits.append(model.compute_logits(model(ids, pos, kv, meta)))
        results.append(torch.cat(logits))
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-4)


def check_decode_graphs_with_triton(kernels):
    """Decode and verify steps padded into the graphs' static buffers, attended by the triton
    kernels (which read those buffers' tensors, padding and empty sequences included), give the
    eager step's logits and K/V."""
    from engine.attention import compute_positions
    from engine.cuda_graphs import DecodeGraphs
    from engine.cuda_graphs.backends import EagerReplayBackend

    model = tiny_model()
    model.attention = KernelAttention(kernels)
    c = model.config
    kv = KVCache(2, 12, 4, c.num_key_value_heads, c.head_dim, model.dtype, scratch_block=True)
    tables = [[3, 1, 7], [0, 2], [5, 9, 4]]
    prompt = [6, 5, 9]
    meta = build_attention_metadata(prompt, prompt, tables, 4)
    ids = torch.randint(0, 64, (sum(prompt),), generator=torch.Generator().manual_seed(1))
    model(ids, torch.from_numpy(compute_positions(prompt, prompt)), kv.tensor, meta)
    graphs = DecodeGraphs(model, kv, 8, 3, 128, EagerReplayBackend())
    graphs.capture()
    for query_lens, verify in [([1, 1, 1], [False] * 3), ([3, 1, 2], [True, False, True])]:
        seq_lens = [p + q for p, q in zip(prompt, query_lens, strict=True)]
        meta = build_attention_metadata(query_lens, seq_lens, tables, 4, verify=verify)
        ids = torch.randint(0, 64, (sum(query_lens),), generator=torch.Generator().manual_seed(2))
        pos = torch.from_numpy(compute_positions(query_lens, seq_lens))
        eager_kv = kv.tensor.clone()
        want = model.compute_logits(model(ids, pos, eager_kv, meta))
        got = model.compute_logits(graphs.forward(ids, pos, meta))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kv.tensor[:, :, :12], eager_kv[:, :, :12], rtol=0, atol=0)
    assert graphs.num_replayed == 2


CHECKS = {
    **{
        f"case{i}": (lambda kernels, c=case: check_case(kernels, c))
        for i, case in enumerate(TRITON_CASES)
    },
    **{
        f"window{w}-case{i}": (lambda kernels, c=WINDOW_CASES[i], w=w: check_case(kernels, c, w))
        for i, w in [(0, 5), (0, 16), (1, 1), (1, 8), (2, 16), (5, 67), (6, 8)]
    },
    "head_dim256": lambda kernels: check_case(kernels, WINDOW_CASES[6]),
    "window_not_read_before": check_blocks_before_the_window_are_not_read,
    "store_kv_strided": check_store_kv_from_strided_views,
    "float16": check_float16,
    "model_triton_vs_torch": check_model_with_triton_backend,
    "model_triton_vs_torch_window": lambda kernels: check_model_with_triton_backend(kernels, 4),
    "decode_graphs_triton": check_decode_graphs_with_triton,
}


def run_all() -> None:
    """Entry point of the subprocess (TRITON_INTERPRET=1): one JSON line of results."""
    from triton.runtime.interpreter import InterpretedFunction

    from engine.attention import triton_kernels
    from engine.attention.triton_row_ops import TritonRowOps

    assert isinstance(triton_kernels._paged_attention_kernel, InterpretedFunction)
    checks = {name: partial(check, triton_kernels) for name, check in CHECKS.items()}
    for name, check in ROW_OPS_CHECKS.items():
        checks[name] = partial(check, TritonRowOps(), "cpu")
    report(checks)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted("tests.engine.test_attention_triton")


@pytest.mark.parametrize("name", [*CHECKS, *ROW_OPS_CHECKS])
def test_triton_kernel_in_interpreter(interpreted, name):
    assert interpreted[name] == "ok", interpreted[name]
