"""Speculative verify rows (a sequence's last token, then its draft) are attended as the decode
steps at their positions would be: the same bits as plain decode, shared-prefix groups and
sliding windows included, so greedy output cannot depend on speculation."""

from __future__ import annotations

import pytest
import torch

from engine.attention import TorchAttention, build_attention_metadata

from .test_attention import dense_reference, make_batch, native_module

# (query_lens, prefix_lens, verify): sequences 0 and 1 share cached blocks, 3 is a prefill chunk
QUERY_LENS, PREFIX_LENS, VERIFY = [4, 4, 3, 6], [21, 26, 13, 5], [True, True, True, False]
BS, HQ, HKV, D = 4, 4, 2, 16
PATHS = {  # TorchAttention arguments of each CPU path
    "torch": lambda: {},
    "native-decode": lambda: {"native": native_module()},
    "native": lambda: {"native": native_module(), "native_prefill": True},
}


def _attend(backend, q, k, v, caches, query_lens, seq_lens, tables, window, verify=None):
    meta = build_attention_metadata(query_lens, seq_lens, tables, BS, verify=verify)
    plan = backend.plan(meta)
    if window is None and backend.native is not None:  # 0 and 1 read their prefix once
        assert plan.decode.shared is not None and plan.decode.shared.blocks.tolist() == [5]
    return backend.forward(q, k, v, *caches, plan, D**-0.5, window)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_verify_rows_are_the_decode_steps_at_their_positions(path, window):
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        7, QUERY_LENS, PREFIX_LENS, BS, HQ, HKV, D, groups=[0, 0, None, None]
    )
    q, k, v, k_cache, v_cache = (x.to(torch.bfloat16) for x in (q, k, v, k_cache, v_cache))
    backend = TorchAttention(**PATHS[path]())
    seq_lens = [a + b for a, b in zip(QUERY_LENS, PREFIX_LENS, strict=True)]
    caches = (k_cache, v_cache)
    out = _attend(backend, q, k, v, caches, QUERY_LENS, seq_lens, tables, window, VERIFY)
    ref = dense_reference(q.float(), full_k, full_v, QUERY_LENS, D**-0.5, window)
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)
    first = [sum(QUERY_LENS[:b]) for b in range(len(QUERY_LENS))]
    for j in range(max(QUERY_LENS[:3])):  # decode step j of every verifying sequence
        seqs = [b for b in range(3) if j < QUERY_LENS[b]]
        rows = [first[b] + j for b in seqs]
        step = _attend(
            backend,
            q[rows],
            k[rows],
            v[rows],
            caches,
            [1] * len(seqs),
            [PREFIX_LENS[b] + j + 1 for b in seqs],
            [tables[b] for b in seqs],
            window,
        )
        assert torch.equal(out[rows], step), f"decode step {j}"
