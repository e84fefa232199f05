"""Where a decode step's time goes on a CUDA GPU: its wall time against the time the GPU spends
in kernels, how many kernels run and how many launches the host makes for them (torch.profiler),
with decode steps replayed from CUDA graphs (engine/cuda_graphs/runner.py) and without. A step whose GPU
is busy for a small share of its wall time is bound by the host (Python, launches), not by the
GPU. The busy share is read in the profiled steps (the profiler slows the host and adds to each
kernel). A graph replay is one launch however many kernels it runs. Host syncs per step count
the synchronizing CUDA calls (torch's sync debug mode): the one a step needs is the copy of its
sampled tokens.

    python -m benchmarks.bench_cuda_step [--model FOLDER] [--batches 1 8 32] [--steps 32]
        [--graphs on off]

Prompts of 128 random tokens, greedy; the timed steps are decode-only. Writes
benchmarks/results/cuda_step.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.results_io import write_results
from engine.config import EngineConfig
from engine.cuda_graphs import graph_memory_reserve
from engine.dtypes import resolve_dtype
from engine.llm_engine import LLMEngine
from engine.request import Prompt
from engine.sampling_params import SamplingParams

PROMPT_TOKENS = 128


def start_decoding(engine: LLMEngine, batch: int, steps: int, vocab: int) -> list[str]:
    """Admits `batch` prompts and steps until every one is decoding; their request ids."""
    rng = random.Random(batch)
    params = SamplingParams(temperature=0, max_tokens=4 * steps + 16, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        tokens = [rng.randrange(100, vocab - 100) for _ in range(PROMPT_TOKENS)]
        engine.add_request(request_id, Prompt(tokens), params)
    while True:
        engine.step()
        running = engine.scheduler.running
        if len(running) == batch and all(
            s.num_computed_tokens >= s.num_prompt_tokens for s in running
        ):
            return ids


def kernels(prof: profile) -> tuple[int, float]:
    """(kernels run, seconds the GPU spent in them) of a profiled run."""
    ran = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(ran), sum(e.device_time_total for e in ran) / 1e6


LAUNCH_CALLS = ("LaunchKernel", "GraphLaunch", "Memcpy", "Memset")


def launches(prof: profile) -> int:
    """Host calls that start GPU work (kernel and graph launches, copies, fills) in a run."""
    return sum(
        1
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CPU
        and e.name.startswith(("cuda", "cu"))
        and any(call in e.name for call in LAUNCH_CALLS)
    )


def host_syncs(engine: LLMEngine, steps: int) -> float:
    """Synchronizing CUDA calls per step (torch's sync debug mode): 1 is the sampled tokens."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / steps


def bench_batch(engine: LLMEngine, batch: int, steps: int, vocab: int, ahead: bool) -> dict:
    engine.run_ahead = ahead
    ids = start_decoding(engine, batch, steps, vocab)
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    forwards = [s.forward_time for s in list(engine.stats.recent)[-steps:]]
    cuda = engine.config.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        if cuda:
            torch.cuda.synchronize()
        profiled = (time.perf_counter() - t0) / steps  # the profiler slows the host down
    ran, busy = kernels(prof)
    syncs = host_syncs(engine, steps) if cuda else None
    for request_id in ids:
        engine.abort(request_id)
    step = statistics.median(walls)
    return {
        "graphs": engine.runner.graphs is not None,
        "run_ahead": ahead,
        "batch": batch,
        "step_ms": 1000 * step,
        "forward_ms": 1000 * statistics.median(forwards),
        "profiled_step_ms": 1000 * profiled,
        "gpu_busy_ms": 1000 * busy / steps,
        "gpu_busy_share": busy / steps / profiled,
        "kernels_per_step": ran / steps,
        "launches_per_step": launches(prof) / steps,
        "host_syncs_per_step": syncs,
        "tokens_per_s": batch / step,
    }


def graph_figures(engine: LLMEngine, start_s: float) -> dict:
    """The engine's start-up time and, with graphs, their buckets and memory (measured around
    capture, and the estimate the KV budget gave up for them)."""
    figures: dict = {"engine_start_s": round(start_s, 2)}
    graphs = engine.runner.graphs
    if graphs is not None:
        model = engine.runner.model
        estimate = graph_memory_reserve(engine.config, model.config, model.dtype)
        figures |= {
            "buckets": graphs.buckets,
            "capture_s": round(graphs.capture_s, 2),
            "graph_memory_mb": round(graphs.memory_bytes / 2**20, 1),
            "estimate_mb": round(estimate / 2**20, 1),
        }
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="HF folder; omitted: the default model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (no kernels counted)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--graphs", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument(
        "--run-ahead",
        nargs="+",
        choices=["on", "off"],
        default=["on", "off"],
        help="steps launched before the previous step's tokens are read (async scheduling)",
    )
    p.add_argument("--out", default="cuda_step")
    args = p.parse_args()
    from engine.loader import ensure_default_model, load_tokenizer

    model = Path(args.model) if args.model else ensure_default_model()
    vocab = load_tokenizer(model).vocab_size
    rows, capture = [], {}
    for graphs in args.graphs:
        config = EngineConfig(
            model=str(model),
            dtype=args.dtype,
            device=args.device,
            max_num_seqs=max(args.batches),
            speculative="off",
            cuda_graphs=graphs == "on",
        )
        t0 = time.perf_counter()
        engine = LLMEngine(config)
        capture[graphs] = graph_figures(engine, time.perf_counter() - t0)
        for ahead in args.run_ahead:
            rows += [bench_batch(engine, b, args.steps, vocab, ahead == "on") for b in args.batches]
        engine.close()
    print(
        f"{'graphs':>6} {'ahead':>5} {'batch':>5} {'step ms':>8} {'forward ms':>10} "
        f"{'GPU busy ms':>11}",
        end="",
    )
    print(f" {'busy':>5} {'kernels':>8} {'launches':>8} {'syncs':>5} {'tok/s':>8}")
    for r in rows:
        print(
            f"{'on' if r['graphs'] else 'off':>6} {'on' if r['run_ahead'] else 'off':>5} "
            f"{r['batch']:>5} {r['step_ms']:>8.2f} "
            f"{r['forward_ms']:>10.2f} {r['gpu_busy_ms']:>11.2f} {r['gpu_busy_share']:>5.0%} "
            f"{r['kernels_per_step']:>8.0f} {r['launches_per_step']:>8.0f} "
            f"{r['host_syncs_per_step'] or 0:>5.1f} {r['tokens_per_s']:>8.0f}"
        )
    for graphs, figures in capture.items():
        print(f"graphs {graphs}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    dtype = resolve_dtype(args.dtype, args.device)
    path = write_results(
        args.out, rows, model=str(model), dtype=dtype, device=args.device, start=capture
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
