//! Requests, responses and sampling validation.

use mtp_contract::{
    resolve, FinishReason, GenerateRequest, GenerateResponse, Message, Metadata, ProviderError,
    Reason, Sampling, Speculation, SpeculationReport, StreamEvent, Timings, ToolCall, Usage,
    RESERVED_TEMPLATE_VARIABLES,
};
use serde_json::json;

#[test]
fn history_none_and_empty_differ_with_a_cache_key() {
    let base = GenerateRequest::new("hi").prompt_cache_key("s1");
    let err = base.clone().validate().unwrap_err();
    assert!(
        matches!(
            err,
            ProviderError::InvalidRequest {
                field: "messages",
                ..
            }
        ),
        "{err}"
    );
    assert!(base.clone().messages(vec![]).validate().is_ok());
    assert!(base
        .messages(vec![Message::user("a"), Message::assistant("b")])
        .validate()
        .is_ok());
    // Without a key, an omitted history is fine.
    assert!(GenerateRequest::new("hi").validate().is_ok());
}

#[test]
fn sampling_validation_table() {
    let bad: Vec<(Sampling, &str)> = vec![
        (
            Sampling {
                temperature: Some(-0.1),
                ..Default::default()
            },
            "temperature",
        ),
        (
            Sampling {
                temperature: Some(f32::NAN),
                ..Default::default()
            },
            "temperature",
        ),
        (
            Sampling {
                top_p: Some(0.0),
                ..Default::default()
            },
            "top_p",
        ),
        (
            Sampling {
                top_p: Some(1.01),
                ..Default::default()
            },
            "top_p",
        ),
        (
            Sampling {
                min_p: Some(-0.5),
                ..Default::default()
            },
            "min_p",
        ),
        (
            Sampling {
                repetition_penalty: Some(0.0),
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            Sampling {
                presence_penalty: Some(f32::INFINITY),
                ..Default::default()
            },
            "presence_penalty",
        ),
    ];
    for (s, field) in bad {
        match s.validate() {
            Err(ProviderError::InvalidRequest { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    let good = Sampling {
        temperature: Some(0.0),
        top_p: Some(1.0),
        min_p: Some(0.0),
        top_k: Some(0),
        ..Default::default()
    };
    assert!(good.validate().is_ok());
    assert!(good.is_greedy());
}

#[test]
fn request_round_trips_and_rejects_bad_speculation() {
    let req = GenerateRequest::new("Explain cache expiry.")
        .max_output_tokens(32)
        .speculation(Speculation::depth(5).unwrap())
        .messages(vec![])
        .prompt_cache_key("k");
    let v = serde_json::to_value(&req).unwrap();
    assert_eq!(v["speculation"], json!({"num_draft_tokens": 5}));
    let back: GenerateRequest = serde_json::from_value(v).unwrap();
    assert_eq!(back, req);
    let bad = json!({"prompt": "x", "speculation": {"num_draft_tokens": 0}});
    let err = serde_json::from_value::<GenerateRequest>(bad).unwrap_err();
    assert!(err.to_string().contains("num_draft_tokens"), "{err}");
    let bad = json!({"prompt": "x", "sampling": {"temprature": 0.3}});
    assert!(serde_json::from_value::<GenerateRequest>(bad).is_err());
    let shorthand: GenerateRequest =
        serde_json::from_value(json!({"prompt": "x", "speculation": false})).unwrap();
    assert_eq!(shorthand.speculation, Some(Speculation::off()));
}

#[test]
fn response_json_shape() {
    let resolved = resolve(None, Some(&false.into()));
    let resp = GenerateResponse {
        content: "ok".into(),
        reasoning_content: None,
        token_ids: Some(vec![1, 2]),
        finish_reason: FinishReason::Length,
        usage: Usage {
            input_tokens: 5,
            output_tokens: 2,
            cached_input_tokens: 0,
        },
        metadata: Metadata {
            speculation: SpeculationReport::not_used(
                &resolved,
                "mtp-engine-cpu",
                Reason::DisabledByRequest,
                None,
            ),
            timings: Timings::default(),
        },
        partial: false,
        warnings: Vec::new(),
        tool_calls: Vec::new(),
        stop_sequence: None,
        prompt_logprobs: None,
        logprobs: None,
    };
    let v = serde_json::to_value(&resp).unwrap();
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"input_tokens":5,"output_tokens":2,"cached_input_tokens":0})
    );
    assert_eq!(
        v["metadata"]["speculation"]["reason"],
        "disabled_by_request"
    );
    assert!(v["metadata"]["timings"]
        .as_object()
        .unwrap()
        .contains_key("time_to_first_token_ms"));
    // no reasoning: no key at all (responses of non-thinking models look as before)
    assert!(v.get("reasoning_content").is_none());
    let back: GenerateResponse = serde_json::from_value(v).unwrap();
    assert_eq!(back, resp);
    let ev = StreamEvent::Delta {
        text: "a".into(),
        token_ids: vec![97],
        reasoning: String::new(),
        logprobs: Vec::new(),
    };
    let v = serde_json::to_value(&ev).unwrap();
    assert_eq!(v["type"], "delta");
    assert!(v.get("reasoning").is_none());
    let thought = StreamEvent::Delta {
        text: String::new(),
        token_ids: vec![1],
        reasoning: "hmm".into(),
        logprobs: Vec::new(),
    };
    let v = serde_json::to_value(&thought).unwrap();
    assert_eq!(v["reasoning"], "hmm");
    assert_eq!(serde_json::from_value::<StreamEvent>(v).unwrap(), thought);
}

#[test]
fn messages_with_reasoning_and_tool_calls_round_trip() {
    let call = ToolCall::function("call_1", "get_weather", json!({"city": "Paris"}));
    let history = vec![
        Message::user("Weather?"),
        Message::assistant("")
            .with_reasoning("Look it up.")
            .with_tool_calls(vec![call]),
        Message::tool("call_1", "sunny"),
    ];
    let v = serde_json::to_value(&history).unwrap();
    assert_eq!(
        v[1]["tool_calls"][0],
        json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}})
    );
    assert_eq!(v[1]["reasoning_content"], "Look it up.");
    assert_eq!(
        v[2],
        json!({"role": "tool", "content": "sunny", "tool_call_id": "call_1"})
    );
    // a plain message keeps its old shape
    assert_eq!(v[0], json!({"role": "user", "content": "Weather?"}));
    let back: Vec<Message> = serde_json::from_value(v).unwrap();
    assert_eq!(back, history);
    // OpenAI's shape: `type` may be omitted, arguments may be a string
    let m: Message = serde_json::from_value(json!({"role": "assistant", "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}))
    .unwrap();
    assert_eq!(m.tool_calls[0].kind, "function");
    assert_eq!(m.tool_calls[0].function.arguments, json!("{\"a\": 1}"));
}

#[test]
fn tools_and_template_kwargs_are_validated() {
    let ok = GenerateRequest::new("hi")
        .tools(vec![json!({"type": "function", "function": {"name": "f"}})])
        .chat_template_kwarg("reasoning_effort", json!("low"));
    assert!(ok.validate().is_ok());
    let bad_tool = GenerateRequest::new("hi").tools(vec![json!("f")]);
    assert!(matches!(
        bad_tool.validate(),
        Err(ProviderError::InvalidRequest { field: "tools", .. })
    ));
    for reserved in RESERVED_TEMPLATE_VARIABLES {
        let r = GenerateRequest::new("hi").chat_template_kwarg(reserved, json!(1));
        assert!(
            matches!(
                r.validate(),
                Err(ProviderError::InvalidRequest {
                    field: "chat_template_kwargs",
                    ..
                })
            ),
            "{reserved}"
        );
    }
}
