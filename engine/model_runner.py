"""Runs one scheduled batch: flat ragged inputs -> model -> logits of the rows that sample."""

from __future__ import annotations

import dataclasses
import time
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.profiler import record_function

from engine.attention import build_attention_metadata, compute_positions
from engine.attention.metadata import AttentionMetadata
from engine.kv.hybrid_cache import HybridKVCache
from engine.models.llama import WindowedKV
from engine.request import PENDING_TOKEN
from engine.step_upload import StepUpload, wait_for

if TYPE_CHECKING:
    from engine.cuda_graphs import DecodeGraphs
    from engine.kv.paged_cache import KVCache
    from engine.scheduler import ScheduledBatch


@dataclass
class TokenFeed:
    """The previous step's sampled tokens, still on the device: a sequence whose chunk ends in
    PENDING_TOKEN reads its input there, at `index[seq_id]`."""

    tokens: torch.Tensor  # int64 [S] on the device
    index: dict[int, int]


@dataclass
class ForwardResult:
    """On a GPU the logits stay there and the forward may still be running: the sampler's
    copy of its tokens is the step's one wait for the device."""

    logits: torch.Tensor  # float32 [R, vocab]: num_rows[i] rows per sampling sequence i
    sample_index: list[int]  # batch index (into batch.seqs) of each sampling sequence
    forward_time: float  # seconds inside the model (forward + logits): on a GPU see elapsed()
    num_rows: list[int] | None = None  # None: one row each; else 1 + its draft's length
    gpu_span: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # the forward on the GPU

    def elapsed(self) -> float:
        """Seconds of the forward: the GPU's, from its events (waits for the forward if nothing
        has waited yet: a step that samples no token), else the host's."""
        if self.gpu_span is None:
            return self.forward_time
        start, end = self.gpu_span
        wait_for(end)
        return start.elapsed_time(end) / 1000


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: KVCache,
        device: torch.device,
        graphs: DecodeGraphs | None = None,  # replays decode steps; None: every step eager
        upload: StepUpload | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size
        self.graphs = graphs
        self.upload = StepUpload(device) if upload is None else upload

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, feed: TokenFeed | None = None) -> ForwardResult:
        drafts = batch.drafts
        starts = [s.num_computed_tokens for s in batch.seqs]
        chunk_ends = [c + n for c, n in zip(starts, batch.num_new_tokens, strict=True)]
        # sequence b's rows cu[b]..cu[b+1]: token_ids[starts[b] : chunk_ends[b]], then its draft
        flat = array("q")
        fed_rows, fed_from = array("q"), array("q")  # rows whose token is still on the device
        for b, (seq, start, end) in enumerate(zip(batch.seqs, starts, chunk_ends, strict=True)):
            flat.extend(seq.token_ids[start:end])
            if seq.token_ids[end - 1] == PENDING_TOKEN:
                assert feed is not None, "a pending token without the step that samples it"
                fed_rows.append(len(flat) - 1)
                fed_from.append(feed.index[seq.seq_id])
            flat.extend(drafts.get(b, ()))
        query_lens = [n + len(drafts.get(b, ())) for b, n in enumerate(batch.num_new_tokens)]
        seq_lens = [c + n for c, n in zip(starts, query_lens, strict=True)]
        input_ids = torch.from_numpy(np.frombuffer(flat, dtype=np.int64).copy())
        positions = torch.from_numpy(compute_positions(query_lens, seq_lens))
        verify = [b in drafts for b in range(len(batch.seqs))]  # a draft follows its last token
        tables = [[s.block_ids for s in batch.seqs]]
        if isinstance(self.kv_cache, HybridKVCache):
            tables.append([s.window_block_ids for s in batch.seqs])
        metas = [
            build_attention_metadata(query_lens, seq_lens, t, self.block_size, "cpu", verify)
            for t in tables
        ]
        sample_index = [
            b
            for b, (s, end) in enumerate(zip(batch.seqs, chunk_ends, strict=True))
            if end == s.num_tokens
        ]
        num_rows = [1 + len(drafts.get(b, ())) for b in sample_index] if drafts else None
        last_rows = _logit_rows(np.cumsum(query_lens)[sample_index], num_rows)
        rows = torch.from_numpy(last_rows.astype(np.int64))
        fed = [
            torch.frombuffer(a, dtype=torch.int64) if a else torch.empty(0, dtype=torch.int64)
            for a in (fed_rows, fed_from)
        ]
        moved = self._to_device([input_ids, positions, rows, *fed], metas)
        input_ids, positions, rows, fed_rows_d, fed_from_d, *metas = moved
        if fed_rows:
            input_ids[fed_rows_d] = feed.tokens[fed_from_d]
        meta, windowed = metas[0], None
        if len(metas) > 1:
            layers = self.kv_cache.groups.window_layers
            windowed = WindowedKV(self.kv_cache.window_tensor, metas[1], layers)
        t0 = time.perf_counter()
        span = None
        if self.device.type == "cuda":
            span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            span[0].record()
        with record_function(_range_name(query_lens, seq_lens)):
            hidden = None
            if self.graphs is not None and windowed is None:
                hidden = self.graphs.forward(input_ids, positions, meta)
            if hidden is None:
                hidden = self.model.forward(
                    input_ids, positions, self.kv_cache.tensor, meta, windowed
                )
            logits = self.model.compute_logits(hidden.index_select(0, rows)).float()
        if span is not None:
            span[1].record()
        forward_s = time.perf_counter() - t0
        return ForwardResult(logits, sample_index, forward_s, num_rows, span)

    def _to_device(self, tensors: list[torch.Tensor], metas: list[AttentionMetadata]) -> list:
        """The step's host-built tensors, then its metadata, on the device in one upload
        (StepUpload)."""
        fields = ("cu_seqlens_q", "seq_lens", "block_tables", "slot_mapping")
        moved = self.upload(tensors + [getattr(m, f) for m in metas for f in fields])
        n = len(tensors)
        out: list = moved[:n]
        for i, m in enumerate(metas):
            start = n + i * len(fields)
            values = moved[start : start + len(fields)]
            out.append(dataclasses.replace(m, **dict(zip(fields, values, strict=True))))
        return out


def _logit_rows(ends: np.ndarray, num_rows: list[int] | None) -> np.ndarray:
    """The flat rows whose logits are taken: each sampling sequence's last num_rows rows (its
    last chunk token, then its draft tokens), given where its rows end."""
    if num_rows is None:
        return ends - 1
    return np.concatenate([np.arange(e - r, e) for e, r in zip(ends, num_rows, strict=True)])


def _range_name(query_lens: list[int], seq_lens: list[int]) -> str:
    """The profiler range of one forward: its kind, new tokens and keys attended
    ("forward.decode.t16.k17600"); benchmarks/step_profile.py reads it."""
    decodes = sum(1 for n in query_lens if n == 1)
    kind = "decode" if decodes == len(query_lens) else "prefill" if decodes == 0 else "mixed"
    return f"forward.{kind}.t{sum(query_lens)}.k{sum(seq_lens)}"
