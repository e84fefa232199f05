"""The one request builder: a request in protocol-neutral terms (GenerationSpec, which each
protocol maps its models onto) and its caller -> the engine's jobs. Here every check that needs
the model runs, once, before the engine sees the request: the prompt (not empty, its token ids in
the vocabulary, its chat template applicable), the context window, logit_bias ids and the output
grammar. Whether the request fits the KV pool the engine says when it admits it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from api.chat_template import ChatTemplates, TemplateError
from api.errors import ApiError
from api.serving.input_checks import (
    check_prompt_ids,
    logit_bias_pairs,
    prepare_constraint,
    resolve_max_tokens,
)
from engine.request import GenerateJob, Prompt
from engine.sampling_params import SamplingParams
from engine.structured.constraints import Constraint
from radixcache.shared.chat_template import ChatPrompt

if TYPE_CHECKING:
    from api.auth import Caller
    from api.state import ServerState

PromptSource = str | list[int] | ChatPrompt  # text, token ids, or chat messages to render
Retention = Literal["in_memory", "24h"]  # prompt_cache_retention


@dataclass(frozen=True)
class GenerationSpec:
    """What a request asks the engine for, whatever protocol it came in (not yet checked against
    the model): one job per prompt, each sampled by SamplingParams(**sampling, constraint=...,
    and the max_tokens and logit_bias the builder checks)."""

    id_prefix: str  # of the jobs' request ids
    prompts: tuple[PromptSource, ...]
    sampling: Mapping[str, Any]  # SamplingParams fields but constraint, max_tokens, logit_bias
    constraint: Constraint | None = None  # the output's grammar (SamplingParams.constraint)
    max_tokens: int | None = None  # asked for; None: default_max_tokens within the room left
    default_max_tokens: int | None = None  # None: all the room the context window leaves
    logit_bias: Mapping[str, float] = field(default_factory=dict)  # token id (a JSON key) -> bias
    cache_salt: str | None = None  # the request's own salt, refined by its caller's tenant
    prompt_cache_key: str | None = None  # a label to count the request under (not a namespace)
    constraint_param: str = "response_format"  # the field a grammar that fails to compile names
    retention: Retention = "in_memory"  # 24h: the prefix is kept in the persistent tier


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _sampling_params(fields: Mapping[str, Any]) -> SamplingParams:
    """The engine's own refusals of a value (e.g. an empty stop string) are 400s."""
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        raise ApiError(400, str(exc), code="invalid_value") from exc


async def build_jobs(state: ServerState, spec: GenerationSpec, caller: Caller) -> list[GenerateJob]:
    """The engine jobs of `spec`, or the 4xx that refuses it."""
    engine = state.engine
    retain = spec.retention == "24h"
    if retain and not engine.can_retain:
        raise ApiError(
            400,
            "prompt_cache_retention '24h' needs a persistent KV cache tier (disk or Redis), and "
            "this server runs without one; send 'in_memory' or leave the field out",
            param="prompt_cache_retention",
            code="unsupported_value",
        )
    tokenizer = engine.tokenizer
    bias = logit_bias_pairs(spec.logit_bias, tokenizer.vocab_size)
    salt = caller.cache_salt(spec.cache_salt)
    jobs = []
    for source in spec.prompts:
        prompt = await asyncio.to_thread(encode, tokenizer, state.templates, source)  # off the loop
        max_tokens = resolve_max_tokens(
            spec.max_tokens, len(prompt.token_ids), engine.max_model_len, spec.default_max_tokens
        )
        fields = dict(spec.sampling, max_tokens=max_tokens, logit_bias=bias)
        params = _sampling_params(dict(fields, constraint=spec.constraint))
        job = GenerateJob(new_id(spec.id_prefix), prompt, params, salt, retain_prefix=retain)
        jobs.append(job)
    await prepare_constraint(engine, spec.constraint, spec.constraint_param)
    return jobs


def encode(tokenizer: Any, templates: ChatTemplates, source: PromptSource) -> Prompt:
    """A prompt's token ids; 400 when it is empty or cannot be rendered."""
    if isinstance(source, ChatPrompt):
        return Prompt(chat_prompt_ids(tokenizer, templates, source))
    if isinstance(source, list):
        return Prompt(check_prompt_ids(source, tokenizer.vocab_size))
    ids = list(tokenizer.encode(source)) if source else []
    if not ids:  # text that gives no token would reach the engine empty
        raise ApiError(400, "The prompt is empty", param="prompt", code="empty_prompt")
    return Prompt(ids, source)


def chat_prompt_ids(tokenizer: Any, templates: ChatTemplates, prompt: ChatPrompt) -> list[int]:
    """The one rendering of the server, the router and the engine (radixcache/shared/chat_template.py,
    through api/chat_template.py), then the tokenizer."""
    try:
        text = templates.render(prompt)
    except TemplateError as exc:  # template errors are the request's fault (roles, order)
        raise ApiError(400, str(exc), param=exc.param) from exc
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise ApiError(400, "The messages produce an empty prompt", param="messages")
    return ids
