"""Tool-call parsers and the content/calls split (api/openai/tool_parsers.py, tool_stream.py), the
chat templates' choice for tools (radixcache/shared/chat_template.py) and the forced-call grammars
(api/openai/tool_plan.py): no server, real parts."""

from __future__ import annotations

import json

import pytest

from api.chat_template import ChatTemplates, TemplateError
from api.openai.protocol import ChatCompletionRequest
from api.openai.tool_parsers import PARSERS, ParsedCall, format_of_template
from api.openai.tool_stream import ToolStream, split_whole
from radixcache.shared.chat_template import ChatPrompt, hermes_template
from tests.api.tool_cases import WEATHER_TOOLS

CASES = {
    "hermes": (
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Sure.\n",
    ),
    "llama3_json": (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}',
        "",
    ),
    "mistral": (
        'Ok [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {}}]',
        "Ok ",
    ),
    "pythonic": ('[get_weather(city="Paris"), get_time()]', ""),
    "qwen3_coder": (
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n"
        "</tool_call>",
        "Let me check.\n",
    ),
}
EXPECTED = [ParsedCall("get_weather", '{"city": "Paris"}'), ParsedCall("get_time", "{}")]


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_each_format_parses_its_calls_whole_and_streamed(fmt: str) -> None:
    text, content = CASES[fmt]
    parser = PARSERS[fmt](WEATHER_TOOLS)
    whole_content, calls = split_whole(parser, True, text)
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.name, c.arguments) for c in EXPECTED
    ]
    assert (whole_content or "") == content
    # streamed a character at a time: the same content, the same calls, no marker shown
    stream, streamed, got = ToolStream(parser), "", {}
    for i, ch in enumerate(text):
        piece, events = stream.feed(ch, final=i == len(text) - 1)
        streamed += piece
        for e in events:
            if e.id is not None:
                assert e.function.arguments == "" and e.index == len(got)
                got[e.index] = ParsedCall(e.function.name, "")
            else:
                call = got[e.index]
                got[e.index] = ParsedCall(call.name, call.arguments + e.function.arguments)
    assert streamed == content and list(got.values()) == EXPECTED == stream.calls


def test_hermes_streams_the_arguments_as_they_are_written() -> None:
    stream = ToolStream(PARSERS["hermes"]())
    _, events = stream.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert [(e.id is not None, e.function.name, e.function.arguments) for e in events] == [
        (True, "get_weather", ""),
        (False, None, '{"city": "Pa'),
    ]
    _, events = stream.feed('ris"}}\n</tool')
    assert [e.function.arguments for e in events] == ['ris"']  # "}}" may still close it
    _, events = stream.feed("_call>", final=True)
    assert [e.function.arguments for e in events] == ["}"]
    assert stream.calls == [ParsedCall("get_weather", '{"city": "Paris"}')]


def test_a_region_that_holds_no_call_is_content() -> None:
    for fmt, text in [
        ("hermes", "see <tool_call> not json </tool_call>"),
        ("llama3_json", '{"answer": 42}'),
        ("pythonic", "[1, 2, 3]"),
    ]:
        content, calls = split_whole(PARSERS[fmt](), True, text)
        assert calls == [] and content == text


def test_streamed_content_never_shows_half_a_marker() -> None:
    stream = ToolStream(PARSERS["hermes"]())
    assert stream.feed("Hello <tool") == ("Hello ", [])
    assert stream.feed("_ca") == ("", [])
    assert stream.feed("t is a cat", final=True) == ("<tool_cat is a cat", [])


def test_one_call_when_parallel_calls_are_off() -> None:
    text, _ = CASES["hermes"]
    _, calls = split_whole(PARSERS["hermes"](), False, text)
    assert [c.function.name for c in calls] == ["get_weather"]


