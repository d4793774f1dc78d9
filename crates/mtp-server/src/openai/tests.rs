//! Unit tests of `openai.rs`.
use super::*;
use mtp_contract::{FinishReason, ToolChoice};
use serde_json::json;

fn chat(v: Value) -> Result<Parsed, ApiError> {
    parse(Endpoint::Chat, &v, &Limits::default())
}

#[test]
fn images_come_inline_only() {
    let url = "data:image/png;base64,iVBORw0KGgo=";
    let p = chat(json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "what is it?"}]}]}))
    .unwrap();
    let m = &p.request.messages.as_ref().unwrap()[0];
    assert_eq!(m.images, [url]);
    assert_eq!(m.content, "what is it?");
    for bad in [
        "/etc/passwd",
        "file:///etc/passwd",
        "https://example.invalid/a.png",
    ] {
        let e = chat(json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": bad}}]}]}))
        .unwrap_err();
        assert!(e.message.contains("not a data: URL"), "{bad}: {e:?}");
    }
}

#[test]
fn a_conversation_is_the_history_as_sent() {
    let p = chat(json!({"model": "x", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
    ], "max_tokens": 7, "temperature": 0, "stop": "\n", "stream": true,
       "stream_options": {"include_usage": true}}))
    .unwrap();
    let r = &p.request;
    assert_eq!(r.prompt, "");
    let m = r.messages.as_ref().unwrap();
    assert_eq!(m[0].role, Role::System);
    assert_eq!(m[1].content, "Hi there");
    assert_eq!(r.max_output_tokens, Some(7));
    assert_eq!(r.sampling.temperature, Some(0.0));
    assert_eq!(r.stop, vec!["\n".to_string()]);
    assert!(p.stream && p.include_usage);
    assert!(!r.raw_prompt);
}

#[test]
fn speculation_per_request_uses_the_contracts_block() {
    let p = chat(json!({"messages": [{"role": "user", "content": "a"}],
        "speculation": {"mode": "native_mtp", "num_draft_tokens": 2}}))
    .unwrap();
    let block = json!({"mode": "native_mtp", "num_draft_tokens": 2});
    assert_eq!(
        p.request.speculation,
        Some(Speculation::from_json(&block).unwrap())
    );
    let off = chat(json!({"messages": [{"role": "user", "content": "a"}], "speculation": false}))
        .unwrap();
    assert_eq!(off.request.speculation, Some(Speculation::off()));
    // llama-server's field
    let n = chat(json!({"messages": [{"role": "user", "content": "a"}], "speculative.n_max": 0}))
        .unwrap();
    assert_eq!(n.request.speculation, Some(Speculation::off()));
    // the contract's own message for a bad block
    let e = chat(json!({"messages": [{"role": "user", "content": "a"}],
        "speculation": {"num_draft_tokens": 0}}))
    .unwrap_err();
    let contract = Speculation::from_json(&json!({"num_draft_tokens": 0})).unwrap_err();
    assert_eq!(e.status, 400);
    assert_eq!(e.param.as_deref(), Some("speculation"));
    assert!(e.message.contains(&contract.to_string()), "{}", e.message);
}

