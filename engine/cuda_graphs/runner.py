"""Decode steps replayed from graphs captured at start, one per row-count bucket.

Buckets count rows (tokens), not sequences: a plain decode step has one row per sequence, a
speculative verify step 1 + its draft's length. A step whose every sequence is a decode or a
verify of at most `max_query_len` rows, with at most the largest bucket's rows, is padded up to
its bucket and replayed; every other step (prefill, mixed, too large) runs eagerly.

The graph reads only persistent buffers (StaticInputs): ids, positions, slot mapping, block
tables, sequence lengths and query starts. A step is copied into them, then replayed:

    rows [0, T): the step's T rows, sequences [0, B): its B sequences
    rows [T, R): padding, one row per padding sequence [B, B + R - T): position 0, length 1,
                 its K/V written to the KV cache's scratch block (KVCache.scratch_block)
    sequences [B + R - T, R): empty (T > B only when some rows verify drafts)

Rows are independent in every op but attention, and attention keeps sequences apart, so the real
rows' outputs do not depend on the padding. The backend does the capturing: CudaGraphBackend
records CUDA graphs; EagerReplayBackend (CPU, tests) runs the same static-buffer forward again
at each replay, so a CPU test drives all the bookkeeping.
"""

from __future__ import annotations

import bisect
import time
from typing import TYPE_CHECKING

import torch

from engine.attention.metadata import AttentionMetadata
from engine.cuda_graphs.backends import CudaGraphBackend, GraphBackend, Replay, StepForward
from engine.cuda_graphs.layout import PaddedLayout, bucket_sizes, pad_layout
from engine.step_upload import HostTurns

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.kv.paged_cache import KVCache

MAX_CAPTURED_ROWS = 512  # the largest bucket captured (larger decode steps run eagerly)
KERNEL_QUERY_TILE = 16  # the paged-attention kernel's row tile for decode-sized queries
GRAPH_MEMORY_ALLOWANCE = 128 << 20  # bytes beyond the activations (graph_memory_estimate)


