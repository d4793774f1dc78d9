//! Whatever a peer sends, reading it neither panics nor refuses an object: random JSON built
//! from the protocol's own field names (so typed fields get values of every wrong type) reads
//! into every type, and writes back.

use mtp_openai::{ChatCompletionRequest, Completion, ErrorBody, ModelList, Props, Slot};
use serde_json::{Map, Value};

const KEYS: &[&str] = &[
    "messages",
    "role",
    "content",
    "type",
    "text",
    "image_url",
    "url",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "index",
    "id",
    "choices",
    "delta",
    "message",
    "usage",
    "timings",
    "stats",
    "metrics",
    "speculative_decoding",
    "error",
    "data",
    "stream_options",
    "include_usage",
    "logit_bias",
    "stop",
    "prompt",
    "structured_outputs",
    "json",
    "regex",
    "choice",
    "grammar",
    "response_format",
    "json_schema",
    "schema",
    "speculation",
    "mode",
    "num_draft_tokens",
    "tool_choice",
    "tools",
    "default_generation_settings",
    "params",
    "speculative.types",
    "speculative.n_max",
    "tokens",
    "finish_reason",
    "prompt_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "acceptance_histogram",
    "n_predict",
    "temperature",
    "max_tokens",
    "logprobs",
    "reasoning_content",
    "reasoning",
    "draft_n",
    "stop_reason",
    "speculative",
    "message",
    "code",
    "param",
    "object",
    "created",
    "x",
];

/// A small deterministic generator (xorshift), so a failure is reproducible from its seed.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn value(&mut self, depth: u32) -> Value {
        let kinds = if depth == 0 { 6 } else { 8 };
        match self.below(kinds) {
            0 => Value::Null,
            1 => Value::Bool(self.below(2) == 0),
            2 => match self.below(5) {
                0 => (-(self.below(1000) as i64)).into(),
                1 => (self.below(3) as f64 + 0.5).into(),
                2 => u64::MAX.into(),
                3 => 1e300.into(),
                _ => self.below(100).into(),
            },
            3 | 4 => {
                let pick = KEYS[self.below(KEYS.len() as u64) as usize];
                match self.below(4) {
                    0 => "".into(),
                    1 => "data:image/png;base64,iVBORw0KGgo=".into(),
                    _ => pick.into(),
                }
            }
            5 => Value::Array(vec![]),
            6 => {
                let n = self.below(4);
                Value::Array((0..n).map(|_| self.value(depth - 1)).collect())
            }
            _ => self.object(depth - 1),
        }
    }

    fn object(&mut self, depth: u32) -> Value {
        let n = self.below(6);
        let mut m = Map::new();
        for _ in 0..n {
            let k = KEYS[self.below(KEYS.len() as u64) as usize];
            let v = self.value(depth);
            m.insert(k.to_string(), v);
        }
        Value::Object(m)
    }
}

fn reads<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value, what: &str) {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: {e}\n{v}"));
    serde_json::to_value(&t).unwrap_or_else(|e| panic!("{what} back: {e}\n{v}"));
}

#[test]
fn random_objects_read_into_every_type() {
    for seed in 1..4000u64 {
        let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let v = g.object(4);
        reads::<ChatCompletionRequest>(&v, "request");
        reads::<Completion>(&v, "completion");
        reads::<ModelList>(&v, "models");
        reads::<Props>(&v, "props");
        reads::<Slot>(&v, "slot");
        // the error body needs its message; what is not one is an error, not a panic
        let _ = serde_json::from_value::<ErrorBody>(v.clone());
        // and the accessors the readers use hold on anything
        if let Ok(c) = serde_json::from_value::<Completion>(v.clone()) {
            let _ = (c.first_choice(), c.error_message());
        }
        if let Ok(p) = serde_json::from_value::<Props>(v.clone()) {
            let _ = p.speculative_params().map(|s| s.types());
        }
        if let Ok(r) = serde_json::from_value::<ChatCompletionRequest>(v) {
            for m in r.messages.and_then(|m| m.into_ok()).into_iter().flatten() {
                if let Some(Ok(calls)) = m
                    .ok()
                    .and_then(|m| m.tool_calls.as_ref())
                    .map(|c| c.as_result().cloned())
                {
                    for c in calls.iter().filter_map(|c| c.ok()) {
                        let _ = c.to_contract();
                    }
                }
            }
        }
    }
}