#[test]
fn constraints_in_every_field_clients_send() {
    let with = |k: &str, v: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "a"}]});
        b[k] = v;
        chat(b).map(|p| p.request.response_format)
    };
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let want = Some(ResponseFormat::json_schema(schema.clone()));
    for (k, v) in [
        ("json_schema", schema.clone()),
        ("guided_json", schema.clone()),
        ("structured_outputs", json!({"json": schema.clone()})),
        ("structured_outputs", json!({"json": schema.to_string()})),
    ] {
        assert_eq!(with(k, v.clone()).unwrap(), want, "{k}: {v}");
    }
    assert_eq!(
        with(
            "structured_outputs",
            json!({"regex": "[a-z]+", "choice": null})
        )
        .unwrap(),
        Some(ResponseFormat::regex("[a-z]+"))
    );
    assert_eq!(
        with("guided_regex", json!("[a-z]+")).unwrap(),
        Some(ResponseFormat::regex("[a-z]+"))
    );
    assert_eq!(
        with("structured_outputs", json!({"grammar": "start: \"a\"+"})).unwrap(),
        Some(ResponseFormat::grammar("start: \"a\"+"))
    );
    // a choice is the regex of exactly one of its strings, metacharacters escaped
    let choice = ResponseFormat::regex(r"(yes|no|a\.b\*)");
    for (k, v) in [
        ("guided_choice", json!(["yes", "no", "a.b*"])),
        (
            "structured_outputs",
            json!({"choice": ["yes", "no", "a.b*"]}),
        ),
    ] {
        assert_eq!(with(k, v).unwrap(), Some(choice.clone()));
    }
    // `response_format: text` is no constraint, and leaves room for another field
    assert_eq!(
        with("response_format", json!({"type": "text"})).unwrap(),
        None
    );
    let mut b = json!({"messages": [{"role": "user", "content": "a"}],
        "response_format": {"type": "text"}, "guided_regex": "x"});
    assert_eq!(
        chat(b.clone()).unwrap().request.response_format,
        Some(ResponseFormat::regex("x"))
    );
    // two constraints at once are refused, naming both
    b["response_format"] = json!({"type": "json_object"});
    let e = chat(b).unwrap_err();
    assert_eq!(e.status, 400);
    assert_eq!(e.param.as_deref(), Some("guided_regex"));
    assert!(
        e.message.contains("`response_format`, `guided_regex`"),
        "{}",
        e.message
    );
    // the contract's prompted_fallback travels as an extension field
    let asked = json!({"messages": [{"role": "user", "content": "a"}],
        "guided_regex": "x", "prompted_fallback": true});
    assert!(chat(asked).unwrap().request.prompted_fallback);
    let plain = json!({"messages": [{"role": "user", "content": "a"}], "guided_regex": "x"});
    assert!(!chat(plain).unwrap().request.prompted_fallback);
    let e = chat(json!({"messages": [{"role": "user", "content": "a"}],
        "prompted_fallback": "yes"}))
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("prompted_fallback"));
    // what structured_outputs holds that is not taken, or is malformed, is named
    for (v, param) in [
        (
            json!({"structural_tag": "{}"}),
            "structured_outputs.structural_tag",
        ),
        (
            json!({"whitespace_pattern": " "}),
            "structured_outputs.whitespace_pattern",
        ),
        (json!({"regex": "a", "json": {}}), "structured_outputs"),
        (json!({}), "structured_outputs"),
        (json!("regex"), "structured_outputs"),
        (json!({"regex": 5}), "structured_outputs.regex"),
        (json!({"json": "{not json"}), "structured_outputs.json"),
        (json!({"choice": []}), "structured_outputs.choice"),
        (json!({"choice": ["a", 1]}), "structured_outputs.choice"),
    ] {
        let e = with("structured_outputs", v.clone()).unwrap_err();
        assert_eq!(e.status, 400, "{v}");
        assert_eq!(e.param.as_deref(), Some(param), "{v}: {}", e.message);
    }
    let e = with("guided_grammar", json!("root ::= \"a\"")).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("guided_grammar"));
}

