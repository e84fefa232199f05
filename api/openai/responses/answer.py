"""One response's body at each stage (in progress, finished, failed): its id, the request's settings
echoed as OpenAI echoes them, and what the model wrote with its usage."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from api.openai.responses.objects import (
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    ResponseError,
    ResponseObject,
    ResponseUsage,
    new_id,
)
from api.openai.responses.protocol import ResponsesRequest
from engine.outputs import RequestResult


def settings_of(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as the Response object echoes them (OpenAI's defaults filled in)."""
    fmt = req.text.format if req.text is not None else None
    tools = [t.model_dump(mode="json") for t in req.tools or ()]
    choice = req.tool_choice or "auto"
    return dict(
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        metadata=req.metadata or {},
        parallel_tool_calls=req.parallel_tool_calls,
        previous_response_id=req.previous_response_id,
        prompt_cache_key=req.prompt_cache_key,
        prompt_cache_retention=req.prompt_cache_retention,
        safety_identifier=req.safety_identifier,
        service_tier="default",
        store=req.store,
        temperature=req.temperature,
        text={
            "format": {"type": "text"} if fmt is None else fmt.model_dump(by_alias=True),
            "verbosity": "medium",
        },
        tool_choice=choice if isinstance(choice, str) else choice.model_dump(),
        tools=tools,
        top_p=req.top_p,
        truncation=req.truncation or "disabled",
        user=req.user,
        background=False,
        max_tool_calls=None,
        reasoning={"effort": None, "summary": None},
        top_logprobs=0,
    )


def usage_of(result: RequestResult) -> ResponseUsage:
    prompt = len(result.prompt_token_ids)
    output = sum(len(c.token_ids) for c in result.outputs)
    return ResponseUsage(
        input_tokens=prompt,
        input_tokens_details=InputTokensDetails(cached_tokens=result.num_cached_tokens),
        output_tokens=output,
        total_tokens=prompt + output,
    )


@dataclass
class Answer:
    model: str
    settings: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def in_progress(self) -> dict[str, Any]:
        return self._body(ResponseObject(**self._head(), status="in_progress"))

    def finished(self, output: list[OutputItem], result: RequestResult) -> dict[str, Any]:
        cut = any(c.finish_reason == "length" for c in result.outputs)
        body = ResponseObject(
            **self._head(),
            status="incomplete" if cut else "completed",
            output=output,
            usage=usage_of(result),
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if cut else None,
            completed_at=None if cut else int(time.time()),
        )
        return self._body(body)

    def failed(self, output: list[OutputItem], code: str, message: str) -> dict[str, Any]:
        error = ResponseError(code=code, message=message)
        return self._body(
            ResponseObject(**self._head(), status="failed", output=output, error=error)
        )

    def _head(self) -> dict[str, Any]:
        return dict(id=self.id, created_at=self.created_at, model=self.model)

    def _body(self, body: ResponseObject) -> dict[str, Any]:
        return {**body.model_dump(mode="json"), **self.settings}
