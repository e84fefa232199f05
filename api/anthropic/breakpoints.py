"""cache_control breakpoints: which prefix of the prompt each one marks, in tokens.

Anthropic's prefix order is tools -> system -> messages; a breakpoint on a block marks the
conversation up to and including that block. How its token position is found: the conversation
is cut right after the marked block (later tools, system blocks, blocks and messages dropped),
that cut is rendered by the same chat template without a generation prompt and tokenized, and the
breakpoint is the length of the common prefix of its token ids and the request's own. This needs
no knowledge of the template: whatever the template writes between blocks, or wherever it puts
the tools (many templates write the system prompt first), the position is exactly the prefix that
a request sharing the conversation up to the block shares with this one, which is what a cache
can reuse. A cut the template refuses to render (e.g. one with no message) marks nothing (0).

At most 4 breakpoints (Anthropic's limit); a top-level `cache_control` marks the last block; a
1h breakpoint may not follow a 5m one (as Anthropic: longer TTLs first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.anthropic.prompt import Conversation, conversation
from api.anthropic.protocol import MAX_BREAKPOINTS, CacheControl, CountTokensRequest, Message
from api.chat_template import ChatTemplates, TemplateError
from api.errors import ApiError
from api.serving.request_builder import chat_prompt_ids


@dataclass(frozen=True)
class Mark:
    """A breakpoint: the conversation up to its block, and how long its prefix is kept."""

    cut: Conversation
    cache_control: CacheControl


@dataclass(frozen=True)
class Breakpoint:
    tokens: int  # the prompt's first `tokens` ids are the marked prefix
    ttl_s: float
    ttl: str  # "5m" | "1h"


def marks(req: CountTokensRequest) -> list[Mark]:
    """The request's breakpoints in prefix order; 400 for more than 4 or a 1h after a 5m."""
    conv = conversation(req)
    tools, system, messages = conv.tools, conv.system, conv.messages
    found = [
        Mark(Conversation(tools[: i + 1], [], []), t.cache_control)
        for i, t in enumerate(tools)
        if t.cache_control is not None
    ]
    found += [
        Mark(Conversation(tools, system[: j + 1], []), b.cache_control)
        for j, b in enumerate(system)
        if b.cache_control is not None
    ]
    for k, m in enumerate(messages):
        blocks = m.blocks()
        for j, b in enumerate(blocks):
            if b.cache_control is not None:
                cut = Message.model_construct(role=m.role, content=blocks[: j + 1])
                found.append(
                    Mark(Conversation(tools, system, [*messages[:k], cut]), b.cache_control)
                )
    last = messages[-1].blocks()[-1]
    if req.cache_control is not None and last.cache_control is None:
        found.append(Mark(conv, req.cache_control))
    if len(found) > MAX_BREAKPOINTS:
        raise ApiError(
            400,
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(found)}.",
            param="cache_control",
        )
    ttls = [m.cache_control.ttl for m in found]
    if "5m" in ttls and "1h" in ttls[ttls.index("5m") :]:
        raise ApiError(
            400,
            "a ttl='1h' cache_control block must not come after a ttl='5m' one (tools, system, "
            "messages order)",
            param="cache_control",
        )
    return found


def locate(
    tokenizer: Any, templates: ChatTemplates, prompt_ids: list[int], found: list[Mark]
) -> list[Breakpoint]:
    """Each mark's position in `prompt_ids` (see the module docstring)."""
    out = []
    for mark in found:
        try:
            text = templates.render(mark.cut.chat_prompt(), add_generation_prompt=False)
        except TemplateError:
            tokens = 0
        else:
            cut_ids = list(tokenizer.encode(text, add_special_tokens=False))
            tokens = common_prefix(prompt_ids, cut_ids)
        out.append(Breakpoint(tokens, mark.cache_control.seconds, mark.cache_control.ttl))
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prompt_ids(tokenizer: Any, templates: ChatTemplates, conv: Conversation) -> list[int]:
    """The request's prompt: rendered with the generation prompt, or cut right after a final
    assistant message's text (a prefill, which the answer continues)."""
    prefill = conv.prefill()
    if prefill is None:
        return chat_prompt_ids(tokenizer, templates, conv.chat_prompt())
    try:
        text = templates.render(conv.chat_prompt(), add_generation_prompt=False)
    except TemplateError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc
    end = text.rfind(prefill)
    if end < 0:
        raise ApiError(
            400,
            "The chat template does not render the final assistant message as given",
            param="messages",
        )
    return list(tokenizer.encode(text[: end + len(prefill)], add_special_tokens=False))
