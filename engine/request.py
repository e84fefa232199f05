"""Request and sequence state. A request has n sequences (samples); the scheduler runs sequences."""

from __future__ import annotations

import itertools
import struct
import time
from array import array
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from engine.detokenizer import IncrementalDetokenizer
    from engine.sampling_params import SamplingParams
    from radixcache.hashing import Namespace


class SequenceStatus(Enum):
    WAITING = "waiting"
    LOADING = "loading"  # its prefix is coming back from a spill tier
    RUNNING = "running"
    FINISHED = "finished"


class RequestTooLarge(ValueError):
    """The request alone needs more KV blocks or context than the engine has."""


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt (the API or the offline LLM tokenizes; the engine never does)."""

    token_ids: list[int]
    text: str | None = None  # the text it came from, when there was one


@dataclass(frozen=True)
class GenerateJob:
    """One request for the async engine: id, prompt, sampling, tenant salt; `retain_prefix`:
    keep the prompt's blocks in the persistent tier (prompt_cache_retention 24h)."""

    request_id: str
    prompt: Prompt
    params: SamplingParams
    cache_salt: str = ""
    retain_prefix: bool = False


_seq_counter = itertools.count()

# the id standing for a token sampled on the device and not read yet (engine/step_pipeline.py);
# the next step's input takes the real one from the device
PENDING_TOKEN = -1


def token_array(token_ids: list[int] | array) -> array:
    """Token ids as array("q"), the engine's and the prefix index's one type: the index compares
    token runs as memory and hashes them without an int per token. (Packed through struct,
    which is faster than array("q", list).)"""
    if type(token_ids) is array:
        return token_ids[:]  # a copy
    return array("q", struct.pack(f"{len(token_ids)}q", *token_ids))


@dataclass(eq=False)
class Sequence:
    request: Request
    index: int  # sample index within the request (0..n-1)
    token_ids: array  # prompt + generated, array("q") (token_array); a list also works
    num_prompt_tokens: int
    generator: torch.Generator | None
    detok: IncrementalDetokenizer
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    status: SequenceStatus = SequenceStatus.WAITING
    # --- KV state (owned by the KV cache manager, engine.kv) ---
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV sits in block_ids
    num_tree_blocks: int = 0  # leading blocks held by the tree (locked through `handle`)
    # a hybrid KV cache's windowed layers: their block of each of block_ids' token blocks, the
    # null block 0 for the first num_window_released (out of the window: let go)
    window_block_ids: list[int] = field(default_factory=list)
    num_window_released: int = 0
    handle: Any = None  # locked radix node; None = nothing locked
    num_cached_tokens: int = 0  # prefix reused at (first) admission: device + lower tiers
    cached_by_tier: dict[str, int] = field(default_factory=dict)  # TierName -> tokens
    kv_load: Any = None  # engine.kv.tiers.TierLoad while its prefix comes from a spill tier
    # --- outputs (emitted as deltas: what came after num_sent_*) ---
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    finish_sent: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # why it ended, when finish_reason is "error"
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    first_token_time: float | None = None
    num_preemptions: int = 0
    matcher: Any = None  # engine.structured.matcher.SequenceMatcher when params.constraint
    spec: Any = None  # engine.speculative.proposer.SeqDrafts once it has been drafted for

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return list(self.token_ids[self.num_prompt_tokens :])

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def sort_key(self) -> tuple[int, float, int]:
        return (self.params.priority, self.request.arrival_time, self.seq_id)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    namespace: Namespace
    arrival_time: float = field(default_factory=time.monotonic)
    seqs: list[Sequence] = field(default_factory=list)
    aborted: bool = False
    retain_prefix: bool = False  # the prompt's full blocks go to the persistent tier, retained

    @property
    def is_finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)
