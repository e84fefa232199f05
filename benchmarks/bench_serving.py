"""Serving benchmark: the real server (subprocess) driven over HTTP.

Workloads (DESIGN.md): MT-small (8 users x 4 turns, shared 512-token system prompt, 64-token user
turns, 32-token answers appended to each history) and GSP-small (8 groups x 8 prompts, 1,024-token
group prefix + 64-token question, 32 output tokens, shuffled with seed 1). Greedy, ignore EOS,
streaming completions with token ids. Each workload runs at concurrency 1, 4 and 16 with the prefix
cache on and off (two server processes up side by side; each run on one is followed at once by the
same run on the other, so both see the same machine load); the cache is flushed before every run.

Reports TTFT and inter-token latency (mean / p50 / p99, client side), output tokens/s, and the cache
hit rate (cached / prompt tokens from `usage`). Prints a table and writes
benchmarks/results/serving.json.

    python -m benchmarks.bench_serving                       # DESIGN shapes (a few minutes)
    python -m benchmarks.bench_serving --quick               # 2 groups / 2 users, same shapes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from benchmarks.processes import free_port, spawn, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "serving.json"


@dataclass
class Result:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)


# ---------------------------------------------------------------- the server


def start_server(args: argparse.Namespace, cache: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--no-disk"]
    cmd += ["--max-num-seqs", "16", "--log-level", "warning", "--dtype", args.dtype]
    if args.model:
        cmd += ["--model", args.model]
    if not cache:
        cmd.append("--no-prefix-caching")
    proc = spawn(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=300)
    except RuntimeError:
        proc.kill()
        raise
    return proc, url


# ---------------------------------------------------------------- one request


async def send(client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int) -> Result:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    res = Result()
    t0 = last = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                res.cached_tokens = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
            new = [t for c in chunk["choices"] for t in c.get("token_ids") or []]
            if not new:
                continue
            now = time.perf_counter()
            if not res.output_ids:
                res.ttft = now - t0
            else:
                res.itl += [(now - last) / len(new)] * len(new)
            last = now
            res.output_ids += new
    return res


async def run_batch(
    client: httpx.AsyncClient, model: str, prompts: list[list[int]], out: int, concurrency: int
) -> list[Result]:
    gate = asyncio.Semaphore(concurrency)

    async def one(p: list[int]) -> Result:
        async with gate:
            return await send(client, model, p, out)

    return await asyncio.gather(*(one(p) for p in prompts))


# ---------------------------------------------------------------- workloads


def random_ids(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(100, vocab - 100, size=n).tolist()


def gsp_prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    prompts = []
    for _ in range(args.gsp_groups):
        system = random_ids(rng, 1024, vocab)
        prompts += [system + random_ids(rng, 64, vocab) for _ in range(args.gsp_prompts)]
    random.Random(1).shuffle(prompts)
    return prompts


async def run_gsp(client, model, args, vocab, concurrency) -> list[Result]:
    return await run_batch(client, model, gsp_prompts(args, vocab), 32, concurrency)


async def run_mt(client, model, args, vocab, concurrency) -> list[Result]:
    rng = np.random.default_rng(0)
    system = random_ids(rng, 512, vocab)
    histories = [list(system) for _ in range(args.mt_users)]
    results: list[Result] = []
    for _ in range(args.mt_turns):
        prompts = [h + random_ids(rng, 64, vocab) for h in histories]
        turn = await run_batch(client, model, prompts, 32, concurrency)
        histories = [p + r.output_ids for p, r in zip(prompts, turn, strict=True)]
        results += turn
    return results


WORKLOADS = {"MT-small": run_mt, "GSP-small": run_gsp}


# ---------------------------------------------------------------- reporting


def pct(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    a = np.asarray(values) * 1000.0
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
    }


def summarize(name: str, cache: bool, conc: int, results: list[Result], wall: float) -> dict:
    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)
    output = sum(len(r.output_ids) for r in results)
    return {
        "workload": name,
        "cache": "on" if cache else "off",
        "concurrency": conc,
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "output_tokens": output,
        "wall_s": wall,
        "output_tok_s": output / wall if wall else 0.0,
        "ttft_ms": pct([r.ttft for r in results]),
        "itl_ms": pct([x for r in results for x in r.itl]),
    }


HEADER = (
    f"{'workload':<10} {'cache':<5} {'conc':>4} {'reqs':>4} {'wall s':>7} "
    f"{'TTFT mean/p50/p99 ms':>22} {'ITL mean/p50/p99 ms':>21} {'out tok/s':>9} {'hit':>6}"
)


def row(r: dict) -> str:
    t, i = r["ttft_ms"], r["itl_ms"]
    ttft = f"{t['mean']:.0f}/{t['p50']:.0f}/{t['p99']:.0f}"
    itl = f"{i['mean']:.1f}/{i['p50']:.1f}/{i['p99']:.1f}"
    return (
        f"{r['workload']:<10} {r['cache']:<5} {r['concurrency']:>4} {r['requests']:>4} "
        f"{r['wall_s']:>7.2f} {ttft:>22} {itl:>21} {r['output_tok_s']:>9.1f} "
        f"{r['hit_rate']:>6.1%}"
    )


# ---------------------------------------------------------------- main


async def bench(args, urls: dict[bool, str], vocab: int) -> list[dict]:
    """Every (concurrency, workload) runs on the cache-on server, then at once on the cache-off
    one (both are up; the idle one costs nothing), so both see the same machine conditions."""
    rows = []
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=64)
    clients = {
        c: httpx.AsyncClient(base_url=u, timeout=timeout, limits=limits) for c, u in urls.items()
    }
    try:
        model = (await next(iter(clients.values())).get("/v1/models")).json()["data"][0]["id"]
        rng = np.random.default_rng(99)
        warm = [random_ids(rng, 64, vocab)] * 2
        for client in clients.values():
            await run_batch(client, model, warm, 4, 2)
        for conc in args.concurrency:
            for name in args.workloads:
                for cache, client in clients.items():
                    await client.post("/v1/cache/flush")
                    t0 = time.perf_counter()
                    results = await WORKLOADS[name](client, model, args, vocab, conc)
                    summary = summarize(name, cache, conc, results, time.perf_counter() - t0)
                    print(row(summary), flush=True)
                    rows.append(summary)
    finally:
        for client in clients.values():
            await client.aclose()
    return rows


def model_vocab(model: str | None) -> tuple[str, int]:
    if model is None:
        from engine.loader import ensure_default_model

        model = str(ensure_default_model(progress=True))
    config = json.loads((Path(model) / "config.json").read_text())
    return model, int(config["vocab_size"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    p.add_argument("--workloads", default="MT-small,GSP-small")
    p.add_argument("--cache", default="on,off", help="on, off or both")
    p.add_argument("--gsp-groups", type=int, default=8)
    p.add_argument("--gsp-prompts", type=int, default=8, help="prompts per group")
    p.add_argument("--mt-users", type=int, default=8)
    p.add_argument("--mt-turns", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="2 GSP groups and 2 MT users (same shapes)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.gsp_groups, args.mt_users = 2, 2
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.cache_modes = [c == "on" for c in args.cache.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.model, vocab = model_vocab(args.model)
    print(HEADER)
    servers = {}
    try:
        for cache in args.cache_modes:
            servers[cache] = start_server(args, cache)
        rows = asyncio.run(bench(args, {c: url for c, (_, url) in servers.items()}, vocab))
    finally:
        for proc, _ in servers.values():
            stop(proc)
    report = {
        "benchmark": "serving",
        "model": Path(args.model).name,
        "dtype": args.dtype,
        "shapes": {
            "GSP-small": f"{args.gsp_groups} groups x {args.gsp_prompts} prompts, 1024+64 -> 32",
            "MT-small": f"{args.mt_users} users x {args.mt_turns} turns, 512 + 64/turn, 32 out",
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average_at_end": os.getloadavg(),
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
