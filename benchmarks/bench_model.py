"""Forward time of the default model (SmolLM2-135M) on this machine's CPU, fp32 and bf16.

Shapes: a 1024-token prefill of one sequence (nothing cached); a 64-token prefill chunk over a
1024-token cached prefix for 16 sequences (the shared-prefix workload's prefill); one decode step
of 16 sequences with 1,100 tokens of context each (private blocks; and sharing a 1024-token prefix).
"cpu ms" is the process CPU time (all threads): on a busy machine it shows what wall time hides.

    python -m benchmarks.bench_model [--reps 5] [--dtypes float32,bfloat16] [--threads 2]

It also measures this CPU's bf16 matmul peak and memory bandwidth (measure_peaks) and prints each
row's limit, the least time the step can take here (benchmarks/step_limit.py), and "x limit",
the measured time over it:

    bytes = weights of every projection and the head + K and V of every distinct key attended
    flops = 2 * projection params * new tokens + 2 * head params * sequences
            + 4 * Hq * D * layers * keys attended
    limit = max(bytes / memory read bandwidth, flops / bf16 matmul peak)

    python -m benchmarks.bench_model --attention [--reps 7]

compares one layer's attention (the model's head shapes: 9 query heads over 3 kv heads of 64,
blocks of 16 at scattered ids) through the native kernels and the pure-torch path, alternating
the two within each shape; the ratio is torch / native (above 1: native is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.results_io import write_results
from benchmarks.step_limit import ModelCosts, step_limit
from engine.attention import (
    TorchAttention,
    build_attention_metadata,
    compute_positions,
    load_native,
)
from engine.dtypes import torch_dtype
from engine.host_memory import request_huge_pages
from engine.kv.paged_cache import KVCache
from engine.loader import ensure_default_model, load_model

BLOCK = 16
PREFIX = 1024


def workload(name: str) -> tuple[list[int], list[int], list[list[int]]]:
    """(query_lens, seq_lens, block_tables) of one step; shared prefix blocks are 0..63."""
    shared = list(range(PREFIX // BLOCK))
    if name == "prefill-1024":
        return [1024], [1024], [list(range(1024 // BLOCK))]
    if name == "prefill-16x64+1024-cached":
        tables = [shared + list(range(100 + 8 * i, 104 + 8 * i)) for i in range(16)]
        return [64] * 16, [PREFIX + 64] * 16, tables
    if name == "decode-16x1100-private":
        return [1] * 16, [1100] * 16, [list(range(70 * i, 70 * i + 70)) for i in range(16)]
    if name == "decode-16x1100-shared":
        tables = [shared + list(range(100 + 8 * i, 106 + 8 * i)) for i in range(16)]
        return [1] * 16, [1100] * 16, tables
    raise ValueError(name)


WORKLOADS = [
    "prefill-1024",
    "prefill-16x64+1024-cached",
    "decode-16x1100-private",
    "decode-16x1100-shared",
]


def time_step(model, kv, name: str, reps: int) -> tuple[float, float]:
    """(median wall seconds, median process CPU seconds) of one step: metadata + forward +
    logits of the last row of each sequence."""
    query_lens, seq_lens, tables = workload(name)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, model.config.vocab_size - 100, (sum(query_lens),), generator=gen)
    pos = torch.from_numpy(compute_positions(query_lens, seq_lens))
    wall, cpu = [], []
    for _ in range(reps + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        meta = build_attention_metadata(query_lens, seq_lens, tables, BLOCK)
        hidden = model(ids, pos, kv, meta)
        model.compute_logits(hidden[torch.cumsum(torch.tensor(query_lens), 0) - 1])
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall[1:]), statistics.median(cpu[1:])


def _best_seconds(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_peaks(reps: int = 5) -> dict[str, float]:
    """This CPU's bf16 matmul rate (packed oneDNN weight, a prefill-sized [2048 x 576] @
    [576 x 3072] product, the model's largest) and memory bandwidth (a 256 MiB copy, read +
    written bytes; and a 256 MiB sum, read bytes: what a step does with its weights and KV), at
    the current torch thread count: what engine figures are read against."""
    from engine.models.packed_linear import linear, pack_weight

    x = torch.randn(2048, 576, dtype=torch.bfloat16)
    w = torch.randn(3072, 576, dtype=torch.bfloat16)
    packed = pack_weight(w)
    matmul = _best_seconds(lambda: linear(x, w, None, packed), reps)
    src = torch.empty(64 << 20, dtype=torch.float32)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    copy = _best_seconds(lambda: dst.copy_(src), reps)
    read = _best_seconds(src.sum, reps)
    return {
        "bf16_matmul_gflops": round(2 * 2048 * 576 * 3072 / matmul / 1e9, 1),
        "memory_gbps": round(2 * src.numel() * 4 / copy / 1e9, 1),
        "memory_read_gbps": round(src.numel() * 4 / read / 1e9, 1),
    }


ATTENTION_SHAPES = [  # (kind, sequences, new tokens each, cached tokens each)
    *[("decode", b, 1, ctx - 1) for b in (1, 4, 16) for ctx in (512, 1024, 2048)],
    *[("prefill", 1, n, 0) for n in (64, 256, 1024, 2048)],
    *[("prefill", 1, n, 1024) for n in (64, 256, 1024)],
    ("prefill", 4, 64, 1024),
]


def attention_case(sequences: int, new: int, cached: int, dtype: torch.dtype):
    """(q, k, v, k_cache, v_cache, metadata) of one layer's step; every block id is scattered."""
    gen = torch.Generator().manual_seed(0)
    per_seq = -(-(new + cached) // BLOCK)
    ids = torch.randperm(sequences * per_seq + 8, generator=gen).tolist()
    tables = [ids[i * per_seq : (i + 1) * per_seq] for i in range(sequences)]
    k_cache, v_cache = (
        torch.randn(len(ids), BLOCK, 3, 64, generator=gen).to(dtype) for _ in range(2)
    )
    t = sequences * new
    q, k, v = (torch.randn(t, h, 64, generator=gen).to(dtype) for h in (9, 3, 3))
    meta = build_attention_metadata([new] * sequences, [new + cached] * sequences, tables, BLOCK)
    return q, k, v, k_cache, v_cache, meta


def attention_rows(dtypes: list[str], reps: int) -> list[dict]:
    """Median ms of one layer's attention forward, torch path vs native kernels, per shape."""
    native = load_native()
    if native is None:
        raise SystemExit("the native kernels do not build here")
    rows = []
    for dtype_name in dtypes:
        dtype = torch_dtype(dtype_name)
        backends = {
            "torch": TorchAttention(),
            "native": TorchAttention(native, native_prefill=native.has_native_prefill(dtype)),
        }
        for kind, b, new, cached in ATTENTION_SHAPES:
            q, k, v, k_cache, v_cache, meta = attention_case(b, new, cached, dtype)
            plans = {name: be.plan(meta) for name, be in backends.items()}
            times = {name: [] for name in backends}
            for _ in range(reps + 1):  # alternating, the first round discarded (warm-up)
                for name, be in backends.items():
                    start = time.perf_counter()
                    be.forward(q, k, v, k_cache, v_cache, plans[name], 0.125)
                    times[name].append(time.perf_counter() - start)
            torch_ms, native_ms = (statistics.median(times[n][1:]) * 1e3 for n in backends)
            rows.append(
                {
                    "kind": kind,
                    "dtype": dtype_name,
                    "shape": f"{b}x{new}+{cached}" if kind == "prefill" else f"{b}x{cached + 1}",
                    "torch_ms": round(torch_ms, 3),
                    "native_ms": round(native_ms, 3),
                    "ratio": round(torch_ms / native_ms, 2),
                }
            )
            r = rows[-1]
            print(
                f"{r['kind']:<8} {r['dtype']:<9} {r['shape']:<12} {r['torch_ms']:>9.3f} "
                f"{r['native_ms']:>9.3f} {r['ratio']:>6.2f}",
                flush=True,
            )
    return rows


def main() -> None:
    request_huge_pages()  # as the server runs: the weights, the KV and the probes alike
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--attention", action="store_true", help="attention kernels only")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.attention:
        native = load_native()
        print(f"threads={torch.get_num_threads()} native vector code: {native.vector_isa()}")
        print(
            f"{'kind':<8} {'dtype':<9} {'shape':<12} {'torch ms':>9} {'native ms':>9} {'ratio':>6}"
        )
        rows = attention_rows(args.dtypes.split(","), args.reps)
        print(f"wrote {write_results('bench_attention', rows, isa=native.vector_isa())}")
        return
    torch.manual_seed(0)
    path = ensure_default_model()
    peaks = measure_peaks()
    rows = []
    for dtype_name in args.dtypes.split(","):
        model = load_model(path, torch_dtype(dtype_name), "cpu")
        costs = ModelCosts.of(model.config, model.dtype)
        kv = KVCache.for_model(model, 1200, BLOCK).tensor
        kv.normal_()
        for name in args.workloads.split(","):
            seconds, cpu_seconds = time_step(model, kv, name, args.reps)
            query_lens, seq_lens, tables = workload(name)
            limit = step_limit(
                costs,
                query_lens,
                seq_lens,
                tables,
                BLOCK,
                peaks["memory_read_gbps"],
                peaks["bf16_matmul_gflops"],
            )
            rows.append(
                {
                    "workload": name,
                    "dtype": dtype_name,
                    "tokens": sum(query_lens),
                    "ms": round(seconds * 1e3, 2),
                    "cpu_ms": round(cpu_seconds * 1e3, 2),
                    "tokens_per_s": round(sum(query_lens) / seconds, 1),
                    "limit_ms": round(limit.seconds * 1e3, 2),
                    "limit_mb": round(limit.bytes / 1e6, 1),
                    "limit_gflop": round(limit.flops / 1e9, 2),
                    "bound": "memory" if limit.memory_s >= limit.compute_s else "compute",
                    "x_limit": round(seconds / limit.seconds, 2),
                }
            )
            r = rows[-1]
            print(f"  {r['workload']:<28} {r['dtype']:<9} {r['ms']:>9.2f} ms", flush=True)
    load = os.getloadavg()[0]
    print(f"\nthreads={torch.get_num_threads()} torch={torch.__version__} load={load:.1f}")
    print(
        f"peak: bf16 matmul {peaks['bf16_matmul_gflops']} GFLOP/s, memory "
        f"{peaks['memory_read_gbps']} GB/s read ({peaks['memory_gbps']} GB/s copy, read + write)"
    )
    print("limit = max(bytes / read bandwidth, flops / matmul peak) (benchmarks/step_limit.py)")
    print(
        f"{'workload':<28} {'dtype':<9} {'tokens':>6} {'ms':>9} {'cpu ms':>9} {'tokens/s':>10} "
        f"{'MB':>7} {'GFLOP':>7} {'limit ms':>9} {'bound':>7} {'x limit':>8}"
    )
    for r in rows:
        print(
            f"{r['workload']:<28} {r['dtype']:<9} {r['tokens']:>6} {r['ms']:>9.2f} "
            f"{r['cpu_ms']:>9.2f} {r['tokens_per_s']:>10.1f} {r['limit_mb']:>7.1f} "
            f"{r['limit_gflop']:>7.2f} {r['limit_ms']:>9.2f} {r['bound']:>7} {r['x_limit']:>8.2f}"
        )
    print(f"wrote {write_results('bench_model', rows, peaks=peaks)}")


if __name__ == "__main__":
    main()
