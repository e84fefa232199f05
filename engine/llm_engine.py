"""The engine core: requests in, one scheduled step at a time, cumulative outputs out.

Single-threaded: the offline LLM calls step() in a loop; the AsyncEngine calls it on its own thread."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from engine.analytics import CacheAnalytics
from engine.block_manager import BlockManager, NoCacheBlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.kv_cache import DTYPES, KVCache
from engine.kv_tiers import KVTiers
from engine.model_runner import ModelRunner
from engine.outputs import RequestOutput, request_output
from engine.request import Request, Sequence
from engine.sampler import Sampler, SampleRow
from engine.sampling import SamplingParams
from engine.scheduler import ScheduledBatch, Scheduler
from engine.stats import EngineStats, StepStats
from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache

DEFAULT_KV_CACHE_MEMORY = 1 << 30
log = logging.getLogger(__name__)


class LLMEngine(CacheAnalytics):
    def __init__(self, config: EngineConfig) -> None:
        from engine.loader import ensure_default_model, load_model, load_tokenizer

        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        path = Path(config.model) if config.model else ensure_default_model()
        self.model_path = path
        self.model_name = path.name
        self.device = torch.device(config.device)
        dtype = DTYPES[config.dtype]
        self.model = load_model(path, dtype, self.device)
        self.tokenizer = load_tokenizer(path)
        mc = self.model.config
        self.max_model_len = min(
            config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings
        )
        self.kv_cache = KVCache.from_budget(
            mc.num_hidden_layers,
            config.block_size,
            mc.num_key_value_heads,
            mc.head_dim,
            dtype,
            self.device,
            memory_bytes=config.kv_cache_memory or DEFAULT_KV_CACHE_MEMORY,
            num_blocks=config.num_blocks,
        )
        self.namespace = Namespace(
            model_id=self.model.model_id, kv_dtype=config.dtype, block_size=config.block_size
        )
        self.tiers = self._make_tiers(config)
        self.prefix_cache = PrefixCache(
            self.kv_cache.num_blocks, config.block_size, policy=config.eviction_policy
        )
        if config.enable_prefix_caching:
            self.blocks = BlockManager(self.prefix_cache, self.kv_cache, self.tiers)
        else:
            self.blocks = NoCacheBlockManager(self.prefix_cache, self.kv_cache)
        self.scheduler = Scheduler(
            self.blocks,
            self.kv_cache.num_blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.max_model_len,
        )
        self.runner = ModelRunner(self.model, self.kv_cache, self.device)
        self.sampler = Sampler(config.seed)
        self.eos_token_ids = set(self.tokenizer.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.stats = EngineStats()

    def _make_tiers(self, config: EngineConfig) -> KVTiers | None:
        if config.tiers is None:
            return None
        from storage.tiered import TieredStore

        return KVTiers(TieredStore(config.tiers), self.kv_cache)

    def close(self) -> None:
        """Finishes queued tier writes and stops the tier threads."""
        if self.tiers is not None:
            self.tiers.close()

    # --- requests ---
    def namespace_for(self, cache_salt: str = "") -> Namespace:
        return self.namespace.with_salt(cache_salt) if cache_salt else self.namespace

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        cache_salt: str = "",
        *,
        prompt_text: str | None = None,
    ) -> Request:
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        text = prompt if isinstance(prompt, str) else prompt_text
        tokens = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise ValueError("the prompt is empty")
        try:
            self.scheduler.check_fits(len(tokens), params.max_tokens)
        except ValueError:
            self.stats.requests_rejected += 1
            raise
        request = Request(request_id, text, tokens, params, self.namespace_for(cache_salt))
        seq = self._new_sequence(request, 0, list(tokens))
        seq.pending_forks = params.n - 1
        self.requests[request_id] = request
        self.scheduler.add(seq)
        return request

    def _new_sequence(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        params = request.params
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed * 1_000_003 + index)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop, params.skip_special_tokens)
        seq = Sequence(request, index, token_ids, len(request.prompt_token_ids), generator, detok)
        request.seqs.append(seq)
        return seq

    def abort(self, request_id: str) -> RequestOutput | None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        request.aborted = True
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.remove(seq)
        self.stats.requests_aborted += 1
        return request_output(request, finished=True)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # --- one step ---
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return self._unblock()
        stats = self._batch_stats(batch)
        result = self.runner.execute(batch)
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.blocks.commit(seq)
        rows = [batch.seqs[i] for i in result.sample_index]
        logit_rows = list(range(len(rows)))
        for j, parent in enumerate(list(rows)):
            for child in self._fork(parent):
                rows.append(child)
                logit_rows.append(j)
        logits = (
            result.logits
            if len(logit_rows) == len(result.sample_index)
            else result.logits[logit_rows]
        )
        t1 = time.perf_counter()
        sampled = self.sampler(logits, [self._sample_row(s) for s in rows])
        stats.sample_time = time.perf_counter() - t1
        touched: dict[str, Request] = {}
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
        stats.forward_time = result.forward_time
        stats.step_time = time.perf_counter() - t0
        self.stats.record(stats)
        return outputs

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
        return stats

    def _fork(self, parent: Sequence) -> list[Sequence]:
        children = []
        while parent.pending_forks > 0:
            parent.pending_forks -= 1
            index = parent.request.params.n - 1 - parent.pending_forks
            child = self._new_sequence(parent.request, index, list(parent.token_ids))
            if self.blocks.fork(parent, child):
                self.scheduler.add_running(child)
                children.append(child)
            else:
                self.scheduler.add(child)  # no block for the copy: recompute (mostly cache hits)
        return children

    @staticmethod
    def _sample_row(seq: Sequence) -> SampleRow:
        return SampleRow(seq.params, seq.token_ids, seq.num_prompt_tokens, seq.generator)

    def _append_token(
        self, seq: Sequence, token: int, logprob: float | None, top: dict | None
    ) -> None:
        params = seq.params
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
        if logprob is not None:
            seq.logprobs = seq.logprobs if seq.logprobs is not None else []
            seq.top_logprobs = seq.top_logprobs if seq.top_logprobs is not None else []
            seq.logprobs.append(logprob)
            seq.top_logprobs.append(top or {})
        reason = None
        if (
            (not params.ignore_eos and token in self.eos_token_ids)
            or token in params.stop_token_ids
            or seq.detok.append(token)
        ):
            reason = "stop"
        elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.remove(seq)
