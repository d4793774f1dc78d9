//! Tool calls the servers parse themselves, passed through (issue 50): what the request body
//! carries (`tools`, `tool_choice`, `parallel_tool_calls`), and the calls of a whole answer
//! (`message.tool_calls`) and of a stream (`delta.tool_calls` pieces, re-emitted as
//! `StreamEvent::ToolCall` and joined on the final response), against a local server that
//! replays the bodies under `tests/fixtures` (sources in the README there):
//! `llama_server/recorded_b11434/chat_tool_call*` were recorded from a real llama-server
//! b11434 `--jinja`; the vLLM, LM Studio and Ollama files are transcribed. A garbled answer is
//! a typed error naming the field, never a panic.

mod common;

use std::sync::Arc;

use common::{Mock, Reply};
use futures::StreamExt;
use mtp_contract::{
    FinishReason, GenerateRequest, GenerateResponse, Provider, ProviderError, ProviderOptions,
    Speculation, StreamEvent, ToolCallDelta, ToolChoice,
};
use serde_json::{json, Value};

const LLAMA: &str = "llama_server/recorded_b11434";

fn opts(base: &str) -> ProviderOptions {
    ProviderOptions::default()
        .base_url(base)
        .speculation(Speculation::native_mtp())
        .extra("idle_timeout_ms", "2000")
        .extra("request_timeout_ms", "5000")
        .extra("connect_timeout_ms", "500")
        .extra("metrics", "off")
}

fn provider(kind: &str, model: &str, o: &ProviderOptions) -> Arc<dyn Provider> {
    mtp_runtimes::create(kind, model, o).expect("create")
}

/// The tools of the recorded llama-server calls (a city from a closed list, so that the
/// server's grammar bounded the reply).
fn tools() -> Vec<Value> {
    let city = json!({"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"]});
    vec![
        json!({"type": "function", "function": {"name": "get_weather",
            "description": "Current weather in a city", "parameters": city}}),
        json!({"type": "function", "function": {"name": "get_time",
            "description": "Local time in a city", "parameters": city}}),
    ]
}

fn ask() -> GenerateRequest {
    GenerateRequest::new("Weather and time in Paris?")
        .max_output_tokens(64)
        .tools(tools())
}

/// Everything a stream gave: the text, the tool-call pieces in order, the final response,
/// and a trailing error.
struct Streamed {
    text: String,
    pieces: Vec<ToolCallDelta>,
    done: Option<GenerateResponse>,
    err: Option<ProviderError>,
    /// Whether a text delta came after a tool-call piece.
    text_after_calls: bool,
}

async fn stream(p: &Arc<dyn Provider>, r: GenerateRequest) -> Streamed {
    let mut s = p.generate_stream(r).await.expect("stream starts");
    let mut out = Streamed {
        text: String::new(),
        pieces: Vec::new(),
        done: None,
        err: None,
        text_after_calls: false,
    };
    while let Some(item) = s.next().await {
        match item {
            Ok(StreamEvent::Delta { text, .. }) => {
                out.text_after_calls |= !out.pieces.is_empty() && !text.is_empty();
                out.text.push_str(&text);
            }
            Ok(StreamEvent::ToolCall(d)) => out.pieces.push(d),
            Ok(StreamEvent::PromptProgress(_)) => {}
            Ok(StreamEvent::Done(r)) => out.done = Some(*r),
            Err(e) => out.err = Some(e),
        }
    }
    out
}

/// `(id, name, arguments)` of each call of a response.
fn calls(r: &GenerateResponse) -> Vec<(Option<&str>, &str, &str)> {
    r.tool_calls
        .iter()
        .map(|c| {
            assert_eq!(c.kind, "function");
            (
                c.id.as_deref(),
                c.function.name.as_str(),
                c.function
                    .arguments
                    .as_str()
                    .expect("arguments as a string"),
            )
        })
        .collect()
}

/// The stream's pieces put together per call: the first piece of each carries its id and
/// name, later ones argument text only; joined they are the final response's calls.
fn joined(pieces: &[ToolCallDelta]) -> Vec<(Option<String>, String, String)> {
    let mut out: Vec<(Option<String>, String, String)> = Vec::new();
    for d in pieces {
        if d.index == out.len() {
            let name = d.name.clone().expect("a call's first piece names it");
            out.push((d.id.clone(), name, d.arguments.clone()));
        } else {
            assert!(
                d.index < out.len(),
                "piece of call {} out of order",
                d.index
            );
            assert!(d.name.is_none() && d.id.is_none(), "{d:?}");
            out[d.index].2.push_str(&d.arguments);
        }
    }
    out
}

