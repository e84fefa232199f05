"""OpenAI requests -> GenerationSpec, the protocol-neutral request the builder makes jobs of: the
sampling fields, the output format or forced tool calls, and OpenAI's defaults."""

from __future__ import annotations

from typing import Any

from api.chat_template import ChatTemplates
from api.errors import ApiError
from api.openai.output_format import output_format
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openai.tool_plan import ToolPlan, plan_tools
from api.serving.request_builder import GenerationSpec

MAX_BATCH_PROMPTS = 64
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def completion_spec(req: CompletionRequest) -> GenerationSpec:
    prompts = req.prompts()
    if not prompts:
        raise ApiError(400, "The prompt is empty", param="prompt", code="empty_prompt")
    if len(prompts) > MAX_BATCH_PROMPTS:
        raise ApiError(400, f"At most {MAX_BATCH_PROMPTS} prompts per request", param="prompt")
    constraint, param = output_format(req)
    return GenerationSpec(
        id_prefix="cmpl",
        prompts=tuple(prompts),
        sampling=_sampling(req, req.logprobs),
        constraint=constraint,
        max_tokens=req.max_tokens,
        default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS,
        logit_bias=req.logit_bias or {},
        cache_salt=req.cache_salt,
        prompt_cache_key=req.prompt_cache_key,
        constraint_param=param,
        retention=req.prompt_cache_retention or "in_memory",
    )


def chat_spec(
    req: ChatCompletionRequest, templates: ChatTemplates, tool_call_parser: str | None
) -> tuple[GenerationSpec, ToolPlan | None]:
    """The spec and the plan of the request's tools (tool_plan.py), whose forced calls are its
    output constraint. `tool_call_parser`: the server's tool-call format, if it sets one."""
    prompt = req.chat_prompt()
    plan = plan_tools(
        req.tools, req.tool_choice, req.parallel_tool_calls, tool_call_parser, templates, prompt
    )
    constraint, param = output_format(req)
    if plan is not None and plan.forced:
        if constraint is not None:
            raise ApiError(
                400,
                "tool_choice 'required' or a named function cannot be combined with an output "
                "format (response_format / structured_outputs)",
                param="tool_choice",
            )
        constraint, param = plan.constraint, "tool_choice"
    top = (req.top_logprobs or 0) if req.logprobs else None
    keep_special = plan is not None and plan.keeps_special_tokens
    spec = GenerationSpec(
        id_prefix="chatcmpl",
        prompts=(prompt,),
        sampling=_sampling(req, top, skip_special_tokens=not keep_special),
        constraint=constraint,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        logit_bias=req.logit_bias or {},
        cache_salt=req.cache_salt,
        prompt_cache_key=req.prompt_cache_key,
        constraint_param=param,
        retention=req.prompt_cache_retention or "in_memory",
    )
    return spec, plan


def _sampling(
    req: CompletionRequest | ChatCompletionRequest,
    logprobs: int | None,
    skip_special_tokens: bool = True,
) -> dict[str, Any]:
    """The request's SamplingParams fields (max_tokens and logit_bias are the builder's)."""
    return dict(
        n=req.n,
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
        skip_special_tokens=skip_special_tokens,
    )
