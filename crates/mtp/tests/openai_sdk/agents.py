"""The `openai-agents` SDK against `mtp serve` (run by crates/mtp/tests/responses.rs): an Agent on
its default model, the Responses API (`OpenAIResponsesModel`), with one function tool.

argv: base URL (http://127.0.0.1:PORT/v1). Prints one JSON object with what it saw; every check
of the SDK's own view is an assert here.
"""

import asyncio
import json
import os
import sys
from typing import Annotated, Literal

# this file's own name would shadow the SDK's package (`agents`): its folder is not searched
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from openai.types.shared import Reasoning  # noqa: E402

set_tracing_disabled(True)

calls = []


@function_tool
def get_weather(
    city: Literal["Paris", "Tokyo", "Lima"], days: Annotated[int, Field(ge=1, le=7)]
) -> str:
    """Weather forecast for a city.

    Args:
        city: The city.
        days: How many days ahead.
    """
    calls.append({"city": city, "days": days})
    return json.dumps({"forecast": "sun", "city": city, "days": days})


class Forecast(BaseModel):
    city: Literal["Paris", "Tokyo", "Lima"]
    sunny: bool


client = AsyncOpenAI(base_url=sys.argv[1], api_key="unused")
model = OpenAIResponsesModel(model="tiny-code", openai_client=client)
settings = dict(
    temperature=0, max_tokens=400, parallel_tool_calls=False, reasoning=Reasoning(effort="none")
)
QUESTION = "What is the weather in Paris for 3 days?"

# the tool's turn: the call is forced (the tiny model would not choose it), and the run ends
# with the tool's result
caller = Agent(
    name="weather",
    instructions="Answer weather questions with the get_weather tool.",
    model=model,
    tools=[get_weather],
    model_settings=ModelSettings(tool_choice="required", **settings),
    tool_use_behavior="stop_on_first_tool",
)
# the answer's turn: the history with the call and its output sent back as items, the answer a
# structured output (`text.format` json_schema), which ends before the token limit
answerer = Agent(
    name="weather",
    instructions="Answer weather questions with the get_weather tool.",
    model=model,
    tools=[get_weather],
    model_settings=ModelSettings(**settings),
    output_type=Forecast,
)


async def main():
    out = {}
    first = await Runner.run(caller, QUESTION, max_turns=2)
    kinds = [item.type for item in first.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"], kinds
    assert json.loads(first.final_output)["forecast"] == "sun", first.final_output
    history = first.to_input_list()
    assert [i.get("type") for i in history[1:]] == ["function_call", "function_call_output"], history
    second = await Runner.run(answerer, history, max_turns=2)
    assert isinstance(second.final_output, Forecast), second.final_output
    out["responses"] = len(first.raw_responses) + len(second.raw_responses)
    out["final_output"] = second.final_output.model_dump_json()

    # streamed: the tool's turn over the Responses stream events
    streamed = Runner.run_streamed(caller, QUESTION, max_turns=2)
    seen = []
    async for event in streamed.stream_events():
        if event.type == "raw_response_event":
            seen.append(event.data.type)
    assert seen[0] == "response.created" and seen[-1] == "response.completed", seen
    assert "response.function_call_arguments.delta" in seen, seen
    assert streamed.final_output == first.final_output, streamed.final_output
    out["tool_calls"] = calls
    print(json.dumps(out))


asyncio.run(main())