fn same_calls(streamed: &[ToolCallDelta], r: &GenerateResponse) {
    let from_pieces = joined(streamed);
    let want: Vec<(Option<String>, String, String)> = calls(r)
        .into_iter()
        .map(|(id, n, a)| (id.map(str::to_string), n.to_string(), a.to_string()))
        .collect();
    assert_eq!(from_pieces, want);
}

fn api_message(e: &ProviderError) -> &str {
    match e {
        ProviderError::Api { message, .. } => message,
        other => panic!("expected an Api error, got {other:?}"),
    }
}

// ---------------------------------------------------------------- llama-server (recorded)

/// Recorded from llama-server b11434 `--jinja`: one call, whole and streamed (the stream
/// splits the call's arguments into one-character pieces). A named function is asked of
/// llama-server as `required` over that one tool, since it reads `tool_choice` as a string.
#[tokio::test]
async fn llama_server_one_call_whole_and_streamed() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![
            Reply::json(&format!("{LLAMA}/chat_tool_call.json")),
            Reply::sse(&format!("{LLAMA}/chat_tool_call_stream.sse"), 7),
        ],
    )])
    .await;
    let p = provider("llama-server", "tiny-tools", &opts(&m.base));
    let req = ask().tool_choice(ToolChoice::Function("get_weather".into()));

    let whole = p.generate(req.clone()).await.expect("whole");
    assert_eq!(whole.finish_reason, FinishReason::ToolCalls);
    assert_eq!(whole.content, "");
    assert_eq!(
        calls(&whole),
        [(
            Some("ZyPdzTJ10OBtNdmvVctAwxqFwasuoud1"),
            "get_weather",
            "{\"city\": \"Paris\" }"
        )]
    );
    assert!(whole.warnings.is_empty(), "{:?}", whole.warnings);
    assert_eq!(whole.usage.output_tokens, 24);

    let s = stream(&p, req).await;
    assert!(s.err.is_none(), "{:?}", s.err);
    let done = s.done.expect("done");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        calls(&done),
        [(
            Some("2DI5dLNKIyTXtby5B0noBKtXZb1oAo4Z"),
            "get_weather",
            "{\"city\": \"Paris\" }"
        )]
    );
    // the first piece as the server sent it (id, name and the arguments' start), then one
    // piece per later fragment
    assert_eq!(s.pieces.len(), 7, "{:?}", s.pieces);
    assert_eq!(s.pieces[0].arguments, "{\"city\": \"P");
    same_calls(&s.pieces, &done);
    assert_eq!(s.text, "");
    // the draft counts of the final usage chunk are read as for any reply
    assert!(done.metadata.speculation.used);

    // what the server received: the one named tool, `required`, parallel calls allowed
    for post in m.posts() {
        let b = &post.body;
        assert_eq!(b["tools"].as_array().map(Vec::len), Some(1), "{b}");
        assert_eq!(b["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(b["tool_choice"], "required");
        assert_eq!(b["parallel_tool_calls"], true);
    }
}

/// Recorded from llama-server b11434: two calls, whole and streamed (the stream's first
/// piece of call 0 holds its whole arguments). `required` with parallel calls.
#[tokio::test]
async fn llama_server_two_calls_whole_and_streamed() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![
            Reply::json(&format!("{LLAMA}/chat_tool_calls.json")),
            Reply::sse(&format!("{LLAMA}/chat_tool_calls_stream.sse"), 13),
        ],
    )])
    .await;
    let p = provider("llama-server", "tiny-tools", &opts(&m.base));
    let req = ask().tool_choice(ToolChoice::Required);

    let whole = p.generate(req.clone()).await.expect("whole");
    assert_eq!(whole.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        calls(&whole),
        [
            (
                Some("HshV1kw3ohhPbTvsm34xvSwIkJPXWy3j"),
                "get_weather",
                "{\"city\": \"Paris\"}"
            ),
            (
                Some("OEckIvj5j8OMiV8BwDtkCfZlQTFhQMB2"),
                "get_time",
                "{\"city\": \"Paris\" }"
            ),
        ]
    );

    let s = stream(&p, req).await;
    assert!(s.err.is_none(), "{:?}", s.err);
    let done = s.done.expect("done");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        calls(&done)
            .iter()
            .map(|(_, n, a)| (*n, *a))
            .collect::<Vec<_>>(),
        [
            ("get_weather", "{\"city\": \"Paris\"}"),
            ("get_time", "{\"city\": \"Paris\" }")
        ]
    );
    same_calls(&s.pieces, &done);
    assert!(!s.text_after_calls);

    for post in m.posts() {
        let b = &post.body;
        assert_eq!(b["tools"], json!(tools()), "{b}");
        assert_eq!(b["tool_choice"], "required");
        assert_eq!(b["parallel_tool_calls"], true);
    }
}

