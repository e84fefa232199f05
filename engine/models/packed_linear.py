"""Linear layers on oneDNN-packed CPU weights, and the row count that keeps them row-invariant.

oneDNN picks its matmul kernel by shape: on AMX CPUs a row's output bits change with the number
of rows in the call (here: one kernel family up to 32 rows, others from 64 and again from ~576),
so a token's hidden state would depend on its batch. A batch-invariant model (deterministic mode)
caps the rows per call at the largest count this CPU's kernels agree on for every padded count
up to it, probed once per weight shape."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PROBE_ROWS = 256  # the largest cap probed (more rows go in further calls of this many)
CHECKED_ROWS = 64  # rows compared against one-row calls at each count


@dataclass(frozen=True)
class PackedWeight:
    """A [out, in] weight in oneDNN's blocked layout; `max_rows` > 0 caps the rows of one call."""

    data: torch.Tensor
    max_rows: int = 0


def pack_weight(weight: torch.Tensor, invariant: bool = False) -> PackedWeight:
    """oneDNN's blocked layout of a [out, in] weight (saves a reorder on every CPU matmul);
    invariant: with the row cap that keeps every row's bits independent of its call's rows."""
    cap = invariant_rows(*weight.shape, weight.dtype) if invariant else 0
    return PackedWeight(_reorder(weight), cap)


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def padded_rows(m: int) -> int:
    """The row count a packed matmul runs with: powers of two up to 64, then multiples of 64.

    oneDNN caches one primitive per shape (up to 1,024, with their scratch memory); ragged batches
    have a new row count almost every step, so unpadded the cache grows the process by hundreds of MB
    and each new shape pays a primitive creation."""
    if m <= 64:
        return 1 << (m - 1).bit_length()
    return -(-m // 64) * 64


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: PackedWeight | None
) -> torch.Tensor:
    if packed is None:
        return F.linear(x, weight, bias)
    cap = packed.max_rows
    if cap and x.shape[0] > cap:
        parts = [_packed_linear(x[i : i + cap], packed.data, bias) for i in range(0, len(x), cap)]
        return torch.cat(parts)
    return _packed_linear(x, packed.data, bias)


def _packed_linear(x: torch.Tensor, data: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    m = x.shape[0]
    rows = padded_rows(m)
    if rows != m:
        x = F.pad(x, (0, 0, 0, rows - m))  # x: [m, in] -> [rows, in], zero rows at the end
    out = torch.ops.mkldnn._linear_pointwise(x, data, bias, "none", [], "")
    return out if rows == m else out[:m]


@functools.cache
def invariant_rows(out_features: int, in_features: int, dtype: torch.dtype) -> int:
    """The largest padded row count (<= PROBE_ROWS) up to which every call of this shape gives
    each of its first CHECKED_ROWS rows the bits of a one-row call: random data, this CPU."""
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=gen) * 0.05).to(dtype)
    data = _reorder(weight)
    x = torch.randn(PROBE_ROWS, in_features, generator=gen).to(dtype)
    one_by_one = torch.cat([_packed_linear(x[i : i + 1], data, None) for i in range(CHECKED_ROWS)])
    cap = 1
    for rows in sorted({padded_rows(m) for m in range(2, PROBE_ROWS + 1)}):
        n = min(rows, CHECKED_ROWS)
        if not torch.equal(_packed_linear(x[:rows], data, None)[:n], one_by_one[:n]):
            break
        cap = rows
    return cap
