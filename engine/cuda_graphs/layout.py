"""How a decode step is laid out over a graph bucket: the row buckets, and the padding that fills
a step up to its bucket (engine/cuda_graphs/runner.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bucket_sizes(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8, the last covering max_rows."""
    sizes = []
    for n in [1, 2, 4, *range(8, max_rows + 8, 8)]:
        sizes.append(n)
        if n >= max_rows:
            return sizes
    return sizes


@dataclass(frozen=True)
class PaddedLayout:
    """One step laid out over a bucket of `rows` rows and `rows` sequence entries."""

    rows: int
    query_lens: list[int]  # [rows]: the step's, then 1 per padding row, then 0
    seq_lens: list[int]  # [rows]: the step's, then 1 per padding row, then 0
    cu_seqlens_q: np.ndarray  # int32 [rows + 1]


def pad_layout(query_lens: list[int], seq_lens: list[int], rows: int) -> PaddedLayout:
    """The step's sequences, then one single-row sequence per padding row, then empty ones."""
    pad = rows - sum(query_lens)
    empty = rows - len(query_lens) - pad
    if pad < 0 or empty < 0:
        raise ValueError(f"a step of {sum(query_lens)} rows does not fit a bucket of {rows}")
    q = list(query_lens) + [1] * pad + [0] * empty
    cu = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(q, out=cu[1:])
    return PaddedLayout(rows, q, list(seq_lens) + [1] * pad + [0] * empty, cu)
