"""What /v1/responses answers: the Response object, its output items and usage, in OpenAI's shapes
(openai.types.responses)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel

Status = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def new_id(prefix: str) -> str:
    """OpenAI's id shape: "resp_<hex>", "msg_<hex>", "fc_<hex>"."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class MessageOutput(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputTextPart]


class FunctionCallOutput(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str  # "fc_..."
    call_id: str  # "call_...": what the function_call_output answers
    name: str
    arguments: str
    status: ItemStatus


OutputItem = MessageOutput | FunctionCallOutput


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    """The request's settings echoed (`settings`, see routes.py) plus what the model did."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    model: str
    output: list[OutputItem] = []
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    completed_at: int | None = None
