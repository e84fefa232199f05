"""Router benchmark: `radixcache route` in front of 2 `radixcache serve` replicas (1 core each).

Workload (issue 11): 32 users x 4 turns; 4 agent types, each with its own 1,024-token system
prompt (8 users per type); each turn appends a 64-token user message; the 32-token answer (greedy,
ignore EOS) is appended to that user's history. Every user runs its turns one after the other and
all users run at once (closed loop), so turns of different users interleave as they finish.

Rows: the router with --policy cache-aware / round-robin / least-loaded over 2 replicas, and a
single replica behind the same router. Caches are flushed before every row. Reports total time,
TTFT mean/p50/p99 (client side, streaming), hit rate (reported cached / prompt tokens, from
`usage`) and the router's own time per request (tokenizing + choosing, from /v1/router/stats);
then the router's time for one 4,096-token chat prompt (first sight and with its system prompt
seen before), measured on the router's parts in this process. Prints a table and writes
benchmarks/results/router.json.

    python -m benchmarks.bench_router            # the issue's shape (~10 minutes on 2 cores)
    python -m benchmarks.bench_router --quick    # 8 users x 2 turns, 2 agents, 256-token prompts
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "router.json"
MODEL_DIR = Path.home() / ".cache" / "radixcache" / "models" / "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Shape:
    users: int = 32
    turns: int = 4
    agents: int = 4
    system_tokens: int = 1024
    message_tokens: int = 64
    answer_tokens: int = 32


QUICK = Shape(users=8, turns=2, agents=2, system_tokens=256)


@dataclass
class Row:
    name: str
    total_s: float = 0.0
    ttft: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    overhead: dict = field(default_factory=dict)
    decisions: dict = field(default_factory=dict)

    def summary(self) -> dict:
        t = np.array(self.ttft) if self.ttft else np.zeros(1)
        return {
            "name": self.name,
            "total_s": round(self.total_s, 2),
            "ttft_mean_s": round(float(t.mean()), 3),
            "ttft_p50_s": round(float(np.percentile(t, 50)), 3),
            "ttft_p99_s": round(float(np.percentile(t, 99)), 3),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": round(self.cached_tokens / max(self.prompt_tokens, 1), 4),
            "router_overhead_mean_us": round(self.overhead.get("mean_us", 0.0), 1),
            "router_overhead_p99_us": round(self.overhead.get("p99_us", 0.0), 1),
            "router_cpu_mean_us": round(self.overhead.get("cpu_mean_us", 0.0), 1),
            "decisions": self.decisions,
        }


# ---------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cmd: list[str], core: str | None) -> subprocess.Popen:
    if core is not None and shutil_which("taskset"):
        cmd = ["taskset", "-c", core, *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)


def shutil_which(name: str) -> bool:
    import shutil

    return shutil.which(name) is not None


def start_replica(args: argparse.Namespace, core: str) -> tuple[subprocess.Popen, str]:
    port, events, replay = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "api.cli", "serve", "--model", str(args.model), "--no-disk"]
    cmd += ["--port", str(port), "--threads", "1", "--log-level", "warning"]
    cmd += ["--kv-memory", args.kv_memory, "--max-num-seqs", "16"]
    cmd += ["--kv-events-endpoint", f"tcp://127.0.0.1:{events}"]
    cmd += ["--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}"]
    proc = spawn(cmd, core)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, f"{url},tcp://127.0.0.1:{events},tcp://127.0.0.1:{replay}"


def start_router(
    args: argparse.Namespace, policy: str, replicas: list[str]
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "api.cli", "route", "--model", str(args.model), "--policy", policy]
    cmd += ["--port", str(port), "--log-level", "warning"]
    for spec in replicas:
        cmd += ["--replica", spec]
    proc = spawn(cmd, None)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling interval
    raise RuntimeError(f"{url} did not become healthy")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


# ---------------------------------------------------------------- workload
def random_text(tokenizer, n: int, rng: random.Random) -> str:
    """Text of about n tokens: random ids from [100, vocab - 100) decoded (no special tokens)."""
    vocab = tokenizer.vocab_size
    ids = [rng.randrange(100, vocab - 100) for _ in range(n)]
    return tokenizer.decode(ids)


def build_workload(shape: Shape, tokenizer, seed: int = 1) -> tuple[list[str], list[list[str]]]:
    rng = random.Random(seed)
    systems = [random_text(tokenizer, shape.system_tokens, rng) for _ in range(shape.agents)]
    messages = [
        [random_text(tokenizer, shape.message_tokens, rng) for _ in range(shape.turns)]
        for _ in range(shape.users)
    ]
    return systems, messages


async def run_user(
    client: httpx.AsyncClient, model: str, system: str, turns: list[str], shape: Shape, row: Row
) -> None:
    history = [{"role": "system", "content": system}]
    for text in turns:
        history.append({"role": "user", "content": text})
        body = {
            "model": model,
            "messages": history,
            "max_tokens": shape.answer_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        first, answer = None, []
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                for choice in chunk.get("choices", []):
                    if choice["delta"].get("content"):
                        first = first or time.perf_counter()
                        answer.append(choice["delta"]["content"])
                usage = chunk.get("usage")
                if usage:
                    row.prompt_tokens += usage["prompt_tokens"]
                    row.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
        row.ttft.append((first or time.perf_counter()) - t0)
        history.append({"role": "assistant", "content": "".join(answer)})


async def run_row(
    url: str, model: str, shape: Shape, systems: list[str], messages: list[list[str]], row: Row
) -> None:
    timeout = httpx.Timeout(1800, connect=10)
    limits = httpx.Limits(max_connections=shape.users + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(
            *(
                run_user(client, model, systems[u % shape.agents], messages[u], shape, row)
                for u in range(shape.users)
            )
        )
        row.total_s = time.perf_counter() - t0


def flush(replica_specs: list[str]) -> None:
    for spec in replica_specs:
        url = spec.split(",")[0]
        httpx.post(f"{url}/v1/cache/flush", json={}, timeout=60).raise_for_status()


# ---------------------------------------------------------------- router's own time, 4,096 tokens
def overhead_4096(model_dir: Path, repeats: int = 20) -> dict:
    from api.router.index import ReplicaIndex
    from api.router.policy import Balance, Router
    from api.router.replicas import Replica, ReplicaSpec
    from api.router.tokenize import PromptTokenizer

    tok = PromptTokenizer(model_dir)
    rng = random.Random(7)
    system = random_text(tok._tok, 4000, rng)
    replicas = [
        Replica(f"r{i}", ReplicaSpec(f"http://x{i}"), ReplicaIndex(1 << 20)) for i in range(2)
    ]
    for k in range(2000):  # other users' histories: ~32k blocks per index
        replicas[k % 2].index.sent([rng.randrange(100, 40000) for _ in range(256)])
    router = Router("cache-aware", Balance())
    out: dict[str, float] = {}
    for label, fresh in (("first_sight", True), ("system_prompt_seen", False)):
        tokenize, route, n = [], [], 0
        for i in range(repeats):
            head = system if not fresh else random_text(tok._tok, 4000, rng)
            msgs = [
                {"role": "system", "content": head},
                {"role": "user", "content": f"question {i}"},
            ]
            t0 = time.perf_counter()
            tokens = tok.chat(msgs)
            t1 = time.perf_counter()
            decision = router.choose(replicas, tokens)
            t2 = time.perf_counter()
            decision.replica.sent(tokens)
            tokenize.append((t1 - t0) * 1e6)
            route.append((t2 - t1) * 1e6)
            n = len(tokens)
        out[f"{label}_tokens"] = n
        out[f"{label}_tokenize_us"] = round(float(np.median(tokenize)), 1)
        out[f"{label}_route_us"] = round(float(np.median(route)), 1)
        out[f"{label}_total_us"] = round(float(np.median(tokenize) + np.median(route)), 1)
    return out


# ---------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="8 users x 2 turns, 2 agents, 256 tokens")
    p.add_argument("--model", type=Path, default=MODEL_DIR)
    p.add_argument("--kv-memory", default="1G", help="device KV pool per replica")
    p.add_argument(
        "--rows",
        default="cache-aware,round-robin,least-loaded,single",
        help="comma-separated: cache-aware, round-robin, least-loaded, single",
    )
    args = p.parse_args()
    shape = QUICK if args.quick else Shape()
    from api.router.tokenize import PromptTokenizer

    systems, messages = build_workload(shape, PromptTokenizer(args.model)._tok)
    model = args.model.name
    procs = [start_replica(args, core) for core in ("0", "1")]
    specs = [spec for _, spec in procs]
    rows: list[dict] = []
    try:
        for name in args.rows.split(","):
            policy, targets = (name, specs) if name != "single" else ("cache-aware", specs[:1])
            flush(specs)
            router, url = start_router(args, policy, targets)
            row = Row(name if name != "single" else "single replica")
            try:
                asyncio.run(run_row(url, model, shape, systems, messages, row))
                stats = httpx.get(f"{url}/v1/router/stats", timeout=30).json()
                row.overhead, row.decisions = stats["overhead"], stats["decisions"]
            finally:
                stop(router)
            rows.append(row.summary())
            print_row(rows[-1], header=len(rows) == 1)
    finally:
        for proc, _ in procs:
            stop(proc)
    extra = overhead_4096(args.model)
    print(
        f"router time for a {extra['first_sight_tokens']}-token chat prompt: first sight "
        f"{extra['first_sight_total_us']:.0f} us (tokenize {extra['first_sight_tokenize_us']:.0f}, "
        f"route {extra['first_sight_route_us']:.0f}); system prompt seen before "
        f"{extra['system_prompt_seen_total_us']:.0f} us (tokenize "
        f"{extra['system_prompt_seen_tokenize_us']:.0f}, route {extra['system_prompt_seen_route_us']:.0f})"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "shape": vars(shape),
        "kv_memory": args.kv_memory,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows, "overhead_4096": extra}, indent=2))
    print(f"wrote {RESULTS}")


def print_row(r: dict, header: bool) -> None:
    if header:
        print(
            f"{'row':<16}{'total s':>9}{'TTFT mean/p50/p99 s':>22}{'hit':>8}{'prompt':>9}"
            f"{'cached':>9}{'router us wall/cpu':>20}  decisions"
        )
    ttft = f"{r['ttft_mean_s']:.2f}/{r['ttft_p50_s']:.2f}/{r['ttft_p99_s']:.2f}"
    router = f"{r['router_overhead_mean_us']:.0f}/{r['router_cpu_mean_us']:.0f}"
    print(
        f"{r['name']:<16}{r['total_s']:>9.1f}{ttft:>22}{r['hit_rate']:>8.3f}{r['prompt_tokens']:>9}"
        f"{r['cached_tokens']:>9}{router:>20}  {r['decisions']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
