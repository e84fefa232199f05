"""The engine's tokenizer (offline LLM.chat), the server's templates and the router's tokenizer
render with radixcache's one renderer (radixcache/shared/chat_template.py): the same templates read from
the folder, the same text and ids for the same messages, with tools and without."""

from __future__ import annotations

from pathlib import Path

import pytest

import api.chat_template
import engine.loader.tokenizer
from api.chat_template import ChatTemplates
from api.router.tokenize import PromptTokenizer
from engine.loader import load_tokenizer
from radixcache.shared import chat_template
from radixcache.shared.chat_template import ChatPrompt
from tests.api.tool_cases import WEATHER_TOOLS

TOOL_LOOP = [
    {"role": "system", "content": "Use tools when they help."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]
CHATS = [
    ChatPrompt([{"role": "user", "content": "hi"}]),
    ChatPrompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
    ChatPrompt([{"role": "user", "content": "Weather in Oslo?"}], WEATHER_TOOLS),
    ChatPrompt(TOOL_LOOP, WEATHER_TOOLS),
    ChatPrompt(TOOL_LOOP),  # tool messages without tools
]


@pytest.fixture(scope="module", params=["default", "tiny"])
def folder(request: pytest.FixtureRequest, default_model_path: Path, tiny_llama: Path) -> Path:
    return default_model_path if request.param == "default" else tiny_llama


def test_engine_server_and_router_hold_the_one_renderer_s_templates(folder: Path) -> None:
    engine_templates = load_tokenizer(folder).templates
    served = ChatTemplates.from_folder(folder)
    routed = PromptTokenizer(folder).templates
    assert type(engine_templates) is chat_template.ChatTemplates
    for templates in (served, routed):
        assert isinstance(templates, chat_template.ChatTemplates)
        assert (templates.default, templates.tool_use, templates.special_tokens) == (
            engine_templates.default,
            engine_templates.tool_use,
            engine_templates.special_tokens,
        )


def test_no_second_jinja_environment() -> None:
    for module in (api.chat_template, engine.loader.tokenizer):
        assert "jinja2" not in vars(module) and "compile_template" not in vars(module)
    assert issubclass(ChatTemplates, chat_template.ChatTemplates)


@pytest.mark.parametrize(
    "prompt", CHATS, ids=["user", "system", "tools", "tool-loop", "tool-messages"]
)
def test_the_engine_renders_the_router_s_very_text_and_ids(
    folder: Path, prompt: ChatPrompt
) -> None:
    engine = load_tokenizer(folder)
    router = PromptTokenizer(folder)
    text = engine.render_chat(prompt.messages, tools=prompt.tools)
    assert text == router.render(prompt) == ChatTemplates.from_folder(folder).render(prompt)
    assert engine.apply_chat_template(prompt.messages, tools=prompt.tools) == router.chat(prompt)
    if prompt.tools:
        assert "get_weather" in text and text != engine.render_chat(prompt.messages)
