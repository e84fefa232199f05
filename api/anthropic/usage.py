"""usage as Anthropic counts it: input_tokens + cache_read_input_tokens +
cache_creation_input_tokens is the prompt. cache_read: the tokens served from the cache (the
engine's cached prefix); cache_creation: the tokens up to the last breakpoint that were not read
from it (0 without breakpoints), split by TTL (those up to the last 1h breakpoint are 1h
writes); input_tokens: the rest, after the last breakpoint."""

from __future__ import annotations

from api.anthropic.breakpoints import Breakpoint
from api.anthropic.protocol import CacheCreation, Usage


def usage_of(
    prompt_tokens: int, cached: int, breakpoints: list[Breakpoint], output_tokens: int
) -> Usage:
    cached = min(cached, prompt_tokens)
    end = max((b.tokens for b in breakpoints), default=0)
    end_1h = max((b.tokens for b in breakpoints if b.ttl == "1h"), default=0)
    created = max(end - cached, 0)
    created_1h = max(min(end_1h, end) - cached, 0)
    return Usage(
        input_tokens=prompt_tokens - cached - created,
        output_tokens=output_tokens,
        cache_creation_input_tokens=created,
        cache_read_input_tokens=cached,
        cache_creation=CacheCreation(
            ephemeral_5m_input_tokens=created - created_1h, ephemeral_1h_input_tokens=created_1h
        ),
    )
