"""Decode steps replayed from CUDA graphs: the bucket layout and padding (`layout`), the capture
backends (`backends`: CUDA graphs, and an eager replay that CPU tests drive), the runner
(`runner`: static input buffers, capture per bucket at start, replay or eager per step)."""

from engine.cuda_graphs.runner import (
    DecodeGraphs,
    build_decode_graphs,
    graph_memory_reserve,
)

__all__ = ["DecodeGraphs", "build_decode_graphs", "graph_memory_reserve"]
