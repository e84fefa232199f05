"""The workloads of bench_spec (token ids, fixed): REPEAT, EDIT, AGENT and FREE, each a list of
waves; a wave's prompts may extend the answers of the wave before (multi-turn rows).

Real text comes from this repository (README.md and source files), rendered through the model's
chat template; AGENT reuses bench_agents' tools, policy, tasks and tool results."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_agents import POLICY, TASKS, make_tools, tool_result
from benchmarks.workloads import gsp_prompts, mt_turns

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    "README.md",
    "radixcache/radix_tree.py",
    "engine/scheduler.py",
    "engine/kv/manager.py",
    "engine/sampler.py",
    "api/observability/metrics.py",
    "storage/disk.py",
    "engine/llm_engine.py",
]
EDITS = [
    "Repeat the following text exactly, without any change:",
    "Rewrite the following text, replacing every 'cache' with 'store' and keeping the rest:",
    "Copy this passage and fix any typos you find, changing nothing else:",
]
CHATS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain to a child why the sky is blue.",
    "Give me three ideas for a weekend trip in the mountains, with reasons.",
    "What are the pros and cons of working from home?",
    "Describe how bread is made, step by step.",
    "Write a poem about autumn leaves.",
    "How do vaccines train the immune system?",
    "Suggest a name for a coffee shop and explain it.",
    "Write a letter to a friend who moved to another country.",
    "What should I pack for a week of camping by a lake?",
    "Explain how a bicycle stays upright when it moves.",
    "Tell me a fable about a fox and a crow, with its moral.",
    "How can I start learning to play the piano as an adult?",
    "Describe a busy market in the morning, in a few paragraphs.",
    "What makes a good team leader? Give examples.",
    "Write a short dialogue between a robot and a gardener.",
    "Why do cats purr? Explain what is known.",
    "Plan a simple vegetarian dinner for four people.",
    "Describe the water cycle for a school report.",
    "Write a story about a train that runs through the night.",
    "What are good habits for sleeping well?",
    "Explain the rules of chess to a beginner.",
    "Write a poem about the sea in winter.",
    "How does a refrigerator keep food cold?",
]

Next = Callable[[list[list[int]], list[list[int]]], list[list[int]]]  # (prompts, answers) -> next


@dataclass
class Workload:
    name: str
    group: str  # REPEAT | EDIT | AGENT | FREE
    waves: list[list[list[int]]]  # the first wave's prompts (later waves come from `next_wave`)
    max_tokens: int
    ignore_eos: bool = False
    untimed_waves: int = 0  # leading waves that only warm the cache (REPEAT's first)
    num_waves: int = 1
    next_wave: Next | None = None  # builds wave i + 1 from wave i's prompts and answers
    meta: dict[str, Any] = field(default_factory=dict)


def passage(path: str, chars: int, offset: int = 0) -> str:
    text = (ROOT / path).read_text()
    return text[offset : offset + chars]


def chat(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(tok.apply_chat_template(messages))


def source_passages(n: int, chars: int) -> list[str]:
    """n passages of `chars` characters: each source's first, then each one's next, ..."""
    return [passage(SOURCES[i % len(SOURCES)], chars, i // len(SOURCES) * chars) for i in range(n)]


def repeat(tok: Any, n: int, max_tokens: int) -> Workload:
    prompts = [
        chat(tok, [{"role": "user", "content": "Explain what this code does:\n\n" + text}])
        for text in source_passages(n, 700)
    ]
    same: Next = lambda prompts, answers: prompts  # noqa: E731 - the same prompts again
    return Workload("repeat", "REPEAT", [prompts], max_tokens, False, 1, 2, same)


def edit(tok: Any, n: int, max_tokens: int) -> Workload:
    prompts = [
        chat(tok, [{"role": "user", "content": EDITS[i % len(EDITS)] + "\n\n" + text}])
        for i, text in enumerate(source_passages(n, 600))
    ]
    return Workload("edit", "EDIT", [prompts], max_tokens)


def agent(tok: Any, n: int, max_tokens: int, turns: int = 3) -> Workload:
    """n agents, `turns` turns: the tools as JSON text in the system message (free decoding: the
    model writes its call as text), each answer followed by a tool result."""
    tools = json.dumps([t["function"] for t in make_tools()])
    system = POLICY + '\nTools (answer with one JSON call {"name", "arguments"}):\n' + tools
    messages = [
        [{"role": "system", "content": system}, {"role": "user", "content": task}]
        for task in TASKS[:n]
    ]
    histories = {"turn": 0, "messages": messages}

    def next_wave(prompts: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
        histories["turn"] += 1
        out = []
        for history, answer in zip(histories["messages"], answers, strict=True):
            history.append({"role": "assistant", "content": tok.decode(answer)})
            result = tool_result("tool", histories["turn"])
            history.append({"role": "user", "content": f"Tool result: {result}\nNext call?"})
            out.append(chat(tok, history))
        return out

    first = [chat(tok, m) for m in messages]
    return Workload("agent", "AGENT", [first], max_tokens, False, 0, turns, next_wave)


def free_chat(tok: Any, n: int, max_tokens: int) -> Workload:
    prompts = [chat(tok, [{"role": "user", "content": c}]) for c in CHATS[:n]]
    return Workload("chat", "FREE", [prompts], max_tokens)


def free_gsp(vocab: int, groups: int) -> Workload:
    """GSP-small (DESIGN.md): the first 8 x `groups` shuffled prompts (8 groups: the shape)."""
    prompts = gsp_prompts(vocab)[: 8 * groups]
    return Workload("gsp-small", "FREE", [prompts], 32, True)


def free_mt(vocab: int, n: int) -> Workload:
    """MT-small (DESIGN.md): n users x 4 turns over the shared system prompt."""
    mt = mt_turns(vocab)
    users = min(n, len(mt.turns[0]))
    state = {"turn": 0}

    def next_wave(prompts: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
        state["turn"] += 1
        messages = mt.turns[state["turn"]][:users]
        return [p + a + m for p, a, m in zip(prompts, answers, messages, strict=True)]

    first = [mt.system + m for m in mt.turns[0][:users]]
    return Workload("mt-small", "FREE", [first], 32, True, 0, len(mt.turns), next_wave)


NAMES = ("repeat", "edit", "agent", "chat", "mt-small", "gsp-small")


def build(name: str, tok: Any, vocab: int, n: int, max_tokens: int, gsp_groups: int) -> Workload:
    """A fresh workload (multi-turn ones keep their histories: one per run)."""
    builders: dict[str, Callable[[], Workload]] = {
        "repeat": lambda: repeat(tok, n, max_tokens),
        "edit": lambda: edit(tok, n, max_tokens),
        "agent": lambda: agent(tok, n, max_tokens),
        "chat": lambda: free_chat(tok, n, max_tokens),
        "mt-small": lambda: free_mt(vocab, n),
        "gsp-small": lambda: free_gsp(vocab, gsp_groups),
    }
    return builders[name]()
