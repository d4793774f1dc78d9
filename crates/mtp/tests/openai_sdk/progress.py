"""The official `openai` client streaming from `mtp serve` with llama-server's `return_progress`
(run by crates/mtp/tests/serve.rs).

argv: base URL (http://127.0.0.1:PORT/v1). Prints one JSON object with what it saw; the
checks of the client's own view are asserts here.
"""

import json
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused")

# a prompt of a few thousand tokens on the byte-level demo vocabulary: several parts of it
PROMPT = "fn add(a: i32, b: i32) -> i32 { a + b }\n" * 60


def stream(progress):
    extra = {"return_progress": True} if progress else {}
    chunks = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    seen, text, usage, text_before_progress = [], "", None, False
    for c in chunks:
        # the client keeps fields it does not know in the model's extras
        p = (c.model_extra or {}).get("prompt_progress")
        if p is not None:
            assert c.choices == [], c
            text_before_progress |= bool(text)
            seen.append(p)
        for ch in c.choices:
            text += ch.delta.content or ""
        if c.usage is not None:
            usage = c.usage
    assert not text_before_progress, seen
    return seen, text, usage


seen, text, usage = stream(True)
plain, plain_text, _ = stream(False)
assert plain == [], plain
assert text == plain_text, (text, plain_text)
print(
    json.dumps(
        {"progress": seen, "prompt_tokens": usage.prompt_tokens, "text": text}
    )
)