#[test]
fn tool_choice_and_tool_call_shapes() {
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let with = |choice: Value| {
        chat(
            json!({"messages": [{"role": "user", "content": "a"}], "tools": tools,
            "tool_choice": choice, "parallel_tool_calls": false}),
        )
    };
    let named = with(json!({"type": "function", "function": {"name": "f"}})).unwrap();
    assert_eq!(named.request.tool_choice, ToolChoice::Function("f".into()));
    assert_eq!(named.request.parallel_tool_calls, Some(false));
    assert_eq!(
        with(json!("required")).unwrap().request.tool_choice,
        ToolChoice::Required
    );
    assert_eq!(
        with(json!("none")).unwrap().request.tool_choice,
        ToolChoice::None
    );
    for bad in [json!("always"), json!({"type": "function"}), json!(3)] {
        let e = with(bad.clone()).unwrap_err();
        assert_eq!(e.status, 400, "{bad}");
        assert_eq!(e.param.as_deref(), Some("tool_choice"), "{bad}");
    }
    // a function that is not a tool is the request's mistake, named
    let e = with(json!({"type": "function", "function": {"name": "g"}})).unwrap_err();
    assert!(e.message.contains("`g`"), "{}", e.message);
    // OpenAI's shapes, ids filled where a runtime gave none
    let call = ToolCall {
        id: None,
        kind: "function".into(),
        function: mtp_contract::FunctionCall {
            name: "f".into(),
            arguments: json!("{\"a\": 1}"),
        },
    };
    assert_eq!(
        serde_json::to_value(tool_calls(&[call])).unwrap(),
        json!([{"id": "call_0", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": 1}"}}])
    );
    let first = ToolCallDelta {
        index: 1,
        id: None,
        name: Some("f".into()),
        arguments: String::new(),
    };
    assert_eq!(
        serde_json::to_value(tool_call_delta(&first)).unwrap(),
        json!({"index": 1, "id": "call_1", "type": "function",
               "function": {"name": "f", "arguments": ""}})
    );
    let more = ToolCallDelta {
        index: 1,
        arguments: "{\"a\"".into(),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(tool_call_delta(&more)).unwrap(),
        json!({"index": 1, "function": {"arguments": "{\"a\""}})
    );
    assert_eq!(finish_reason(FinishReason::ToolCalls), "tool_calls");
}

#[test]
fn what_cannot_be_honoured_is_refused_by_name() {
    let base = |k: &str, v: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "a"}]});
        b[k] = v;
        chat(b).unwrap_err()
    };
    assert_eq!(base("n", json!(0)).param.as_deref(), Some("n"));
    assert_eq!(base("n", json!(129)).param.as_deref(), Some("n"));
    assert_eq!(
        base("logprobs", json!(3)).param.as_deref(),
        Some("logprobs")
    );
    assert_eq!(
        base("top_logprobs", json!(21)).param.as_deref(),
        Some("top_logprobs")
    );
    assert_eq!(base("echo", json!(true)).param.as_deref(), Some("echo"));
    assert_eq!(
        base("response_format", json!({"type": "xml"}))
            .param
            .as_deref(),
        Some("response_format")
    );
    assert_eq!(
        base("grammar", json!("root ::= \"a\"")).param.as_deref(),
        Some("grammar")
    );
    assert_eq!(
        base("tool_choice", json!("required")).param.as_deref(),
        Some("tool_choice")
    );
    assert_eq!(
        base("temperature", json!("hot")).param.as_deref(),
        Some("temperature")
    );
    assert_eq!(
        base("max_tokens", json!(-1)).param.as_deref(),
        Some("max_tokens")
    );
    // a budget of zero is refused naming the field that was sent
    assert_eq!(
        base("max_tokens", json!(0)).param.as_deref(),
        Some("max_tokens")
    );
    assert_eq!(
        base("max_completion_tokens", json!(0)).param.as_deref(),
        Some("max_completion_tokens")
    );
    assert_eq!(base("best_of", json!(3)).param.as_deref(), Some("best_of"));
    assert_eq!(
        base("prompt_cache_key", json!("k".repeat(257)))
            .param
            .as_deref(),
        Some("prompt_cache_key")
    );
    assert_eq!(base("stop", json!([1])).param.as_deref(), Some("stop"));
    let e = chat(json!({"messages": [{"role": "robot", "content": "a"}]})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0]"));
    assert!(chat(json!({"messages": []})).is_err());
    assert!(chat(json!([1, 2])).is_err());
}

