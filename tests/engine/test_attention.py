"""The torch attention backend and the metadata builder against a dense reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.attention import (
    TorchAttention,
    build_attention_metadata,
    compute_positions,
    load_native,
)


def make_batch(
    seed, query_lens, prefix_lens, block_size, hq, hkv, d, groups=None, ordered=False, shared=8
):
    """Random q/k/v for the new tokens and random cached prefixes in a paged cache.

    groups[b] (optional): sequences with the same group id start with the same cached blocks
    (as many as their cached prefix covers, up to `shared`), like requests sharing a system prompt.
    ordered: hand out consecutive block ids (the cache is then sliced, not gathered)."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    num_blocks = 160
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    free = (
        list(range(num_blocks))[::-1] if ordered else [int(b) for b in rng.permutation(num_blocks)]
    )
    group_blocks = {
        g: [free.pop() for _ in range(shared)] for g in set(groups or []) if g is not None
    }
    tables, full_k, full_v = [], [], []
    for i, (qlen, plen) in enumerate(zip(query_lens, prefix_lens, strict=True)):
        nb = -(-(qlen + plen) // block_size) + int(rng.integers(0, 2))  # maybe a spare block
        g = groups[i] if groups else None
        shared = group_blocks[g][: plen // block_size] if g is not None else []
        tables.append(shared + [free.pop() for _ in range(nb - len(shared))])
        slots = [tables[-1][p // block_size] * block_size + p % block_size for p in range(plen)]
        full_k.append(k_cache.view(-1, hkv, d)[slots].clone())
        full_v.append(v_cache.view(-1, hkv, d)[slots].clone())
    t = sum(query_lens)
    q = torch.randn(t, hq, d, generator=gen)
    k = torch.randn(t, hkv, d, generator=gen)
    v = torch.randn(t, hkv, d, generator=gen)
    start = 0
    for i, qlen in enumerate(query_lens):
        full_k[i] = torch.cat([full_k[i], k[start : start + qlen]])
        full_v[i] = torch.cat([full_v[i], v[start : start + qlen]])
        start += qlen
    return q, k, v, k_cache, v_cache, tables, full_k, full_v


def dense_reference(q, full_k, full_v, query_lens, scale, window=None):
    """window W: the query at position p attends keys [max(0, p - W + 1), p] only."""
    out, start = [], 0
    for qlen, fk, fv in zip(query_lens, full_k, full_v, strict=True):
        qs = q[start : start + qlen].double()
        group = qs.shape[1] // fk.shape[1]
        ks = fk.double().repeat_interleave(group, 1)
        vs = fv.double().repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        n = fk.shape[0]
        key_pos, query_pos = torch.arange(n)[None, :], torch.arange(n - qlen, n)[:, None]
        allowed = key_pos <= query_pos
        if window is not None:
            allowed &= key_pos > query_pos - window
        s = s.masked_fill(~allowed, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vs))
        start += qlen
    return torch.cat(out).float()


CASES = [
    # (query_lens, prefix_lens, block_size, hq, hkv, d, groups)
    ([7], [0], 4, 4, 4, 16, None),
    ([5, 1, 1, 9], [0, 12, 3, 20], 4, 8, 2, 16, None),
    ([1, 1, 1], [30, 0, 17], 16, 6, 3, 32, None),
    ([16, 3, 1, 1, 40], [16, 33, 64, 1, 0], 8, 9, 3, 64, None),
    ([2, 1, 64], [5, 100, 7], 32, 4, 1, 8, None),
    ([1, 13, 1, 1, 6], [0, 0, 9, 15, 1], 1, 2, 2, 16, None),
    # shared prefixes: decode and prefill members, different shared lengths, two groups
    ([1, 1, 1, 1], [20, 23, 17, 31], 4, 8, 2, 16, [0, 0, 0, 0]),
    ([6, 1, 9, 1, 3, 1], [16, 21, 16, 9, 30, 12], 4, 6, 3, 16, [0, 0, 0, 1, 1, None]),
    ([1, 5, 2, 1], [32, 33, 35, 8], 8, 4, 4, 32, [2, 2, 2, 2]),
    ([4, 4, 1], [3, 3, 3], 4, 4, 2, 16, [0, 0, 0]),  # nothing whole to share
    ([5, 1, 5, 5, 2, 5], [0, 7, 0, 0, 0, 9], 4, 6, 2, 16, None),  # equal-length fresh prefills
    ([7, 7, 1, 7], [16, 16, 20, 19], 8, 4, 2, 16, [1, 1, 1, 1]),  # batched after a shared prefix
]


def native_module():
    module = load_native()
    assert module is not None, "the native attention kernel must build on this machine"
    return module


def run_case(
    case, dtype=torch.float32, ordered=False, native=None, native_prefill=False, window=None
):
    """native: None (pure torch) or the compiled kernels; native_prefill: bf16 prefill kernel;
    window: a sliding-window layer's attention."""
    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        len(query_lens), query_lens, prefix_lens, bs, hq, hkv, d, groups, ordered
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, bs)
    scale = d**-0.5
    args = [x.to(dtype) for x in (q, k, v, k_cache, v_cache)]
    backend = TorchAttention(native, native_prefill)
    plan = backend.plan(meta)
    out = backend.forward(*args, plan, scale, window)
    ref = dense_reference(q, full_k, full_v, query_lens, scale, window)
    return out, ref, plan, args


@pytest.mark.parametrize("ordered", [False, True], ids=["scattered", "consecutive"])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_torch_backend_matches_dense_reference(case, ordered):
    out, ref, plan, (_, k, v, k_cache, v_cache) = run_case(case, ordered=ordered)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the new tokens' K/V landed at their slots
    hkv, d = k.shape[1:]
    torch.testing.assert_close(k_cache.view(-1, hkv, d)[plan.slot_mapping], k)
    torch.testing.assert_close(v_cache.view(-1, hkv, d)[plan.slot_mapping], v)


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_native_decode_matches_dense_reference(case):
    out, ref, plan, _ = run_case(case, native=native_module())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    if 1 in case[0]:  # decode tokens went to the kernel, outside every shared-prefix group
        assert type(plan.decode).__name__ == "NativeDecode"
        decode_rows = set(plan.decode.rows.tolist())
        assert not any(decode_rows & set(g.rows.tolist()) for g in plan.shared)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[7]], ids=["private", "d32", "shared"])
