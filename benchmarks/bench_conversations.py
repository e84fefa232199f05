"""One conversation two ways: a 10-turn chat continued through /v1/responses with
`previous_response_id` (each turn sends its new message and the system text as `instructions`,
which by the API's rules never carry over; the server keeps the rest) against
the same chat re-sending its whole history to /v1/chat/completions, on one server. With
--vllm-python, the same two conversations run on vLLM's CPU build (`vllm serve` on the same model
folder, its Responses store on: VLLM_ENABLE_RESPONSES_API_STORE=1).

    python -m benchmarks.bench_conversations [--vllm-python /work/peers/vllmenv/bin/python]
        [--turns 10] [--system-tokens 1000] [--max-tokens 64]

Per turn: the request body's size in bytes, TTFT (streamed: the first output_text.delta / the
first content delta), the prompt tokens and the cached ones the server reports. Each conversation
opens with a system message of its own (no conversation finds another's prefix cached); the user
messages are the same for all. Greedy decoding. Writes benchmarks/results/conversations.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.processes import ROOT, free_port, spawn, sse_chunks, stop, wait_healthy
from benchmarks.results_io import write_results

VLLM_CLI = ROOT / "benchmarks" / "vllm_cli.py"
APIS = ("responses", "chat")
POLICY = (
    "You are the support assistant of a small online bookshop. Answer in plain sentences, at "
    "most three of them. Orders ship within two working days; returns are free within thirty "
    "days if the book is unread; gift cards never expire; the shop delivers to the whole "
    "European Union and charges a flat fee of four euros below forty euros of books. "
)
QUESTIONS = [
    "Hello! I ordered two novels yesterday. When will they ship?",
    "Can I still add a third book to that order?",
    "What does delivery to Portugal cost for a 25 euro order?",
    "One of the books arrived with a torn cover. What can I do?",
    "Do you sell gift cards, and do they expire?",
    "I read half of a book and did not like it. Can I return it?",
    "Which payment methods do you accept?",
    "Could you recommend a short mystery novel for a train ride?",
    "How do I change the delivery address of an order?",
    "Thanks. Can you summarise what we discussed in two sentences?",
]


def system_text(tag: str, target_tokens: int, count: Any) -> str:
    """POLICY repeated to about target_tokens, opened by `tag` (so no two conversations share a
    cached prefix)."""
    text = f"[{tag}] {POLICY}"
    while count(text) < target_tokens:
        text += POLICY
    return text


async def stream(client: httpx.AsyncClient, path: str, body: dict) -> tuple[float, dict]:
    """Sends body, reads the stream: (TTFT s, what the API returned at the end)."""
    content = json.dumps(body).encode()
    t0 = time.perf_counter()
    ttft, text, final = None, [], {}
    async with client.stream(
        "POST", path, content=content, headers={"content-type": "application/json"}
    ) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{path}: {resp.status_code} {(await resp.aread())[:500]!r}")
        async for chunk in sse_chunks(resp):
            delta = _delta(chunk)
            if delta and ttft is None:
                ttft = time.perf_counter() - t0
            text.append(delta)
            if chunk.get("type") in ("response.completed", "response.incomplete"):
                final = chunk["response"]  # incomplete: max_output_tokens reached
            elif chunk.get("type") in ("error", "response.failed"):
                raise RuntimeError(f"{path}: {chunk}")
            elif chunk.get("usage"):
                final = chunk
    final["text"], final["bytes_sent"] = "".join(text), len(content)
    return (ttft if ttft is not None else time.perf_counter() - t0), final


def _delta(chunk: dict) -> str:
    if chunk.get("type") == "response.output_text.delta":
        return chunk.get("delta", "")
    choices = chunk.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


async def responses_conversation(url: str, args: Any, model: str, system: str) -> list[dict]:
    rows, previous = [], None
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for turn, question in enumerate(QUESTIONS[: args.turns], 1):
            user = {"role": "user", "content": question}
            body: dict[str, Any] = {
                "model": model,
                "instructions": system,  # instructions never carry over to the next response
                "input": [user],
                "stream": True,
                "store": True,
                "max_output_tokens": args.max_tokens,
                "temperature": 0,
            }
            if previous is not None:
                body["previous_response_id"] = previous
            ttft, final = await stream(client, "/v1/responses", body)
            previous = final["id"]
            usage = final.get("usage") or {}
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
            rows.append(_row(turn, final["bytes_sent"], ttft, usage.get("input_tokens"), cached))
    return rows


async def chat_conversation(url: str, args: Any, model: str, system: str) -> list[dict]:
    rows, messages = [], [{"role": "system", "content": system}]
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for turn, question in enumerate(QUESTIONS[: args.turns], 1):
            messages.append({"role": "user", "content": question})
            body = {
                "model": model,
                "messages": messages,
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            ttft, final = await stream(client, "/v1/chat/completions", body)
            messages.append({"role": "assistant", "content": final["text"]})
            usage = final.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            rows.append(_row(turn, final["bytes_sent"], ttft, usage.get("prompt_tokens"), cached))
    return rows


def _row(turn: int, sent: int, ttft: float, prompt: int | None, cached: int | None) -> dict:
    return {
        "turn": turn,
        "bytes_sent": sent,
        "ttft_ms": round(ttft * 1000, 1),
        "prompt_tokens": prompt,
        "cached_tokens": cached or 0,
    }


def start_ours(model: Path, dtype: str, port: int, store: Path):
    cmd = [sys.executable, "-m", "api.cli", "serve", "--model", str(model), "--dtype", dtype]
    cmd += ["--port", str(port), "--no-disk", "--log-level", "warning"]
    cmd += ["--max-model-len", "4096"]
    return spawn(cmd, env={"RADIXCACHE_HOME": str(store)})  # a fresh response store


def start_vllm(python: str, model: Path, dtype: str, port: int, name: str):
    cmd = [python, str(VLLM_CLI), "serve", str(model), "--port", str(port), "--dtype", dtype]
    cmd += ["--served-model-name", name, "--max-model-len", "4096", "--max-num-seqs", "16"]
    cmd += ["--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    return spawn(cmd, env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"})


def run_system(system: str, args: Any, count: Any, tmp: Path) -> list[dict]:
    port, name = free_port(), args.model.name
    if system == "radixcache":
        proc = start_ours(args.model, args.dtype, port, tmp)
    else:
        proc = start_vllm(args.vllm_python, args.model, args.dtype, port, name)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        wait_healthy(url, proc)
        for api in args.apis:
            prompt = system_text(f"{system} {api}", args.system_tokens, count)
            run = responses_conversation if api == "responses" else chat_conversation
            for row in asyncio.run(run(url, args, name, prompt)):
                rows.append({"system": system, "api": api, **row})
                print_rows(rows[-1:])
    finally:
        stop(proc)
    return rows


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(
            f"{r['system']:<11} {r['api']:<10} turn {r['turn']:>2}  {r['bytes_sent']:>7} B sent  "
            f"TTFT {r['ttft_ms']:8.1f} ms  prompt {r['prompt_tokens'] or 0:>5}  "
            f"cached {r['cached_tokens']:>5}"
        )


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for system in dict.fromkeys(r["system"] for r in rows):
        for api in APIS:
            run = [r for r in rows if (r["system"], r["api"]) == (system, api)]
            if not run:
                continue
            later = [r["ttft_ms"] for r in run[1:]] or [run[0]["ttft_ms"]]
            prompt = sum(r["prompt_tokens"] or 0 for r in run)
            out.append(
                {
                    "system": system,
                    "api": api,
                    "turns": len(run),
                    "bytes_sent": sum(r["bytes_sent"] for r in run),
                    "ttft_first_ms": run[0]["ttft_ms"],
                    "ttft_later_mean_ms": round(statistics.mean(later), 1),
                    "cached_share": round(sum(r["cached_tokens"] for r in run) / prompt, 3)
                    if prompt
                    else 0.0,
                }
            )
    return out


def print_summary(summary: list[dict]) -> None:
    print(
        f"\n{'system':<11} {'api':<10} {'turns':>5} {'bytes sent':>11} {'TTFT 1st':>9} "
        f"{'TTFT later':>11} {'cached':>7}"
    )
    for s in summary:
        print(
            f"{s['system']:<11} {s['api']:<10} {s['turns']:>5} {s['bytes_sent']:>11} "
            f"{s['ttft_first_ms']:>7.1f}ms {s['ttft_later_mean_ms']:>9.1f}ms "
            f"{s['cached_share']:>7.1%}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vllm-python", default=None, help="vLLM's interpreter (PEERS.md)")
    p.add_argument("--model", type=Path, default=None, help="HF folder (default model)")
    p.add_argument("--dtype", default="auto", help="auto: what `radixcache serve` picks here")
    p.add_argument("--turns", type=int, default=10, choices=range(1, len(QUESTIONS) + 1))
    p.add_argument("--system-tokens", type=int, default=1000, help="system message length")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per turn (at most)")
    p.add_argument("--apis", nargs="+", choices=APIS, default=list(APIS), help="what to run")
    args = p.parse_args()
    os.environ.pop("GOMP_CPU_AFFINITY", None)  # as bench_serving_vs_vllm: no pinned threads

    from api.router.tokenize import PromptTokenizer
    from engine.dtypes import resolve_dtype
    from engine.loader import ensure_default_model

    args.model = args.model or ensure_default_model()
    args.dtype = resolve_dtype(args.dtype, "cpu")
    renderer = PromptTokenizer(args.model)

    def count(text: str) -> int:
        return len(renderer.chat([{"role": "system", "content": text}]))

    systems = ["radixcache"]
    if args.vllm_python and Path(args.vllm_python).exists():
        systems.append("vllm")
    elif args.vllm_python:
        print(f"note: no vLLM interpreter at {args.vllm_python!r}: only radixcache runs")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for system in systems:
            rows += run_system(system, args, count, Path(tmp))
    summary = summarize(rows)
    print(f"\n{args.turns} turns, system message ~{args.system_tokens} tokens, {args.dtype}")
    print_summary(summary)
    out = write_results(
        "conversations",
        rows,
        summary=summary,
        model=str(args.model),
        dtype=args.dtype,
        turns=args.turns,
        system_tokens=args.system_tokens,
        max_tokens=args.max_tokens,
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
