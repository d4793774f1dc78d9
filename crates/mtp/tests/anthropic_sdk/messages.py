"""The official `anthropic` client against `mtp serve` (run by crates/mtp/tests/anthropic.rs).

argv: base URL (http://127.0.0.1:PORT). Prints one JSON object with what it saw; every check
of the client's own view (types, the streamed events, the final message) is an assert here.
"""

import json
import sys

import anthropic

client = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused")

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "input_schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "days", "metric"],
        },
    },
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
PLAIN = [{"role": "user", "content": "fn main() {\n    let mut total = 0;\n"}]
NO_THINKING = {"type": "disabled"}
# the newest clients send sampling only as extra body fields
GREEDY = {"temperature": 0}

out = {}

# messages.create: a whole answer, MTP on and off give the same greedy text
texts = []
for spec in (True, False):
    m = client.messages.create(
        model="tiny-code",
        max_tokens=24,
        system="You complete code.",
        messages=PLAIN,
        thinking=NO_THINKING,
        metadata={"user_id": "u1"},
        extra_body={**GREEDY, "speculation": spec},
    )
    assert isinstance(m, anthropic.types.Message), m
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert [b.type for b in m.content] == ["text"], m.content
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 24, m.usage
    # the server's report, kept by the client as an extra field
    assert m.model_extra["speculation"]["used"] is spec, m.model_extra
    texts.append(m.content[0].text)
assert texts[0] == texts[1], texts
out["text"] = texts[0]
out["input_tokens"] = m.usage.input_tokens

# count_tokens: the same request's prompt, without generating
count = client.messages.count_tokens(
    model="tiny-code", system="You complete code.", messages=PLAIN, thinking=NO_THINKING
)
out["counted"] = count.input_tokens

# messages.stream: the helper's text stream and final message
with client.messages.stream(
    model="tiny-code",
    max_tokens=24,
    system="You complete code.",
    messages=PLAIN,
    thinking=NO_THINKING,
    extra_body=GREEDY,
) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
assert streamed == final.content[0].text, (streamed, final)
assert final.stop_reason in ("end_turn", "max_tokens"), final
assert final.usage.output_tokens > 0, final.usage
out["streamed"] = streamed

# max_tokens and stop_sequences as stop reasons
short = client.messages.create(
    model="tiny-code", max_tokens=3, messages=PLAIN, thinking=NO_THINKING, extra_body=GREEDY
)
assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3, short
stop = texts[0].strip()[2:5]
cut = client.messages.create(
    model="tiny-code",
    max_tokens=24,
    system="You complete code.",
    messages=PLAIN,
    thinking=NO_THINKING,
    stop_sequences=[stop],
    extra_body=GREEDY,
)
assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, (stop, cut)
assert cut.content[0].text == texts[0][: texts[0].index(stop)], (stop, cut)

# thinking on: the reasoning comes back as a thinking block with a signature
thought = client.messages.create(
    model="tiny-code",
    max_tokens=16,
    messages=PLAIN,
    thinking={"type": "enabled", "budget_tokens": 1024},
    extra_body=GREEDY,
)
assert thought.content and thought.content[0].type == "thinking", thought.content
assert thought.content[0].thinking and isinstance(thought.content[0].signature, str), thought

# tools: a forced call (named, and `any`), valid against its schema
def valid(block):
    assert block.type == "tool_use" and block.id.startswith("toolu_"), block
    assert block.name == "get_weather", block
    args = block.input
    assert args["city"] in ("Paris", "Tokyo", "Lima"), args
    assert 1 <= args["days"] <= 7 and isinstance(args["days"], int), args
    assert isinstance(args["metric"], bool) and len(args) == 3, args
    return args

calls = {}
for name, choice in (("tool", {"type": "tool", "name": "get_weather"}), ("any", {"type": "any"})):
    r = client.messages.create(
        model="tiny-code",
        max_tokens=400,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={**choice, "disable_parallel_tool_use": True},
        thinking=NO_THINKING,
        extra_body=GREEDY,
    )
    assert r.stop_reason == "tool_use", r
    uses = [b for b in r.content if b.type == "tool_use"]
    assert len(uses) == 1, r.content
    calls[name] = valid(uses[0])
    if name == "tool":
        first = r
out["call"] = calls["tool"]

# the same call streamed: input_json_delta pieces joined by the helper
with client.messages.stream(
    model="tiny-code",
    max_tokens=400,
    messages=QUESTION,
    tools=TOOLS,
    tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    thinking=NO_THINKING,
    extra_body=GREEDY,
) as stream:
    kinds = [e.type for e in stream]
    final = stream.get_final_message()
assert "input_json" in kinds or "content_block_delta" in kinds, kinds
assert final.stop_reason == "tool_use", final
out["streamed_call"] = valid([b for b in final.content if b.type == "tool_use"][0])

# the tool's result as the next turn, the history as the client keeps it
history = QUESTION + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": [b for b in first.content if b.type == "tool_use"][0].id,
                "content": [{"type": "text", "text": '{"forecast": "sun"}'}],
            }
        ],
    },
]
nxt = client.messages.create(
    model="tiny-code",
    max_tokens=8,
    messages=history,
    tools=TOOLS,
    thinking=NO_THINKING,
    extra_body=GREEDY,
)
assert nxt.stop_reason in ("end_turn", "max_tokens", "tool_use"), nxt
tool_count = client.messages.count_tokens(
    model="tiny-code", messages=history, tools=TOOLS, thinking=NO_THINKING
)
out["tool_turn_input_tokens"] = nxt.usage.input_tokens
out["tool_turn_counted"] = tool_count.input_tokens
out["first_input_tokens"] = first.usage.input_tokens

# errors in Anthropic's shape, raised as the client's own exception types
try:
    client.messages.create(model="tiny-code", max_tokens=8, messages=[])
    raise AssertionError("an empty conversation was answered")
except anthropic.BadRequestError as e:
    assert e.status_code == 400 and e.body["type"] == "error", e.body
    assert e.body["error"]["type"] == "invalid_request_error", e.body
print(json.dumps(out))
