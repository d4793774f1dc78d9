"""The official `openai` client's Responses API against `mtp serve` (run by
crates/mtp/tests/responses.rs).

argv: base URL (http://127.0.0.1:PORT/v1). Prints one JSON object with what it saw; every check
of the client's own view (typed objects, `output_text`, the streamed events, the stream helper's
final response) is an assert here.
"""

import json
import sys

import openai
from openai import OpenAI
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

client = OpenAI(base_url=sys.argv[1], api_key="unused")

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "days", "metric"],
            "additionalProperties": False,
        },
        "strict": True,
    },
]
QUESTION = "What is the weather in Paris for 3 days?"
PLAIN = "fn main() {\n    let mut total = 0;\n"
NO_THINKING = {"effort": "none"}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "size", "tags"],
    "additionalProperties": False,
}


def valid_call(call):
    assert isinstance(call, ResponseFunctionToolCall), call
    assert call.type == "function_call" and call.name == "get_weather", call
    assert call.call_id and call.id and call.id.startswith("fc_"), call
    args = json.loads(call.arguments)
    assert args["city"] in ("Paris", "Tokyo", "Lima"), args
    assert 1 <= args["days"] <= 7 and isinstance(args["days"], int), args
    assert isinstance(args["metric"], bool) and len(args) == 3, args
    return args


def valid_json(text):
    v = json.loads(text)
    assert set(v) == {"name", "size", "tags"}, v
    assert isinstance(v["name"], str) and len(v["name"]) <= 12, v
    assert isinstance(v["size"], int) and 0 <= v["size"] <= 99, v
    assert isinstance(v["tags"], list) and len(v["tags"]) <= 3, v
    assert all(t in ("a", "b") for t in v["tags"]), v
    return v


out = {}

# responses.create: a typed Response whose output_text is the message's text, MTP on and off
texts = []
for spec in (True, False):
    r = client.responses.create(
        model="tiny-code",
        instructions="You complete code.",
        input=PLAIN,
        max_output_tokens=24,
        temperature=0,
        reasoning=NO_THINKING,
        metadata={"k": "v"},
        store=False,
        extra_body={"speculation": spec},
    )
    assert isinstance(r, Response), r
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status in ("completed", "incomplete"), r
    assert [type(i) for i in r.output] == [ResponseOutputMessage], r.output
    assert r.output[0].content[0].type == "output_text", r.output
    assert r.output_text == r.output[0].content[0].text and r.output_text, r
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 24, r.usage
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage
    assert r.instructions == "You complete code." and r.max_output_tokens == 24, r
    assert r.metadata == {"k": "v"} and r.temperature == 0, r
    # the server's report, kept by the client as an extra field
    assert r.model_extra["speculation"]["used"] is spec, r.model_extra
    texts.append(r.output_text)
assert texts[0] == texts[1], texts
out["text"] = texts[0]

# the token limit: incomplete, with the reason
short = client.responses.create(
    model="tiny-code", input=PLAIN, max_output_tokens=3, temperature=0, reasoning=NO_THINKING
)
assert short.status == "incomplete", short
assert short.incomplete_details.reason == "max_output_tokens", short
assert short.usage.output_tokens == 3, short.usage

# thinking on: a reasoning item before the text
thought = client.responses.create(
    model="tiny-code", input=PLAIN, max_output_tokens=16, temperature=0, reasoning={"effort": "high"}
)
assert isinstance(thought.output[0], ResponseReasoningItem), thought.output
assert thought.output[0].content[0].type == "reasoning_text", thought.output[0]
assert thought.output[0].content[0].text, thought.output[0]

