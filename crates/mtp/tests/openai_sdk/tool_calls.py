"""The official `openai` client against `mtp serve` (run by crates/mtp/tests/tool_calls.rs).

argv: base URL (http://127.0.0.1:PORT/v1). Prints one JSON object with what it saw; every
check of the client's own view (types, the streamed pieces) is an assert here.
"""

import json
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused")

TOOLS = [
    {
        "type": "function",
        "function": {
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
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                "required": ["zone"],
            },
        },
    },
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def create(tool_choice, speculation, **kw):
    return client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=400,
        extra_body={
            "speculation": speculation,
            "chat_template_kwargs": {"enable_thinking": False},
        },
        **kw,
    )


def valid(call):
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert args["city"] in ("Paris", "Tokyo", "Lima"), args
        assert 1 <= args["days"] <= 7 and isinstance(args["days"], int), args
        assert isinstance(args["metric"], bool), args
        assert len(args) == 3, args
    else:
        assert call.function.name == "get_time", call
        assert args["zone"] in ("UTC", "CET"), args
    return args


out = {}
for name, choice in (("named", NAMED), ("required", "required")):
    seen = []
    for spec in (True, False):
        r = create(choice, spec)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.content is None, c.message
        assert len(c.message.tool_calls) == 1, c.message.tool_calls
        call = c.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_"), call
        if choice == NAMED:
            assert call.function.name == "get_weather", call
        valid(call)
        seen.append([call.function.name, call.function.arguments])
    assert seen[0] == seen[1], seen  # MTP on and off: the same call
    out[name] = seen[0]

# streamed, with usage: the pieces join to the whole answer's call
stream = create(NAMED, True, stream=True, stream_options={"include_usage": True})
calls, finish, usage, text = {}, None, None, ""
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    if not chunk.choices:
        continue
    d = chunk.choices[0].delta
    text += d.content or ""
    for piece in d.tool_calls or []:
        entry = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
        if piece.id:
            entry["id"] = piece.id
            assert piece.type == "function", piece
        if piece.function and piece.function.name:
            entry["name"] = piece.function.name
        if piece.function and piece.function.arguments:
            entry["arguments"] += piece.function.arguments
    if chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
assert finish == "tool_calls", finish
assert "<tool_call>" not in text and "<function=" not in text, text
assert list(calls) == [0], calls
assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather", calls
assert usage is not None and usage.completion_tokens > 0, usage
out["streamed"] = [calls[0]["name"], calls[0]["arguments"]]

# the tool's result as the next turn, history as the client keeps it
first = create(NAMED, True)
msg = first.choices[0].message
history = MESSAGES + [
    msg.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": '{"forecast": "sun"}'},
]
nxt = client.chat.completions.create(
    model="m",
    messages=history,
    tools=TOOLS,
    temperature=0,
    max_tokens=8,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
assert nxt.choices[0].finish_reason in ("stop", "length", "tool_calls"), nxt
out["tool_turn_prompt_tokens"] = nxt.usage.prompt_tokens
out["first_prompt_tokens"] = first.usage.prompt_tokens
print(json.dumps(out))