/// llama-server b11434 answered `parallel_tool_calls: false` with two calls (recorded): the
/// adapter keeps the first, streams only its pieces, and says what it dropped.
#[tokio::test]
async fn parallel_tool_calls_false_keeps_the_first_call() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![
            Reply::json(&format!("{LLAMA}/chat_tool_calls.json")),
            Reply::sse(&format!("{LLAMA}/chat_tool_calls_stream.sse"), 64),
        ],
    )])
    .await;
    let p = provider("llama-server", "tiny-tools", &opts(&m.base));
    let req = ask()
        .tool_choice(ToolChoice::Required)
        .parallel_tool_calls(false);
    let whole = p.generate(req.clone()).await.expect("whole");
    assert_eq!(
        calls(&whole),
        [(
            Some("HshV1kw3ohhPbTvsm34xvSwIkJPXWy3j"),
            "get_weather",
            "{\"city\": \"Paris\"}"
        )]
    );
    assert_eq!(whole.finish_reason, FinishReason::ToolCalls);
    let w = whole.warnings.join("\n");
    assert!(
        w.contains("parallel_tool_calls") && w.contains("`get_time`"),
        "{w}"
    );

    let s = stream(&p, req).await;
    let done = s.done.expect("done");
    assert!(s.pieces.iter().all(|d| d.index == 0), "{:?}", s.pieces);
    same_calls(&s.pieces, &done);
    assert_eq!(done.tool_calls.len(), 1);
    assert!(done
        .warnings
        .iter()
        .any(|w| w.contains("parallel_tool_calls")));
    for post in m.posts() {
        assert_eq!(post.body["parallel_tool_calls"], false);
    }
}

// ---------------------------------------------------------------- vLLM (transcribed)

/// vLLM's chat response with two calls (`content: null`, `chatcmpl-tool-` ids, arguments as
/// `json.dumps` writes them), whole and streamed (first piece id, type and name without
/// arguments, then fragments; the finish chunk carries `content: ""`). A named function goes
/// to vLLM as OpenAI's object.
#[tokio::test]
async fn vllm_two_calls_whole_and_streamed() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![
            Reply::json("vllm/chat_tool_calls.json"),
            Reply::sse("vllm/chat_tool_calls_stream.sse", 11),
            Reply::json("vllm/chat_tool_calls.json"),
        ],
    )])
    .await;
    let p = provider("vllm", "Qwen/Qwen3-8B", &opts(&m.base));
    let want = [
        (
            Some("chatcmpl-tool-ca99dda515524c6abe47d1ea22813507"),
            "get_weather",
            "{\"city\": \"Paris\"}",
        ),
        (
            Some("chatcmpl-tool-3f1b7d2c8e9a4b5c9d0e1f2a3b4c5d6e"),
            "get_time",
            "{\"city\": \"Paris\"}",
        ),
    ];
    let req = ask()
        .tool_choice(ToolChoice::Required)
        .parallel_tool_calls(true);
    let whole = p.generate(req.clone()).await.expect("whole");
    assert_eq!(whole.content, "");
    assert_eq!(whole.finish_reason, FinishReason::ToolCalls);
    assert_eq!(calls(&whole), want);
    assert_eq!(
        (whole.usage.input_tokens, whole.usage.output_tokens),
        (236, 40)
    );

    let s = stream(&p, req).await;
    assert!(s.err.is_none(), "{:?}", s.err);
    let done = s.done.expect("done");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(calls(&done), want);
    // vLLM's first piece has no arguments: it is passed on with the name and empty text
    assert_eq!(s.pieces[0].arguments, "");
    assert_eq!(s.pieces.len(), 8, "{:?}", s.pieces);
    same_calls(&s.pieces, &done);
    assert_eq!(done.usage.output_tokens, 40);

    // a named function: OpenAI's object
    let named = p
        .generate(ask().tool_choice(ToolChoice::Function("get_time".into())))
        .await
        .expect("named");
    assert_eq!(named.tool_calls.len(), 2);
    let posts = m.posts();
    for post in &posts[..2] {
        let b = &post.body;
        assert_eq!(b["tools"], json!(tools()), "{b}");
        assert_eq!(b["tool_choice"], "required");
        assert_eq!(b["parallel_tool_calls"], true);
    }
    assert_eq!(
        posts[2].body["tool_choice"],
        json!({"type": "function", "function": {"name": "get_time"}})
    );
    assert!(posts[2].body.get("parallel_tool_calls").is_none());
}

