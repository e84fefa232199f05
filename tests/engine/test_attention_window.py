"""Sliding-window attention in every CPU path (pure torch, native decode, native prefill) against
the dense reference: the query at position p attends keys [max(0, p - W + 1), p]."""

from __future__ import annotations

import pytest
import torch

from engine.attention import TorchAttention, build_attention_metadata

from .test_attention import dense_reference, make_batch, native_module, run_case

WINDOW_CASES = [
    # (query_lens, prefix_lens, block_size, hq, hkv, d, groups)
    ([1, 1, 1, 1], [40, 9, 3, 70], 4, 8, 2, 16, None),  # decodes, windows across blocks
    ([20, 1, 9, 30], [0, 37, 50, 17], 4, 8, 2, 16, None),  # prefill chunks and decodes
    ([100], [0], 16, 9, 3, 64, None),  # a fresh prompt of several query tiles
    ([64, 1, 64, 30], [112, 127, 118, 0], 16, 9, 3, 64, [0, 0, 0, None]),  # shared prefixes
    ([1, 1, 1, 1], [20, 23, 17, 31], 4, 8, 2, 16, [0, 0, 0, 0]),  # a shared decode group
    ([70, 3], [130, 61], 16, 4, 2, 128, None),  # head_dim 128, partial key blocks
    ([40, 1, 1], [90, 200, 5], 16, 8, 1, 256, None),  # head_dim 256 (Gemma 3), one kv head
]
WINDOWS = [1, 5, 8, 16, 67]
IDS = [f"case{i}" for i in range(len(WINDOW_CASES))]
PATHS = {  # TorchAttention arguments of each CPU path
    "torch": lambda: {},
    "native-decode": lambda: {"native": native_module()},
    "native": lambda: {"native": native_module(), "native_prefill": True},
}
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def full_reference(case) -> torch.Tensor:
    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    q, _, _, _, _, _, full_k, full_v = make_batch(
        len(query_lens), query_lens, prefix_lens, bs, hq, hkv, d, groups
    )
    return dense_reference(q, full_k, full_v, query_lens, d**-0.5)


def assert_window_matters(case, window, ref) -> None:
    """Where some key lies outside a window, the windowed answer is not full attention's: a
    backend ignoring the window cannot pass."""
    if max(q + p for q, p in zip(case[0], case[1], strict=True)) > window:
        assert (ref - full_reference(case)).abs().max() > 1e-2
    else:
        torch.testing.assert_close(ref, full_reference(case))


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("case", WINDOW_CASES, ids=IDS)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_windowed_attention_matches_dense_reference(path, case, window):
    out, ref, _, _ = run_case(case, window=window, **PATHS[path]())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert_window_matters(case, window, ref)


@pytest.mark.parametrize("window", [3, 16, 67])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=IDS)
@pytest.mark.parametrize("path", ["native", "native-decode"])
def test_windowed_native_kernels_bfloat16(path, case, window):
    out, ref, _, _ = run_case(case, torch.bfloat16, window=window, **PATHS[path]())
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


