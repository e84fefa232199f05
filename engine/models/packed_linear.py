"""Linear layers on oneDNN-packed CPU weights, and the row counts that keep them row-invariant.

oneDNN picks its matmul kernel by shape, so a row's output bits can change with the number of rows
in the call: on AMX CPUs one kernel family up to 32 rows, others from 64 and again from ~576; on an
AVX512-BF16 EPYC the 1,536-wide down projection sums a lone row in another order than two or more.
A batch-invariant model (deterministic mode) runs every call within the range of row counts this
CPU's kernels agree on, probed once per weight shape: a lone row padded to the range's floor, more
rows than its cap split into calls of the cap. The default model pads a lone row to the floor too
(a decode step of one sequence then sums as a speculative verify of it does, so greedy output is
the same with speculation on and off) but keeps its calls whole."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PROBE_ROWS = 256  # the largest cap probed (more rows go in further calls of this many)
CHECKED_ROWS = 64  # rows compared against the floor's calls at each count
PROBE_TILE = 1024  # distinct weight rows in a probe
LONE_ROWS = 16  # rows compared one at a time against two at a time (every load of a model)


@dataclass(frozen=True)
class PackedWeight:
    """A [out, in] weight in oneDNN's blocked layout; `max_rows` > 0 caps the rows of one call,
    `min_rows` pads a call with fewer rows up to that many."""

    data: torch.Tensor
    max_rows: int = 0
    min_rows: int = 1


def pack_weight(weight: torch.Tensor, invariant: bool = False) -> PackedWeight:
    """oneDNN's blocked layout of a [out, in] weight (saves a reorder on every CPU matmul);
    invariant: with the row range that keeps every row's bits independent of its call's rows."""
    data = _reorder(weight)
    if not invariant:
        return PackedWeight(data, 0, lone_row_floor(*weight.shape, weight.dtype))
    floor, cap = invariant_rows(*weight.shape, weight.dtype)
    return PackedWeight(data, cap, floor)


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def padded_rows(m: int) -> int:
    """The row count a packed matmul runs with: 1, 2, 4, then multiples of 4 up to 64, of 16 up
    to 256, of 64 up to 1,024, of 256 beyond (46 counts up to 2,048 rows).

    oneDNN caches one primitive per shape (up to 1,024, with their scratch memory); ragged batches
    have a new row count almost every step, so unpadded the cache grows the process by hundreds of MB
    and each new shape pays a primitive creation. The steps are fine where decode and verify steps
    fall: from 8 rows on a bf16 matmul is bound by its arithmetic on a small CPU, so a step's cost
    grows with its padded rows (powers of two made a batch of 8 with one draft token cost 16 rows).
    They widen with the rows (at most a quarter wasted) because every count held costs a model
    about 3 MB of primitives: 70 counts made a server's memory climb for several rounds of load."""
    if m <= 4:
        return 1 << (m - 1).bit_length()
    for limit, step in ((64, 4), (256, 16), (1024, 64)):
        if m <= limit:
            return -(-m // step) * step
    return -(-m // 256) * 256


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: PackedWeight | None
) -> torch.Tensor:
    if packed is None:
        return F.linear(x, weight, bias)
    cap, floor = packed.max_rows, packed.min_rows
    if cap and x.shape[0] > cap:
        parts = [
            _packed_linear(x[i : i + cap], packed.data, bias, floor) for i in range(0, len(x), cap)
        ]
        return torch.cat(parts)
    return _packed_linear(x, packed.data, bias, floor)


def _packed_linear(
    x: torch.Tensor, data: torch.Tensor, bias: torch.Tensor | None, floor: int = 1
) -> torch.Tensor:
    m = x.shape[0]
    rows = max(floor, padded_rows(m))
    if rows != m:
        x = F.pad(x, (0, 0, 0, rows - m))  # x: [m, in] -> [rows, in], zero rows at the end
    out = torch.ops.mkldnn._linear_pointwise(x, data, bias, "none", [], "")
    return out if rows == m else out[:m]


def _probe(out_features: int, in_features: int, dtype: torch.dtype):
    """A packed weight and PROBE_ROWS inputs of this shape whose magnitudes span 2^-6..2^6, so
    the sums cancel and a change in the order of accumulation shows in the rounded bits (plain
    random data hides most of them); and calls_of(rows, floor): the first CHECKED_ROWS rows'
    outputs computed `rows` at a time."""
    gen = torch.Generator().manual_seed(0)

    def wide(*shape: int) -> torch.Tensor:
        scale = torch.exp2(torch.randint(-6, 7, shape, generator=gen).float())
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    # the weight's rows repeat a tile (cheap to make for a vocabulary-wide head): each output
    # still sums over every input, in the kernel's order
    tile = wide(min(out_features, PROBE_TILE), in_features)
    data = _reorder(tile.repeat(-(-out_features // len(tile)), 1)[:out_features])
    x = wide(PROBE_ROWS, in_features)

    def calls_of(rows: int, floor: int, checked: int = CHECKED_ROWS) -> torch.Tensor:
        n = max(rows, checked)
        return torch.cat(
            [_packed_linear(x[i : i + rows], data, None, floor) for i in range(0, n, rows)]
        )[:checked]

    return calls_of


@functools.cache
def lone_row_floor(out_features: int, in_features: int, dtype: torch.dtype) -> int:
    """2 where this CPU sums a lone row of this shape in another order than rows of two, else 1."""
    calls_of = _probe(out_features, in_features, dtype)
    return 1 if torch.equal(calls_of(1, 1, LONE_ROWS), calls_of(2, 1, LONE_ROWS)) else 2


@functools.cache
def invariant_rows(out_features: int, in_features: int, dtype: torch.dtype) -> tuple[int, int]:
    """(floor, cap): the row counts, padded, from floor (1 or 2) up to cap (<= PROBE_ROWS) at
    which every call of this shape gives each of CHECKED_ROWS rows the bits of floor-row calls,
    on this CPU."""
    calls_of = _probe(out_features, in_features, dtype)
    best = (1, 1)
    for floor in (1, 2):
        reference, cap = calls_of(floor, floor), floor
        for rows in sorted({padded_rows(m) for m in range(floor + 1, PROBE_ROWS + 1)}):
            if not torch.equal(calls_of(rows, floor), reference):
                break
            cap = rows
        if cap > best[1]:
            best = (floor, cap)
        if cap == PROBE_ROWS:
            break
    return best
