"""Allowed-token bitmasks for the constrained rows of a step, filled in one batched call.

Layout (llguidance's and xgrammar's): int32 words [rows, ceil(vocab / 32)], bit j of word w
allows token 32 * w + j."""

from __future__ import annotations

from dataclasses import dataclass

import llguidance as llg
import numpy as np
import torch

from engine.structured.matcher import SequenceMatcher


@dataclass(frozen=True)
class TokenMasks:
    rows: list[int]  # the sampler rows the masks apply to, in order
    bitmask: torch.Tensor  # [len(rows), words] int32

    def banned(self, num_rows: int, vocab_size: int) -> torch.Tensor:
        """[num_rows, vocab_size] bool over the whole batch: True where a token is disallowed
        (rows without a mask ban nothing). Inverted as words, then unpacked once."""
        words = np.zeros((num_rows, self.bitmask.shape[1]), dtype=np.int32)
        words[self.rows] = ~self.bitmask.numpy()
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
        return torch.from_numpy(bits[:, :vocab_size]).view(torch.bool)

    def dead_rows(self) -> list[int]:
        """Indices into `rows` whose mask allows no token at all."""
        return (~self.bitmask.ne(0).any(dim=1)).nonzero().flatten().tolist()


class MaskFiller:
    """Fills masks for many matchers at once, on llguidance's own thread pool."""

    def __init__(self, vocab_size: int, num_threads: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._executor = llg.LLExecutor(num_threads)

    def fill(self, rows: list[int], matchers: list[SequenceMatcher]) -> TokenMasks:
        bitmask = torch.empty((len(rows), self.words), dtype=torch.int32)
        row_bytes = self.words * 4
        if len(matchers) == 1:  # no thread hand-off for one row
            matchers[0].matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), row_bytes)
        else:
            pairs = [(m.matcher, i) for i, m in enumerate(matchers)]
            self._executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), row_bytes, len(rows))
        return TokenMasks(rows, bitmask)
