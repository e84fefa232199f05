"""The OpenAI Agents SDK on its default model (OpenAIResponsesModel: /v1/responses) against a real
server on the tiny model: an Agent with a function tool, forced by tool_choice "required" (the SDK
resets it after the call), runs the tool and comes back with a final output (a structured one, so
the random-weight model's answer is bounded), whole and streamed."""

from __future__ import annotations

import asyncio
from typing import Literal

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from pydantic import BaseModel

from tests.api.servers import Server


class Forecast(BaseModel):
    sky: Literal["sunny", "rainy"]


@pytest.fixture()
def ran() -> list[str]:
    """The tool's calls, as the agent made them."""
    return []


def _agent(server: Server, calls: list[str]) -> Agent:
    @function_tool
    def weather(city: Literal["Paris"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny"

    set_default_openai_api("responses")
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    settings = ModelSettings(
        tool_choice="required", temperature=0, max_tokens=100, parallel_tool_calls=False
    )
    return Agent(
        name="forecaster",
        instructions="Answer with the weather.",
        model=server.model,
        tools=[weather],
        output_type=Forecast,
        model_settings=settings,
    )


def test_agent_calls_its_tool_and_answers(long_server: Server, ran: list[str]) -> None:
    agent = _agent(long_server, ran)
    result = asyncio.run(Runner.run(agent, "Weather in Paris?", max_turns=3))
    assert ran == ["Paris"]
    assert isinstance(result.final_output, Forecast)
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert all(r.usage.output_tokens > 0 for r in result.raw_responses)


def test_agent_streamed(long_server: Server, ran: list[str]) -> None:
    agent = _agent(long_server, ran)

    async def run() -> tuple[object, list[str]]:
        streamed = Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
        kinds = [e.type async for e in streamed.stream_events()]
        return streamed.final_output, kinds

    final, kinds = asyncio.run(run())
    assert ran == ["Paris"]
    assert isinstance(final, Forecast) and "raw_response_event" in kinds
