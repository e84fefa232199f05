"""Soak: concurrent streaming clients (hang-ups, n>1, stop strings, long prompts) against a small KV
pool with host and disk tiers, for a few bounded rounds. Reports requests/s held, TTFT p50/p99, and
afterwards: referenced blocks when idle, invariants, RSS against the warm value, and whether every
completed answer equals the cache-off reference (float32 by default, where that must hold exactly).

    python -m benchmarks.bench_soak                       # default model, 64 clients, 3 rounds
    python -m benchmarks.bench_soak --clients 16 --rounds 2 --requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from benchmarks.soak_driver import make_requests, percentile, rss_bytes, run_soak, wait_idle
from engine.llm import LLM
from engine.loader import ensure_default_model
from engine.sampling_params import SamplingParams
from tests.serve_process import ServeProcess

RESULTS = Path(__file__).parent / "results" / "soak.json"


def reference(model: Path, dtype: str, requests: list) -> list[str]:
    llm = LLM(str(model), dtype=dtype, enable_prefix_caching=False, max_model_len=1024)
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, stop=r.stop) for r in requests]
    texts = [o.outputs[0].text for o in llm.generate([r.prompt for r in requests], params)]
    llm.engine.close()
    return texts


def main(args: argparse.Namespace) -> None:
    model = Path(args.model) if args.model else ensure_default_model()
    home = Path(tempfile.mkdtemp(prefix="soak-"))
    serve = ["--model", str(model), "--dtype", args.dtype, "--num-blocks", str(args.num_blocks)]
    serve += [
        "--max-model-len",
        "1024",
        "--host-tier-bytes",
        "64M",
        "--disk-path",
        str(home / "kv"),
    ]
    server = ServeProcess([*serve, "--log-level", "warning"], home)
    server.wait_healthy()
    rows = []
    try:
        for r in range(args.rounds):
            requests = make_requests(args.requests, seed=r, prefix_len=256)
            result = asyncio.run(run_soak(server.url, model.name, requests, args.clients, 600))
            want = reference(model, args.dtype, requests)
            wrong = sum(texts != [want[i]] * requests[i].n for i, texts in result.texts.items())
            report = wait_idle(server.url, timeout_s=120)
            rows.append(
                {
                    "round": r,
                    "requests": len(requests),
                    "completed": result.completed,
                    "hung_up": result.hung_up,
                    "errors": len(result.errors),
                    "wrong_answers": wrong,
                    "requests_per_s": len(requests) / result.elapsed_s,
                    "ttft_p50_s": percentile(result.ttft_s, 0.5),
                    "ttft_p99_s": percentile(result.ttft_s, 0.99),
                    "referenced_when_idle": report["blocks"]["referenced"],
                    "integrity_ok": report["ok"],
                    "rss_mb": rss_bytes(server.proc.pid) / 2**20,
                }
            )
            print_row(rows[-1], header=r == 0)
    finally:
        server.terminate()
    meta = {"model": model.name, "dtype": args.dtype, "clients": args.clients}
    meta |= {"num_blocks": args.num_blocks, "load_average": os.getloadavg()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nwrote {RESULTS}")


def print_row(row: dict, header: bool) -> None:
    if header:
        print(
            f"{'round':>5} {'reqs':>5} {'done':>5} {'hung':>5} {'err':>4} {'wrong':>5} "
            f"{'req/s':>7} {'TTFT p50/p99 s':>15} {'ref idle':>8} {'ok':>3} {'RSS MB':>7}"
        )
    ttft = f"{row['ttft_p50_s']:.2f}/{row['ttft_p99_s']:.2f}"
    print(
        f"{row['round']:>5} {row['requests']:>5} {row['completed']:>5} {row['hung_up']:>5} "
        f"{row['errors']:>4} {row['wrong_answers']:>5} {row['requests_per_s']:>7.2f} {ttft:>15} "
        f"{row['referenced_when_idle']:>8} {'yes' if row['integrity_ok'] else 'NO':>3} "
        f"{row['rss_mb']:>7.0f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=128, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-blocks", type=int, default=256, help="device KV blocks (small)")
    main(parser.parse_args())
