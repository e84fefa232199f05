"""Batched sampling: logit_bias and grammar masks, penalties, temperature, top-k/top-p/min-p,
per-row seeds, logprobs.

Every transform runs on the whole [S, vocab] batch; the only per-row Python is drawing the uniform
of rows that carry their own torch.Generator (a generator cannot be shared across rows).

It runs where the logits are. On a GPU the per-row values (temperatures, top-k, the uniforms
drawn from the CPU generators, grammar masks...) go up from pinned memory without a wait, and the
step waits once, for the sampled tokens (and for the logprobs of rows that asked for them). The
uniforms come from the same CPU generators on every device, so a seed means the same draw.

Order: logit_bias, then the grammar masks (one torch.where over the batch), then the
logprobs are taken, then penalties, temperature, top-k/top-p/min-p and the draw (or argmax). So a
constrained row's logprobs are those of the constrained distribution: the model's, biased, with
every disallowed token at -inf, renormalised over the allowed ones (before penalties and
temperature, as the unconstrained rows' are of the raw model distribution)."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.profiler import record_function

from engine.sampling_params import SamplingParams
from engine.structured.masks import TokenMasks

if TYPE_CHECKING:
    from engine.request import Sequence


@dataclass
class SampleRow:
    params: SamplingParams
    token_ids: array | list[int]  # prompt + output so far
    num_prompt_tokens: int
    generator: torch.Generator | None  # per-request seed; None = the engine's generator

    @classmethod
    def of(cls, seq: Sequence) -> SampleRow:
        return cls(seq.params, seq.token_ids, seq.num_prompt_tokens, seq.generator)


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[float] | None  # logprob of each sampled token (biased, masked distribution)
    top_logprobs: list[dict[int, float]] | None  # per row: top-k token -> logprob (k from params)

    @classmethod
    def read(
        cls, tokens: torch.Tensor, logprobs: LogprobTensors | None, params: list[SamplingParams]
    ) -> SamplerOutput:
        """What was sampled, as lists (reading a GPU's tensors waits for them)."""
        if logprobs is None:
            return cls(tokens.tolist(), None, None)
        return cls(tokens.tolist(), *logprobs.lists(params))

    def select(self, index: list[int]) -> SamplerOutput:
        """The rows at `index`, in that order."""
        lp, top = self.logprobs, self.top_logprobs
        return SamplerOutput(
            [self.token_ids[i] for i in index],
            None if lp is None else [lp[i] for i in index],
            None if top is None else [top[i] for i in index],
        )


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(
        self, logits: torch.Tensor, rows: list[SampleRow], masks: TokenMasks | None = None
    ) -> SamplerOutput:
        """Samples one token per row; `masks` hold the grammar masks of the constrained rows."""
        with record_function("sample"):
            tokens, logprobs = self._sample(logits, rows, masks)
            return SamplerOutput.read(tokens, logprobs, [r.params for r in rows])

    def sample_on_device(
        self, logits: torch.Tensor, rows: list[SampleRow]
    ) -> tuple[torch.Tensor, LogprobTensors | None]:
        """The tokens [S] (and what rows asking for logprobs need) as tensors where the logits
        are, not waited for: rows without masks (engine/step_pipeline.py)."""
        with record_function("sample"):
            return self._sample(logits, rows, None)

    def _sample(
        self, logits: torch.Tensor, rows: list[SampleRow], masks: TokenMasks | None
    ) -> tuple[torch.Tensor, LogprobTensors | None]:
        """(tokens [S], what the rows asking for logprobs need)."""
        # logits: [S, vocab] float32, one row per entry of `rows`
        params = [r.params for r in rows]
        if any(p.logit_bias for p in params):
            logits = apply_logit_bias(logits, params)
        if masks is not None:
            logits = apply_token_masks(logits, masks)
        want_logprobs = any(p.logprobs is not None for p in params)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        if any(p.has_penalties for p in params):
            logits = apply_penalties(logits, rows)
        greedy = [p.greedy for p in params]
        random = not all(greedy)
        tokens = self._sample_random(logits, rows, greedy) if random else logits.argmax(dim=-1)
        if raw_logprobs is None:
            return tokens, None
        return tokens, LogprobTensors.of(raw_logprobs, tokens, params)

    def _sample_random(
        self, logits: torch.Tensor, rows: list[SampleRow], greedy: list[bool]
    ) -> torch.Tensor:
        params = [r.params for r in rows]
        temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
        scaled = logits / on_device(temps, torch.float32, logits.device).unsqueeze(1)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            scaled = apply_top_k_top_p(scaled, params)
        probs = torch.softmax(scaled, dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = on_device([p.min_p for p in params], torch.float32, logits.device)
            probs = probs.masked_fill(probs < min_p.unsqueeze(1) * probs.amax(-1, True), 0.0)
        sampled = self._inverse_cdf(probs, rows)
        if any(greedy):
            greedy_t = on_device(greedy, torch.bool, logits.device)
            sampled = torch.where(greedy_t, logits.argmax(dim=-1), sampled)
        return sampled

    def _inverse_cdf(self, probs: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """One uniform u per row; the token is the first whose cumulative probability exceeds
        u x the row's total (float64 sums: a token's share is kept to ~1e-16). A row's draw
        depends only on its own generator; one uniform per row is much cheaper than a noise
        draw per vocabulary entry (the exponential race)."""
        cdf = probs.double().cumsum_(dim=-1)
        u = torch.empty(len(rows), 1, dtype=torch.float64)
        shared = [i for i, r in enumerate(rows) if r.generator is None]
        if shared:
            u[shared] = torch.rand(len(shared), 1, dtype=torch.float64, generator=self.generator)
        for i, r in enumerate(rows):
            if r.generator is not None:
                u[i] = torch.rand(1, dtype=torch.float64, generator=r.generator)
        u = on_device(u, torch.float64, probs.device).mul_(cdf[:, -1:])
        # right=True: the first index whose sum exceeds u, so a zero-probability token (its sum
        # equal to its predecessor's) is never chosen; u < total keeps it inside the vocabulary
        return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def on_device(values: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` (a list, or a CPU tensor) as a tensor on `device`: on a GPU copied from pinned
    memory without a wait (torch keeps the pinned block until the copy is done)."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    host = host.to(dtype)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def plain_greedy(p: SamplingParams) -> bool:
    """The token is the argmax of the raw logits: nothing else of the row is needed."""
    return p.greedy and not p.has_penalties and not p.logit_bias and p.logprobs is None


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's (token, bias) pairs added; ids past the vocabulary are ignored."""
    vocab = logits.shape[1]
    at = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias if t < vocab]
    if not at:
        return logits
    row, token, bias = zip(*at, strict=True)
    device = logits.device
    index = (on_device(row, torch.int64, device), on_device(token, torch.int64, device))
    return logits.index_put(index, on_device(bias, logits.dtype, device), accumulate=True)


def apply_token_masks(logits: torch.Tensor, masks: TokenMasks) -> torch.Tensor:
    """Disallowed tokens of the masked rows at -inf: one pass over the batch (torch.where, not
    masked_fill, which branches per element)."""
    banned = on_device(masks.banned(*logits.shape), torch.bool, logits.device)
    return torch.where(banned, logits.new_full((), float("-inf")), logits)


def apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    num_rows, vocab = logits.shape
    logits, device, params = logits.clone(), logits.device, [r.params for r in rows]
    if any(p.repetition_penalty != 1.0 for p in params):
        rep = on_device([p.repetition_penalty for p in params], torch.float32, device)
        rep = rep.unsqueeze(1)
        seen = _token_counts(vocab, [r.token_ids for r in rows], device) > 0
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
    if any(p.frequency_penalty != 0 or p.presence_penalty != 0 for p in params):
        freq = on_device([p.frequency_penalty for p in params], torch.float32, device)
        pres = on_device([p.presence_penalty for p in params], torch.float32, device)
        outputs = [r.token_ids[r.num_prompt_tokens :] for r in rows]
        counts = _token_counts(vocab, outputs, device)
        logits = logits - freq.unsqueeze(1) * counts - pres.unsqueeze(1) * (counts > 0).float()
    return logits


def _token_counts(vocab: int, seqs: list[array | list[int]], device: torch.device) -> torch.Tensor:
    # counts[r, t] = occurrences of token t in seqs[r]; padded with an extra sink column
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), max(width, 1)), vocab, dtype=torch.int64)
    for i, s in enumerate(seqs):
        if s:
            ids[i, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.int64))
    ids = on_device(ids, torch.int64, device)
    counts = torch.zeros(len(seqs), vocab + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab]


def apply_top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    vocab, device = logits.shape[1], logits.device
    top_k = on_device([p.top_k if p.top_k > 0 else vocab for p in params], torch.int64, device)
    top_k = top_k.unsqueeze(1)
    top_p = on_device([p.top_p for p in params], torch.float32, device).unsqueeze(1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    drop = ranks >= top_k
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p  # the first token is always kept (mass_before = 0)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


@dataclass
class LogprobTensors:
    """What the rows' logprobs need of the whole distribution, where it was computed."""

    chosen: torch.Tensor  # [S]: each sampled token's logprob
    top_values: torch.Tensor | None  # [S, k]: the k most likely (k the rows' largest ask)
    top_ids: torch.Tensor | None

    @classmethod
    def of(
        cls, logprobs: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]
    ) -> LogprobTensors:
        chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        k_max = max((p.logprobs or 0) for p in params)
        if k_max == 0:
            return cls(chosen, None, None)
        values, ids = logprobs.topk(k_max, dim=-1)
        return cls(chosen, values, ids)

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LogprobTensors:
        values, ids = self.top_values, self.top_ids
        return LogprobTensors(
            fn(self.chosen),
            None if values is None else fn(values),
            None if ids is None else fn(ids),
        )

    def lists(self, params: list[SamplingParams]) -> tuple[list[float], list[dict[int, float]]]:
        """Each row's sampled-token logprob and its top-k dict (k from its params)."""
        tops: list[dict[int, float]] = [{} for _ in params]
        if self.top_values is not None and self.top_ids is not None:
            values, ids = self.top_values.tolist(), self.top_ids.tolist()
            for i, p in enumerate(params):
                k = p.logprobs or 0
                pairs = zip(ids[i][:k], values[i][:k], strict=True)
                tops[i] = {t: v for t, v in pairs if v != float("-inf")}  # masked tokens left out
        return self.chosen.tolist(), tops