class StaticInputs:
    """The persistent buffers every graph reads, sized for the largest bucket."""

    def __init__(self, rows: int, table_width: int, device: torch.device) -> None:
        def buffer(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.input_ids = buffer(rows, dtype=torch.int64)
        self.positions = buffer(rows, dtype=torch.int64)
        self.slot_mapping = buffer(rows, dtype=torch.int64)
        self.cu_seqlens_q = buffer(rows + 1, dtype=torch.int32)
        self.seq_lens = buffer(rows, dtype=torch.int32)
        self.block_tables = buffer(rows, table_width, dtype=torch.int32)
        # host side of the per-step lengths, pinned on CUDA so their copies do not block; two
        # in turn (a step may be prepared before the one ahead of it has run:
        # engine/step_pipeline.py)
        self.host_lens = HostTurns(pin=device.type == "cuda")

    @property
    def nbytes(self) -> int:
        tensors = (self.input_ids, self.positions, self.slot_mapping, self.cu_seqlens_q)
        tensors += (self.seq_lens, self.block_tables)
        return sum(t.numel() * t.element_size() for t in tensors)


class DecodeGraphs:
    """Replays decode steps from graphs captured per row bucket (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: KVCache,
        max_rows: int,
        max_query_len: int,
        max_model_len: int,
        backend: GraphBackend,
    ) -> None:
        if kv_cache.scratch_block is None:
            raise ValueError("decode graphs need a KV cache with a scratch block for padding")
        self.model, self.kv_cache, self.backend = model, kv_cache, backend
        self.buckets = bucket_sizes(min(max_rows, MAX_CAPTURED_ROWS))
        self.max_query_len = min(max_query_len, KERNEL_QUERY_TILE)
        # + max_query_len: a verify's draft rows may run past max_model_len
        self.max_positions = max_model_len + self.max_query_len
        self.block_size = kv_cache.block_size
        self.scratch_block = kv_cache.scratch_block
        width = -(-self.max_positions // self.block_size)
        self.static = StaticInputs(self.buckets[-1], width, kv_cache.tensor.device)
        self.replays: dict[int, Replay] = {}
        self.memory_bytes = 0  # measured around capture on CUDA (0 elsewhere)
        self.capture_s = 0.0
        self.num_replayed = 0
        self.num_eager = 0

    def capture(self) -> None:
        """One graph per bucket, largest first; every row is padding (scratch block only)."""
        device, t0 = self.kv_cache.tensor.device, time.perf_counter()
        free_before = 0
        if device.type == "cuda":  # what the allocator caches now is not the graphs'
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            free_before = torch.cuda.mem_get_info(device)[0]
        with torch.inference_mode():
            for rows in reversed(self.buckets):
                layout = self._fill_padding(pad_layout([], [], rows))
                meta = self._meta(layout, [], [False] * rows)
                self.replays[rows] = self.backend.capture(self._forward_fn(rows), meta)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            captured = free_before - torch.cuda.mem_get_info(device)[0]
            self.memory_bytes = captured + self.static.nbytes
        self.capture_s = time.perf_counter() - t0

    def bucket_for(self, meta: AttentionMetadata) -> int | None:
        """The bucket a step replays in; None: it runs eagerly."""
        rows = sum(meta.query_lens)
        if rows == 0 or rows > self.buckets[-1] or meta.max_seqlen_k > self.max_positions:
            return None
        if meta.block_tables.shape[1] > self.width:
            return None
        for q, verify in zip(meta.query_lens, meta.verify, strict=True):
            if q > self.max_query_len or (q != 1 and not verify):
                return None  # a prefill chunk
        return self.buckets[bisect.bisect_left(self.buckets, rows)]

    @property
    def width(self) -> int:
        return self.static.block_tables.shape[1]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor | None:
        """Hidden states [T, hidden] of the step from its bucket's graph; None: not replayable
        (the caller runs the model eagerly)."""
        rows = self.bucket_for(meta)
        if rows is None or rows not in self.replays:
            self.num_eager += 1
            return None
        t, s = input_ids.shape[0], self.static
        s.input_ids[:t].copy_(input_ids, non_blocking=True)
        s.positions[:t].copy_(positions, non_blocking=True)
        s.slot_mapping[:t].copy_(meta.slot_mapping, non_blocking=True)
        b, w = meta.block_tables.shape
        s.block_tables[:b, :w].copy_(meta.block_tables, non_blocking=True)
        layout = self._fill_padding(pad_layout(meta.query_lens, meta.seq_lens_list, rows), t, b)
        hidden = self.replays[rows](self._meta(layout, meta.block_tables_list, meta.verify))
        self.num_replayed += 1
        return hidden[:t]

    def _fill_padding(self, layout: PaddedLayout, t: int = 0, b: int = 0) -> PaddedLayout:
        """Static rows [t, R) and sequences [b, R) as the layout's padding; all lengths."""
        s, rows = self.static, layout.rows
        pad = rows - t
        s.input_ids[t:rows].zero_()
        s.positions[t:rows].zero_()
        s.slot_mapping[t:rows].fill_(self.scratch_block * self.block_size)
        s.block_tables[b : b + pad, 0].fill_(self.scratch_block)
        lens = s.host_lens.take(4 * (2 * rows + 1)).view(torch.int32)
        host = lens[: 2 * rows + 1].numpy()
        host[: rows + 1] = layout.cu_seqlens_q
        host[rows + 1 :] = layout.seq_lens
        s.cu_seqlens_q[: rows + 1].copy_(lens[: rows + 1], non_blocking=True)
        s.seq_lens[:rows].copy_(lens[rows + 1 : 2 * rows + 1], non_blocking=True)
        s.host_lens.copied()
        return layout

    def _meta(
        self, layout: PaddedLayout, tables: list[list[int]], verify: list[bool]
    ) -> AttentionMetadata:
        """The metadata over the static buffers' first `rows` entries. Its host fields describe
        the padded step (read by backends that re-run the forward; a CUDA graph reads none)."""
        s, rows = self.static, layout.rows
        pad_tables = [[self.scratch_block]] * (rows - len(tables))
        return AttentionMetadata(
            cu_seqlens_q=s.cu_seqlens_q[: rows + 1],
            seq_lens=s.seq_lens[:rows],
            block_tables=s.block_tables[:rows],
            slot_mapping=s.slot_mapping[:rows],
            max_seqlen_q=self.max_query_len,  # fixes the kernels' grids across replays
            max_seqlen_k=self.max_positions,  # the rope tables: grown once, before capture
            block_size=self.block_size,
            query_lens=layout.query_lens,
            seq_lens_list=layout.seq_lens,
            block_tables_list=[*tables, *pad_tables],
            verify=[*verify, *[False] * (rows - len(verify))],
        )

    def _forward_fn(self, rows: int) -> StepForward:
        s, model, kv = self.static, self.model, self.kv_cache

        def forward(meta: AttentionMetadata) -> torch.Tensor:
            return model.forward(s.input_ids[:rows], s.positions[:rows], kv.tensor, meta)

        return forward


def graph_memory_estimate(model_config, dtype: torch.dtype, max_rows: int) -> int:
    """Bytes the graphs are expected to hold, reserved from the KV budget before the pool is
    sized: a layer's live activations per row (residual, norm output, qkv, roped q/k, attention
    output, gate_up and its product) for the largest bucket, twice over for the allocator's
    rounding, plus a fixed allowance for the static buffers, the cuBLAS workspaces of the warm-up
    and capture streams, the compiled kernels and the graphs' own objects.
    DecodeGraphs.memory_bytes is the figure measured around capture."""
    c = model_config
    rows = min(max_rows, MAX_CAPTURED_ROWS)
    qkv = c.q_size + 2 * c.kv_size
    per_row = 4 * c.hidden_size + 2 * qkv + c.q_size + 3 * c.intermediate_size
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * rows * per_row * elem + GRAPH_MEMORY_ALLOWANCE


def graph_rows(config: EngineConfig) -> tuple[int, int]:
    """(most rows of a decode step, most rows of one sequence in it) under this config."""
    per_seq = 1 + (config.num_speculative_tokens if config.speculative != "off" else 0)
    return min(config.max_num_seqs * per_seq, config.max_num_batched_tokens), per_seq


def wants_decode_graphs(config: EngineConfig) -> bool:
    return config.cuda_graphs and config.device.startswith("cuda")


def graph_memory_reserve(config: EngineConfig, model_config, dtype: torch.dtype) -> int:
    """What the KV budget gives up for the graphs: their estimate where they will be captured."""
    if not wants_decode_graphs(config):
        return 0
    return graph_memory_estimate(model_config, dtype, graph_rows(config)[0])


def build_decode_graphs(
    config: EngineConfig, model: torch.nn.Module, kv_cache: KVCache, max_model_len: int
) -> DecodeGraphs | None:
    """The captured decode graphs of a CUDA engine; None where graphs are off, on CPU, and for
    a KV cache without a scratch block (a hybrid cache: its windowed layers run eagerly)."""
    if not wants_decode_graphs(config) or kv_cache.scratch_block is None:
        return None
    max_rows, per_seq = graph_rows(config)
    device = kv_cache.tensor.device
    backend = CudaGraphBackend(device)
    graphs = DecodeGraphs(model, kv_cache, max_rows, per_seq, max_model_len, backend)
    graphs.capture()
    return graphs
