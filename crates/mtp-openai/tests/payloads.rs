//! Round trips of real payloads: every body and stream event of the HTTP runtimes' fixtures
//! (llama-server b11434 recordings, vLLM, LM Studio and Ollama transcriptions, see
//! `crates/mtp-runtimes/tests/fixtures/README.md`) reads into the types and writes back as the
//! same JSON (`null` and absent are the same; numbers compare by value), and the requests and
//! answers `mtp serve` exchanges are written byte for byte as before.

use std::path::{Path, PathBuf};

use mtp_openai::{
    ChatCompletionRequest, Completion, Content, ErrorBody, Field, ModelList, Props, Stop,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mtp-runtimes/tests/fixtures")
}

/// Every file under the fixtures with this extension.
fn files(ext: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, ext, out);
            } else if p.extension().and_then(|x| x.to_str()) == Some(ext) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&fixtures(), ext, &mut out);
    out.sort();
    assert!(!out.is_empty(), "no .{ext} fixtures");
    out
}

/// The `data:` payloads of an SSE body (one per event, lines joined), `[DONE]` left out.
fn events(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    for line in text.lines().chain([""]) {
        if line.trim().is_empty() {
            if !cur.is_empty() {
                out.push(cur.join("\n"));
                cur.clear();
            }
        } else if let Some(d) = line.strip_prefix("data:") {
            cur.push(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    out.retain(|d| d.trim() != "[DONE]");
    out
}

/// JSON equality where `null` and an absent key are the same and numbers compare by value.
fn same(a: &Value, b: &Value, at: &str) -> Result<(), String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let (u, v) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                same(u, v, &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .try_for_each(|(i, (u, v))| same(u, v, &format!("{at}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => Ok(()),
        _ if a == b => Ok(()),
        _ => Err(format!("{at}: {a} != {b}")),
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(v: &Value, what: &str) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&t).unwrap();
    same(v, &back, "").unwrap_or_else(|e| panic!("{what}: {e}\n{v}\n{back}"));
    t
}

#[test]
fn every_fixture_body_round_trips() {
    let mut n = 0;
    for p in files("json") {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        let what = p.display().to_string();
        if name.starts_with("error") {
            let e: ErrorBody = round_trip(&v, &what);
            assert!(!e.error.message.is_empty(), "{what}");
        } else if name.starts_with("props") {
            let props: Props = round_trip(&v, &what);
            assert!(props.speculative_params().is_some(), "{what}");
        } else {
            let c: Completion = round_trip(&v, &what);
            assert!(
                c.first_choice().is_some() || c.content.is_some(),
                "{what}: neither choices nor content"
            );
        }
        n += 1;
    }
    assert!(n >= 15, "{n} bodies");
}

#[test]
fn every_fixture_stream_event_round_trips() {
    let mut n = 0;
    for p in files("sse") {
        let text = std::fs::read_to_string(&p).unwrap();
        for (i, data) in events(&text).iter().enumerate() {
            let v: Value = serde_json::from_str(data).unwrap();
            let _: Completion = round_trip(&v, &format!("{} event {i}", p.display()));
            n += 1;
        }
    }
    assert!(n >= 50, "{n} events");
}

/// What the HTTP runtimes read out of the fixtures, through the types.
#[test]
fn fields_the_runtimes_read() {
    let read = |rel: &str| -> Value {
        serde_json::from_slice(&std::fs::read(fixtures().join(rel)).unwrap()).unwrap()
    };
    // llama-server b11434: the draft counts in `timings`
    let c: Completion =
        serde_json::from_value(read("llama_server/recorded_b11434/chat.json")).unwrap();
    let t = c.timings.unwrap();
    assert_eq!(
        (t.draft_n, t.draft_n_accepted, t.cache_n),
        (Some(16), Some(9), Some(16))
    );
    // vLLM: two whole tool calls, content null
    let c: Completion = serde_json::from_value(read("vllm/chat_tool_calls.json")).unwrap();
    let m = c.first_choice().unwrap().message.as_ref().unwrap();
    assert_eq!(m.content, None);
    let calls = m.tool_calls.as_ref().unwrap().ok().unwrap();
    assert_eq!(calls.len(), 2);
    let f = calls[0]
        .ok()
        .unwrap()
        .function
        .as_ref()
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!(
        f.name.as_ref().unwrap().ok().map(String::as_str),
        Some("get_weather")
    );
    assert!(f.arguments.as_ref().unwrap().is_string());
    // LM Studio: the draft counters in `stats` or in `usage`
    let c: Completion = serde_json::from_value(read("lmstudio/chat_stats.json")).unwrap();
    assert!(c.stats.unwrap().total_draft_tokens_count.is_some());
    let c: Completion = serde_json::from_value(read("lmstudio/chat_usage.json")).unwrap();
    assert!(c
        .usage
        .flatten()
        .unwrap()
        .total_draft_tokens_count
        .is_some());
    // vLLM's per-request speculative metrics
    let c: Completion = serde_json::from_value(read("vllm/chat_spec_metrics.json")).unwrap();
    let m = c.metrics.unwrap().speculative_decoding.unwrap();
    assert!(m.num_draft_tokens.is_some() && m.acceptance_histogram.is_some());
    // llama-server native: tokens and the stop type
    let c: Completion =
        serde_json::from_value(read("llama_server/completion_native.json")).unwrap();
    assert!(c.tokens.is_some() && c.stop == Some(true) && c.stop_type.is_some());
}

/// A request as clients send it to `mtp serve` (every field the server reads) reads into the
/// types and writes back as it was.
#[test]
fn requests_round_trip_and_keep_bad_fields() {
    let body = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
                {"type": "text", "text": "what is it?"}]},
            {"role": "assistant", "content": null, "reasoning_content": "r", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"}
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": false,
        "stream": true, "stream_options": {"include_usage": true},
        "max_tokens": 7, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 7,
        "repetition_penalty": 1.1, "logit_bias": {"10": -100, "2": 5.5},
        "stop": ["\n"], "chat_template_kwargs": {"enable_thinking": false},
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}},
        "speculation": {"mode": "native_mtp", "num_draft_tokens": 2},
        "prompted_fallback": true, "prompt_cache_key": "k", "n": 1,
        "user": "someone", "metadata": {"a": "b"}
    });
    let r: ChatCompletionRequest = round_trip(&body, "request");
    assert_eq!(r.extra.keys().collect::<Vec<_>>(), ["user", "metadata"]);
    let msgs = r.messages.unwrap().into_ok().unwrap();
    assert!(
        matches!(msgs[1].ok().unwrap().content.as_ref().unwrap().ok(), Some(Content::Parts(p)) if p.len() == 2)
    );
    assert_eq!(r.stop, Some(Field::Ok(Stop::Many(vec!["\n".into()]))));
    // the logit bias keeps the order it was sent in
    let bias = r.logit_bias.unwrap().into_ok().unwrap();
    assert_eq!(
        bias.0.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["10", "2"]
    );

    // a field of the wrong type is kept, with why, for the 400 that names it
    let r: ChatCompletionRequest = serde_json::from_value(json!({
        "messages": "hi", "temperature": "hot", "tool_choice": "always",
        "speculation": {"num_draft_tokens": 0}, "stop": [1]}))
    .unwrap();
    for (f, want) in [
        (r.messages.as_ref().unwrap().invalid(), json!("hi")),
        (r.temperature.as_ref().unwrap().invalid(), json!("hot")),
        (r.stop.as_ref().unwrap().invalid(), json!([1])),
    ] {
        assert_eq!(f, Some(&want));
    }
    // the contract's parsers give the messages
    match r.tool_choice.unwrap() {
        Field::Invalid { error, .. } => {
            assert!(error.contains("\"always\" is not known"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    let contract =
        mtp_contract::Speculation::from_json(&json!({"num_draft_tokens": 0})).unwrap_err();
    match r.speculation.unwrap() {
        Field::Invalid { error, .. } => assert_eq!(error, contract.to_string()),
        other => panic!("{other:?}"),
    }
    // a message that is not an object is kept as sent
    let r: ChatCompletionRequest =
        serde_json::from_value(json!({"messages": [[1, 2], {"role": "user"}]})).unwrap();
    let msgs = r.messages.unwrap().into_ok().unwrap();
    assert_eq!(msgs[0].invalid(), Some(&json!([1, 2])));
    assert_eq!(msgs[1].ok().unwrap().role_str(), Some("user"));
}

/// The bytes `mtp serve` writes for each shape, field order included.
#[test]
fn answers_are_written_in_each_shapes_order() {
    use mtp_openai::{Choice, Delta, ToolCall, Usage};
    let chunk = Completion {
        id: Some("chatcmpl-1".into()),
        object: Some("chat.completion.chunk".into()),
        created: Some(7),
        model: Some("m".into()),
        choices: Some(vec![Choice {
            index: Some(0),
            delta: Some(Delta {
                role: Some("assistant".into()),
                content: Some(String::new()),
                ..Default::default()
            }),
            ..Default::default()
        }
        .into()]),
        usage: Some(None),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&chunk).unwrap(),
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}"#
    );
    let text = Choice {
        index: Some(0),
        text: Some("x".into()),
        logprobs: Some(None),
        finish_reason: Some("stop".into()),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&text).unwrap(),
        r#"{"index":0,"text":"x","logprobs":null,"finish_reason":"stop"}"#
    );
    let tool = Delta {
        tool_calls: Some(
            vec![ToolCall::piece(0, Some("call_0".into()), Some("f".into()), "").into()].into(),
        ),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&tool).unwrap(),
        r#"{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"f","arguments":""}}]}"#
    );
    let native = Completion {
        content: Some("hi".into()),
        model: Some("m".into()),
        stop: Some(true),
        stop_type: Some("eos".into()),
        stopping_word: Some(String::new()),
        tokens_predicted: Some(2),
        tokens_evaluated: Some(5),
        truncated: Some(false),
        tokens: Some(vec![1, 2]),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&native).unwrap(),
        r#"{"content":"hi","model":"m","stop":true,"stop_type":"eos","stopping_word":"","tokens_predicted":2,"tokens_evaluated":5,"truncated":false,"tokens":[1,2]}"#
    );
    let usage = Usage::of(&mtp_contract::Usage {
        input_tokens: 3,
        output_tokens: 4,
        cached_input_tokens: 0,
    });
    let models = ModelList::of(vec![serde_json::from_value(
        json!({"id": "m", "object": "model"}),
    )
    .unwrap()]);
    assert_eq!(
        serde_json::to_string(&models).unwrap(),
        r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#
    );
    assert_eq!(usage.total_tokens, Some(7));
}
