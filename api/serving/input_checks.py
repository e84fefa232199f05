"""The API's checks of a request against the model (its names, vocabulary, context window and
grammars): each refuses bad input with a 4xx before the engine sees it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from api.errors import ApiError
from engine.structured.constraints import Constraint, ConstraintError

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine


def check_model(requested: str, served: list[str]) -> None:
    if requested not in served:
        raise ApiError(
            404,
            f"The model '{requested}' does not exist; this server serves {served}",
            param="model",
            code="model_not_found",
        )


def check_token_ids(ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ApiError(
            400, f"Token id {bad[0]} is outside the vocabulary [0, {vocab_size})", param=param
        )


def check_prompt_ids(ids: list[int], vocab_size: int) -> list[int]:
    """A prompt given as token ids: not empty, every id in the vocabulary."""
    if not ids:
        raise ApiError(400, "The prompt is empty", param="prompt", code="empty_prompt")
    check_token_ids(ids, vocab_size)
    return list(ids)


def logit_bias_pairs(bias: Mapping[str, float], vocab_size: int) -> tuple[tuple[int, float], ...]:
    """{token id as a string: bias} (JSON object keys are strings) -> (token id, bias) pairs,
    every id in the vocabulary."""
    pairs = []
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()) or int(key) >= vocab_size:
            raise ApiError(
                400,
                f"logit_bias key {key!r} is not a token id in [0, {vocab_size})",
                param="logit_bias",
            )
        pairs.append((int(key), value))
    return tuple(pairs)


def resolve_max_tokens(
    requested: int | None, prompt_len: int, max_model_len: int, default: int | None
) -> int:
    """The max_tokens to run with; 400 when the prompt plus max_tokens cannot fit the context
    window. (Whether it fits the KV pool the engine says when the request is admitted.)"""
    if prompt_len >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens (at least one token must be left to generate)",
            param="prompt",
            code="context_length_exceeded",
        )
    room = max_model_len - prompt_len
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise ApiError(
            400,
            f"max_tokens is too large: {requested}. This model's maximum context length is "
            f"{max_model_len} tokens and the prompt has {prompt_len} tokens, so at most {room} "
            "tokens can be generated",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


async def prepare_constraint(
    engine: AsyncEngine, constraint: Constraint | None, param: str
) -> None:
    """Compiles the request's grammar before any stream opens: a bad schema is a 400 here."""
    if constraint is None:
        return
    try:
        await engine.prepare_constraints([constraint])
    except ConstraintError as exc:
        raise ApiError(400, str(exc), param=param, code="invalid_schema") from exc
