"""Both servers under vLLM's own serving client: `vllm bench serve` (vLLM's CPU build, its venv)
drives `radixcache serve` and then `vllm serve` on the same model folder, alternating run by run.

    python -m benchmarks.bench_serving_vs_vllm \\
        --vllm-python /work/venvs/vllm/bin/python --concurrency 8 16

Dataset: vLLM's prefix_repetition (8 prefixes of 1,024 tokens, 64-token suffixes, 32 output tokens,
64 prompts, EOS ignored); each repeat uses a new dataset seed, the same for both servers, so no run
starts with its prefixes cached. One server runs at a time (the other is stopped). Prints duration,
output tokens/s, TTFT mean / p99 and TPOT mean per server and the time ratio; writes
benchmarks/results/serving_vs_vllm.json.

No process here inherits GOMP_CPU_AFFINITY: libgomp binds a process's first thread when torch loads
and every Python thread started later inherits that one core, so a server's event loop would share
the engine's first core (our c8 run: 47.8 s pinned, 28.6 s unpinned). vLLM binds its engine's
OpenMP threads itself (VLLM_CPU_OMP_THREADS_BIND=0-1); ours float.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.processes import ROOT, free_port, spawn, stop, wait_healthy
from benchmarks.results_io import write_results

VLLM_CLI = ROOT / "benchmarks" / "vllm_cli.py"
FIELDS = ("duration", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms")


def start_ours(model: Path, dtype: str, port: int):
    cmd = [sys.executable, "-m", "api.cli", "serve", "--model", str(model), "--dtype", dtype]
    cmd += ["--port", str(port), "--max-num-seqs", "16", "--no-disk", "--log-level", "warning"]
    return spawn(cmd)


def start_vllm(python: str, model: Path, dtype: str, port: int, name: str):
    cmd = [python, str(VLLM_CLI), "serve", str(model), "--port", str(port), "--dtype", dtype]
    cmd += ["--served-model-name", name, "--max-model-len", "4096", "--max-num-seqs", "16"]
    cmd += ["--enforce-eager", "--enable-prefix-caching"]
    return spawn(cmd)


def bench_serve(args, url: str, name: str, concurrency: int, seed: int, out: Path) -> dict:
    cmd = [args.vllm_python, str(VLLM_CLI), "bench", "serve", "--backend", "openai"]
    cmd += ["--base-url", url, "--model", name, "--tokenizer", str(args.model)]
    cmd += ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "1024"]
    cmd += ["--prefix-repetition-suffix-len", "64", "--prefix-repetition-num-prefixes", "8"]
    cmd += ["--prefix-repetition-output-len", "32", "--num-prompts", str(args.num_prompts)]
    dataset_seed = 1000 * seed + concurrency  # fresh prefixes for every run of one server
    cmd += ["--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(dataset_seed)]
    cmd += ["--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    proc = spawn(cmd)
    if proc.wait() != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve against {url} failed ({proc.returncode})")
    result = json.loads(out.read_text())
    return {k: result[k] for k in FIELDS} | {"completed": result["completed"]}


def run_server(args, system: str, seeds: list[int], tmp: Path) -> list[dict]:
    port, name = free_port(), args.model.name
    if system == "radixcache":
        proc = start_ours(args.model, args.dtype, port)
    else:
        proc = start_vllm(args.vllm_python, args.model, args.dtype, port, name)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        wait_healthy(url, proc)
        for concurrency in args.concurrency:
            for seed in seeds:
                out = tmp / f"{system}-c{concurrency}-s{seed}.json"
                row = bench_serve(args, url, name, concurrency, seed, out)
                rows.append({"system": system, "concurrency": concurrency, "seed": seed, **row})
                print_rows(rows[-1:])
    finally:
        stop(proc)
    return rows


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(
            f"{r['system']:<11} c{r['concurrency']:<3} seed {r['seed']:<3} {r['duration']:7.2f} s "
            f"{r['output_throughput']:7.1f} tok/s  TTFT {r['mean_ttft_ms']:8.0f} / "
            f"{r['p99_ttft_ms']:8.0f} ms  TPOT {r['mean_tpot_ms']:6.1f} ms  "
            f"{r.get('ratio', '')}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vllm-python", required=True, help="vLLM's interpreter (PEERS.md)")
    p.add_argument("--model", type=Path, default=None, help="HF folder (default model)")
    p.add_argument("--dtype", default="auto", help="auto: what `radixcache serve` picks here")
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2, help="dataset seeds per concurrency")
    args = p.parse_args()
    os.environ.pop("GOMP_CPU_AFFINITY", None)  # see the module's docstring
    from engine.dtypes import resolve_dtype
    from engine.loader import ensure_default_model

    args.model = args.model or ensure_default_model()
    args.dtype = resolve_dtype(args.dtype, "cpu")
    seeds = list(range(1, args.repeat + 1))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:  # alternate: ours, then vLLM, on the same dataset seed
            for system in ("radixcache", "vllm"):
                rows += run_server(args, system, [seed], Path(tmp))
    for r in rows:
        if r["system"] == "radixcache":
            peer = next(
                x
                for x in rows
                if x["system"] == "vllm"
                and (x["concurrency"], x["seed"]) == (r["concurrency"], r["seed"])
            )
            r["ratio"] = round(r["duration"] / peer["duration"], 2)
    print(f"\nvllm bench serve, prefix_repetition 8 x (1,024 + 64), {args.dtype}; ratio = time")
    print_rows(sorted(rows, key=lambda r: (r["concurrency"], r["seed"], r["system"])))
    out = write_results(
        "serving_vs_vllm",
        rows,
        model=str(args.model),
        dtype=args.dtype,
        settings_that_differ=(
            "vLLM: enforce_eager, max_model_len 4096, KV 4 GiB, OMP bound to cores 0-1, "
            "its scheduler and front-end processes share the cores; ours: default token budget "
            "(2048), no disk tier; both: max 16 running, prefix caching on"
        ),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
