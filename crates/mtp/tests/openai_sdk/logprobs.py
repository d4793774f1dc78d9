"""The official `openai` client reading log probabilities, `echo`, token-id prompts and `n`
from `mtp serve` (run by crates/mtp/tests/logprobs.rs).

argv: base URL (http://127.0.0.1:PORT/v1). Prints one JSON object with what it saw; the
client parses every answer into its own types (so a field of the wrong shape fails here).
"""

import json
import sys
import urllib.request

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused")
MESSAGES = [{"role": "user", "content": "def add(a, b):"}]


def chat(**kw):
    return client.chat.completions.create(
        model="any", messages=MESSAGES, max_tokens=8, temperature=0, **kw
    )


def content_lps(lps):
    return [(t.token, t.logprob, t.bytes, [(a.token, a.logprob) for a in t.top_logprobs]) for t in lps.content]


off = chat(logprobs=True, top_logprobs=3, extra_body={"speculation": False})
on = chat(
    logprobs=True,
    top_logprobs=3,
    extra_body={"speculation": {"mode": "native_mtp", "num_draft_tokens": 3}},
)
assert off.choices[0].logprobs is not None
for t in off.choices[0].logprobs.content:
    assert len(t.top_logprobs) == 3
    assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
    assert t.logprob <= 0.0

streamed = []
for chunk in chat(logprobs=True, top_logprobs=3, stream=True, extra_body={"speculation": False}):
    for c in chunk.choices:
        if c.logprobs is not None and c.logprobs.content:
            streamed.extend(c.logprobs.content)

raw = client.chat.completions.with_raw_response.create(
    model="any", messages=MESSAGES, max_tokens=4, temperature=0
)

# the server's tokenizer route (outside /v1), as lm-evaluation-harness calls it
req = urllib.request.Request(
    sys.argv[1].removesuffix("/v1") + "/tokenize",
    data=json.dumps({"prompt": "fn main() {", "add_special_tokens": False}).encode(),
    headers={"Content-Type": "application/json"},
)
with urllib.request.urlopen(req) as r:
    prompt_ids = json.load(r)["tokens"]
echo = client.completions.create(
    model="any", prompt=prompt_ids, max_tokens=3, temperature=0, logprobs=2, echo=True
)
lp = echo.choices[0].logprobs
assert lp.token_logprobs[0] is None
assert len(lp.tokens) == len(prompt_ids) + echo.usage.completion_tokens

batch = client.completions.create(
    model="any", prompt=["a", "b"], max_tokens=2, temperature=0, n=2, seed=3
)

print(
    json.dumps(
        {
            "off": content_lps(off.choices[0].logprobs),
            "on": content_lps(on.choices[0].logprobs),
            "on_used": (on.model_extra or {}).get("speculation", {}).get("used"),
            "streamed": [(t.token, t.logprob) for t in streamed],
            "header_used": raw.headers.get("x-mtp-speculation-used"),
            "echo_tokens": len(lp.tokens),
            "echo_prompt": len(prompt_ids),
            "batch_indexes": [c.index for c in batch.choices],
            "model": client.models.retrieve(client.models.list().data[0].id).id,
        }
    )
)
