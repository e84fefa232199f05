"""The native kernels for quantized KV blocks (engine/attention/csrc/quant_attention.cpp):
attention against a dense float64 reference over the dequantized keys and against torch's
DequantizingAttention; the quantizing stores bit for bit against engine/kv/quant.py; a row's
bits whatever its batch, tile, chunking or thread count; and an engine whose cache on and off
give the same tokens."""

from __future__ import annotations

import pytest
import torch

from engine.attention import build_attention_metadata, make_attention_backend
from engine.attention.native import NativeKernels, load_native
from engine.attention.quant_backend import QuantizedAttention
from engine.attention.quant_reference import DequantizingAttention
from engine.kv.quant import KV_FORMATS, KVFormat, dequantize, quantize
from engine.models.row_ops import NativeRowOps, RowOps
from tests.engine.test_attention import dense_reference, make_batch
from tests.engine.test_invariance import answers, engine, prompts_sharing_a_head
from tests.engine.test_row_ops import _rope_case

FORMATS = list(KV_FORMATS.values())
FORMAT_IDS = list(KV_FORMATS)

CASES = [
    # (query_lens, prefix_lens, block_size, hq, hkv, d, window): prefill and decode mixed, GQA
    ([7], [0], 4, 4, 4, 16, None),
    ([5, 1, 1, 9], [0, 12, 3, 20], 4, 8, 2, 16, 6),
    ([16, 3, 1, 1, 40], [16, 33, 64, 1, 0], 8, 9, 3, 64, None),
    ([1, 1, 1, 2, 1], [90, 95, 17, 80, 130], 16, 9, 3, 64, None),  # decodes in a shared task
    ([1, 37, 1], [140, 5, 100], 16, 8, 2, 256, 45),
    ([2, 1, 20], [5, 40, 7], 32, 4, 1, 48, None),  # no vector kernel for 48: the portable one
]


@pytest.fixture(scope="module")
def native() -> NativeKernels:
    kernels = load_native()
    assert kernels is not None, "the native kernels must build here"
    return kernels


def quantized_batch(case, fmt: KVFormat, dtype: torch.dtype):
    """make_batch's batch in a pool of fmt (shared groups of decodes: every sequence's table
    starts with the same 8 blocks), the new tokens already stored, and the dense reference over
    the dequantized keys."""
    query_lens, prefix_lens, bs, hq, hkv, d, window = case
    decode_group = [0 if n <= 2 else None for n in query_lens]
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        len(query_lens) + d, query_lens, prefix_lens, bs, hq, hkv, d, decode_group
    )
    k_pool, v_pool = quantize(k_cache, fmt), quantize(v_cache, fmt)
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, bs)
    q = q.to(dtype)
    dq = [dequantize(quantize(x, fmt), fmt) for x in (*full_k, *full_v)]
    ref = dense_reference(
        q.float(), dq[: len(full_k)], dq[len(full_k) :], query_lens, d**-0.5, window
    )
    return q, k, v, k_pool, v_pool, meta, ref


TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_kernel_matches_the_dense_reference_over_dequantized_keys(native, fmt, case, dtype):
    q, k, v, k_pool, v_pool, meta, ref = quantized_batch(case, fmt, dtype)
    backend = QuantizedAttention(native, fmt)
    window, d = case[-1], case[5]
    out = backend.forward(q, k, v, k_pool, v_pool, backend.plan(meta), d**-0.5, window)
    assert out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    # the new tokens were stored quantized, as the reference quantizes them
    hkv = k.shape[1]
    assert torch.equal(k_pool.view(-1, hkv, d + 4)[meta.slot_mapping], quantize(k, fmt))
    assert torch.equal(v_pool.view(-1, hkv, d + 4)[meta.slot_mapping], quantize(v, fmt))


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_kernel_agrees_with_the_dequantizing_reference(native, fmt):
    q, k, v, k_pool, v_pool, meta, _ = quantized_batch(CASES[2], fmt, torch.float32)
    want_pools = (k_pool.clone(), v_pool.clone())
    reference = DequantizingAttention(fmt)
    want = reference.forward(q, k, v, *want_pools, reference.plan(meta), 0.125)
    backend = QuantizedAttention(native, fmt)
    got = backend.forward(q, k, v, k_pool, v_pool, backend.plan(meta), 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(k_pool, want_pools[0]) and torch.equal(v_pool, want_pools[1])


def fp8_edge_values(fmt: KVFormat) -> torch.Tensor:
    """Every code's value, the midpoints between neighbours (ties: round to even) and the floats
    on either side of them, subnormals and qmax included."""
    if fmt.code_dtype == torch.int8:
        steps = torch.arange(-127, 128, dtype=torch.float32)
        values = torch.cat([steps, steps[:-1] + 0.5])
    else:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt.code_dtype).float()
        codes = codes[codes.isfinite()].unique()
        values = torch.cat([codes, (codes[1:] + codes[:-1]) / 2])
    up = torch.nextafter(values, torch.tensor(float("inf")))
    down = torch.nextafter(values, torch.tensor(float("-inf")))
    return torch.cat([values, up, down]).clamp(-fmt.qmax, fmt.qmax)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_codes_are_torchs_at_ties_subnormals_and_qmax(native, fmt):
    """Rows whose amax is qmax have scale 1: each value is converted as it is."""
    d = 64
    values = fp8_edge_values(fmt)
    values = torch.cat([values, values[: (-len(values)) % (d - 1)]])
    rows = torch.cat([torch.full((len(values) // (d - 1), 1), fmt.qmax), values.view(-1, d - 1)], 1)
    rows = rows[:, None]  # [T, 1, 64]
    k_pool = torch.zeros(len(rows), 1, 1, d + 4, dtype=torch.uint8)
    v_pool = torch.zeros_like(k_pool)
    native.quantize_store_kv(rows, -rows, k_pool, v_pool, torch.arange(len(rows)), fmt)
    assert torch.equal(k_pool.view(len(rows), 1, -1), quantize(rows, fmt))
    assert torch.equal(v_pool.view(len(rows), 1, -1), quantize(-rows, fmt))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_quantize_store_kv_writes_the_references_bytes(native, fmt, dtype):
    """Strided rows (k and v as views of a fused qkv output), head dims on and off the 16-lane
    vectors, rows of zeros, of tiny and of large values."""
    gen, info = torch.Generator().manual_seed(fmt.code), torch.finfo(dtype)
    for d in (16, 64, 40):
        t, hkv = 29, 3
        magnitude = torch.exp(torch.randn(t, 1, generator=gen).clamp(-2, 2) * 2)
        qkv = torch.randn(t, 7 * d, generator=gen) * magnitude
        qkv[3] = 0.0
        qkv[4] *= info.tiny  # subnormal and normal values of the dtype
        qkv[5] *= info.max / 1e3
        qkv = qkv.to(dtype)
        k = qkv[:, d : 4 * d].view(t, hkv, d)
        v = qkv[:, 4 * d :].view(t, hkv, d)
        k_pool = torch.zeros(12, 4, hkv, d + 4, dtype=torch.uint8)
        v_pool = torch.zeros_like(k_pool)
        slots = torch.randperm(48, generator=gen)[:t]
        native.quantize_store_kv(k, v, k_pool, v_pool, slots, fmt)
        k_rows, v_rows = k_pool.view(-1, hkv, d + 4), v_pool.view(-1, hkv, d + 4)
        assert torch.equal(k_rows[slots], quantize(k, fmt)), d
        assert torch.equal(v_rows[slots], quantize(v, fmt)), d
        untouched = torch.ones(48, dtype=torch.bool)
        untouched[slots] = False
        assert not k_rows[untouched].any() and not v_rows[untouched].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_rope_store_kv_q_stores_the_roped_heads_quantized(native, fmt, dtype):
    ops, reference = NativeRowOps(native, fmt), RowOps(fmt)
    for tokens, dims in ((1, (64, 64)), (33, (64, 32)), (5, (48, 48))):
        qk, v, cos, sin, slots, (blocks, bs, hkv, d) = _rope_case(tokens, *dims, dtype)
        pools = [torch.zeros(blocks, bs, hkv, d + 4, dtype=torch.uint8) for _ in range(4)]
        got = ops.rope_store_kv(qk, v, cos, sin, pools[0], pools[1], slots)
        want = reference.rope_store_kv(qk, v, cos, sin, pools[2], pools[3], slots)
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
        hq = qk.shape[1] - hkv
        k_rows, v_rows = pools[0].flatten(0, 1), pools[1].flatten(0, 1)
        assert torch.equal(k_rows[slots], quantize(got[:, hq:], fmt))  # the k heads it returns
        assert torch.equal(v_rows[slots], quantize(v, fmt))
        untouched = torch.ones(len(k_rows), dtype=torch.bool)
        untouched[slots] = False
        assert not k_rows[untouched].any() and not v_rows[untouched].any()


class Sequences:
    """A pool of fmt and sequences over it: 0 a prompt of 150 tokens; 1..6 share its first 128
    tokens (8 blocks) and have tails of their own. q_of[b][p]: the query of b's token at p."""

    def __init__(self, fmt: KVFormat, dtype: torch.dtype, window: int | None) -> None:
        gen = torch.Generator().manual_seed(7)
        self.fmt, self.window, self.bs, self.hq, self.hkv, self.d = fmt, window, 16, 9, 3, 64
        self.lens = [150] + [128 + 3 * b + 1 for b in range(1, 7)]
        self.tables = [list(range(10))] + [
            list(range(8)) + [10 + 2 * b, 11 + 2 * b] for b in range(1, 7)
        ]
        keys = torch.randn(2, 24 * self.bs, self.hkv, self.d, generator=gen)
        self.pools = [quantize(x, fmt).view(24, self.bs, self.hkv, -1) for x in keys]
        self.q_of = [torch.randn(n, self.hq, self.d, generator=gen).to(dtype) for n in self.lens]

    def attend(self, native: NativeKernels, steps: list[tuple[int, int, int]]) -> list:
        """steps: (sequence, first, end): its tokens [first, end) in one call, with the keys up
        to end -> each step's output rows."""
        q = torch.cat([self.q_of[b][first:end] for b, first, end in steps])
        out = torch.empty_like(q)
        q_lens = [end - first for _, first, end in steps]
        starts = torch.tensor([0, *q_lens[:-1]]).cumsum(0).int()
        width = max(len(t) for t in self.tables)
        tables = torch.tensor(
            [self.tables[b] + [0] * (width - len(self.tables[b])) for b, _, _ in steps]
        )
        native.paged_attention_q(
            q,
            *self.pools,
            out,
            starts,
            torch.tensor(q_lens).int(),
            torch.tensor([end for _, _, end in steps]).int(),
            tables.int(),
            self.d**-0.5,
            self.window,
            self.fmt,
        )
        return list(out.split(q_lens))


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_a_row_has_the_same_bits_in_any_batch_tile_chunking_or_thread_count(
    native, fmt, dtype, window
):
    seqs = Sequences(fmt, dtype, window)
    (whole,) = seqs.attend(native, [(0, 0, 150)])  # tiles of 32 tokens
    halves = seqs.attend(native, [(0, 0, 75)]) + seqs.attend(native, [(0, 75, 150)])
    assert torch.equal(torch.cat(halves), whole)  # two prefill steps (the second over cache)
    odd = seqs.attend(native, [(0, 0, 17)]) + seqs.attend(native, [(0, 17, 150)])
    assert torch.equal(torch.cat(odd), whole)  # tiles start at another token
    for p in (0, 31, 32, 149):  # the token decoded alone at its position
        assert torch.equal(seqs.attend(native, [(0, p, p + 1)])[0], whole[p : p + 1])
    alone = [seqs.attend(native, [(b, n - 1, n)])[0] for b, n in enumerate(seqs.lens)]
    # decodes sharing 128 keys in one task (or split for threads), beside a prefill chunk
    steps = [(0, 100, 150)] + [(b, seqs.lens[b] - 1, seqs.lens[b]) for b in range(1, 7)]
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            batched = seqs.attend(native, steps)
            assert torch.equal(batched[0], whole[100:]), n
            for b in range(1, 7):
                assert torch.equal(batched[b], alone[b]), (n, b)
    finally:
        torch.set_num_threads(threads)
    # a verify-like step: sequence 3's last 3 tokens at once, as each decoded alone
    n = seqs.lens[3]
    (three,) = seqs.attend(native, [(3, n - 3, n)])
    for i in range(3):
        (one,) = seqs.attend(native, [(3, n - 3 + i, n - 2 + i)])
        assert torch.equal(three[i : i + 1], one)


def test_the_native_kernel_serves_quantized_pools_on_cpu(native):
    fmt = KV_FORMATS["int8"]
    assert isinstance(make_attention_backend("cpu", kv_format=fmt), QuantizedAttention)
    assert isinstance(
        make_attention_backend("cpu", invariant=True, kv_format=fmt), QuantizedAttention
    )
    assert isinstance(make_attention_backend("cpu", False, kv_format=fmt), DequantizingAttention)
    with pytest.raises(RuntimeError, match="deterministic mode needs the native kernel"):
        make_attention_backend("cpu", False, invariant=True, kv_format=fmt)


@pytest.mark.parametrize("fmt", FORMAT_IDS)
def test_cache_on_and_off_give_the_same_tokens(make_llm, tiny_llama, fmt):
    prompts = prompts_sharing_a_head(8, 48, 250, seed=5)
    settings = {"kv_cache_dtype": fmt, "max_num_batched_tokens": 64}
    off = engine(make_llm, tiny_llama, "bfloat16", enable_prefix_caching=False, **settings)
    want = answers(off, prompts)
    assert len({tuple(ids) for ids, _ in want}) > 1  # distinct answers: a real check
    on = engine(make_llm, tiny_llama, "bfloat16", **settings)
    assert answers(on, prompts) == want  # cold: shared heads hit within the batch
    assert answers(on, prompts) == want  # warm: every prompt's head from the device tree
    model = on.engine.runner.model
    assert isinstance(model.attention, QuantizedAttention)
    assert isinstance(model.row_ops, NativeRowOps) and model.row_ops.kv_format.name == fmt
