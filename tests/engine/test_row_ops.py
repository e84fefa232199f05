"""The native row ops (engine/attention/csrc/row_ops.cpp through NativeRowOps) against the torch
reference (RowOps): float32 and bfloat16, one row and several, sizes off the 16-lane vectors."""

from __future__ import annotations

import pytest
import torch

from engine.attention.native import load_native
from engine.models.row_ops import NativeRowOps, RowOps

DTYPES = (torch.float32, torch.bfloat16)
ROWS = (1, 2, 17, 300)  # 300: split over threads by the native ops
WIDTHS = (576, 100, 37)  # 100, 37: a vector tail, no whole vector


@pytest.fixture(scope="module")
def native() -> NativeRowOps:
    kernels = load_native()
    assert kernels is not None, "the native kernels must build here"
    return NativeRowOps(kernels)


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """float32: a few ulps (the native ops sum in another order); bfloat16: one rounding."""
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(actual.float(), expected.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", WIDTHS)
def test_rms_norm_matches_the_reference(native, dtype, rows, n):
    wide = _randn(rows, n + 9, dtype=dtype, seed=rows * n, scale=3.0)
    x, weight = wide[:, :n], _randn(n, dtype=dtype, seed=1)  # rows strided n + 9
    _close(native.rms_norm(x, weight, 1e-6), RowOps().rms_norm(x, weight, 1e-6))


def test_rms_norm_of_heads_normalises_each_head(native):
    """[T, H, D] heads of a fused qkv row (the qk-norm): each head of D values normalised."""
    qkv = _randn(3, 8 * 32, dtype=torch.float32, seed=4)
    heads = qkv[:, : 5 * 32].view(3, 5, 32)
    weight = _randn(32, dtype=torch.float32, seed=5)
    got = native.rms_norm(heads, weight, 1e-5)
    assert got.shape == (3, 5, 32)
    _close(got, RowOps().rms_norm(heads, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", WIDTHS)
def test_add_rms_norm_adds_in_place_and_normalises_the_sum(native, dtype, rows, n):
    x = _randn(rows, n, dtype=dtype, seed=rows + n, scale=2.0)
    residual = _randn(rows, n, dtype=dtype, seed=7 * rows + n)
    weight = _randn(n, dtype=dtype, seed=3)
    want_y, want_sum = RowOps().add_rms_norm(x, residual.clone(), weight, 1e-6)
    y, summed = native.add_rms_norm(x, residual, weight, 1e-6)
    assert summed.data_ptr() == residual.data_ptr()  # the stream is updated in place
    assert torch.equal(summed, want_sum)  # one rounding of the same sum
    _close(y, want_y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("inter", (1536, 100, 37))
def test_silu_mul_matches_the_reference(native, dtype, rows, inter):
    gate_up = _randn(rows, 2 * inter, dtype=dtype, seed=rows * inter, scale=4.0)
    gate_up[0, :3] = torch.tensor([-100.0, 100.0, 0.0])  # exp's range ends and silu(0)
    _close(native.silu_mul(gate_up), RowOps().silu_mul(gate_up))


def test_silu_mul_reads_strided_rows(native):
    wide = _randn(5, 2 * 48 + 16, dtype=torch.bfloat16, seed=9)
    gate_up = wide[:, : 2 * 48]
    _close(native.silu_mul(gate_up), RowOps().silu_mul(gate_up))


def _rope_case(tokens: int, head_dim: int, rotary_dim: int, dtype: torch.dtype):
    """qk and v as views of one fused qkv output, their rope tables and empty caches."""
    hq, hkv = 6, 2
    qkv = _randn(tokens, (hq + 2 * hkv) * head_dim, dtype=dtype, seed=tokens + head_dim)
    qk = qkv[:, : (hq + hkv) * head_dim].view(tokens, hq + hkv, head_dim)
    v = qkv[:, (hq + hkv) * head_dim :].view(tokens, hkv, head_dim)
    positions = torch.arange(tokens) * 37 % 1000
    half = rotary_dim // 2
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.outer(positions.float(), inv_freq)
    cos = torch.ones(tokens, head_dim)
    cos[:, :half], cos[:, half : 2 * half] = freqs.cos(), freqs.cos()
    cos, sin = cos.to(dtype)[:, None], freqs.sin().to(dtype)[:, None]
    blocks = max(12, tokens)
    slots = torch.randperm(blocks * 4, generator=torch.Generator().manual_seed(tokens))[:tokens]
    return qk, v, cos, sin, slots, (blocks, 4, hkv, head_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", (1, 3, 33, 200))
@pytest.mark.parametrize("dims", ((64, 64), (64, 32), (48, 48), (40, 24)))
def test_rope_store_kv_ropes_and_stores_as_the_reference(native, dtype, tokens, dims):
    qk, v, cos, sin, slots, cache_shape = _rope_case(tokens, *dims, dtype)
    caches = [torch.zeros(cache_shape, dtype=dtype) for _ in range(4)]
    want = RowOps().rope_store_kv(qk, v, cos, sin, caches[0], caches[1], slots)
    got = native.rope_store_kv(qk, v, cos, sin, caches[2], caches[3], slots)
    _close(got, want)
    hq = qk.shape[1] - v.shape[1]
    k_rows, v_rows = caches[2].flatten(0, 1), caches[3].flatten(0, 1)
    assert torch.equal(k_rows[slots], got[:, hq:])  # the roped k heads, as returned
    assert torch.equal(v_rows[slots], v)
    untouched = torch.ones(len(k_rows), dtype=torch.bool)
    untouched[slots] = False
    assert not k_rows[untouched].any() and not v_rows[untouched].any()


def test_rope_store_kv_refuses_a_slot_outside_the_cache(native):
    qk, v, cos, sin, _, cache_shape = _rope_case(2, 64, 64, torch.float32)
    k_cache, v_cache = torch.zeros(cache_shape), torch.zeros(cache_shape)
    with pytest.raises(RuntimeError, match="slot out of range"):
        native.rope_store_kv(qk, v, cos, sin, k_cache, v_cache, torch.tensor([0, 48]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_keeps_its_bits_alone_or_among_many(native, dtype):
    """What the deterministic mode needs: no op's row depends on the rows beside it."""
    rows, n = 300, 576
    x = _randn(rows, n, dtype=dtype, seed=11, scale=2.0)
    residual = _randn(rows, n, dtype=dtype, seed=12)
    weight = _randn(n, dtype=dtype, seed=13)
    gate_up = _randn(rows, 2 * n, dtype=dtype, seed=14, scale=3.0)
    qk, v, cos, sin, slots, cache_shape = _rope_case(rows, 64, 64, dtype)
    caches = [torch.zeros(cache_shape, dtype=dtype) for _ in range(2)]
    norm_all = native.add_rms_norm(x, residual.clone(), weight, 1e-6)[0]
    silu_all = native.silu_mul(gate_up)
    rope_all = native.rope_store_kv(qk, v, cos, sin, *caches, slots)
    for i in (0, 21, 32, 299):
        one = slice(i, i + 1)
        assert torch.equal(
            native.add_rms_norm(x[one], residual[one].clone(), weight, 1e-6)[0], norm_all[one]
        )
        assert torch.equal(native.silu_mul(gate_up[one]), silu_all[one])
        assert torch.equal(
            native.rope_store_kv(qk[one], v[one], cos[one], sin[one], *caches, slots[one]),
            rope_all[one],
        )


def test_for_device_picks_the_native_ops_on_cpu():
    assert isinstance(RowOps.for_device(torch.device("cpu")), NativeRowOps)
