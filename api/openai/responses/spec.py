"""A /v1/responses request -> GenerationSpec (its prompt already token ids: conversation.py) and
the plan of its tools, through the chat path's protocol-neutral tool_plan and format_constraint."""

from __future__ import annotations

from api.chat_template import ChatTemplates
from api.openai.output_format import format_constraint
from api.openai.responses.items import chat_tool_choice, chat_tools, response_format
from api.openai.responses.protocol import ResponsesRequest
from api.openai.tool_plan import ToolPlan, plan_tools
from api.serving.request_builder import GenerationSpec
from radixcache.shared.chat_template import ChatPrompt


def tool_plan_of(
    req: ResponsesRequest,
    templates: ChatTemplates,
    tool_call_parser: str | None,
    prompt: ChatPrompt,
) -> ToolPlan | None:
    tools, choice = chat_tools(req.tools), chat_tool_choice(req.tool_choice)
    return plan_tools(tools, choice, req.parallel_tool_calls, tool_call_parser, templates, prompt)


def responses_spec(
    req: ResponsesRequest, prompt_ids: list[int], plan: ToolPlan | None
) -> GenerationSpec:
    # forced calls leave no text for text.format to shape: their grammar wins (OpenAI takes both)
    if plan is not None and plan.forced:
        constraint, param = plan.constraint, "tool_choice"
    else:
        constraint, param = format_constraint(response_format(req.text)), "text.format"
    keep_special = plan is not None and plan.keeps_special_tokens
    return GenerationSpec(
        id_prefix="resp",
        prompts=(prompt_ids,),
        sampling=dict(
            temperature=req.temperature, top_p=req.top_p, skip_special_tokens=not keep_special
        ),
        constraint=constraint,
        max_tokens=req.max_output_tokens,
        prompt_cache_key=req.prompt_cache_key,
        constraint_param=param,
        retention=req.prompt_cache_retention or "in_memory",
    )
