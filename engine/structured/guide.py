"""The engine's side of constrained decoding: a matcher for each constrained sequence, the step's
masks for the rows that sample, and what a sampled token does to the grammar.

A row whose mask allows nothing (a dead end: the grammar can neither continue nor end) leaves the
step before sampling and ends with finish_reason "error"; so does a token the grammar rejects."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.structured.compiler import GrammarCompiler
from engine.structured.masks import MaskFiller, TokenMasks
from engine.structured.matcher import SequenceMatcher

if TYPE_CHECKING:
    from engine.request import Sequence
    from engine.sampling import SamplingParams


class Guide:
    def __init__(self, grammars: GrammarCompiler, vocab_size: int) -> None:
        self.grammars = grammars
        self.vocab_size = vocab_size
        self._filler: MaskFiller | None = None

    def matcher_for(self, params: SamplingParams) -> SequenceMatcher | None:
        """A fresh matcher for a request's first sequence (compiles on a cache miss; raises
        ConstraintError); None when the request is free."""
        if params.constraint is None:
            return None
        return SequenceMatcher.start(self.grammars.compile(params.constraint))

    def select(
        self, rows: list[Sequence], logits: torch.Tensor
    ) -> tuple[list[Sequence], torch.Tensor, TokenMasks | None, list[Sequence]]:
        """(rows, logits, masks, dead): the rows that sample with their masks, and the dead-end
        rows taken out of the step (the caller ends them with their `error`)."""
        index = [i for i, seq in enumerate(rows) if seq.matcher is not None]
        if not index:
            return rows, logits, None, []
        if self._filler is None:
            self._filler = MaskFiller(self.vocab_size)
        masks = self._filler.fill(index, [rows[i].matcher for i in index])
        # an errored matcher's mask allows EOS alone: that would read as a clean stop
        dead_at = sorted(
            {*masks.dead_rows(), *(j for j, i in enumerate(index) if rows[i].matcher.error)}
        )
        if not dead_at:
            return rows, logits, masks, []
        dead = [rows[index[j]] for j in dead_at]
        for seq in dead:
            detail = seq.matcher.error or "no token can continue the output"
            seq.error = f"constrained decoding reached a dead end: {detail}"
        keep = [i for i, seq in enumerate(rows) if seq not in dead]
        live = [j for j in range(len(index)) if j not in dead_at]
        position = {old: new for new, old in enumerate(keep)}
        masks = TokenMasks([position[index[j]] for j in live], masks.bitmask[live])
        if not masks.rows:
            masks = None
        return [rows[i] for i in keep], logits[keep], masks, dead

    @staticmethod
    def advance(seq: Sequence, token: int) -> str | None:
        """Feeds a sampled token to seq's matcher: "stop" when the grammar is complete, "error"
        (with seq.error) when it rejects the token, None to go on."""
        if not seq.matcher.accept(token):
            seq.error = f"the grammar rejected token {token}: {seq.matcher.error}"
            return "error"
        return "stop" if seq.matcher.is_terminated else None
