"""Router benchmark: `radixcache route` in front of 2 `radixcache serve` replicas (1 core each).

Workloads (benchmarks/router_workload.py): `--workload issue` (issue 11's: 32 users x 4 turns, 4
agent types with 1,024-token system prompts, 64-token messages, 32-token answers) and
`--workload long-history` (16 users x 3 turns, one 128-token system prompt, 512-token messages,
128-token answers: the history, not the system prompt, is most of each prompt). Each turn appends
a user message; the answer (greedy, ignore EOS) is appended to that user's history. Every user
runs its turns one after the other and all users run at once (closed loop).

Rows: the router with --policy cache-aware / round-robin / least-loaded over 2 replicas, and a
single replica behind the same router. Caches are flushed before every row. The header gives the
hit rates the workload allows (system prompts only, round-robin by chance, the ceiling). Reports
total time, TTFT mean/p50/p99 (client side, streaming), hit rate (reported cached / prompt tokens,
from `usage`) and the router's own time per request (tokenizing + choosing, from
/v1/router/stats); then the router's time for a 4,096-token chat prompt seen before, as a
conversation's next turn (its last answer and new message unseen) and fully new, measured on the
router's parts in this process. Prints a table and writes benchmarks/results/router.json.

    python -m benchmarks.bench_router                           # the issue's shape
    python -m benchmarks.bench_router --workload long-history   # history-heavy chats
    python -m benchmarks.bench_router --quick                   # a small version of either

vLLM replicas (`--vllm-python`) are not part of this script yet.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from benchmarks.processes import free_port, spawn, sse_chunks, stop, wait_healthy
from benchmarks.results_io import write_results
from benchmarks.router_workload import SHAPES, Shape, build_workload, random_text, reuse_bounds

MODEL_DIR = Path.home() / ".cache" / "radixcache" / "models" / "SmolLM2-135M-Instruct"


@dataclass
class Row:
    name: str
    total_s: float = 0.0
    ttft: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    overhead: dict = field(default_factory=dict)
    decisions: dict = field(default_factory=dict)
    tokenizer: dict = field(default_factory=dict)

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
            "stretches_tokenized": self.tokenizer.get("stretch_misses", 0),
            "stretches_reused": self.tokenizer.get("stretch_hits", 0),
        }


# ---------------------------------------------------------------- processes
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
    proc = spawn(cmd)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


# ---------------------------------------------------------------- workload
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
            async for chunk in sse_chunks(resp):
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
def conversation(sizer, rng: random.Random, tokens: int = 4096) -> list[dict]:
    """A chat of about `tokens` tokens: a 512-token system prompt, then turns of a 256-token
    message and a 64-token answer, ending with a message. `sizer` is a PromptTokenizer other than
    the one measured (whose own word cache would make a first sight look cheaper)."""
    msgs = [{"role": "system", "content": random_text(sizer.hf_tokenizer, 512, rng)}]
    while True:
        msgs.append({"role": "user", "content": random_text(sizer.hf_tokenizer, 256, rng)})
        if len(sizer.chat(msgs)) >= tokens:
            return msgs
        msgs.append({"role": "assistant", "content": random_text(sizer.hf_tokenizer, 64, rng)})


def overhead_4096(model_dir: Path, repeats: int = 20) -> dict:
    """Median router time for one ~4,096-token chat: `seen_before` (the same prompt again),
    `next_turn` (the router saw the conversation up to its previous message: the last answer and
    the new message are new, about 8% of the prompt, and are tokenized after routing) and
    `fully_new` (nothing seen before)."""
    from api.router.index import ReplicaIndex
    from api.router.policy import Balance, Router
    from api.router.replicas import Replica, ReplicaSpec
    from api.router.tokenize import PromptTokenizer

    tok = PromptTokenizer(model_dir)
    rng = random.Random(7)
    sizer = PromptTokenizer(model_dir)
    chats = [conversation(sizer, rng) for _ in range(repeats)]
    replicas = [
        Replica(f"r{i}", ReplicaSpec(f"http://x{i}"), ReplicaIndex(1 << 20)) for i in range(2)
    ]
    for k in range(2000):  # other users' histories: ~32k blocks per index
        replicas[k % 2].index.sent([rng.randrange(100, 40000) for _ in range(256)])
    router = Router("cache-aware", Balance())
    # first sight first: each chat is new to the tokenizer's own word cache too
    seen = {"fully_new": None, "next_turn": lambda m: m[:-2], "seen_before": lambda m: m}
    out: dict[str, float] = {}
    for label, earlier in seen.items():
        tokenize, route, cpu, new, deferred = [], [], [], [], []
        for msgs in chats:
            tok.segments.clear()
            if earlier is not None:
                tok.chat(earlier(msgs))
            misses = tok.segments.misses
            # the router's path (api/router/app.py): ids to route on, choose, note what was sent
            t0, c0 = time.perf_counter(), time.thread_time()
            tokens, tail = tok.chat_for_routing(msgs)
            t1 = time.perf_counter()
            decision = router.choose(replicas, tokens)
            decision.replica.sent(tokens)
            t2, c2 = time.perf_counter(), time.thread_time()
            # after it: the tail, tokenized while the replica works
            if tail:
                decision.replica.sent(tokens + tok.segments.encode_array(tail))
            t3 = time.perf_counter()
            tokenize.append((t1 - t0) * 1e6)
            route.append((t2 - t1) * 1e6)
            cpu.append((c2 - c0) * 1e6)
            deferred.append((t3 - t2) * 1e6)
            new.append(tok.segments.misses - misses)
        out[f"{label}_tokens"] = len(tokens) + len(tok.segments.encode(tail))
        out[f"{label}_routed_on_tokens"] = len(tokens)
        out[f"{label}_new_stretches"] = float(np.median(new))
        out[f"{label}_tokenize_us"] = round(float(np.median(tokenize)), 1)
        out[f"{label}_route_us"] = round(float(np.median(route)), 1)
        out[f"{label}_total_us"] = round(float(np.median(tokenize) + np.median(route)), 1)
        out[f"{label}_cpu_us"] = round(float(np.median(cpu)), 1)
        out[f"{label}_deferred_us"] = round(float(np.median(deferred)), 1)
    out["segmented"] = tok.segments.segmented
    return out


def print_overhead(extra: dict) -> None:
    print(
        f"router time for a ~{extra['fully_new_tokens']}-token chat prompt (median of 20, "
        f"on the request's path: tokenize + route, wall and CPU, in this process; then the tail "
        f"tokenized after routing; segmented: {extra['segmented']}):"
    )
    for label, what in (
        ("seen_before", "seen before"),
        ("next_turn", "next turn (last answer + new message unseen)"),
        ("fully_new", "fully new"),
    ):
        print(
            f"  {what:<46}{extra[f'{label}_total_us']:>7.0f} us, cpu "
            f"{extra[f'{label}_cpu_us']:>6.0f} us  (tokenize "
            f"{extra[f'{label}_tokenize_us']:.0f}, route {extra[f'{label}_route_us']:.0f}; routed "
            f"on {extra[f'{label}_routed_on_tokens']} tokens; after routing "
            f"{extra[f'{label}_deferred_us']:.0f} us; "
            f"{extra[f'{label}_new_stretches']:.0f} stretches tokenized)"
        )


# ---------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=sorted(SHAPES), default="issue")
    p.add_argument("--quick", action="store_true", help="a small version of the workload")
    p.add_argument("--model", type=Path, default=MODEL_DIR)
    p.add_argument("--kv-memory", default="1G", help="device KV pool per replica")
    p.add_argument(
        "--rows",
        default="cache-aware,round-robin,least-loaded,single",
        help="comma-separated: cache-aware, round-robin, least-loaded, single",
    )
    args = p.parse_args()
    shape = SHAPES[args.workload][1 if args.quick else 0]
    from api.router.tokenize import PromptTokenizer

    tok = PromptTokenizer(args.model)
    systems, messages = build_workload(shape, tok.hf_tokenizer)
    bounds = reuse_bounds(shape, systems, messages, tok, replicas=2)
    print(f"workload {args.workload}{' (quick)' if args.quick else ''}: {shape.describe()}")
    print(
        f"hit rates it allows (est.: turns one at a time, random answers): system prompts alone "
        f"{bounds['system']:.3f}"
        f", round-robin by chance {bounds['round_robin']:.3f}, ceiling {bounds['ceiling']:.3f}"
        f" -> cache-aware / round-robin <= ~{bounds['ceiling'] / bounds['round_robin']:.2f}"
    )
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
                row.tokenizer = stats["tokenizer"]
            finally:
                stop(router)
            rows.append(row.summary())
            print_row(rows[-1], header=len(rows) == 1)
    finally:
        for proc, _ in procs:
            stop(proc)
    extra = overhead_4096(args.model)
    print_overhead(extra)
    name = "router_quick" if args.quick else "router"  # never over the full run's figures
    results = write_results(
        name,
        rows,
        workload=args.workload,
        quick=args.quick,
        shape=vars(shape),
        bounds=bounds,
        kv_memory=args.kv_memory,
        overhead_4096=extra,
    )
    print(f"wrote {results}")


def print_row(r: dict, header: bool) -> None:
    if header:
        print(
            f"{'row':<16}{'total s':>9}{'TTFT mean/p50/p99 s':>22}{'hit':>8}{'prompt':>9}"
            f"{'cached':>9}{'router us wall/cpu':>20}{'stretches new/reused':>22}  decisions"
        )
    ttft = f"{r['ttft_mean_s']:.2f}/{r['ttft_p50_s']:.2f}/{r['ttft_p99_s']:.2f}"
    router = f"{r['router_overhead_mean_us']:.0f}/{r['router_cpu_mean_us']:.0f}"
    stretches = f"{r['stretches_tokenized']}/{r['stretches_reused']}"
    print(
        f"{r['name']:<16}{r['total_s']:>9.1f}{ttft:>22}{r['hit_rate']:>8.3f}{r['prompt_tokens']:>9}"
        f"{r['cached_tokens']:>9}{router:>20}{stretches:>22}  {r['decisions']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