def test_the_format_comes_from_the_template() -> None:
    assert format_of_template(hermes_template()) == "hermes"
    assert format_of_template("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert format_of_template("<tool_call>\n<function=x>") == "qwen3_coder"
    assert format_of_template("<|python_tag|>{{ tools }}") == "llama3_json"
    assert format_of_template("{{ messages }}") == "hermes"


CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
PROMPT = ChatPrompt([{"role": "user", "content": "hi"}], [WEATHER_TOOLS[0]])


def test_chatml_without_tools_gets_the_hermes_template_and_others_a_400() -> None:
    assert ChatTemplates(CHATML).source_for(PROMPT) == hermes_template()
    assert ChatTemplates(CHATML).source_for(ChatPrompt(PROMPT.messages)) == CHATML
    with pytest.raises(TemplateError, match="cannot render tools") as err:
        ChatTemplates("[INST] {{ messages[0].content }} [/INST]").source_for(PROMPT)
    assert err.value.param == "tools"
    tool_use = "{{ tools | length }} tools"
    assert ChatTemplates(CHATML, tool_use).source_for(PROMPT) == tool_use


def test_tools_render_byte_stable_and_template_kwargs_reach_the_template() -> None:
    templates = ChatTemplates(CHATML)
    once = templates.render(PROMPT)
    again = ChatPrompt([{"role": "user", "content": "hi"}], json.loads(json.dumps(PROMPT.tools)))
    assert templates.render(again) == once
    assert json.dumps(WEATHER_TOOLS[0], ensure_ascii=False) in once
    flag = ChatTemplates("{{ 'on' if flag else 'off' }}")
    assert flag.render(ChatPrompt([], None, {"flag": True})) == "on"
    with pytest.raises(TemplateError):
        flag.render(ChatPrompt([], None, {"messages": []}))


def test_the_hermes_template_renders_a_whole_tool_loop() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "tools": WEATHER_TOOLS,
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
            ],
        },
        strict=False,
    )
    text = ChatTemplates(CHATML).render(req.chat_prompt())
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


CUT_CASES = {
    "hermes": (
        'Sure.\n<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>\n'
        '<tool_call>\n{"name":"get_weather","arguments":{"city":"Par',
        "Sure.\n",
    ),
    "mistral": (
        'Ok [TOOL_CALLS][{"name":"get_time","arguments":{}},'
        '{"name":"get_weather","arguments":{"city":"Par',
        "Ok ",
    ),
    "llama3_json": (
        '{"name":"get_time","parameters":{}}; {"name":"get_weather","parameters":{"city":"Par',
        "",
    ),
}


@pytest.mark.parametrize("fmt", sorted(CUT_CASES))
def test_a_call_cut_by_the_token_limit_is_a_call_whole_and_streamed(fmt: str) -> None:
    text, content = CUT_CASES[fmt]
    expected = [("get_time", "{}"), ("get_weather", '{"city":"Par')]
    parser = PARSERS[fmt](WEATHER_TOOLS)
    whole_content, calls = split_whole(parser, True, text, cut=True)
    assert [(c.function.name, c.function.arguments) for c in calls] == expected
    assert (whole_content or "") == content
    stream, streamed, got = ToolStream(parser), "", {}
    for i, ch in enumerate(text):
        last = i == len(text) - 1
        piece, events = stream.feed(ch, final=last, cut=last)
        streamed += piece
        for e in events:
            if e.id is not None:
                got[e.index] = [e.function.name, ""]
            else:
                got[e.index][1] += e.function.arguments
    assert streamed == content  # no markup, ever
    assert [tuple(c) for c in got.values()] == expected


def test_a_cut_before_the_name_or_inside_a_marker_shows_no_markup() -> None:
    for fmt, text, content in [
        ("hermes", 'Hi <tool_call>\n{"na', "Hi "),
        ("hermes", "Hi <tool_ca", "Hi "),
        ("mistral", "[TOOL_CALLS][", ""),
        ("llama3_json", '{"na', ""),
    ]:
        whole_content, calls = split_whole(PARSERS[fmt](), True, text, cut=True)
        assert calls == [] and (whole_content or "") == content, (fmt, text)
    # JSON that is no call stays content, cut or not
    assert split_whole(PARSERS["llama3_json"](), True, '{"answer": 4', cut=True) == (
        '{"answer": 4',
        [],
    )


def test_a_call_complete_but_cut_inside_its_end_tag_keeps_its_whole_arguments() -> None:
    text = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_c'
    content, calls = split_whole(PARSERS["hermes"](), True, text, cut=True)
    assert content is None and [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", '{"city":"Oslo"}')
    ]


def test_a_cut_after_json_that_is_no_call_keeps_it_as_content() -> None:
    text = '{"answer": 4} and then {"na'
    assert split_whole(PARSERS["llama3_json"](), True, text, cut=True) == (text, [])
