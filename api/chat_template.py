"""The server's and the router's chat templates: radixcache's one renderer (radixcache/
chat_template.py, which the engine's tokenizer uses too), its refusals as TemplateErrors that name
the request's field at fault (a 400), and the request's chat_template_kwargs checked."""

from __future__ import annotations

from radixcache.shared import chat_template
from radixcache.shared.chat_template import ChatPrompt, NoChatTemplate, ToolsUnsupported

_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "documents"})


class TemplateError(ValueError):
    """The request cannot be rendered (a 400 naming `param`)."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


class ChatTemplates(chat_template.ChatTemplates):
    def source_for(self, prompt: ChatPrompt) -> str:
        """The template to render `prompt` with; TemplateError when none can render its tools."""
        try:
            return super().source_for(prompt)
        except NoChatTemplate as exc:
            raise TemplateError(f"{exc}: use /v1/completions") from exc
        except ToolsUnsupported as exc:
            raise TemplateError(str(exc), param="tools" if prompt.tools else "messages") from exc

    def render(self, prompt: ChatPrompt, add_generation_prompt: bool = True) -> str:
        bad = _RESERVED & prompt.template_kwargs.keys()
        if bad:
            raise TemplateError(
                f"chat_template_kwargs may not set {sorted(bad)}", param="chat_template_kwargs"
            )
        try:
            return super().render(prompt, add_generation_prompt)
        except TemplateError:  # source_for's refusals, already named
            raise
        except Exception as exc:  # the template refuses the request's roles, order or fields
            raise TemplateError(f"Cannot apply the chat template: {exc}") from exc
