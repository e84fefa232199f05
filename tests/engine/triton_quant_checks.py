"""Checks of the triton kernels over quantized KV pools (engine/attention/triton_quant.py and its
callers) against the torch reference (engine/kv/quant.py, DequantizingAttention): run by the
triton interpreter on CPU (test_attention_triton_quant.py) and compiled on a GPU (test_cuda.py).
Each check takes the device its tensors live on."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.attention import TorchAttention, build_attention_metadata, compute_positions
from engine.attention.quant_reference import DequantizingAttention
from engine.kv.paged_cache import KVCache
from engine.kv.quant import KV_FORMATS, KVFormat, quantize
from engine.models.rope import apply_rope
from engine.models.row_ops import RowOps

from .row_ops_checks import _close, _randn, assert_only_slots_written, rope_store_inputs
from .test_attention import make_batch
from .test_attention_triton import TRITON_CASES, tiny_model
from .test_attention_window import WINDOW_CASES, assert_window_matters


def tie_rows(fmt: KVFormat, d: int) -> torch.Tensor:
    """float32 [R, d]: rows whose amax is qmax (so their scale is exactly 1) holding every code
    value and every midpoint between neighbouring ones (the rounding's ties), both signs;
    for fp8 the subnormals and the midpoint below the smallest one too."""
    if fmt.code_dtype == torch.int8:
        values = torch.arange(0, 128, dtype=torch.float32)
    else:
        codes = torch.arange(128, dtype=torch.uint8).view(fmt.code_dtype).float()
        values = codes[codes.isfinite() & (codes <= fmt.qmax)]
    values = values.sort().values
    mids = (values[1:] + values[:-1]) / 2  # exact in float32: one bit more than the codes
    body = torch.cat([values, mids, -values, -mids])
    body = torch.cat([body, body.new_zeros(-len(body) % (d - 1))]).view(-1, d - 1)
    return torch.cat([body.new_full((len(body), 1), fmt.qmax), body], dim=1)


def _rows(x: torch.Tensor, t: int, heads: int, d: int) -> torch.Tensor:
    """x's rows cycled or cut to [t, heads, d]."""
    flat = x.reshape(-1, d)
    reps = -(-t * heads // len(flat))
    return flat.repeat(reps, 1)[: t * heads].view(t, heads, d)


def check_store(fmt: KVFormat, device: str) -> None:
    """store_kv's quantized rows are quantize()'s, bit for bit: k and v from column slices of a
    fused qkv, rows of very different magnitudes (subnormal scales too), an all-zero row, and
    every tie of the format's rounding."""
    from engine.attention import triton_kernels

    hkv, d, num_blocks, bs = 2, 16, 16, 4
    ties = tie_rows(fmt, d)
    t = -(-len(ties) // hkv)
    for dtype in (torch.float32, torch.bfloat16):
        qkv = _randn(t, 3 * hkv * d, dtype=torch.float32, device="cpu", seed=t)
        # magnitudes from subnormal (float32 only: the interpreter widens subnormal bfloat16
        # wrongly) to large
        qkv *= torch.logspace(-40 if dtype == torch.float32 else -30, 4, t)[:, None]
        qkv[1, hkv * d : hkv * d + d] = 0  # k's first head of token 1: an all-zero row
        qkv[:, 2 * hkv * d :] = _rows(ties, t, hkv, d).reshape(t, -1)  # v: the ties
        qkv = qkv.to(device, dtype)
        k = qkv[:, hkv * d : 2 * hkv * d].view(t, hkv, d)
        v = qkv[:, 2 * hkv * d :].view(t, hkv, d)
        k_cache, v_cache = (
            torch.zeros(num_blocks, bs, hkv, d + 4, dtype=torch.uint8, device=device)
            for _ in range(2)
        )
        gen = torch.Generator().manual_seed(3)
        slots = torch.randperm(num_blocks * bs, generator=gen)[:t].to(device)
        triton_kernels.store_kv(k, v, k_cache, v_cache, slots, fmt)
        k_rows, v_rows = k_cache.view(-1, hkv, d + 4), v_cache.view(-1, hkv, d + 4)
        assert torch.equal(k_rows[slots], quantize(k, fmt))
        assert torch.equal(v_rows[slots], quantize(v, fmt))
        assert_only_slots_written(k_rows, v_rows, slots)


def check_rope_store(fmt: KVFormat, device: str) -> None:
    """TritonRowOps(fmt).rope_store_kv: rope as torch's, and the caches hold quantize() of its
    roped k heads and of v, bit for bit."""
    from engine.attention.triton_row_ops import TritonRowOps

    ops = TritonRowOps(fmt)
    hq, hkv, bs, num_blocks = 4, 2, 4, 6
    for dtype in (torch.float32, torch.bfloat16):
        for rows, head_dim, rotary_dim in ((1, 16, 16), (5, 48, 24)):
            qk, v, cos, sin, slots = rope_store_inputs(
                rows, hq, hkv, head_dim, rotary_dim, dtype, device
            )
            k_cache, v_cache = (
                torch.zeros(num_blocks, bs, hkv, head_dim + 4, dtype=torch.uint8, device=device)
                for _ in range(2)
            )
            out = ops.rope_store_kv(qk, v, cos, sin, k_cache, v_cache, slots)
            _close(out, apply_rope(qk, cos, sin))
            k_rows = k_cache.view(-1, hkv, head_dim + 4)
            v_rows = v_cache.view(-1, hkv, head_dim + 4)
            assert torch.equal(k_rows[slots], quantize(out[:, hq:], fmt))
            assert torch.equal(v_rows[slots], quantize(v, fmt))
            assert_only_slots_written(k_rows, v_rows, slots)


def check_attention(
    fmt: KVFormat, case, device: str, window: int | None = None, dtype=torch.float32
) -> None:
    """TritonAttention(fmt) over a packed pool (a random cached prefix per sequence, then the
    step's own rows stored by the backend) against DequantizingAttention on a copy."""
    from engine.attention.triton_backend import TritonAttention

    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    q, k, v, k_cache, v_cache, tables, _, _ = make_batch(
        len(query_lens), query_lens, prefix_lens, bs, hq, hkv, d, groups
    )
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, bs, device)
    q, k, v = (x.to(device, dtype) for x in (q, k, v))
    packed = [quantize(c, fmt).to(device) for c in (k_cache, v_cache)]
    ref_caches = [c.clone() for c in packed]
    reference = DequantizingAttention(fmt)
    scale = d**-0.5
    want = reference.forward(q, k, v, *ref_caches, reference.plan(meta), scale, window)
    got = TritonAttention(fmt).forward(q, k, v, *packed, meta, scale, window)
    assert torch.equal(packed[0], ref_caches[0]) and torch.equal(packed[1], ref_caches[1])
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    if window is not None:
        assert_window_matters(case, window, want.float().cpu())


def _model_logits(model, kv_format: KVFormat, steps, tables) -> torch.Tensor:
    kv = KVCache.for_model(model, 8, 4, kv_format).tensor
    gen = torch.Generator().manual_seed(1)
    logits = []
    for query_lens, seq_lens in steps:
        meta = build_attention_metadata(query_lens, seq_lens, tables, 4, model.device)
        ids = torch.randint(0, 64, (sum(query_lens),), generator=gen).to(model.device)
        pos = torch.from_numpy(compute_positions(query_lens, seq_lens)).to(model.device)
        logits.append(model.compute_logits(model(ids, pos, kv, meta)))
    return torch.cat(logits)


def check_model(fmt: KVFormat, device: str) -> None:
    """A tiny Qwen3 (GQA, qk-norm) over prefill, mixed and decode steps: the triton row ops and
    attention over a packed pool against the torch reference path (RowOps(fmt) + Dequantizing
    Attention), and both near the model over an unquantized pool."""
    from engine.attention.triton_backend import TritonAttention
    from engine.attention.triton_row_ops import TritonRowOps

    model = tiny_model(device=device)
    steps = [([9, 4], [9, 4]), ([1, 6], [10, 10]), ([1, 1], [11, 11])]
    tables = [[3, 1, 7], [0, 2, 5]]
    model.row_ops, model.attention = RowOps(fmt), DequantizingAttention(fmt)
    want = _model_logits(model, fmt, steps, tables)
    model.row_ops, model.attention = TritonRowOps(fmt), TritonAttention(fmt)
    got = _model_logits(model, fmt, steps, tables)
    # the two paths' norms and ropes round differently in the last bit, so a row's scale may
    # differ by an ulp and a value on a rounding boundary take the neighbouring code: one code
    # step of one key moves these logits (|max| ~0.4) by ~2e-4; a wrong kernel moves them by 1e-2+
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    model.row_ops, model.attention = RowOps(), TorchAttention()
    full = _model_logits(model, None, steps, tables)
    assert (got - full).abs().max() < 0.1 * full.abs().max()  # quantized, yet the same model


def check_decode_graphs(fmt: KVFormat, device: str) -> None:
    """Decode and verify steps padded into the graphs' static buffers over a packed pool (its
    scratch block takes the padding rows' quantized K/V) give the eager step's logits and
    pool bytes."""
    from engine.attention.triton_backend import TritonAttention
    from engine.attention.triton_row_ops import TritonRowOps
    from engine.cuda_graphs import DecodeGraphs
    from engine.cuda_graphs.backends import EagerReplayBackend

    model = tiny_model(device=device)
    model.row_ops, model.attention = TritonRowOps(fmt), TritonAttention(fmt)
    c = model.config
    kv = KVCache(
        2, 12, 4, c.num_key_value_heads, c.head_dim, model.dtype, device, True, kv_format=fmt
    )
    tables = [[3, 1, 7], [0, 2], [5, 9, 4]]
    prompt = [6, 5, 9]
    meta = build_attention_metadata(prompt, prompt, tables, 4, device)
    ids = torch.randint(0, 64, (sum(prompt),), generator=torch.Generator().manual_seed(1))
    positions = torch.from_numpy(compute_positions(prompt, prompt))
    model(ids.to(device), positions.to(device), kv.tensor, meta)
    graphs = DecodeGraphs(model, kv, 8, 3, 128, EagerReplayBackend())
    graphs.capture()
    for query_lens, verify in [([1, 1, 1], [False] * 3), ([3, 1, 2], [True, False, True])]:
        seq_lens = [p + q for p, q in zip(prompt, query_lens, strict=True)]
        meta = build_attention_metadata(query_lens, seq_lens, tables, 4, device, verify=verify)
        gen = torch.Generator().manual_seed(2)
        ids = torch.randint(0, 64, (sum(query_lens),), generator=gen).to(device)
        pos = torch.from_numpy(compute_positions(query_lens, seq_lens)).to(device)
        eager_kv = kv.tensor.clone()
        want = model.compute_logits(model(ids, pos, eager_kv, meta))
        got = model.compute_logits(graphs.forward(ids, pos, meta))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(kv.tensor[:, :, :12], eager_kv[:, :, :12])
    assert graphs.num_replayed == 2


ATTENTION_CASES = {  # name: (case, window)
    "mixed_gqa": (TRITON_CASES[1], None),  # prefill chunks and decodes, 8 q heads over 2
    "long_chunk": (TRITON_CASES[6], None),  # a chunk of more rows than one query tile
    "window": (WINDOW_CASES[1], 8),  # prefill chunks and decodes, a window across blocks
}

QUANT_CHECKS: dict[str, Callable[[str], None]] = {}
for _fmt in KV_FORMATS.values():
    _name = _fmt.name
    QUANT_CHECKS[f"store_{_name}"] = lambda device, f=_fmt: check_store(f, device)
    QUANT_CHECKS[f"rope_store_{_name}"] = lambda device, f=_fmt: check_rope_store(f, device)
    for _case_name, (_case, _window) in ATTENTION_CASES.items():
        QUANT_CHECKS[f"attention_{_name}_{_case_name}"] = (
            lambda device, f=_fmt, c=_case, w=_window: check_attention(f, c, device, w)
        )
QUANT_CHECKS["attention_fp8_e4m3_head_dim12"] = lambda device: check_attention(
    KV_FORMATS["fp8_e4m3"], TRITON_CASES[7], device
)
QUANT_CHECKS["attention_int8_float16"] = lambda device: check_attention(
    KV_FORMATS["int8"], TRITON_CASES[1], device, dtype=torch.float16
)  # float16, not bfloat16: the interpreter's bfloat16 dot is wrong (the unquantized one's too)
# a model's forward is slow in the interpreter: the integer and an fp8 format, and the graphs
# over the other fp8 one
QUANT_CHECKS["model_int8"] = lambda device: check_model(KV_FORMATS["int8"], device)
QUANT_CHECKS["model_fp8_e4m3"] = lambda device: check_model(KV_FORMATS["fp8_e4m3"], device)
QUANT_CHECKS["decode_graphs_fp8_e5m2"] = lambda device: check_decode_graphs(
    KV_FORMATS["fp8_e5m2"], device
)