def test_a_windowed_layer_gets_its_own_plan_and_full_layers_keep_theirs():
    """One plan per step: the full-attention layers read it as built (shared prefixes, batched
    fresh prefills), a windowed layer a variant built once per window and kept in the plan."""
    case = WINDOW_CASES[3]
    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    q, k, v, k_cache, v_cache, tables, _, _ = make_batch(
        4, query_lens, prefix_lens, bs, hq, hkv, d, groups
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    backend = TorchAttention()
    plan = backend.plan(build_attention_metadata(query_lens, seq_lens, tables, bs))
    assert plan.shared and plan.causal
    backend.forward(q, k, v, k_cache, v_cache, plan, d**-0.5, 16)
    windowed = plan.windowed[16]
    assert not windowed.shared and not windowed.causal
    assert [s.key_start for s in windowed.prefills] == [97, 103, 0]  # first row's window start
    backend.forward(q, k, v, k_cache, v_cache, plan, d**-0.5, 16)
    assert plan.windowed[16] is windowed  # built once per step and window
    backend.forward(q, k, v, k_cache, v_cache, plan, d**-0.5, 1000)
    assert 1000 not in plan.windowed  # every key lies within it: the full plan serves


def test_decode_groups_are_dropped_under_a_window():
    out, ref, plan, _ = run_case(WINDOW_CASES[4], native=native_module())
    assert plan.decode.shared is not None  # full attention: the group reads its prefix once
    out, ref, plan, _ = run_case(WINDOW_CASES[4], native=native_module(), window=5)
    assert plan.windowed[5].decode.shared is None
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_the_kernels_refuse_a_window_with_shared_groups_or_below_one():
    native = native_module()
    _, _, plan, (q, _, _, k_cache, v_cache) = run_case(WINDOW_CASES[4], native=native)
    d = plan.decode
    with pytest.raises(RuntimeError, match="shared groups attend whole prefixes"):
        native.paged_decode(q, k_cache, v_cache, d.block_tables, d.seq_lens, 0.25, d.shared, 4)
    with pytest.raises(RuntimeError, match="window must be at least 1"):
        native.paged_decode(q, k_cache, v_cache, d.block_tables, d.seq_lens, 0.25, None, 0)
    with pytest.raises(ValueError, match="at least 1"):
        run_case(WINDOW_CASES[0], window=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [5, 64, 100])
def test_windowed_native_prefill_does_not_depend_on_chunking(dtype, window):
    """Skipped key blocks sit at absolute 64-key positions and a block wholly before a token's
    window leaves it untouched, so deterministic mode keeps its bits under a window; a window
    wider than the context gives full attention's bits."""
    native = native_module()
    gen = torch.Generator().manual_seed(3)
    n, bs, table = 150, 16, torch.randperm(12, generator=gen)[:10].int()
    k_cache, v_cache = (torch.randn(12, bs, 3, 256, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(n, 6, 256, generator=gen).to(dtype)

    def attend(first: int, last: int, w: int | None) -> torch.Tensor:
        out = torch.zeros(last - first, 6, 256, dtype=dtype)
        ints = [torch.tensor([x], dtype=torch.int32) for x in (0, last - first, last)]
        native.paged_prefill(q[first:last], k_cache, v_cache, out, *ints, table[None], 0.0625, w)
        return out

    whole = attend(0, n, window)
    for cuts in ([37, 101], [64, 65, 149], list(range(1, n))[::7]):
        bounds = [0, *cuts, n]
        chunks = [attend(a, b, window) for a, b in zip(bounds, bounds[1:], strict=False)]
        assert torch.equal(whole, torch.cat(chunks)), cuts
    assert not torch.equal(whole, attend(0, n, None))
    assert torch.equal(attend(0, n, n), attend(0, n, None))


def poisoned_batch(case, window):
    """make_batch's batch with NaN in every cache block that lies wholly before its sequence's
    first new token's window (no shared blocks): what a backend must not read."""
    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    assert groups is None
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        len(query_lens), query_lens, prefix_lens, bs, hq, hkv, d
    )
    for table, start in zip(tables, prefix_lens, strict=True):
        dead = table[: max(0, start - window + 1) // bs]
        k_cache[dead] = float("nan")
        v_cache[dead] = float("nan")
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, bs)
    ref = dense_reference(q, full_k, full_v, query_lens, d**-0.5, window)
    return (q, k, v, k_cache, v_cache), meta, ref


UNSHARED = [i for i, case in enumerate(WINDOW_CASES) if case[6] is None]


@pytest.mark.parametrize("window", [5, 16])
@pytest.mark.parametrize("index", UNSHARED, ids=[f"case{i}" for i in UNSHARED])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_blocks_before_the_window_are_not_read(path, index, window):
    """The contract a KV manager releasing out-of-window blocks relies on: no block wholly
    before a sequence's first new token's window is read (the native kernels read no key
    before it)."""
    case = WINDOW_CASES[index]
    tensors, meta, ref = poisoned_batch(case, window)
    backend = TorchAttention(**PATHS[path]())
    out = backend.forward(*tensors, backend.plan(meta), case[5] ** -0.5, window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
