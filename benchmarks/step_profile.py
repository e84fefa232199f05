"""Where an engine run's time goes, from a torch.profiler trace of it.

Reads the ranges the engine opens: "engine.step" (one per step, opened by the benchmark),
"forward.<kind>.t<tokens>.k<keys>" (ModelRunner.execute), "attention" (one per layer, the torch
backend) and "sample" (Sampler); everything else is classified by op name. Python overhead is
a range's wall time minus the ops it launched (what the interpreter spent between them).

The run's wall time is taken inside the profiler (its start-up is no part of the run): "between
steps" is then the benchmark loop's own time, which a sampling profiler finds near zero. The
profiler's own cost per recorded op (profiler_event_cost, measured beside the run) would read as
Python between the ops: it is taken out of the Python figures and shown on its own line."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

MATMUL_OPS = {"mkldnn::_linear_pointwise", "aten::linear", "aten::addmm", "aten::mm"}
DECODE_KERNEL_OPS = {"radixcache::paged_decode"}
PREFILL_KERNEL_OPS = {"radixcache::paged_prefill"}
SDPA_OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu"}
ROW_OPS = {  # the layer's fused row ops (engine/models/row_ops.py), native ones and torch's
    "radixcache::rms_norm": "row ops: rms norm",
    "radixcache::add_rms_norm": "row ops: rms norm",
    "radixcache::silu_mul": "row ops: silu * up",
    "aten::silu": "row ops: silu * up",
    "radixcache::rope_store_kv": "row ops: rope + kv write",
}


@dataclass
class ForwardShape:
    kind: str  # decode | prefill | mixed
    tokens: int  # new tokens of the step
    keys: int  # sum of context lengths (keys attended)

    @staticmethod
    def parse(name: str) -> ForwardShape:
        _, kind, t, k = name.split(".")
        return ForwardShape(kind, int(t[1:]), int(k[1:]))


@dataclass
class Breakdown:
    """Seconds by category (and per step kind), plus the counts derived figures need."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    steps: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    keys: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    layers_seen: int = 0
    run_wall: float = 0.0
    event_cost: float = 0.0  # seconds the profiler adds per recorded op (profiler_event_cost)


def _dur(ev) -> float:
    return (ev.time_range.end - ev.time_range.start) / 1e6


def profiler_event_cost(ops: int = 20000) -> float:
    """Seconds the CPU profiler adds to each op it records: a loop of near-free ops timed bare
    and under a profiler, the difference per op (the best of three each)."""
    x = torch.empty(4)

    def loop() -> float:
        start = time.perf_counter()
        for _ in range(ops):
            x.view(-1)
        return time.perf_counter() - start

    bare = min(loop() for _ in range(3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        profiled = min(loop() for _ in range(3))
    return max(0.0, (profiled - bare) / ops)


def _ops_time(children) -> float:
    return sum(_dur(c) for c in children)


def _python(ev, out: Breakdown, category: str) -> None:
    """ev's wall time outside the ops it launched, less the profiler's cost of recording them."""
    gap = _dur(ev) - _ops_time(ev.cpu_children)
    cost = min(gap, out.event_cost * len(ev.cpu_children))
    out.seconds[category] += gap - cost
    out.seconds["profiler's own cost (estimated)"] += cost


def _attention(ev, kind: str, out: Breakdown) -> None:
    s = out.seconds
    for c in ev.cpu_children:
        if c.name in DECODE_KERNEL_OPS:
            s[f"attention: decode kernel ({kind})"] += _dur(c)
        elif c.name in PREFILL_KERNEL_OPS:
            s[f"attention: prefill kernel ({kind})"] += _dur(c)
        elif c.name in SDPA_OPS:
            s[f"attention: sdpa ({kind})"] += _dur(c)
        else:
            s["attention: kv write + glue ops"] += _dur(c)
    _python(ev, out, "python: per layer (attention)")


def _forward(ev, out: Breakdown) -> None:
    shape = ForwardShape.parse(ev.name)
    out.steps[shape.kind] += 1
    out.tokens[shape.kind] += shape.tokens
    out.keys[shape.kind] += shape.keys
    s = out.seconds
    for c in ev.cpu_children:
        if c.name == "attention":
            out.layers_seen += 1
            _attention(c, shape.kind, out)
        elif c.name in MATMUL_OPS:
            s[f"matmul ({shape.kind})"] += _dur(c)
        else:
            s[ROW_OPS.get(c.name, "other ops (residual, embed, torch row ops)")] += _dur(c)
    _python(ev, out, "python: forward (plan, layer loop)")


def breakdown(events, run_wall: float, event_cost: float = 0.0) -> Breakdown:
    """events: prof.events() of a run whose steps were each wrapped in "engine.step";
    event_cost: profiler_event_cost()."""
    out = Breakdown(run_wall=run_wall, event_cost=event_cost)
    s = out.seconds
    steps_wall = 0.0
    for ev in events:
        if ev.name != "engine.step":
            continue
        steps_wall += _dur(ev)
        for c in ev.cpu_children:
            if c.name.startswith("forward."):
                _forward(c, out)
            elif c.name == "sample":
                s["sampling"] += _dur(c)
            else:
                s["ops outside the forward (inputs, sampling glue)"] += _dur(c)
        _python(ev, out, "python: schedule, prepare inputs, postprocess")
    s["between steps (benchmark loop)"] = max(0.0, run_wall - steps_wall)
    return out
