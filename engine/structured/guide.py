"""The engine's side of constrained decoding: a matcher for each constrained sequence, the step's
masks for the rows that sample, and what a sampled token does to the grammar.

The masks of a step depend only on the matchers, which change only when a sampled token is fed,
so they are filled on a worker thread while the forward runs (`start`, before the forward;
`join`, after it and before anything touches a matcher again): llguidance drops the GIL, so a
step's fill costs the step nothing where cores are free. A sampling row without an early mask (none in the engine's flow: n>1 samples are sibling
sequences of the batch) would be filled on the spot.

A row whose mask allows nothing, or whose matcher is in its error state (its mask would allow
EOS alone, which would read as a clean stop), leaves the step before sampling and ends with
finish_reason "error"; so does a token the grammar rejects."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from engine.structured.compiler import GrammarCompiler
from engine.structured.masks import MaskFiller, TokenMasks
from engine.structured.matcher import SequenceMatcher

if TYPE_CHECKING:
    from engine.request import Sequence
    from engine.sampling_params import SamplingParams
    from engine.scheduler import ScheduledBatch


class Guide:
    def __init__(self, grammars: GrammarCompiler, vocab_size: int) -> None:
        self.grammars = grammars
        self.vocab_size = vocab_size
        self._filler: MaskFiller | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[list[int], Future[TokenMasks]] | None = None  # (seq ids, masks)
        self._early: dict[int, int] = {}  # seq id -> row of self._early_masks
        self._early_masks: TokenMasks | None = None

    def matcher_for(self, params: SamplingParams) -> SequenceMatcher | None:
        """A fresh matcher for a request's first sequence (compiles on a cache miss; raises
        ConstraintError); None when the request is free."""
        if params.constraint is None:
            return None
        return SequenceMatcher.start(self.grammars.compile(params.constraint))

    @property
    def filler(self) -> MaskFiller:
        if self._filler is None:
            self._filler = MaskFiller(self.vocab_size)
        return self._filler

    def start(self, batch: ScheduledBatch) -> None:
        """Starts filling the masks of the batch's constrained sequences that sample this step
        (their chunk reaches their last token)."""
        seqs = [
            seq
            for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            if seq.matcher is not None and seq.num_computed_tokens + n == seq.num_tokens
        ]
        if not seqs:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mask-fill")
        matchers = [s.matcher for s in seqs]
        future = self._pool.submit(self.filler.fill, list(range(len(seqs))), matchers)
        self._pending = ([s.seq_id for s in seqs], future)

    def join(self) -> None:
        """Waits for the early fill: call before any matcher is read or copied again."""
        if self._pending is not None:
            ids, future = self._pending
            self._pending = None
            self._early_masks = future.result()
            self._early = {seq_id: j for j, seq_id in enumerate(ids)}

    def select(
        self, rows: list[Sequence], logits: torch.Tensor
    ) -> tuple[list[Sequence], torch.Tensor, TokenMasks | None, list[Sequence]]:
        """(rows, logits, masks, dead): the rows that sample with their masks, and the dead-end
        rows taken out of the step (the caller ends them with their `error`)."""
        self.join()
        index = [i for i, seq in enumerate(rows) if seq.matcher is not None]
        masks = self._masks(rows, index) if index else None
        self._early, self._early_masks = {}, None
        if masks is None:
            return rows, logits, None, []
        dead_at = set(masks.dead_rows())
        dead_at.update(j for j, i in enumerate(index) if rows[i].matcher.error)
        if not dead_at:
            return rows, logits, masks, []
        dead = [rows[index[j]] for j in sorted(dead_at)]
        for seq in dead:
            detail = seq.matcher.error or "no token can continue the output"
            seq.error = f"constrained decoding reached a dead end: {detail}"
        dead_rows = {index[j] for j in dead_at}
        keep = [i for i in range(len(rows)) if i not in dead_rows]
        live = [j for j in range(len(index)) if j not in dead_at]
        position = {old: new for new, old in enumerate(keep)}
        live_masks = TokenMasks([position[index[j]] for j in live], masks.bitmask[live])
        return [rows[i] for i in keep], logits[keep], live_masks if live else None, dead

    def _masks(self, rows: list[Sequence], index: list[int]) -> TokenMasks:
        early = self._early_masks
        have = [j for j, i in enumerate(index) if rows[i].seq_id in self._early]
        if early is not None and len(have) == len(index):
            order = [self._early[rows[i].seq_id] for i in index]
            if order == list(range(len(early.rows))):
                return TokenMasks(index, early.bitmask)
            return TokenMasks(index, early.bitmask[order])
        bitmask = torch.empty((len(index), self.filler.words), dtype=torch.int32)
        if have:
            assert early is not None
            bitmask[have] = early.bitmask[[self._early[rows[index[j]].seq_id] for j in have]]
        early_rows = set(have)
        missing = [j for j in range(len(index)) if j not in early_rows]
        late = self.filler.fill(missing, [rows[index[j]].matcher for j in missing])
        bitmask[missing] = late.bitmask
        return TokenMasks(index, bitmask)

    @staticmethod
    def advance(seq: Sequence, token: int) -> str | None:
        """Feeds a sampled token to seq's matcher: "stop" when the grammar is complete, "error"
        (with seq.error) when it rejects the token, None to go on."""
        if not seq.matcher.accept(token):
            seq.error = f"the grammar rejected token {token}: {seq.matcher.error}"
            return "error"
        return "stop" if seq.matcher.is_terminated else None

    def close(self) -> None:
        self.join()
        if self._pool is not None:
            self._pool.shutdown()