def test_native_decode_low_precision_close_to_reference(case, dtype):
    out, ref, _, _ = run_case(case, dtype, native=native_module())
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


def test_native_decode_long_context_matches_torch_path():
    # the default model's head shapes (9 query heads over 3 kv heads of 64), scattered blocks
    case = ([1] * 6, [349] * 6, 16, 9, 3, 64, None)
    native_out, ref, _, _ = run_case(case, torch.bfloat16, native=native_module())
    torch_out, _, _, _ = run_case(case, torch.bfloat16)
    torch.testing.assert_close(native_out.float(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(native_out, torch_out, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_decode_reads_a_shared_prefix_once_per_group(dtype):
    """Decode tokens whose tables start with the same cached blocks form groups the kernel reads
    those keys once for (cascade attention); the answer is the per-sequence one."""
    native = native_module()
    out, ref, plan, _ = run_case(CASES[6], native=native)  # 4 decodes, one group
    shared = plan.decode.shared
    assert shared.offsets.tolist() == [0, 4] and shared.members.tolist() == [0, 1, 2, 3]
    assert shared.blocks.tolist() == [4]  # 17 cached tokens: 4 whole blocks before the new one
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the default model's head shapes; two groups and a sequence of its own
    case = ([1] * 6, [349, 360, 333, 349, 400, 349], 16, 9, 3, 64, [0, 0, 0, 1, 1, None])
    out, ref, plan, _ = run_case(case, dtype, native=native)
    assert plan.decode.shared.offsets.tolist() == [0, 3, 5]
    assert plan.decode.shared.blocks.tolist() == [8, 8]  # make_batch shares 8 blocks per group
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    torch_out, _, _, _ = run_case(case, dtype)
    torch.testing.assert_close(out, torch_out, rtol=tol, atol=tol)


def test_native_decode_gives_a_row_the_same_bits_in_any_shared_group():
    """The kernel attends a row's keys in parts of 16 blocks at fixed positions, and a group
    reads only whole parts of its prefix once for all members: a decode row gets the same bits
    alone, in a group of four (2 parts shared) or of two (3 parts shared), so how sequences
    happen to be batched (speculation on or off) cannot move a greedy near-tie."""
    native = native_module()
    bs, hq, hkv, d = 2, 4, 2, 16
    prefix_lens = [70, 100, 66, 110]
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        5, [1] * 4, prefix_lens, bs, hq, hkv, d, groups=[0] * 4, shared=56
    )
    q, k, v, k_cache, v_cache = (x.to(torch.bfloat16) for x in (q, k, v, k_cache, v_cache))

    def decode(seqs: list[int]):
        meta = build_attention_metadata(
            [1] * len(seqs), [prefix_lens[b] + 1 for b in seqs], [tables[b] for b in seqs], bs
        )
        backend = TorchAttention(native)
        plan = backend.plan(meta)
        out = backend.forward(q[seqs], k[seqs], v[seqs], k_cache, v_cache, plan, d**-0.5, None)
        return out, plan.decode.shared

    together, shared = decode([0, 1, 2, 3])
    assert shared.blocks.tolist() == [33]  # 66 cached tokens in common: 2 whole parts
    ref = dense_reference(q.float(), full_k, full_v, [1] * 4, d**-0.5)
    torch.testing.assert_close(together.float(), ref, rtol=2e-2, atol=2e-2)
    pair, shared = decode([1, 3])
    assert shared.blocks.tolist() == [50]  # 3 whole parts
    assert torch.equal(pair, together[[1, 3]])
    for b in range(4):
        alone, shared = decode([b])
        assert shared is None
        assert torch.equal(alone[0], together[b]), b


def test_shared_prefix_groups_are_found():
    """Prefill chunks share a cached prefix; decode rows are attended alone on the torch path
    (group 1 keeps one prefill chunk: no group)."""
    _, _, plan, _ = run_case(CASES[7])
    assert [g.rows.tolist() for g in plan.shared] == [[*range(0, 6), *range(7, 16)]]
    assert [g.num_tokens for g in plan.shared] == [16]
    _, _, plan, _ = run_case(CASES[11], ordered=True)
    assert [(b.n, b.length, b.rows) for b in plan.causal] == [(2, 7, slice(0, 14))]
    assert [len(p.mask.float32) for p in plan.prefills] == [7]  # seq 3: 3 cached tokens of its own
    assert plan.shared[0].blocks.span is not None


def test_equal_length_prefills_are_batched():
    _, _, plan, _ = run_case(CASES[10])
    batches = {b.length: b for b in plan.causal}
    assert batches[5].n == 3 and batches[5].rows.tolist() == [*range(0, 5), *range(6, 16)]
    assert batches[2].n == 1 and batches[2].rows == slice(16, 18)
    assert [(p.start, p.end) for p in plan.prefills] == [(18, 23)]


@pytest.mark.parametrize("case", [CASES[1], CASES[7]], ids=["private", "shared"])
def test_torch_backend_bfloat16_close_to_reference(case):
    out, ref, _, _ = run_case(case, torch.bfloat16)
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


def test_metadata_positions_and_slots():
    meta = build_attention_metadata([3, 1, 2], [3, 6, 9], [[7, 2], [4, 5], [1, 0, 3]], 4)
    assert compute_positions([3, 1, 2], [3, 6, 9]).tolist() == [0, 1, 2, 5, 7, 8]
    assert meta.slot_mapping.tolist() == [28, 29, 30, 21, 3, 12 + 0]
    assert meta.cu_seqlens_q.tolist() == [0, 3, 4, 6]
    assert meta.seq_lens.tolist() == [3, 6, 9]
    assert meta.block_tables.tolist() == [[7, 2, 0], [4, 5, 0], [1, 0, 3]]
    assert meta.block_tables.dtype == torch.int32 and meta.slot_mapping.dtype == torch.int64
    assert (meta.max_seqlen_q, meta.max_seqlen_k) == (3, 9)
    plan = TorchAttention().plan(meta)
    assert plan.decode is not None and plan.decode.rows.tolist() == [3]
    assert [(b.rows, b.n, b.length) for b in plan.causal] == [(slice(0, 3), 1, 3)]
    assert [(s.start, s.end, s.ctx_len) for s in plan.prefills] == [(4, 6, 9)]


PREFILL_CASES = [c for c in CASES if c[5] in (16, 32, 64, 128)] + [
    ([64, 1, 64, 30], [112, 127, 118, 0], 16, 9, 3, 64, [0, 0, 0, None]),  # shared-prefix chunks
    ([100], [0], 16, 9, 3, 64, None),  # a fresh prompt: several query tiles, causal
    ([70, 3], [130, 61], 16, 4, 2, 128, None),  # head_dim 128, partial key blocks
]
PREFILL_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def test_native_kernels_use_this_cpus_vector_code():
    """The build picked the vector path this CPU supports (-march=native): no silent scalar."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    native = native_module()
    isa = native.vector_isa()
    if "avx512f" in flags:
        assert isa == ("avx512bf16" if "avx512_bf16" in flags else "avx512")
    elif {"avx2", "fma", "f16c"} <= flags:
        assert isa == "avx2"
    if isa != "scalar":
        assert native.has_native_prefill(torch.float32) and native.has_native_prefill(
            torch.bfloat16
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", PREFILL_CASES, ids=[f"case{i}" for i in range(len(PREFILL_CASES))])
def test_native_prefill_close_to_reference(case, dtype):
    native = native_module()
    assert native.has_native_prefill(dtype), f"no {dtype} prefill kernel ({native.vector_isa()})"
    out, ref, plan, (_, k, _, k_cache, _) = run_case(
        case, dtype, native=native, native_prefill=True
    )
    tol = PREFILL_TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    assert not plan.shared and not plan.causal and not plan.prefills
    prefill_lens = [n for n in case[0] if n > 1]
    if prefill_lens:
        assert plan.native_prefill.q_lens.tolist() == prefill_lens
    else:
        assert plan.native_prefill is None
    hkv, d = k.shape[1:]
    torch.testing.assert_close(k_cache.view(-1, hkv, d)[plan.slot_mapping], k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_native_prefill_does_not_depend_on_chunking(dtype):
    """Key blocks sit at absolute positions, so a prompt in one chunk or in three (the later
    ones reading the earlier ones' keys from the cache) gives the same bits."""
    native = native_module()
    gen = torch.Generator().manual_seed(3)
    n, bs, table = 150, 16, torch.randperm(12, generator=gen)[:10].int()
    k_cache, v_cache = (torch.randn(12, bs, 3, 64, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(n, 9, 64, generator=gen).to(dtype)

    def attend(first: int, last: int) -> torch.Tensor:
        out = torch.zeros(last - first, 9, 64, dtype=dtype)
        ints = [torch.tensor([x], dtype=torch.int32) for x in (0, last - first, last)]
        native.paged_prefill(q[first:last], k_cache, v_cache, out, *ints, table[None], 0.125)
        return out

    whole = attend(0, n)
    chunks = torch.cat([attend(0, 37), attend(37, 101), attend(101, n)])
    assert torch.equal(whole, chunks)


def test_a_build_killed_midway_does_not_hang_the_next_start():
    """torch's build baton ("lock") outlives a killed build; the next start must not wait on it."""
    import subprocess
    import sys

    from engine.attention.native import build_dir

    native_module()  # built (or found) in this process
    (build_dir() / "lock").touch()  # what a build killed halfway leaves behind
    code = "from engine.attention.native import load_native; assert load_native() is not None"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert not (build_dir() / "lock").exists()
