"""The token ids the router routes a request on: a chat or completions request's own prompt (a
template error is the request's fault: 400), or the chat the router read leniently out of a
Responses or Messages body (anything it cannot render is routed on no ids, never refused)."""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Any

from api.errors import ApiError
from api.openai.protocol import ChatCompletionRequest
from api.router.tokenize import PromptTokenizer
from radixcache.shared.chat_template import ChatPrompt


@dataclass(frozen=True)
class PromptIds:
    """What routing needs of a prompt: the ids to route on, the text still to tokenize once the
    request is on its way (PromptTokenizer.chat_for_routing; empty when `ids` is the whole
    prompt), the wall and CPU µs spent on them."""

    ids: array  # array("q"): packed once for every index the request meets
    tail: str = ""
    wall_us: float = 0.0
    cpu_us: float = 0.0


NO_PROMPT = PromptIds(array("q"))


def request_prompt_ids(tok: PromptTokenizer, req: Any) -> PromptIds:
    """A validated /v1/chat/completions or /v1/completions request's prompt."""
    t0, c0 = time.perf_counter(), time.thread_time()
    tail = ""
    try:
        if isinstance(req, ChatCompletionRequest):
            ids, tail = tok.chat_for_routing(req.chat_prompt())
        else:
            prompts = req.prompts()
            first = prompts[0] if prompts else ""
            ids = array("q", tok.encode(first) if isinstance(first, str) else first)
    except Exception as exc:  # template errors are the request's fault
        raise ApiError(400, f"Cannot tokenize the prompt: {exc}", param="messages") from exc
    return _timed(ids, tail, t0, c0)


def lenient_prompt_ids(tok: PromptTokenizer, chat: ChatPrompt | None) -> PromptIds:
    """A chat read leniently from a body; one the template cannot render routes on no ids (the
    replica, which validates, answers the request's fault)."""
    if chat is None:
        return NO_PROMPT
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        ids, tail = tok.chat_for_routing(chat)
    except Exception:  # any template failure: the replica will say what is wrong
        return NO_PROMPT
    return _timed(ids, tail, t0, c0)


def _timed(ids: array, tail: str, t0: float, c0: float) -> PromptIds:
    wall, cpu = (time.perf_counter() - t0) * 1e6, (time.thread_time() - c0) * 1e6
    return PromptIds(ids, tail, wall, cpu)
