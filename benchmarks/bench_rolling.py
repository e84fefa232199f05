"""Rolling restart under load: `radixcache route` (a process of its own) in front of two
`radixcache serve` replicas (one torch thread each) that share one Redis tier written through
(`--write-policy write-through`: every computed block is in Redis at once) and publish KV events.
32 streaming chat clients (closed loop; 4 system prompts of ~400 words, a message of its own,
32-token greedy answers) run the whole time while each replica in turn is SIGTERMed (it drains:
/ready 503, running streams finish, the router retries what it refuses elsewhere), waited for,
started again on the same port and waited for until the router has it back.

Phases (tests/rolling_load.py): before; r0 restarting (SIGTERM until the router has it back); r0
back; r1 restarting; after, each but the restarts lasting `--settle` requests. Per phase:
requests, failed (not a 200), truncated (a 200 stream without a finish_reason and [DONE], or with
an error event), TTFT p50/p99 (client side, to the first content) and the hit rate (cached /
prompt tokens, from each stream's usage), and which replica answered. Per restart: its exit code,
drain and downtime, the router's refused-and-retried count, and the new process's first request's
cached tokens and its Redis hits (it never computed those prefixes itself). Prints a table and
writes benchmarks/results/rolling.json.

The default model (SmolLM2-135M-Instruct) by default: on a CPU its prefill of a 500-token system
prompt costs far more than loading it from Redis, so TTFT and hit rate show what the restart costs;
with the tiny random model (`--tiny`, a smoke run) compute is nearly free and TTFT shows only the
queueing.

    python -m benchmarks.bench_rolling                                # 32 clients, SmolLM2
    python -m benchmarks.bench_rolling --tiny --clients 8 --settle 16 # a quick smoke run
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.processes import free_port, spawn, stop, wait_healthy
from benchmarks.results_io import write_results
from tests.redis_server import RedisServer
from tests.restartable_serve import RestartableServe
from tests.rolling_load import ChatWorkload, Load, Restart, first_served, roll, summarise


def serve_args(args: argparse.Namespace, model: Path, redis_url: str) -> tuple[list[str], str]:
    """A replica's `serve` arguments and its router spec's event endpoints."""
    events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    out = ["--model", str(model), "--threads", "1", "--max-model-len", str(args.max_model_len)]
    if args.tiny:
        out += ["--dtype", "float32", "--block-size", "4", "--num-blocks", "1024"]
    elif args.dtype:
        out += ["--dtype", args.dtype]
    out += ["--no-disk", "--host-tier-bytes", "0", "--redis-url", redis_url]
    out += ["--write-policy", "write-through", "--drain-timeout", str(args.drain_timeout)]
    out += ["--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay]
    return [*out, "--log-level", "info"], f"{events},{replay}"


def start_router(model: Path, policy: str, specs: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "api.cli", "route", "--model", str(model), "--policy", policy]
    cmd += ["--port", str(port), "--log-level", "warning"]
    for spec in specs:
        cmd += ["--replica", spec]
    proc = spawn(cmd)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


def model_folder(args: argparse.Namespace, home: Path) -> Path:
    if args.tiny:
        from tests.tiny_models import make_tiny_model

        return make_tiny_model(home / "tiny-llama", "llama")
    if args.model:
        return Path(args.model)
    from engine.loader import ensure_default_model

    return ensure_default_model()


def restart_notes(load: Load, restart: Restart, server: RestartableServe, router: dict) -> dict:
    first = first_served(load, restart)
    report = httpx.get(f"{server.url}/v1/cache/stats", timeout=10).json()
    stats, nodes = report["since_start"], report["redis_nodes"].values()
    return restart.as_dict() | {
        "retried_elsewhere": router["replicas"][restart.replica]["failures"],
        "first_request_cached_tokens": first.cached_tokens if first else None,
        "first_request_prompt_tokens": first.prompt_tokens if first else None,
        "new_process_redis_hit_tokens": stats["hit_tokens_by_tier"].get("redis", 0),
        # a Redis call that failed or timed out (a starved CPU) opens the breaker: misses for 5 s
        "new_process_redis_errors": sum(n["errors"] for n in nodes),
    }


def main(args: argparse.Namespace) -> None:
    if args.system_words is None:
        args.system_words = 40 if args.tiny else 400  # the tiny model's tokens are bytes
    if args.max_model_len is None:
        args.max_model_len = 1024 if args.tiny else 2048
    home = Path(tempfile.mkdtemp(prefix="rolling-"))
    model = model_folder(args, home)
    workload = ChatWorkload(
        model.name,
        systems=args.systems,
        system_words=args.system_words,
        user_words=args.user_words,
        max_tokens=args.max_tokens,
    )
    (home / "redis").mkdir()
    redis = RedisServer(home / "redis")
    redis.start()
    servers: list[RestartableServe] = []
    router_proc = None
    try:
        specs = []
        for i in range(2):
            serve, events = serve_args(args, model, redis.url)
            servers.append(RestartableServe(serve, home / f"r{i}"))
            specs.append(f"{servers[-1].url},{events}")
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy(600)
        router_proc, url = start_router(model, args.policy, specs)

        def router_stats() -> dict:
            return httpx.get(f"{url}/v1/router/stats", timeout=10).json()

        load = Load(url, workload, args.clients)
        began = time.monotonic()
        load.start()
        try:
            phases, restarts = roll(load, servers, router_stats, args.settle)
        finally:
            load.stop()
        took = time.monotonic() - began
        rows = summarise(load.outcomes, phases)
        final = router_stats()
        notes = [restart_notes(load, r, s, final) for r, s in zip(restarts, servers, strict=True)]
    finally:
        if router_proc is not None:
            stop(router_proc)
        for server in servers:
            server.stop()
        redis.stop()
    print_table(rows, notes)
    meta = {"model": model.name, "tiny": args.tiny, "clients": args.clients}
    meta |= {"policy": args.policy, "settle_requests": args.settle, "seconds": round(took, 1)}
    meta |= {"workload": vars(workload), "drain_timeout_s": args.drain_timeout}
    meta |= {"restarts": notes, "replica_threads": 1, "router_health_interval_s": 1.0}
    print(f"\nwrote {write_results('rolling', rows, **meta)}")


def print_table(rows: list[dict], notes: list[dict]) -> None:
    print(
        f"{'phase':>14} {'reqs':>5} {'failed':>6} {'trunc':>5} {'TTFT p50 ms':>11} "
        f"{'p99 ms':>8} {'hit rate':>8}  by replica"
    )
    for r in rows:
        p50 = "-" if r["ttft_p50_ms"] is None else f"{r['ttft_p50_ms']:.0f}"
        p99 = "-" if r["ttft_p99_ms"] is None else f"{r['ttft_p99_ms']:.0f}"
        by = " ".join(f"{k}:{v}" for k, v in r["by_replica"].items())
        print(
            f"{r['phase']:>14} {r['requests']:>5} {r['failed']:>6} {r['truncated']:>5} "
            f"{p50:>11} {p99:>8} {r['hit_rate']:>8.3f}  {by}"
        )
    for n in notes:
        print(
            f"{n['replica']}: exit {n['exit_code']}, drained in {n['drain_s']:.1f} s, back after "
            f"{n['down_s']:.1f} s, {n['retried_elsewhere']} refused and retried elsewhere; its "
            f"first request: {n['first_request_cached_tokens']}/"
            f"{n['first_request_prompt_tokens']} tokens cached; Redis hit tokens since its "
            f"start: {n['new_process_redis_hit_tokens']} ({n['new_process_redis_errors']} errors)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model (smoke run)")
    parser.add_argument("--dtype", default=None, help="the replicas' --dtype (default: theirs)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--settle", type=int, default=96, help="requests per phase but restarts")
    parser.add_argument("--policy", default="cache-aware", help="the router's --policy")
    parser.add_argument("--systems", type=int, default=4, help="system prompts shared")
    parser.add_argument(
        "--system-words", type=int, default=None, help="words per system prompt (400; tiny: 40)"
    )
    parser.add_argument("--user-words", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="the replicas' (2048; tiny: 1024)"
    )
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    main(parser.parse_args())
