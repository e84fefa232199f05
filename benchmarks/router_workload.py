"""bench_router's workloads (multi-user chats, fixed seeds) and what each allows: the share of
prompt tokens a replica can have cached by the shared system prompts alone, by round-robin's
chance of landing a turn where an earlier one went, and at most (every turn on the replica holding
the user's previous turns).

- issue (issue 11): 32 users x 4 turns, 4 agent types each with its own 1,024-token system prompt,
  64-token messages, 32-token answers. The system prompts are most of every prompt, so every
  replica soon holds all of them and round-robin already hits most of what can be hit.
- long-history: 16 users x 3 turns, one 128-token system prompt, 512-token messages, 128-token
  answers. The conversation history, not the system prompt, is most of the prompt.

Why so few turns: with 2 replicas, a turn routed without regard to history still lands where the
user's previous turn went half the time, and otherwise finds an older turn there (1/4: two turns
back, ...), so round-robin misses about one turn's worth of history per request. The longer the
conversation, the smaller that share: cache-aware / round-robin is at most ~1.53 at 3 turns of
512 + 128 tokens, ~1.45 at 4, ~1.24 at 16 users x 8 turns of 256 + 64 (reuse_bounds computes it
for the workload at hand)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

BLOCK = 16  # the replicas' block size: only full blocks are cached


@dataclass(frozen=True)
class Shape:
    users: int
    turns: int
    agents: int
    system_tokens: int
    message_tokens: int
    answer_tokens: int

    def describe(self) -> str:
        return (
            f"{self.users} users x {self.turns} turns, {self.agents} system prompt(s) of "
            f"{self.system_tokens} tokens, {self.message_tokens}-token messages, "
            f"{self.answer_tokens}-token answers"
        )


SHAPES = {  # name: (full, --quick)
    "issue": (Shape(32, 4, 4, 1024, 64, 32), Shape(8, 2, 2, 256, 64, 32)),
    "long-history": (Shape(16, 3, 1, 128, 512, 128), Shape(4, 3, 1, 64, 256, 64)),
}


def random_text(tokenizer, n: int, rng: random.Random) -> str:
    """Text of about n tokens: random ids from [100, vocab - 100) decoded (no special tokens)."""
    vocab = tokenizer.vocab_size
    return tokenizer.decode([rng.randrange(100, vocab - 100) for _ in range(n)])


def build_workload(shape: Shape, tokenizer, seed: int = 1) -> tuple[list[str], list[list[str]]]:
    rng = random.Random(seed)
    systems = [random_text(tokenizer, shape.system_tokens, rng) for _ in range(shape.agents)]
    messages = [
        [random_text(tokenizer, shape.message_tokens, rng) for _ in range(shape.turns)]
        for _ in range(shape.users)
    ]
    return systems, messages


def reuse_bounds(
    shape: Shape, systems: list[str], messages: list[list[str]], tok, replicas: int
) -> dict[str, float]:
    """Hit rates the workload allows (cached tokens / prompt tokens), with answers of random text
    standing in for the model's: `system` (the system prompt and template head, which round-robin
    hits once every replica holds it), `round_robin` (expected when each turn lands on a replica
    at random: it hits the latest earlier turn sent there), `ceiling` (each turn lands on the
    replica holding the previous one). `tok` is the router's PromptTokenizer."""
    rng = random.Random(3)
    stay = 1 - 1 / replicas
    total = system = chance = ceiling = 0.0
    for u in range(shape.users):
        head = [{"role": "system", "content": systems[u % shape.agents]}]
        shared = tok.chat([*head, {"role": "user", "content": ""}])
        history, earlier = list(head), []  # earlier: each turn's prompt + answer ids
        for text in messages[u]:
            history.append({"role": "user", "content": text})
            prompt = tok.chat(history)
            sys_hit = _cached(prompt, shared)
            hits = [max(sys_hit, _cached(prompt, seq)) for seq in earlier]  # oldest first
            total += len(prompt)
            system += sys_hit
            ceiling += hits[-1] if hits else sys_hit
            # the latest earlier turn on the replica this one lands on is k turns back: (1-s) s^k
            latest = [(1 - stay) * stay**k * h for k, h in enumerate(reversed(hits))]
            chance += sum(latest) + stay ** len(hits) * sys_hit
            answer = random_text(tok.hf_tokenizer, shape.answer_tokens, rng)
            earlier.append(prompt + tok.encode(answer, add_special_tokens=False))
            history.append({"role": "assistant", "content": answer})
    return {
        "prompt_tokens": int(total),
        "system": round(system / total, 3),
        "round_robin": round(chance / total, 3),
        "ceiling": round(ceiling / total, 3),
    }


def _cached(prompt: list[int], seq: list[int]) -> int:
    """Tokens of `prompt` a replica holding `seq` has cached: the common prefix in full blocks,
    short of the last prompt token (always computed)."""
    n = min(len(prompt) - 1, len(seq))
    a, b = np.asarray(prompt[:n]), np.asarray(seq[:n])
    differ = np.flatnonzero(a != b)
    common = int(differ[0]) if differ.size else n
    return common // BLOCK * BLOCK
