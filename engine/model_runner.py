"""Runs one scheduled batch: flat ragged inputs -> model -> logits of the rows that sample."""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.profiler import record_function

from engine.attention import build_attention_metadata, compute_positions

if TYPE_CHECKING:
    from engine.kv_cache import KVCache
    from engine.scheduler import ScheduledBatch


@dataclass
class ForwardResult:
    logits: torch.Tensor  # float32 [S, vocab]: one row per sampling sequence
    sample_index: list[int]  # batch index (into batch.seqs) of each logits row
    forward_time: float  # seconds inside the model (forward + logits)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, device: torch.device) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> ForwardResult:
        query_lens = batch.num_new_tokens
        starts = [s.num_computed_tokens for s in batch.seqs]
        seq_lens = [c + n for c, n in zip(starts, query_lens, strict=True)]
        # new tokens of sequence b: token_ids[starts[b] : seq_lens[b]], rows cu[b]..cu[b+1]
        flat = array("q")
        for seq, start, end in zip(batch.seqs, starts, seq_lens, strict=True):
            flat.extend(seq.token_ids[start:end])
        input_ids = torch.from_numpy(np.frombuffer(flat, dtype=np.int64).copy()).to(self.device)
        positions = torch.from_numpy(compute_positions(query_lens, seq_lens)).to(self.device)
        meta = build_attention_metadata(
            query_lens,
            seq_lens,
            [s.block_ids for s in batch.seqs],
            self.block_size,
            self.device,
        )
        sample_index = [
            b
            for b, (s, end) in enumerate(zip(batch.seqs, seq_lens, strict=True))
            if end == s.num_tokens
        ]
        last_rows = np.cumsum(query_lens)[sample_index] - 1
        t0 = time.perf_counter()
        with record_function(_range_name(query_lens, seq_lens)):
            hidden = self.model.forward(input_ids, positions, self.kv_cache.tensor, meta)
            rows = torch.from_numpy(last_rows.astype(np.int64)).to(self.device)
            logits = self.model.compute_logits(hidden.index_select(0, rows)).float()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return ForwardResult(logits.cpu(), sample_index, time.perf_counter() - t0)


def _range_name(query_lens: list[int], seq_lens: list[int]) -> str:
    """The profiler range of one forward: its kind, new tokens and keys attended
    ("forward.decode.t16.k17600"); benchmarks/step_profile.py reads it."""
    decodes = sum(1 for n in query_lens if n == 1)
    kind = "decode" if decodes == len(query_lens) else "prefill" if decodes == 0 else "mixed"
    return f"forward.{kind}.t{sum(query_lens)}.k{sum(seq_lens)}"
