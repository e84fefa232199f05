"""The engine core: typed prompts in, one scheduled step at a time, output deltas out.

Single-threaded: the offline LLM calls step() in a loop; the AsyncEngine calls it on its own thread."""

from __future__ import annotations

import logging
import time
from array import array
from typing import TypeVar

import torch

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.factory import build_parts
from engine.kv.admin import AdminOp
from engine.model_runner import ForwardResult
from engine.outputs import RequestOutput, request_output
from engine.request import PENDING_TOKEN, Prompt, Request, Sequence, token_array
from engine.sampler import SamplerOutput, SampleRow
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledBatch
from engine.speculative.speculator import Drafted
from engine.stats import EngineSnapshot, StepStats
from engine.step_pipeline import SPEC_PROBE_STEPS, InFlight, runs_ahead
from engine.structured.masks import TokenMasks
from engine.structured.matcher import SequenceMatcher

log = logging.getLogger(__name__)
T = TypeVar("T")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        parts = build_parts(config)
        self.config = config
        self.model = parts.model
        self.model_name = parts.model_path.name
        self.tokenizer = parts.tokenizer
        self.max_model_len = parts.max_model_len
        self.vocab_size = parts.vocab_size
        self.namespace = parts.namespace
        self.kv = parts.kv  # the one door to the KV subsystem
        self.scheduler = parts.scheduler
        self.runner = parts.runner
        self.sampler = parts.sampler
        self.stop = parts.stop
        self.grammars = parts.grammars
        self.guide = parts.guide
        self.stats = parts.stats
        self.analytics = parts.analytics
        self.cache_admin = parts.admin
        self.speculator = parts.speculator
        self.requests: dict[str, Request] = {}
        self.in_flight: InFlight | None = None  # a step whose tokens are still on the device
        self.run_ahead = config.pipelines_steps  # (benchmarks switch it per run)
        self._ahead_streak = 0  # steps run ahead in a row (with the speculator on)
        self.load_poll_s = 0.005  # an idle step waits this long for a spill-tier load at most

    def close(self) -> None:
        """Finishes queued tier writes, stops the tier threads and frees the KV pools (the
        engine cannot step after this)."""
        self.kv.close()
        self.guide.close()

    # --- requests ---
    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        cache_salt: str = "",
        *,
        retain_prefix: bool = False,
    ) -> Request:
        """`retain_prefix`: keep the prompt's blocks in the persistent tier (kv.can_retain)."""
        assert not retain_prefix or self.kv.can_retain, "no persistent tier to retain in"
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        try:
            self.check_request(prompt, params)
            matcher = self.guide.matcher_for(params)  # ConstraintError (a ValueError) if bad
        except ValueError:
            self.stats.requests_rejected += 1
            raise
        request = Request(
            request_id,
            prompt.text,
            prompt.token_ids,
            params,
            self.namespace.with_salt(cache_salt),
            retain_prefix=retain_prefix,
        )
        tokens = token_array(prompt.token_ids)
        # n samples are n sequences; the scheduler admits the siblings once the first one's
        # prompt is in the tree, as cache hits of it (each with its own grammar matcher)
        for index in range(params.n):
            own = matcher if index == 0 or matcher is None else matcher.copy()
            self.scheduler.add(self._new_sequence(request, index, tokens[:], own))
        self.requests[request_id] = request
        return request

    def check_request(self, prompt: Prompt, params: SamplingParams) -> None:
        """RequestTooLarge when the KV pool can never hold the request; reads constants only,
        so any thread may call it. The fronts (the API, the offline LLM) refuse bad input
        before it gets here: what they check is asserted."""
        num_tokens = len(prompt.token_ids)
        assert num_tokens > 0, "the prompt is empty"
        assert num_tokens < self.max_model_len, "the prompt fills the context window"
        assert all(t < self.vocab_size for t, _ in params.logit_bias), "logit_bias past the vocab"
        self.scheduler.check_fits(num_tokens, params.max_tokens)

    def abort(self, request_id: str) -> RequestOutput | None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        request.aborted = True
        for seq in request.seqs:
            if seq.token_ids[-1] == PENDING_TOKEN:  # its step in flight will pass it over
                seq.token_ids.pop()
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.remove(seq)
        self.stats.requests_aborted += 1
        return request_output(request, finished=True)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # --- one step: schedule -> run -> sample -> postprocess ---
    def step(self) -> list[RequestOutput]:
        """One step; with steps run ahead (engine/step_pipeline.py) the outputs are those of
        the tokens read this time: the previous step's, and this one's if it did not run ahead."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        ahead, self.in_flight = self.in_flight, None
        if not batch.seqs:
            if ahead is not None:
                return self._land(ahead)
            if self.scheduler.loading or self.scheduler.ready:  # a load is on its way: wait
                self.scheduler.wait_for_loads(self.load_poll_s)
                return []
            return self._unblock()
        if self.speculator is not None:
            self.speculator.draft(batch)
        stats = self._batch_stats(batch)
        self.guide.start(batch)  # constrained rows' masks fill while the forward runs
        try:
            result = self.runner.execute(batch, None if ahead is None else ahead.feed)
        finally:
            self.guide.join()  # before a sampled token advances a matcher
        outputs = [] if ahead is None else self._land(ahead)  # may end sequences of this batch
        self._computed(batch)
        rows, logits, drafted = self._sampling_rows(batch, result)
        t1 = time.perf_counter()
        if self._run_ahead(rows, drafted):
            sampled = self.sampler.sample_on_device(logits, [SampleRow.of(s) for s in rows])
            for seq in rows:
                seq.token_ids.append(PENDING_TOKEN)
            stats.sample_time = time.perf_counter() - t1
            self.in_flight = InFlight.launch(rows, sampled, result, stats, t0)
            self.stats.steps_run_ahead += 1
            return outputs
        rows, logits, masks, dead = self.guide.select(rows, logits)
        sampled = self._sample(rows, logits, masks)
        for seq in dead:
            self._finish(seq, "error")
        verified = self._verify(drafted)
        stats.sample_time = time.perf_counter() - t1
        outputs += self._postprocess(rows, sampled, dead + verified)
        stats.forward_time = result.elapsed()  # on a GPU: known once the tokens came back
        stats.step_time = time.perf_counter() - t0
        self.stats.record(stats)
        if self.speculator is not None and stats.decode_only:
            rows = stats.num_decode_tokens + stats.num_draft_tokens
            self.speculator.record_step(rows, stats.step_time)
        return outputs

    def _run_ahead(self, rows: list[Sequence], drafted: list[Drafted]) -> bool:
        """Whether this step's tokens may stay on the device (engine/step_pipeline.py)."""
        ahead = self.run_ahead and bool(rows) and not drafted
        ahead = ahead and all(runs_ahead(s, self.max_model_len) for s in rows)
        if self.speculator is not None:  # now and then a step the next one can draft after
            ahead = ahead and self._ahead_streak < SPEC_PROBE_STEPS
            self._ahead_streak = self._ahead_streak + 1 if ahead else 0
        return ahead

    def _land(self, ahead: InFlight) -> list[RequestOutput]:
        """Reads a step's tokens in place of its pending ones, with their stop checks; a
        sequence that ended meanwhile (aborted) is passed over."""
        sampled = ahead.read()
        keep = [i for i, seq in enumerate(ahead.rows) if not seq.is_finished]
        rows = [ahead.rows[i] for i in keep]
        for seq in rows:
            assert seq.token_ids[-1] == PENDING_TOKEN
            seq.token_ids.pop()
        outputs = self._postprocess(rows, sampled.select(keep), [])
        stats = ahead.stats
        stats.forward_time = ahead.result.elapsed()
        stats.step_time = time.perf_counter() - ahead.started
        self.stats.record(stats)
        return outputs

    def _computed(self, batch: ScheduledBatch) -> None:
        """The step computed these chunks' KV (a sequence that ran a draft is told after its
        verification, with the draft tokens it accepted; one that ended while the step ran,
        its blocks freed, is not told)."""
        for b, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            if b not in batch.drafts and not seq.is_finished:
                self.kv.computed(seq, n)

    def _sampling_rows(
        self, batch: ScheduledBatch, result: ForwardResult
    ) -> tuple[list[Sequence], torch.Tensor, list[Drafted]]:
        """The sequences that sample one token this step with their logits, and those that
        verify a draft with theirs (1 + k rows each)."""
        num_rows = result.num_rows or [1] * len(result.sample_index)
        if all(not batch.seqs[b].is_finished for b in result.sample_index) and not batch.drafts:
            return [batch.seqs[i] for i in result.sample_index], result.logits, []
        plain: list[Sequence] = []
        plain_rows: list[int] = []
        drafted: list[Drafted] = []
        row = 0
        for b, n in zip(result.sample_index, num_rows, strict=True):
            seq = batch.seqs[b]
            if seq.is_finished:  # ended while the step ran (engine/step_pipeline.py)
                pass
            elif b in batch.drafts:
                drafted.append(Drafted(seq, batch.drafts[b], result.logits[row : row + n]))
            else:
                plain.append(seq)
                plain_rows.append(row)
            row += n
        # slices, not an index list: a list would go to a GPU as a copy the host waits for
        logits = result.logits
        picked = torch.cat([logits[r : r + 1] for r in plain_rows]) if plain_rows else logits[:0]
        return plain, picked, drafted

    def _verify(self, drafted: list[Drafted]) -> list[Sequence]:
        """Accepts each draft's tokens one by one; the verified KV goes to the tree, the
        blocks past it are freed, and a sequence that stopped on the way is finished."""
        if not drafted:
            return []
        assert self.speculator is not None
        verified = self.speculator.verify(drafted, self.sampler, self._emit)
        for v in verified:
            # a draft follows a one-token decode chunk: that token and the accepted draft
            # tokens are computed; the rest of the draft is dropped
            self.kv.computed(v.seq, 1 + v.accepted)
            if v.reason is not None:
                self._finish(v.seq, v.reason)
        return [v.seq for v in verified]

    def _sample(
        self, rows: list[Sequence], logits: torch.Tensor, masks: TokenMasks | None
    ) -> SamplerOutput:
        if not rows:
            return SamplerOutput([], None, None)
        return self.sampler(logits, [SampleRow.of(s) for s in rows], masks)

    def _postprocess(
        self, rows: list[Sequence], sampled: SamplerOutput, others: list[Sequence]
    ) -> list[RequestOutput]:
        """`others`: sequences that changed outside `rows` (ended, or emitted verified drafts)."""
        touched: dict[str, Request] = {s.request.request_id: s.request for s in others}
        for i, seq in enumerate(rows):
            lp = None if sampled.logprobs is None else sampled.logprobs[i]
            top = None if sampled.top_logprobs is None else sampled.top_logprobs[i]
            self._append_token(seq, sampled.token_ids[i], lp, top)
            touched[seq.request.request_id] = seq.request
        outputs = [request_output(r, finished=r.is_finished) for r in touched.values()]
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]
                self.stats.requests_finished += 1
        return outputs

    def _append_token(
        self, seq: Sequence, token: int, logprob: float | None, top: dict | None
    ) -> None:
        reason = self._emit(seq, token, logprob, top)
        if reason is not None:
            self._finish(seq, reason)

    def _emit(
        self, seq: Sequence, token: int, logprob: float | None, top: dict | None
    ) -> str | None:
        """Appends a sampled token and its logprobs; why seq stops after it, or None."""
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
        if logprob is not None:
            seq.logprobs = seq.logprobs if seq.logprobs is not None else []
            seq.top_logprobs = seq.top_logprobs if seq.top_logprobs is not None else []
            seq.logprobs.append(logprob)
            seq.top_logprobs.append(top or {})
        reason = self.stop.check(seq, token)
        if reason is None and seq.matcher is not None:
            reason = self.guide.advance(seq, token)  # the grammar wins over ignore_eos at its end
        return reason

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.scheduler.remove(seq)
        if self.speculator is not None:
            self.speculator.finished(seq)

    def _unblock(self) -> list[RequestOutput]:
        """Nothing runs, yet the head of the queue cannot be admitted (pinned blocks hold the
        pool): abort it rather than spin forever."""
        if self.scheduler.running or not self.scheduler.waiting:
            return []
        request_id = self.scheduler.waiting[0].request.request_id
        log.warning(
            "request %s cannot get KV blocks (pinned prefixes hold them): aborted", request_id
        )
        out = self.abort(request_id)
        return [out] if out is not None else []

    def _batch_stats(self, batch: ScheduledBatch) -> StepStats:
        stats = StepStats(batch_size=len(batch.seqs), num_preempted=batch.num_preempted)
        stats.num_cached_tokens = batch.num_cached_tokens
        for seq in batch.admitted:
            if seq.num_preemptions == 0:
                self.stats.add_cached(seq.cached_by_tier)
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            decode = n == 1 and seq.num_output_tokens > 0
            if decode and seq.num_computed_tokens == seq.num_tokens - 1:
                stats.num_decode_tokens += 1
            else:
                stats.num_prefill_tokens += n
        stats.num_draft_tokens = sum(len(d) for d in batch.drafts.values())
        return stats

    # --- sequences ---
    def _new_sequence(
        self,
        request: Request,
        index: int,
        token_ids: array,
        matcher: SequenceMatcher | None = None,
    ) -> Sequence:
        params = request.params
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed * 1_000_003 + index)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop, params.skip_special_tokens)
        seq = Sequence(request, index, token_ids, len(request.prompt_token_ids), generator, detok)
        seq.matcher = matcher
        request.seqs.append(seq)
        return seq

    # --- cache analytics and administration ---
    def snapshot(self) -> EngineSnapshot:
        return self.analytics.snapshot()

    def admin(self, op: AdminOp[T]) -> T:
        """A cache administration operation (engine.kv.admin), on this thread."""
        return self.cache_admin.run(op)
