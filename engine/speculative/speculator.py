"""Drafting before the forward and verification after it.

draft(batch): each decoding sequence (not constrained: a grammar matcher advances only on
sampled tokens) may get draft tokens, as many as are expected to pay for their rows
(engine/speculative/draft_length.py, with the step cost fitted in engine/speculative/step_cost.py), within the
token budget the scheduled chunks left and the free KV blocks (never evicting). The runner then
computes 1 + k rows for it.

verify(...): position j of every live draft is sampled exactly as a plain decode step would
sample it: the same logits processing (penalties see the tokens accepted before j), the same
one uniform draw from the sequence's generator per emitted token. The draft token is accepted
when the sample equals it. For a one-hot draft this is the exact rejection rule: the draft x
is accepted with probability p(x), and a rejection's sample is distributed as p without x,
renormalised; a seeded request consumes its generator as it would without speculation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.request import PENDING_TOKEN
from engine.sampler import Sampler, SamplerOutput, SampleRow, plain_greedy
from engine.speculative.config import SpecConfig
from engine.speculative.draft_length import SourceRates, draft_plan
from engine.speculative.proposer import DraftProposer, SeqDrafts
from engine.speculative.stats import SpecStats
from engine.speculative.step_cost import StepCost
from radixcache.suffix_index import SuffixIndex

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.kv import KVCacheManager
    from engine.request import Sequence
    from engine.scheduler import ScheduledBatch

# emit(seq, token, logprob, top logprobs) -> why seq stops after the token, or None
Emit = Callable[["Sequence", int, "float | None", "dict | None"], "str | None"]


@dataclass
class Drafted:
    """A sequence that ran a draft, with its logits: row j predicts the token after draft[:j]."""

    seq: Sequence
    draft: list[int]
    logits: torch.Tensor  # [len(draft) + 1, vocab]


@dataclass
class Verified:
    seq: Sequence
    drafted: int
    accepted: int  # draft tokens the model agreed with (their KV is valid)
    reason: str | None  # why the sequence stops, or None


class Speculator:
    def __init__(
        self,
        config: SpecConfig,
        proposer: DraftProposer,
        kv: KVCacheManager,
        max_num_batched_tokens: int,
        max_model_len: int,
        stats: SpecStats,
    ) -> None:
        self.config = config
        self.proposer = proposer
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.stats = stats
        self.cost = StepCost.prior() if config.step_cost == "prior" else StepCost()
        self.rates: dict[str, SourceRates] = {}  # source -> its engine-wide acceptance

    def draft(self, batch: ScheduledBatch) -> None:
        """Fills batch.drafts (batch index -> draft tokens) and reserves their blocks."""
        decoding = [
            b
            for b, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))
            if self._decoding(seq, n)
        ]
        if not decoding:
            return
        # a row's cost over a token's worth (what plain decoding pays for one token now)
        fixed, per_row = self.cost.line()
        worth = (fixed + per_row * batch.num_tokens) / len(decoding)
        threshold = per_row / worth if worth > 0 else 0.0
        budget = self.max_num_batched_tokens - batch.num_tokens
        for b in decoding:
            seq = batch.seqs[b]
            state = self.proposer.state(seq)
            self._score_shadows(seq, state)
            room = min(budget, self._room(seq), self.config.num_tokens)
            if room <= 0:
                continue
            best, best_k, best_gain, best_draft = "", 0, 0.0, []
            for source, draft in self.proposer.proposals(seq, room):
                rates = self._rates(source)
                k, gain = draft_plan(state.first.get(source, rates), rates, threshold, len(draft))
                state.shadows[source] = (seq.num_tokens, draft[0])
                if gain > best_gain:
                    best, best_k, best_gain, best_draft = source, k, gain, draft
            if best_k > 0:
                best_k = self.kv.draft_within_own_block(seq, best_draft[:best_k])
            if best_k == 0:
                continue
            del state.shadows[best]  # scored by verify instead
            k = self.kv.reserve_draft(seq, batch.num_new_tokens[b], best_k)
            if k > 0:
                batch.drafts[b] = best_draft[:k]
                state.last_source = best
                budget -= k

    def record_step(self, rows: int, seconds: float) -> None:
        """A decode-only step's rows (decode tokens and drafts) and time, for the cost line."""
        self.cost.record(rows, seconds)

    def _rates(self, source: str) -> SourceRates:
        return self.rates.setdefault(source, SourceRates())

    def _score_shadows(self, seq: Sequence, state: SeqDrafts) -> None:
        """Scores the first tokens the sources would have drafted last step against the one
        sampled."""
        for source, (pos, token) in state.shadows.items():
            if pos < seq.num_tokens:
                self._observe(state, source, 1, int(seq.token_ids[pos] == token))
        state.shadows.clear()

    def _observe(self, state: SeqDrafts, source: str, drafted: int, accepted: int) -> None:
        """A draft's (or a shadow's) outcome, into the source's rates and the sequence's."""
        rates = self._rates(source)
        rates.record(drafted, accepted)
        state.first.observe(source, rates, accepted > 0)

    @staticmethod
    def _decoding(seq: Sequence, n: int) -> bool:
        return (
            n == 1
            and seq.matcher is None
            and seq.num_output_tokens > 0
            and seq.num_computed_tokens + 1 == seq.num_tokens
            and seq.token_ids[-1] != PENDING_TOKEN  # a draft follows a token not read yet
        )

    def _room(self, seq: Sequence) -> int:
        """Draft tokens that could all be emitted: one token always follows the accepted ones."""
        left = min(
            seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens
        )
        return left - 1

    def verify(self, drafted: list[Drafted], sampler: Sampler, emit: Emit) -> list[Verified]:
        """Samples position j of every draft still held, then j + 1, ...; emits each token."""
        seqs = [d.seq for d in drafted]
        drafts = [d.draft for d in drafted]
        out = [Verified(d.seq, len(d.draft), 0, None) for d in drafted]
        argmax = _plain_argmax(drafted)
        live = list(range(len(drafted)))
        j = 0
        while live:
            if argmax is not None:
                sampled = SamplerOutput([argmax[i][j] for i in live], None, None)
            else:
                rows = [SampleRow.of(seqs[i]) for i in live]
                sampled = sampler(torch.stack([drafted[i].logits[j] for i in live]), rows)
            still = []
            for r, i in enumerate(live):
                token = sampled.token_ids[r]
                lp = None if sampled.logprobs is None else sampled.logprobs[r]
                top = None if sampled.top_logprobs is None else sampled.top_logprobs[r]
                out[i].reason = emit(seqs[i], token, lp, top)
                held = j < len(drafts[i]) and token == drafts[i][j]
                out[i].accepted += held
                if held and out[i].reason is None:
                    still.append(i)
            live, j = still, j + 1
        for v in out:
            self.stats.record_draft(v.drafted, v.accepted)
            state = self.proposer.state(v.seq)
            self._observe(state, state.last_source, v.drafted, v.accepted)
        return out

    def finished(self, seq: Sequence) -> None:
        """A finished sequence's tokens (prompt and output) join its namespace's suffix index."""
        if self.proposer.suffix_index is not None:
            self.proposer.suffix_index.add(seq.request.namespace, seq.token_ids)


def _plain_argmax(drafted: list[Drafted]) -> list[list[int]] | None:
    """Every position's token at once when every row is greedy on the raw logits (no penalty,
    bias or logprobs: nothing depends on the tokens accepted before), else None."""
    if not all(plain_greedy(d.seq.params) for d in drafted):
        return None
    tokens = torch.cat([d.logits for d in drafted]).argmax(dim=-1).tolist()
    out, start = [], 0
    for d in drafted:
        out.append(tokens[start : start + len(d.draft) + 1])
        start += len(d.draft) + 1
    return out


def build_speculator(
    config: EngineConfig, kv: KVCacheManager, max_model_len: int, stats: SpecStats
) -> Speculator | None:
    """The engine's speculator per its config; None with speculation off."""
    spec = config.spec
    if not spec.enabled:
        return None
    cache = spec.mode == "cache"
    suffix = SuffixIndex(spec.suffix_index_tokens, spec.ngram_sizes) if cache else None
    proposer = DraftProposer(spec, kv if cache else None, suffix)
    return Speculator(spec, proposer, kv, config.max_num_batched_tokens, max_model_len, stats)
