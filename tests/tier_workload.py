"""The engine-with-tiers workload both the tier and the cluster tests run: 8 prompts sharing a
24-token head on a device pool far smaller than their ~60 distinct 4-token blocks."""

from __future__ import annotations

import random
from pathlib import Path

from engine.llm import LLM
from engine.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
ENGINE = {"dtype": "float32", "block_size": 4, "max_num_seqs": 2, "seed": 0}
DEVICE_BLOCKS = 32  # the prompts below need ~60 distinct blocks


def tier_prompts() -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(3, 250) for _ in range(24)]
    return [shared + [rng.randrange(3, 250) for _ in range(24)] for _ in range(8)]


def token_ids(outputs: list) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def cache_off_reference(model: Path, prompts: list[list[int]]) -> list[list[int]]:
    """What every cache and tier configuration must reproduce exactly (float32, greedy)."""
    ref = LLM(str(model), **ENGINE | {"num_blocks": 128}, enable_prefix_caching=False)
    return token_ids(ref.generate(prompts, PARAMS))
