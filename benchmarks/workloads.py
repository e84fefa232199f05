"""The benchmark workloads of DESIGN.md, built once here (fixed seeds: the same token ids on every
run and in every script that uses them). Random ids are drawn from [100, vocab - 100)."""

from __future__ import annotations

import random
from dataclasses import dataclass

OUT_TOKENS = 32  # every request: 32 output tokens, greedy, EOS ignored
MAX_RUNNING = 16  # at most 16 requests running at once


def random_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def gsp_prompts(vocab: int) -> list[list[int]]:
    """GSP-small: 8 groups x 8 prompts, 1,024-token system prompt + 64-token question, shuffled
    with seed 1, all submitted at once."""
    rng = random.Random(0)
    prompts = []
    for _ in range(8):
        system = random_tokens(rng, 1024, vocab)
        prompts += [system + random_tokens(rng, 64, vocab) for _ in range(8)]
    random.Random(1).shuffle(prompts)
    return prompts


@dataclass(frozen=True)
class MultiTurn:
    """MT-small: 8 users x 4 turns over one shared 512-token system prompt; turn t's prompt of a
    user is system + (message, answer) of the turns before + message t; all users' turn-t
    requests are submitted together."""

    system: list[int]
    turns: list[list[list[int]]]  # [turn][user] -> 64-token message


def mt_turns(vocab: int) -> MultiTurn:
    rng = random.Random(0)
    system = random_tokens(rng, 512, vocab)
    return MultiTurn(system, [[random_tokens(rng, 64, vocab) for _ in range(8)] for _ in range(4)])


GSP_IDEAL_PREFILL = 8 * 1024 + 64 * 64
MT_IDEAL_PREFILL = 512 + 8 * 64 + 3 * 8 * (64 + 1)  # the last answer token's KV is never computed
WARMUP_SEED = 9  # one 64-token warm-up prompt before a timed run
