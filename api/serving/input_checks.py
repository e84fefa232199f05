"""Checks that need the engine (model names, tokenizer, context window) and the mapping of an
OpenAI request onto the engine's SamplingParams."""

from __future__ import annotations

from typing import Any

from api.errors import ApiError
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from engine.sampling import SamplingParams
from engine.structured.constraints import Constraint, ConstraintError


async def prepare_constraint(engine: Any, constraint: Constraint | None, param: str) -> None:
    """Compiles the request's grammar before any stream opens: a bad schema is a 400 here."""
    if constraint is None:
        return
    try:
        await engine.prepare_constraints([constraint])
    except ConstraintError as exc:
        raise ApiError(400, str(exc), param=param, code="invalid_schema") from exc


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


def encode_prompt(tokenizer: Any, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "The prompt is empty", param="prompt", code="empty_prompt")
        return list(tokenizer.encode(prompt))
    if not prompt:
        raise ApiError(400, "The prompt is empty", param="prompt", code="empty_prompt")
    check_token_ids(prompt, tokenizer.vocab_size)
    return list(prompt)


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


def to_sampling_params(
    req: CompletionRequest | ChatCompletionRequest,
    max_tokens: int,
    logprobs: int | None,
    constraint: Constraint | None = None,
    logit_bias: tuple[tuple[int, float], ...] = (),
    skip_special_tokens: bool = True,
) -> SamplingParams:
    try:
        return SamplingParams(
            n=req.n,
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=max(req.top_k, 0),
            min_p=req.min_p,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=req.seed,
            stop=tuple(req.stop_list()),
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            constraint=constraint,
            logit_bias=logit_bias,
            skip_special_tokens=skip_special_tokens,
        )
    except ValueError as exc:  # the engine's own checks (e.g. an empty stop string)
        raise ApiError(400, str(exc), code="invalid_value") from exc