# responses.stream: the helper's text deltas and its final response (a JSON answer, which ends
# before the token limit: the helper gives a final response only for a completed one)
with client.responses.stream(
    model="tiny-code",
    input="Describe a box as JSON.",
    text={"format": {"type": "json_schema", "name": "box", "schema": SCHEMA, "strict": True}},
    max_output_tokens=200,
    temperature=0,
    reasoning=NO_THINKING,
) as stream:
    deltas = []
    kinds = []
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    final = stream.get_final_response()
assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
assert "".join(deltas) == final.output_text, (deltas, final)
assert final.usage.output_tokens > 0, final.usage
out["streamed_json"] = valid_json(final.output_text)

# create(stream=True): the raw events, numbered in order
events = list(
    client.responses.create(
        model="tiny-code",
        instructions="You complete code.",
        input=PLAIN,
        max_output_tokens=24,
        temperature=0,
        reasoning=NO_THINKING,
        stream=True,
    )
)
assert [e.sequence_number for e in events] == list(range(len(events))), events
assert events[0].type == "response.created" and events[1].type == "response.in_progress", events
raw = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert raw == events[-1].response.output_text, (raw, events[-1])
assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
out["streamed"] = raw

# tools: a forced call (required, and named), its arguments valid against the schema
calls = {}
for name, choice in (("required", "required"), ("named", {"type": "function", "name": "get_weather"})):
    r = client.responses.create(
        model="tiny-code",
        input=QUESTION,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        max_output_tokens=400,
        temperature=0,
        reasoning=NO_THINKING,
    )
    assert r.status == "completed", r
    fcs = [i for i in r.output if i.type == "function_call"]
    assert len(fcs) == 1, r.output
    calls[name] = valid_call(fcs[0])
    if name == "named":
        first = r
out["call"] = calls["named"]

# the same call streamed: argument deltas joined by the helper into the final response
with client.responses.stream(
    model="tiny-code",
    input=QUESTION,
    tools=TOOLS,
    tool_choice={"type": "function", "name": "get_weather"},
    parallel_tool_calls=False,
    max_output_tokens=400,
    temperature=0,
    reasoning=NO_THINKING,
) as stream:
    pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
    final = stream.get_final_response()
streamed_calls = [i for i in final.output if i.type == "function_call"]
assert len(streamed_calls) == 1, final.output
assert "".join(pieces) == streamed_calls[0].arguments, (pieces, streamed_calls)
out["streamed_call"] = valid_call(streamed_calls[0])

# the call's output as the next turn, the history as the client keeps it (the output items
# given back as they came)
history = [{"role": "user", "content": QUESTION}]
history += [i.model_dump(exclude_none=True) for i in first.output]
call = [i for i in first.output if i.type == "function_call"][0]
history.append({"type": "function_call_output", "call_id": call.call_id, "output": '{"forecast": "sun"}'})
nxt = client.responses.create(
    model="tiny-code",
    input=history,
    tools=TOOLS,
    max_output_tokens=8,
    temperature=0,
    reasoning=NO_THINKING,
)
assert nxt.status in ("completed", "incomplete"), nxt
out["tool_turn_input_tokens"] = nxt.usage.input_tokens
out["first_input_tokens"] = first.usage.input_tokens

# text.format json_schema: JSON valid against the schema
r = client.responses.create(
    model="tiny-code",
    input="Describe a box as JSON.",
    text={"format": {"type": "json_schema", "name": "box", "schema": SCHEMA, "strict": True}},
    max_output_tokens=200,
    temperature=0,
    reasoning=NO_THINKING,
)
assert r.status == "completed", r
out["json"] = valid_json(r.output_text)

# errors in OpenAI's shape, raised as the client's own exception types
try:
    client.responses.create(model="tiny-code", input=PLAIN, previous_response_id="resp_0")
    raise AssertionError("a previous_response_id was answered")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.body["param"] == "previous_response_id", e.body
try:
    client.responses.create(model="tiny-code", input=PLAIN, tools=[{"type": "web_search"}])
    raise AssertionError("a hosted tool was answered")
except openai.BadRequestError as e:
    assert e.body["param"] == "tools[0]" and "web_search" in e.body["message"], e.body
print(json.dumps(out))