/// vLLM answers a named `tool_choice` with `finish_reason: "stop"` and the call: the reply
/// ended with a call for the caller to run, so it is `tool_calls` here.
#[tokio::test]
async fn a_stop_with_calls_is_a_tool_calls_finish() {
    let mut body: Value =
        serde_json::from_slice(&common::fixture("vllm/chat_tool_calls.json")).expect("fixture");
    body["choices"][0]["finish_reason"] = json!("stop");
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::status(
            200,
            "application/json",
            body.to_string().as_bytes(),
        )],
    )])
    .await;
    let p = provider("vllm", "Qwen/Qwen3-8B", &opts(&m.base));
    let r = p
        .generate(ask().tool_choice(ToolChoice::Function("get_weather".into())))
        .await
        .expect("answer");
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
}

// ---------------------------------------------------------------- LM Studio, Ollama

/// LM Studio's documented tool-call response (no `content` key at all); `tool_choice` goes
/// to it as a string, a named function as `required` over that tool.
#[tokio::test]
async fn lmstudio_whole_answer_without_content() {
    let m = Mock::start(vec![(
        "POST /api/v0/chat/completions",
        vec![Reply::json("lmstudio/chat_tool_calls.json")],
    )])
    .await;
    let p = provider("lmstudio", "qwen2.5-7b-instruct", &opts(&m.base));
    let r = p
        .generate(ask().tool_choice(ToolChoice::Function("get_time".into())))
        .await
        .expect("answer");
    assert_eq!(r.content, "");
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        calls(&r),
        [(
            Some("365174485"),
            "search_products",
            "{\"query\":\"dell\",\"category\":\"electronics\",\"max_price\":50}"
        )]
    );
    let b = &m.posts()[0].body;
    assert_eq!(b["tool_choice"], "required");
    assert_eq!(b["tools"].as_array().map(Vec::len), Some(1));
    assert_eq!(b["tools"][0]["function"]["name"], "get_time");
}

/// Ollama streams each call whole in one chunk (with `index`); it has no `tool_choice`
/// field, so a forced call is refused before anything is sent, naming `tool_choice`.
#[tokio::test]
async fn ollama_streams_whole_calls_and_refuses_a_forced_one() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::sse("ollama/chat_tool_calls_stream.sse", 29)],
    )])
    .await;
    let p = provider("ollama", "qwen2.5-coder:7b-instruct-q8_0", &opts(&m.base));
    let s = stream(&p, ask()).await;
    let done = s.done.expect("done");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        calls(&done),
        [
            (
                Some("call_809l7n8f"),
                "run_command",
                "{\"command\":\"ls -la\"}"
            ),
            (
                Some("call_oqp1e2a1"),
                "run_command",
                "{\"command\":\"ls -la\",\"cwd\":\"/path/to/directory\"}"
            ),
        ]
    );
    same_calls(&s.pieces, &done);
    assert!(m.posts()[0].body.get("tool_choice").is_none());

    for choice in [
        ToolChoice::Required,
        ToolChoice::Function("get_time".into()),
    ] {
        match p.generate(ask().tool_choice(choice.clone())).await {
            Err(ProviderError::InvalidRequest { field, .. }) => assert_eq!(field, "tool_choice"),
            other => panic!("{choice:?}: {other:?}"),
        }
    }
    assert_eq!(m.posts().len(), 1, "a refused request is not sent");
}

