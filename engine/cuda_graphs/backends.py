"""What captures a decode step's static-buffer forward and replays it: CUDA graphs, or (CPU,
tests) the same forward run again at each replay (engine/cuda_graphs/runner.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata

StepForward = Callable[[AttentionMetadata], torch.Tensor]  # meta over the static buffers -> hidden
Replay = Callable[[AttentionMetadata], torch.Tensor]


class GraphBackend(Protocol):
    def capture(self, forward: StepForward, meta: AttentionMetadata) -> Replay:
        """Record forward(meta); the replay re-runs it on the static buffers' current values and
        returns its hidden states [rows, hidden]."""
        ...


class EagerReplayBackend:
    """Captures nothing: a replay runs the static-buffer forward again (CPU; tests)."""

    def capture(self, forward: StepForward, meta: AttentionMetadata) -> Replay:
        forward(meta)
        return forward


class CudaGraphBackend:
    """CUDA graphs sharing one memory pool (captured largest first, so smaller ones fit it)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def capture(self, forward: StepForward, meta: AttentionMetadata) -> Replay:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm up: compile the kernels, create cuBLAS handles
            forward(meta)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a tier thread's CUDA calls during capture are not an error
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            hidden = forward(meta)
        self.graphs.append(graph)

        def replay(_: AttentionMetadata) -> torch.Tensor:
            graph.replay()
            return hidden

        return replay
