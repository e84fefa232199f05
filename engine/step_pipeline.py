"""Steps one ahead of their tokens: the host schedules and launches step N+1 while the GPU still
runs step N, instead of waiting for N's tokens first.

A step whose sampling rows allow it leaves its tokens on the device (InFlight): each row's
sequence gets PENDING_TOKEN for now, so the scheduler counts the token and gives the sequence its
next decode row; that row's input is read on the device from N's tokens (model_runner.TokenFeed).
Once N+1 is launched the engine reads N's tokens (their copy was queued before N+1, so this waits
for N only), puts them in place of the pending ones and runs N's stop checks; a sequence that
stopped there had a wasted row in N+1, whose results are dropped.

Rows that need N's token before N+1's sampling can start are not run ahead: grammars (the
matcher advances on each token), and a row whose token is its last (max_tokens, the context
window): its sequence ends either way, so it gets no wasted row. Logprobs come back with the
tokens (the sampled one's and the top k, not the distribution).

Speculation drafts from the tokens: a step that verifies drafts reads its tokens at once, and a
sequence whose last token is pending gets no draft. So that drafting is not starved, with the
speculator on every SPEC_PROBE_STEPS + 1-th step reads its tokens at once: the next step drafts
from them, and keeps reading at once while drafts come.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model_runner import ForwardResult, TokenFeed
from engine.request import Sequence
from engine.sampler import LogprobTensors, SamplerOutput
from engine.stats import StepStats
from engine.step_upload import wait_for

SPEC_PROBE_STEPS = 4  # steps run ahead in a row before one lets the speculator draft again


@dataclass
class InFlight:
    """A step whose sampled tokens are on the device, their copy to the host under way."""

    rows: list[Sequence]  # the sampling rows, in the order of `tokens`
    tokens: torch.Tensor  # int64 [S] where the logits were
    host: torch.Tensor  # their copy (pinned on a GPU), complete once `copied` has happened
    host_logprobs: LogprobTensors | None  # the same for rows that asked for logprobs
    copied: torch.cuda.Event | None
    result: ForwardResult
    stats: StepStats
    started: float  # perf_counter() at the step's start

    @classmethod
    def launch(
        cls,
        rows: list[Sequence],
        sampled: tuple[torch.Tensor, LogprobTensors | None],
        result: ForwardResult,
        stats: StepStats,
        started: float,
    ) -> InFlight:
        """Queues the copies to the host of what was sampled (not waited for)."""
        tokens, logprobs = sampled
        if tokens.device.type == "cpu":
            return cls(rows, tokens, tokens, logprobs, None, result, stats, started)
        host = _to_host(tokens)
        host_logprobs = None if logprobs is None else logprobs.apply(_to_host)
        copied = torch.cuda.Event()
        copied.record()
        return cls(rows, tokens, host, host_logprobs, copied, result, stats, started)

    @property
    def feed(self) -> TokenFeed:
        return TokenFeed(self.tokens, {seq.seq_id: i for i, seq in enumerate(self.rows)})

    def read(self) -> SamplerOutput:
        """What was sampled, once its copy is done (the step's one wait for the device)."""
        wait_for(self.copied)
        return SamplerOutput.read(self.host, self.host_logprobs, [s.params for s in self.rows])


def _to_host(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def runs_ahead(seq: Sequence, max_model_len: int) -> bool:
    """Whether seq's next token may stay on the device while the next step is launched."""
    p = seq.params
    if seq.matcher is not None:
        return False
    # the token to sample now is the last one: the sequence ends after it whatever it is
    return seq.num_output_tokens + 1 < p.max_tokens and seq.num_tokens + 1 < max_model_len
