"""The official openai client against the real server: results match the offline LLM API."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from engine.sampling_params import SamplingParams
from tests.api.servers import BLOCK_SIZE, Server, fresh_text


@pytest.fixture()
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture()
def aclient(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def greedy(max_tokens: int = 12, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def test_models_list(client: openai.OpenAI, server: Server) -> None:
    ids = [m.id for m in client.models.list().data]
    assert server.model in ids


def test_completion_matches_offline(client, server, offline) -> None:
    prompt = fresh_text(40, 1)
    expected = offline.generate([prompt], greedy())[0]
    out = client.completions.create(model=server.model, prompt=prompt, max_tokens=12, temperature=0)
    assert out.choices[0].text == expected.outputs[0].text
    assert out.choices[0].finish_reason == expected.outputs[0].finish_reason
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert out.usage.completion_tokens == len(expected.outputs[0].token_ids)


def test_chat_matches_offline_streaming_and_not(client, server, offline) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": fresh_text(30, 2)},
    ]
    expected = offline.chat(messages, greedy())[0].outputs[0].text
    out = client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=12, temperature=0
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected
    stream = client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_async_streaming_completion_matches_offline(aclient, server, offline) -> None:
    prompt = fresh_text(25, 3)
    expected = offline.generate([prompt], greedy(10))[0]

    async def run() -> tuple[str, object]:
        stream = await aclient.completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            text += "".join(c.text for c in chunk.choices)
            usage = chunk.usage or usage
        return text, usage

    text, usage = asyncio.run(run())
    assert text == expected.outputs[0].text
    assert usage.completion_tokens == len(expected.outputs[0].token_ids)
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_async_chat_non_streaming(aclient, server, offline) -> None:
    messages = [{"role": "user", "content": fresh_text(20, 4)}]
    expected = offline.chat(messages, greedy(8))[0].outputs[0].text
    out = asyncio.run(
        aclient.chat.completions.create(
            model=server.model, messages=messages, max_tokens=8, temperature=0
        )
    )
    assert out.choices[0].message.content == expected


def test_cached_tokens_zero_then_positive(client, server) -> None:
    prompt = fresh_text(5 * BLOCK_SIZE + 3, 5)
    first = client.completions.create(
        model=server.model, prompt=prompt, max_tokens=4, temperature=0
    )
    again = client.completions.create(
        model=server.model, prompt=prompt, max_tokens=4, temperature=0
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= 5 * BLOCK_SIZE
    assert again.choices[0].text == first.choices[0].text


def test_chat_streaming_usage_reports_cached_tokens(client, server) -> None:
    messages = [{"role": "user", "content": fresh_text(4 * BLOCK_SIZE, 6)}]
    usages = []
    for _ in range(2):
        stream = client.chat.completions.create(
            model=server.model,
            messages=messages,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        usages.append(chunks[-1].usage)
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details.cached_tokens >= 3 * BLOCK_SIZE


def test_n_seed_and_sampling(client, server) -> None:
    kw = dict(
        model=server.model, prompt=fresh_text(20, 7), max_tokens=8, temperature=1.0, top_p=0.9
    )
    a = client.completions.create(n=3, seed=11, **kw)
    b = client.completions.create(n=3, seed=11, **kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.completion_tokens == 24


def test_stop_strings_match_offline(client, server, offline) -> None:
    prompt = fresh_text(30, 8)
    full = offline.generate([prompt], greedy(16))[0].outputs[0].text
    stop = next((full[i : i + 1] for i in range(3, len(full)) if full[i].isprintable()), None)
    if stop is None:
        stop = "zz"
    expected = offline.generate([prompt], greedy(16, stop=(stop,)))[0].outputs[0]
    out = client.completions.create(
        model=server.model, prompt=prompt, max_tokens=16, temperature=0, stop=[stop]
    )
    assert out.choices[0].text == expected.text
    assert stop not in out.choices[0].text
    assert out.choices[0].finish_reason == expected.finish_reason


def test_logprobs(client, server) -> None:
    prompt = fresh_text(20, 9)
    out = client.completions.create(
        model=server.model, prompt=prompt, max_tokens=5, temperature=0, logprobs=2
    )
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == 5 and all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 5
    assert all(len(t.top_logprobs) == 3 for t in content)
    # greedy: the chosen token is the most likely one
    assert all(t.logprob >= max(x.logprob for x in t.top_logprobs) - 1e-5 for t in content)


def test_batch_prompts_and_echo(client, server, offline) -> None:
    prompts = [fresh_text(15, 10), fresh_text(18, 11)]
    expected = [offline.generate([p], greedy(6))[0].outputs[0].text for p in prompts]
    out = client.completions.create(model=server.model, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.text for c in out.choices] == expected
    echo = client.completions.create(
        model=server.model, prompt=prompts[0], max_tokens=6, temperature=0, echo=True
    )
    assert echo.choices[0].text == prompts[0] + expected[0]


def test_token_id_prompt(client, server, offline) -> None:
    ids = offline.tokenizer.encode(fresh_text(12, 12))
    expected = offline.generate([ids], greedy(6))[0].outputs[0].text
    out = client.completions.create(model=server.model, prompt=ids, max_tokens=6, temperature=0)
    assert out.choices[0].text == expected


def test_return_token_ids_extension(http, server, offline) -> None:
    prompt = fresh_text(20, 13)
    expected = offline.generate([prompt], greedy(6))[0]
    body = {"model": server.model, "prompt": prompt, "max_tokens": 6, "temperature": 0}
    plain = http.post("/v1/completions", json=body).json()["choices"][0]
    assert "token_ids" not in plain and plain["logprobs"] is None
    choice = http.post("/v1/completions", json={**body, "return_token_ids": True}).json()
    choice = choice["choices"][0]
    assert choice["token_ids"] == expected.outputs[0].token_ids
    assert choice["prompt_token_ids"] == expected.prompt_token_ids
    streamed: list[int] = []
    stream_body = {**body, "return_token_ids": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=stream_body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    streamed += c.get("token_ids") or []
    assert streamed == expected.outputs[0].token_ids


def test_streaming_chat_with_n_choices(client, server) -> None:
    kw = dict(
        model=server.model,
        messages=[{"role": "user", "content": fresh_text(20, 14)}],
        max_tokens=6,
        temperature=0.9,
        seed=5,
        n=2,
    )
    whole = client.chat.completions.create(**kw)
    texts = {0: "", 1: ""}
    reasons = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}  # same seed, same ends
    assert set(reasons) == {0, 1} and set(reasons.values()) <= {"length", "stop"}
