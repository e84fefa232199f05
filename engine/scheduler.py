"""Continuous batching: waiting/loading/running queues, a token budget per step, chunked prefill,
priority-then-FCFS order, and preemption by recompute when blocks run out.

A sequence whose prefix is in a spill tier waits in `loading` while the loader thread brings it
back; the steps meanwhile run the others, and it is admitted once its blocks arrived (or its
deadline passed: the rest is recomputed). Blocks are only reached through the KVCacheManager."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from engine.kv import KVCacheManager, MatchState, blocks_for
from engine.request import RequestTooLarge, Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # chunk per sequence
    num_preempted: int = 0
    admitted: list[Sequence] = field(default_factory=list)  # newly admitted (or re-admitted)
    num_cached_tokens: int = 0  # prefix tokens the admitted sequences did not have to compute
    # batch index -> draft tokens run after that sequence's chunk (engine.speculative); its KV blocks
    # are reserved, its tokens are not in seq.token_ids until verified
    drafts: dict[int, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: list[Sequence] = []  # sorted by sort_key (priority, arrival, id)
        self.running: list[Sequence] = []  # sorted by sort_key; preemption takes from the end
        self.loading: list[Sequence] = []  # waiting for their prefix from a spill tier
        self.ready: list[Sequence] = []  # loads arrived: they hold their prefix, admitted first
        self.num_preemptions = 0

    # --- queues ---
    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """RequestTooLarge when the KV pool cannot hold the request even alone (the prompt is
        within the context window: the fronts check that)."""
        total = min(num_prompt_tokens + max_tokens, self.max_model_len)
        bs = self.kv.block_size
        needed = blocks_for(total, bs)
        if needed > self.kv.num_blocks:
            raise RequestTooLarge(
                f"request needs {needed} KV blocks ({total} tokens) but the KV cache has only "
                f"{self.kv.num_blocks} blocks of {bs} tokens"
            )

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)

    def add_running(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.sort_key)

    def remove(self, seq: Sequence) -> None:
        """Takes a finished or aborted sequence out of the queues and frees its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.LOADING:
            (self.loading if seq in self.loading else self.ready).remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self.kv.free(seq)

    def holders(self) -> list[Sequence]:
        """The sequences that may hold KV blocks (a waiting one holds none)."""
        return self.running + self.loading + self.ready

    # --- one step ---
    def schedule(self) -> ScheduledBatch:
        self.kv.step_started(decoding=bool(self.running))
        self._collect_loads()
        batch = ScheduledBatch()
        budget = self._schedule_running(batch, self.max_num_batched_tokens)
        if batch.num_preempted == 0:
            self._schedule_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.allocate(seq, n):
                victim = self.running[-1]
                self._preempt(victim)
                batch.num_preempted += 1
                if victim is seq:
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
        return budget

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        budget = self._schedule_ready(batch, budget)
        deferred: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._prefix_in_flight(seq):
                deferred.append(self.waiting.pop(0))  # wait: its next block is being computed
                continue
            worst = blocks_for(min(seq.num_tokens, budget), self.kv.block_size)
            if not self.kv.can_fit(worst):
                break
            if self.kv.match(seq) is MatchState.LOADING:
                self.waiting.pop(0)
                seq.status = SequenceStatus.LOADING
                self.loading.append(seq)
                continue
            if not self._start(batch, seq, budget):
                self.kv.free(seq)
                break
            self.waiting.pop(0)
            budget -= batch.num_new_tokens[-1]
        for seq in deferred:
            self.add(seq)

    def _schedule_ready(self, batch: ScheduledBatch, budget: int) -> int:
        """Sequences whose load arrived go first: their blocks go in (over a few steps while
        others decode) and they start; one that does not fit lets go of its prefix and queues
        again (no waiting sequence holds blocks)."""
        while self.ready and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.ready[0]
            if self.kv.match(seq, decoding=bool(self.running)) is MatchState.LOADING:
                break  # its loaded blocks go in a part per step; the others wait behind it
            self.ready.pop(0)
            if self._start(batch, seq, budget):
                budget -= batch.num_new_tokens[-1]
            else:
                self.kv.free(seq)
                self.add(seq)
        return budget

    def _start(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> bool:
        """Blocks for seq's first chunk, and seq into the batch; False if short."""
        n = min(seq.num_tokens - seq.num_computed_tokens, budget)
        if not self.kv.allocate(seq, n):
            return False
        self.add_running(seq)
        batch.admitted.append(seq)
        batch.num_cached_tokens += seq.num_computed_tokens
        batch.seqs.append(seq)
        batch.num_new_tokens.append(n)
        return True

    def _collect_loads(self) -> None:
        """Loaded (or expired) sequences become `ready`: admitted before the waiting queue."""
        if not self.loading:
            return
        now = time.monotonic()
        for seq in [s for s in self.loading if self.kv.load_ready(s, now)]:
            self.loading.remove(seq)
            bisect.insort(self.ready, seq, key=lambda s: s.sort_key)

    def wait_for_loads(self, timeout: float) -> None:
        """Nothing else can run: block until the first load is done (at most `timeout`)."""
        if self.loading and not self.running:
            self.kv.wait_for_load(self.loading[0], timeout)

    def _prefix_in_flight(self, seq: Sequence) -> bool:
        """True when a running sequence is computing the block this one would compute first:
        admitting it later turns that block into a cache hit instead of a second computation
        (this is also how the n > 1 siblings of a request wait for the first one's prompt)."""
        cached = self.kv.peek(seq)
        end = cached + self.kv.block_size
        if cached < 0 or end >= seq.num_tokens:
            return False
        head = seq.token_ids[:end]
        ns = seq.request.namespace
        return any(
            r.num_computed_tokens < end <= r.num_tokens
            and r.request.namespace == ns
            and r.token_ids[:end] == head
            for r in self.running
        )

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)  # its full blocks stay in the tree: recompute mostly hits
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)