#[test]
fn completions_are_raw_prompts() {
    let p = parse(
        Endpoint::Completion,
        &json!({"prompt": ["fn main() {"], "max_tokens": 3}),
        &Limits::default(),
    )
    .unwrap();
    assert!(p.request.raw_prompt);
    assert_eq!(p.request.prompt, "fn main() {");
    let l = Limits::default();
    assert!(parse(Endpoint::Completion, &json!({}), &l).is_err());
    // token ids, and batches of prompts: each a choice, `n` each
    let p = parse(Endpoint::Completion, &json!({"prompt": [1, 2]}), &l).unwrap();
    assert_eq!(p.request.prompt_token_ids, Some(vec![1, 2]));
    assert!(p.request.prompt.is_empty() && p.request.raw_prompt);
    let p = parse(
        Endpoint::Completion,
        &json!({"prompt": [[1, 2], [3]], "n": 2, "seed": 7, "logprobs": 2, "echo": true}),
        &l,
    )
    .unwrap();
    assert_eq!(p.choices(), 4);
    let rs = p.choice_requests();
    let ids: Vec<_> = rs
        .iter()
        .map(|r| r.prompt_token_ids.clone().unwrap())
        .collect();
    assert_eq!(ids, [vec![1, 2], vec![1, 2], vec![3], vec![3]]);
    let seeds: Vec<_> = rs.iter().map(|r| r.sampling.seed.unwrap()).collect();
    assert_eq!(seeds, [7, 8, 7, 8]);
    assert!(rs.iter().all(|r| r.logprobs == Some(2) && r.echo));
    let p = parse(Endpoint::Completion, &json!({"prompt": ["a", "b"]}), &l).unwrap();
    assert_eq!(p.choice_requests()[1].prompt, "b");
    // `max_tokens: 0` only with `echo`
    assert!(parse(
        Endpoint::Completion,
        &json!({"prompt": "a", "max_tokens": 0, "echo": true}),
        &l
    )
    .is_ok());
    for bad in [
        json!({"prompt": "a", "max_tokens": 0}),
        json!({"prompt": []}),
        json!({"prompt": [[1], []]}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": [[1], "a"]}),
        json!({"prompt": "a", "logprobs": true}),
        json!({"prompt": "a", "logprobs": 21}),
    ] {
        assert!(parse(Endpoint::Completion, &bad, &l).is_err(), "{bad}");
    }
    // llama-server's /completion: one prompt, one answer
    assert!(parse(Endpoint::Native, &json!({"prompt": ["a", "b"]}), &l).is_err());
    assert!(parse(Endpoint::Native, &json!({"prompt": "a", "n": 2}), &l).is_err());
}

/// Random bodies made of the protocol's own field names (every field given values of
/// every type) are answered, never a panic: a request or a 400.
#[test]
fn random_bodies_never_panic() {
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
        "id",
        "tools",
        "tool_choice",
        "stop",
        "prompt",
        "n_predict",
        "max_tokens",
        "temperature",
        "top_k",
        "logit_bias",
        "stream",
        "stream_options",
        "include_usage",
        "response_format",
        "json_schema",
        "schema",
        "structured_outputs",
        "json",
        "regex",
        "choice",
        "grammar",
        "guided_choice",
        "speculation",
        "num_draft_tokens",
        "speculative.n_max",
        "chat_template_kwargs",
        "enable_thinking",
        "reasoning_content",
        "n",
        "logprobs",
        "suffix",
        "x",
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    fn value(next: &mut dyn FnMut(u64) -> u64, depth: u32) -> Value {
        match next(if depth == 0 { 6 } else { 8 }) {
            0 => Value::Null,
            1 => Value::Bool(next(2) == 0),
            2 => [json!(-1), json!(0), json!(1.5), json!(u64::MAX), json!(3)][next(5) as usize]
                .clone(),
            3 => json!(KEYS[next(KEYS.len() as u64) as usize]),
            4 => json!("data:image/png;base64,iVBORw0KGgo="),
            5 => json!([]),
            6 => Value::Array((0..next(4)).map(|_| value(next, depth - 1)).collect()),
            _ => {
                let mut m = serde_json::Map::new();
                for _ in 0..next(6) {
                    let k = KEYS[next(KEYS.len() as u64) as usize];
                    m.insert(k.into(), value(next, depth - 1));
                }
                Value::Object(m)
            }
        }
    }
    let limits = Limits::default();
    for _ in 0..3000 {
        let mut body = serde_json::Map::new();
        for _ in 0..next(8) {
            let k = KEYS[next(KEYS.len() as u64) as usize];
            body.insert(k.into(), value(&mut next, 4));
        }
        let body = Value::Object(body);
        for endpoint in [Endpoint::Chat, Endpoint::Completion, Endpoint::Native] {
            if let Err(e) = parse(endpoint, &body, &limits) {
                assert!(e.status.is_client_error(), "{body}: {e:?}");
            }
        }
    }
}
