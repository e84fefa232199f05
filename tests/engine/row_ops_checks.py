"""Checks of the fused row ops (engine/attention/triton_row_ops.py) against plain torch: run by
the triton interpreter on CPU (test_attention_triton.py) and compiled on a GPU (test_cuda.py).
Each check takes the ops object and the device its tensors live on."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.models.rope import apply_rope
from engine.models.row_ops import rms_norm

ROW_COUNTS = (1, 5)
DTYPES = (torch.float32, torch.bfloat16)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:  # a few roundings of the activations' dtype apart
        torch.testing.assert_close(actual.float(), expected.float(), rtol=3e-2, atol=2e-2)


def _randn(*shape: int, dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device, dtype)


def check_rms_norm(ops, device: str) -> None:
    for dtype in DTYPES:
        for rows in ROW_COUNTS:
            n = 64 if rows == 1 else 48
            x = _randn(rows, n, dtype=dtype, device=device, seed=rows + n)
            w = _randn(n, dtype=dtype, device=device, seed=7)
            _close(ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))
    # heads of a strided view ([T, H, D], the q-norm of a fused qkv output)
    qkv = _randn(3, 6 * 16, dtype=torch.float32, device=device, seed=1)
    heads = qkv[:, : 4 * 16].view(3, 4, 16)
    w = _randn(16, dtype=torch.float32, device=device, seed=2)
    _close(ops.rms_norm(heads, w, 1e-5), rms_norm(heads, w, 1e-5))


def check_add_rms_norm(ops, device: str) -> None:
    for dtype in DTYPES:
        for rows in ROW_COUNTS:
            x = _randn(rows, 64, dtype=dtype, device=device, seed=rows)
            residual = _randn(rows, 64, dtype=dtype, device=device, seed=10 + rows)
            w = _randn(64, dtype=dtype, device=device, seed=3)
            want_residual = residual + x
            y, r = ops.add_rms_norm(x, residual, w, 1e-6)
            assert r.data_ptr() == residual.data_ptr()  # updated in place
            _close(r, want_residual)  # float32: equal (bfloat16: the interpreter may truncate)
            _close(y, rms_norm(want_residual, w, 1e-6))


def check_silu_mul(ops, device: str) -> None:
    for dtype in DTYPES:
        for rows in ROW_COUNTS:
            inter = 48 if rows == 1 else 1100  # 1100: two column tiles
            gate_up = _randn(rows, 2 * inter, dtype=dtype, device=device, seed=rows + inter)
            gate, up = gate_up.chunk(2, dim=-1)
            _close(ops.silu_mul(gate_up), F.silu(gate) * up)


def _rope_tables(positions: torch.Tensor, head_dim: int, rotary_dim: int, dtype, device):
    """cos [T, 1, D] as [cos, cos, 1...], sin [T, 1, rotary_dim / 2] (engine/models/rope.py)."""
    half = rotary_dim // 2
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.outer(positions.float(), inv_freq)
    cos = torch.ones(len(positions), head_dim)
    cos[:, :half] = freqs.cos()
    cos[:, half : 2 * half] = freqs.cos()
    return cos.to(device, dtype)[:, None], freqs.sin().to(device, dtype)[:, None]


def rope_store_inputs(
    rows: int, hq: int, hkv: int, head_dim: int, rotary_dim: int, dtype, device: str
) -> tuple[torch.Tensor, ...]:
    """A rope_store_kv case: qk [rows, hq + hkv, D] and v as views of one qkv projection, the rope
    tables at fixed positions and distinct slots (up to 5 rows)."""
    qkv = _randn(rows, (hq + 2 * hkv) * head_dim, dtype=dtype, device=device, seed=rows)
    qk = qkv[:, : (hq + hkv) * head_dim].view(rows, hq + hkv, head_dim)
    v = qkv[:, (hq + hkv) * head_dim :].view(rows, hkv, head_dim)
    positions = torch.tensor([3, 40, 7, 0, 123][:rows])
    cos, sin = _rope_tables(positions, head_dim, rotary_dim, dtype, device)
    slots = torch.tensor([21, 0, 9, 4, 13][:rows], device=device)
    return qk, v, cos, sin, slots


def assert_only_slots_written(
    k_rows: torch.Tensor, v_rows: torch.Tensor, slots: torch.Tensor
) -> None:
    """Every row of the (zero-initialised) caches but those at `slots` is still zero."""
    untouched = torch.ones(k_rows.shape[0], dtype=torch.bool, device=k_rows.device)
    untouched[slots] = False
    assert not k_rows[untouched].any() and not v_rows[untouched].any()


def check_rope_store_kv(ops, device: str) -> None:
    hq, hkv, bs, num_blocks = 4, 2, 4, 6
    for dtype in DTYPES:
        for rows in (1, 5):
            for head_dim, rotary_dim in ((64, 64), (64, 32), (48, 24)):
                qk, v, cos, sin, slots = rope_store_inputs(
                    rows, hq, hkv, head_dim, rotary_dim, dtype, device
                )
                k_cache, v_cache = (
                    torch.zeros(num_blocks, bs, hkv, head_dim, dtype=dtype, device=device)
                    for _ in range(2)
                )
                out = ops.rope_store_kv(qk, v, cos, sin, k_cache, v_cache, slots)
                want = apply_rope(qk, cos, sin)
                _close(out, want)
                k_rows, v_rows = k_cache.view(-1, hkv, head_dim), v_cache.view(-1, hkv, head_dim)
                assert torch.equal(k_rows[slots], out[:, hq:])
                assert torch.equal(v_rows[slots], v)
                assert_only_slots_written(k_rows, v_rows, slots)


ROW_OPS_CHECKS: dict[str, Callable[..., None]] = {
    "row_ops_rms_norm": check_rms_norm,
    "row_ops_add_rms_norm": check_add_rms_norm,
    "row_ops_silu_mul": check_silu_mul,
    "row_ops_rope_store_kv": check_rope_store_kv,
}
