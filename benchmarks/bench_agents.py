"""The agent workload: 8 agents share a ~2,000-token system prompt that is mostly 20 tool
definitions (realistic JSON-schema tools), and each runs 4 turns: ask -> a tool call -> the tool's
result appended -> the next call. Run against `radixcache serve` and, live, against `vllm serve`
on the same model folder with the same ChatML hermes tool template (`--enable-auto-tool-choice
--tool-call-parser hermes --chat-template api/templates/chatml_hermes_tools.jinja`).

    python -m benchmarks.bench_agents [--vllm-python /work/venvs/vllm/bin/python]
        [--agents 8] [--turns 4] [--tool-choice required|auto]

Per server: wall time of the whole workload, TTFT (first streamed delta with content or a tool
call, mean / p50 / p99), the cached share of prompt tokens (usage.prompt_tokens_details), and the
share of turns whose output parses into a call of a declared tool with arguments that validate
against its schema. Without --vllm-python (or when that interpreter is missing) only our side runs
and a note says so. Writes benchmarks/results/agents.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from benchmarks.processes import ROOT, free_port, spawn, sse_chunks, stop, wait_healthy
from benchmarks.results_io import write_results

VLLM_CLI = ROOT / "benchmarks" / "vllm_cli.py"
TEMPLATE = ROOT / "api" / "templates" / "chatml_hermes_tools.jinja"
DOMAINS = [
    ("calendar", "events", "a calendar event"),
    ("email", "messages", "an email message"),
    ("crm", "contacts", "a customer contact"),
    ("tickets", "issues", "a support ticket"),
    ("inventory", "items", "a warehouse item"),
]
VERBS = [
    ("search", "Search {plural} in the {domain} system by free text and filters"),
    ("get", "Fetch one of the {plural} of the {domain} system by its identifier"),
    ("create", "Create {one} in the {domain} system"),
    ("update", "Change fields of {one} in the {domain} system"),
]


def make_tools() -> list[dict[str, Any]]:
    """20 tools: 5 domains x search / get / create / update, with typed, bounded parameters."""
    tools = []
    for domain, plural, one in DOMAINS:
        for verb, text in VERBS:
            props: dict[str, Any] = {}
            if verb == "search":
                props["query"] = {"type": "string", "maxLength": 40}
                props["sort"] = {"type": "string", "enum": ["newest", "oldest", "relevance"]}
                required = ["query"]
            else:
                props["id"] = {"type": "string", "maxLength": 16}
                required = ["id"]
            if verb in ("create", "update"):
                props["title"] = {"type": "string", "maxLength": 40}
                props["priority"] = {"type": "string", "enum": ["low", "normal", "high"]}
                required = ["id", "title"] if verb == "update" else ["title"]
                if verb == "create":
                    props.pop("id")
            description = text.format(plural=plural, domain=domain, one=one) + "."
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": f"{domain}_{verb}",
                        "description": description,
                        "parameters": {
                            "type": "object",
                            "properties": props,
                            "required": required,
                            "additionalProperties": False,
                        },
                    },
                }
            )
    return tools


POLICY = (
    "You are an operations agent for a mid-sized company. You act only through the tools "
    "listed below and never invent identifiers: search first, then fetch, then change. Keep "
    "every argument short and exact. When a tool returns an error, try a narrower search. "
    "Rules of the house: respect customer privacy, never delete data, log every change with a "
    "short title, prefer the newest records, and stop once the user's request is fulfilled. "
)
TASKS = [
    "Find the overdue support tickets about billing and raise their priority.",
    "Schedule a review meeting with the customer who wrote about the late delivery.",
    "Check whether we still have blue widgets in stock and tag them for reorder.",
    "Look up the contact details of ACME's purchasing manager.",
    "Answer the latest email from the finance team about the quarterly report.",
    "Create a ticket for the broken printer on the third floor.",
    "Move tomorrow's stand-up to the afternoon and tell the team.",
    "List the items that went out of stock this week.",
]


def system_prompt(target_tokens: int, count: Any) -> str:
    """POLICY repeated until the system message with the tools is about target_tokens long."""
    text = POLICY
    while count(text) < target_tokens:
        text += POLICY
    return text


def tool_result(name: str, turn: int) -> str:
    return json.dumps(
        {
            "ok": True,
            "tool": name,
            "results": [{"id": f"R{turn}{i}", "status": "open"} for i in range(3)],
        }
    )


async def one_turn(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[float, list[dict[str, Any]], str, dict[str, Any]]:
    """Streams one request: (TTFT s, calls as [{"name", "arguments"}], content, usage)."""
    t0 = time.perf_counter()
    ttft = None
    calls: dict[int, dict[str, Any]] = {}
    content, usage = "", {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread()).decode()[:300]}")
        async for chunk in sse_chunks(resp):
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", ()):
                delta = choice.get("delta", {})
                if ttft is None and (delta.get("content") or delta.get("tool_calls")):
                    ttft = time.perf_counter() - t0
                content += delta.get("content") or ""
                for tc in delta.get("tool_calls") or ():
                    call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    call["name"] += fn.get("name") or ""
                    call["arguments"] += fn.get("arguments") or ""
    return ttft or time.perf_counter() - t0, [calls[i] for i in sorted(calls)], content, usage


def valid_call(calls: list[dict[str, Any]], schemas: dict[str, Any]) -> bool:
    if len(calls) != 1 or calls[0]["name"] not in schemas:
        return False
    try:
        jsonschema.validate(json.loads(calls[0]["arguments"]), schemas[calls[0]["name"]])
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


async def run_agent(
    client: httpx.AsyncClient, args: Any, model: str, system: str, tools: list, task: str
) -> list[dict[str, Any]]:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task},
    ]
    turns = []
    for turn in range(args.turns):
        body = {
            "model": model,
            "messages": messages,
            "tools": tools,
            "tool_choice": args.tool_choice,
            "parallel_tool_calls": False,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        ttft, calls, content, usage = await one_turn(client, body)
        ok = valid_call(calls, schemas)
        prompt = usage.get("prompt_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        turns.append({"ttft": ttft, "valid": ok, "prompt": prompt, "cached": cached})
        call = calls[0] if calls else {"name": "unknown", "arguments": "{}"}
        call_id = f"call_{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": content or None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": tool_result(call["name"], turn)}
        )
    return turns


async def workload(url: str, args: Any, model: str, system: str, tools: list) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=1800) as client:
        t0 = time.perf_counter()
        per_agent = await asyncio.gather(
            *(
                run_agent(client, args, model, system, tools, TASKS[i % len(TASKS)])
                for i in range(args.agents)
            )
        )
        wall = time.perf_counter() - t0
    turns = [t for agent in per_agent for t in agent]
    ttfts = sorted(t["ttft"] for t in turns)
    prompt = sum(t["prompt"] for t in turns)
    return {
        "time_s": round(wall, 2),
        "ttft_mean_ms": round(1000 * statistics.mean(ttfts), 1),
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
        "ttft_p99_ms": round(1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1),
        "cached_share": round(sum(t["cached"] for t in turns) / max(prompt, 1), 3),
        "valid_share": round(sum(t["valid"] for t in turns) / len(turns), 3),
        "turns": len(turns),
        "prompt_tokens": prompt,
    }


def start_ours(model: Path, dtype: str, port: int):
    cmd = [sys.executable, "-m", "api.cli", "serve", "--model", str(model), "--dtype", dtype]
    cmd += ["--port", str(port), "--max-num-seqs", "16", "--no-disk", "--log-level", "warning"]
    cmd += ["--max-model-len", "4096"]
    return spawn(cmd)


def start_vllm(python: str, model: Path, dtype: str, port: int, name: str):
    cmd = [python, str(VLLM_CLI), "serve", str(model), "--port", str(port), "--dtype", dtype]
    cmd += ["--served-model-name", name, "--max-model-len", "4096", "--max-num-seqs", "16"]
    cmd += ["--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    cmd += ["--chat-template", str(TEMPLATE)]
    return spawn(cmd)


def run_system(system: str, args: Any, prompt_text: str, tools: list) -> dict[str, Any]:
    port, name = free_port(), args.model.name
    if system == "radixcache":
        proc = start_ours(args.model, args.dtype, port)
    else:
        proc = start_vllm(args.vllm_python, args.model, args.dtype, port, name)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        row = asyncio.run(workload(url, args, name, prompt_text, tools))
    finally:
        stop(proc)
    return {"system": system, **row}


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'system':<11} {'time s':>8} {'TTFT mean':>10} {'p50':>8} {'p99':>8} "
        f"{'cached':>7} {'valid':>6} {'turns':>6}"
    )
    for r in rows:
        print(
            f"{r['system']:<11} {r['time_s']:8.2f} {r['ttft_mean_ms']:8.0f}ms "
            f"{r['ttft_p50_ms']:6.0f}ms {r['ttft_p99_ms']:6.0f}ms {r['cached_share']:7.1%} "
            f"{r['valid_share']:6.1%} {r['turns']:6d}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vllm-python", default=None, help="vLLM's interpreter (PEERS.md)")
    p.add_argument("--model", type=Path, default=None, help="HF folder (default model)")
    p.add_argument("--dtype", default="auto", help="auto: what `radixcache serve` picks here")
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=2000, help="system prompt with tools")
    p.add_argument("--max-tokens", type=int, default=96, help="per turn")
    p.add_argument("--tool-choice", default="required", choices=["required", "auto"])
    args = p.parse_args()
    os.environ.pop("GOMP_CPU_AFFINITY", None)  # as bench_serving_vs_vllm: no pinned threads
    from api.openai.protocol import ChatCompletionRequest
    from api.router.tokenize import PromptTokenizer
    from engine.dtypes import resolve_dtype
    from engine.loader import ensure_default_model

    args.model = args.model or ensure_default_model()
    args.dtype = resolve_dtype(args.dtype, "cpu")
    tools = make_tools()
    renderer = PromptTokenizer(args.model)

    def count(text: str) -> int:
        req = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "system", "content": text}], "tools": tools},
            strict=False,
        )
        return len(renderer.chat(req.chat_prompt()))

    system = system_prompt(args.system_tokens, count)
    print(f"system prompt with {len(tools)} tools: {count(system)} tokens")
    systems = ["radixcache"]
    if args.vllm_python and Path(args.vllm_python).exists():
        systems.append("vllm")
    else:
        print(f"note: no vLLM interpreter at {args.vllm_python!r}: only radixcache runs")
    rows = []
    for system_name in systems:
        rows.append(run_system(system_name, args, system, tools))
        print_rows(rows[-1:])
    if len(rows) == 2:
        rows[0]["time_vs_vllm"] = round(rows[0]["time_s"] / rows[1]["time_s"], 2)
    print(f"\nagents: {args.agents} x {args.turns} turns, tool_choice {args.tool_choice}")
    print_rows(rows)
    out = write_results(
        "agents",
        rows,
        model=str(args.model),
        dtype=args.dtype,
        agents=args.agents,
        turns=args.turns,
        tool_choice=args.tool_choice,
        system_tokens=count(system),
        settings_that_differ=(
            "vLLM: enforce_eager, KV 4 GiB, OMP bound to cores 0-1, hermes parser, same "
            "template file; ours: default token budget, no disk tier; both: max_model_len 4096, "
            "16 running, prefix caching on"
        ),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