/// `tool_choice: "none"` shows the model no tools: nothing about tools is sent.
#[tokio::test]
async fn tool_choice_none_sends_no_tools() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::json("vllm/chat.json")],
    )])
    .await;
    let p = provider("vllm", "m", &opts(&m.base));
    let r = p
        .generate(ask().tool_choice(ToolChoice::None))
        .await
        .expect("answer");
    assert!(r.tool_calls.is_empty());
    assert_eq!(r.finish_reason, FinishReason::Stop);
    let b = &m.posts()[0].body;
    for key in ["tools", "tool_choice", "parallel_tool_calls"] {
        assert!(b.get(key).is_none(), "{b}");
    }
}

// ---------------------------------------------------------------- garbled answers

/// A tool call that cannot be read is an `Api` error naming the field, whole or streamed (the
/// pieces before it are delivered first); more calls than `max_tool_calls` is one too.
#[tokio::test]
async fn garbled_tool_calls_are_typed_errors() {
    let chunk = |delta: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1,
                   "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
        )
    };
    let no_index = [
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "a", "type": "function",
                     "function": {"name": "get_time", "arguments": "{\"ci"}}]}),
        ),
        chunk(json!({"tool_calls": [{"function": {"arguments": "ty\": 1}"}}]})),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let object_args = [
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": {"a": 1}}}]}),
        ),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let nameless = json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
        "content": null, "tool_calls": [{"id": "c", "type": "function",
        "function": {"arguments": "{}"}}]}}]});
    let sse = |body: &str| Reply::status(200, "text/event-stream", body.as_bytes());
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![
            sse(&no_index),
            sse(&object_args),
            Reply::status(200, "application/json", nameless.to_string().as_bytes()),
            Reply::json(&format!("{LLAMA}/chat_tool_calls.json")),
            Reply::sse(&format!("{LLAMA}/chat_tool_calls_stream.sse"), 64),
        ],
    )])
    .await;
    let p = provider("vllm", "m", &opts(&m.base));

    let s = stream(&p, ask()).await;
    assert_eq!(s.pieces.len(), 1, "the piece before the bad one goes out");
    assert!(s.done.is_none());
    let e = s.err.expect("an error");
    let msg = api_message(&e);
    assert!(
        msg.contains("`choices[0].delta.tool_calls[0].index` is missing"),
        "{msg}"
    );
    assert!(msg.contains("/v1/chat/completions"), "{msg}");

    let s = stream(&p, ask()).await;
    let e = s.err.expect("an error");
    assert!(
        api_message(&e).contains("function.arguments` is an object"),
        "{e}"
    );

    let e = p.generate(ask()).await.unwrap_err();
    assert!(
        api_message(&e).contains("`choices[0].message.tool_calls[0].function.name` is missing"),
        "{e}"
    );

    // bounded: one call allowed, two sent
    let one = provider("vllm", "m", &opts(&m.base).extra("max_tool_calls", "1"));
    let e = one.generate(ask()).await.unwrap_err();
    assert!(
        api_message(&e).contains("more than 1 tool calls")
            && api_message(&e).contains("max_tool_calls"),
        "{e}"
    );
    let s = stream(&one, ask()).await;
    assert_eq!(s.pieces.iter().filter(|d| d.name.is_some()).count(), 1);
    assert!(api_message(&s.err.expect("an error")).contains("max_tool_calls"));
}

/// A streamed reply's tool-call text counts toward `max_body_bytes` like its text does.
#[tokio::test]
async fn tool_call_text_counts_toward_the_reply_cap() {
    let m = Mock::start(vec![(
        "POST /v1/chat/completions",
        vec![Reply::sse("vllm/chat_tool_calls_stream.sse", 64)],
    )])
    .await;
    let p = provider("vllm", "m", &opts(&m.base).extra("max_body_bytes", "24"));
    let s = stream(&p, ask()).await;
    let e = s.err.expect("over the cap");
    let msg = api_message(&e);
    assert!(
        msg.contains("max_body_bytes") && msg.contains("tool calls"),
        "{msg}"
    );
    assert!(s.done.is_none());
}
