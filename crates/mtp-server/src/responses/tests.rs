//! Unit tests of `responses.rs`.
use super::*;
use mtp_contract::Role;

fn rep(v: Value, n: usize) -> Value {
    Value::Array(vec![v; n])
}

fn read(v: Value) -> Result<(Parsed, rs::Response), ApiError> {
    parse(&v, &Limits::default())
}

#[test]
fn an_item_history_becomes_the_chat_history() {
    let (p, echo) = read(json!({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 9,
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "in Paris?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
                "content": [{"type": "reasoning_text", "text": "call it"}], "encrypted_content": "x"},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
                "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
            {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": "{\"city\": \"Lima\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "sun"},
            {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "rain"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "again"}]},
            {"type": "function_call", "call_id": "call_c", "name": "get_weather", "arguments": "{}"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "dropped"}]},
            {"role": "user", "content": "thanks"}],
        "tools": [{"type": "function", "name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}],
        "tool_choice": "none", "parallel_tool_calls": false,
        "reasoning": {"effort": "minimal", "summary": "auto"}, "temperature": 0.5, "top_p": 0.9,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}, "verbosity": "low"},
        "metadata": {"k": "v"}, "user": "u", "store": true, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "conv-1", "truncation": "disabled", "stream": true
    }))
    .unwrap();
    let r = &p.request;
    let m = r.messages.as_ref().unwrap();
    let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
    use Role::*;
    assert_eq!(
        roles,
        [System, System, User, Assistant, Tool, Tool, Assistant, User]
    );
    assert_eq!(m[0].content, "Be brief.");
    assert_eq!(m[1].content, "Use tools.");
    assert_eq!(m[2].content, "weather in Paris?");
    assert_eq!(m[2].images, ["data:image/png;base64,iVBORw0KGgo="]);
    assert_eq!(m[3].content, "Let me look.");
    assert_eq!(m[3].reasoning_content.as_deref(), Some("call it"));
    let calls: Vec<(&str, &str)> = m[3]
        .tool_calls
        .iter()
        .map(|c| (c.id.as_deref().unwrap(), c.function.name.as_str()))
        .collect();
    assert_eq!(
        calls,
        [("call_a", "get_weather"), ("call_b", "get_weather")]
    );
    assert_eq!(
        m[3].tool_calls[1].function.arguments,
        json!("{\"city\": \"Lima\"}")
    );
    assert_eq!(m[4].tool_call_id.as_deref(), Some("call_a"));
    assert_eq!(m[4].name.as_deref(), Some("get_weather"));
    assert_eq!(
        (m[4].content.as_str(), m[5].content.as_str()),
        ("sun", "rain")
    );
    assert_eq!(m[6].content, "");
    assert_eq!(m[6].reasoning_content.as_deref(), Some("again"));
    assert_eq!(m[6].tool_calls[0].id.as_deref(), Some("call_c"));
    assert_eq!(m[7].content, "thanks");
    assert_eq!(r.tool_choice, ToolChoice::None);
    assert_eq!(r.parallel_tool_calls, Some(false));
    assert_eq!(r.thinking, Some(false));
    assert_eq!(r.max_output_tokens, Some(9));
    assert_eq!(r.sampling.temperature, Some(0.5));
    assert_eq!(r.prompt_cache_key.as_deref(), Some("conv-1"));
    assert_eq!(
        r.tools[0],
        json!({"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}})
    );
    assert!(matches!(
        &r.response_format,
        Some(mtp_contract::ResponseFormat::JsonSchema { json_schema, .. })
            if json_schema.name.as_deref() == Some("w") && json_schema.strict == Some(true)
    ));
    assert!(p.stream);
    // the settings the answer echoes
    assert_eq!(echo.instructions.as_deref(), Some("Be brief."));
    assert_eq!(echo.max_output_tokens, Some(9));
    assert!(!echo.parallel_tool_calls);
    assert_eq!(echo.tool_choice, json!("none"));
    assert_eq!(echo.tools[0]["name"], "get_weather");
    assert_eq!(echo.tools[0]["strict"], true);
    assert_eq!(echo.text["format"]["type"], "json_schema");
    assert_eq!(echo.text["verbosity"], "low");
    assert_eq!(
        echo.reasoning,
        json!({"effort": "minimal", "summary": "auto"})
    );
    assert_eq!(echo.metadata, json!({"k": "v"}));
    assert_eq!((echo.temperature, echo.top_p), (Some(0.5), Some(0.9)));
}

#[test]
fn a_string_input_and_the_defaults() {
    let (p, echo) = read(json!({"model": "m", "input": "hi"})).unwrap();
    let m = p.request.messages.unwrap();
    assert_eq!(
        (m.len(), m[0].role, m[0].content.as_str()),
        (1, Role::User, "hi")
    );
    assert_eq!(p.request.thinking, None);
    assert_eq!(p.request.response_format, None);
    assert!(!p.stream);
    assert_eq!(echo.tool_choice, json!("auto"));
    assert!(echo.parallel_tool_calls && echo.tools.is_empty());
    assert_eq!(echo.text, json!({"format": {"type": "text"}}));
    for (effort, on) in [
        ("none", false),
        ("low", true),
        ("medium", true),
        ("high", true),
        ("xhigh", true),
    ] {
        let (p, _) = read(json!({"input": "hi", "reasoning": {"effort": effort}})).unwrap();
        assert_eq!(p.request.thinking, Some(on), "{effort}");
    }
    let (p, _) = read(json!({"input": "hi", "reasoning": {"summary": "auto"}})).unwrap();
    assert_eq!(p.request.thinking, None);
    let (p, _) = read(json!({"input": "hi", "text": {"format": {"type": "json_object"}}})).unwrap();
    assert!(matches!(
        p.request.response_format,
        Some(mtp_contract::ResponseFormat::JsonObject { .. })
    ));
    let (p, _) = read(json!({"input": "hi", "text": {"format": {"type": "text"}}})).unwrap();
    assert_eq!(p.request.response_format, None);
    let (p, _) = read(
        json!({"input": "hi", "tool_choice": {"type": "function", "name": "f"},
        "tools": [{"type": "function", "name": "f"}], "max_tool_calls": 1}),
    )
    .unwrap();
    assert_eq!(p.request.tool_choice, ToolChoice::Function("f".into()));
    assert_eq!(p.request.parallel_tool_calls, Some(false));
    // a tool without parameters takes none
    assert_eq!(
        p.request.tools[0]["function"]["parameters"],
        json!({"type": "object", "properties": {}})
    );
    let (p, _) = read(json!({"input": "hi", "tool_choice": "required",
        "tools": [{"type": "function", "name": "f"}]}))
    .unwrap();
    assert_eq!(p.request.tool_choice, ToolChoice::Required);
    let (p, _) = read(json!({"input": "hi", "speculation": false})).unwrap();
    assert_eq!(
        p.request.speculation,
        Some(mtp_contract::Speculation::off())
    );
}

#[test]
fn what_the_responses_shapes_get_wrong_is_refused_by_name() {
    let base = || json!({"input": "a"});
    let with = |k: &str, v: Value| {
        let mut b = base();
        b[k] = v;
        read(b).unwrap_err()
    };
    for (k, v, param) in [
        (
            "previous_response_id",
            json!("resp_1"),
            "previous_response_id",
        ),
        ("conversation", json!("conv_1"), "conversation"),
        ("background", json!(true), "background"),
        ("prompt", json!({"id": "p"}), "prompt"),
        ("store", json!("yes"), "store"),
        ("input", json!(null), "input"),
        ("input", json!(3), "input"),
        ("input", json!([]), "input"),
        (
            "input",
            json!([{"role": "tool", "content": "a"}]),
            "input[0]",
        ),
        ("input", json!([{"role": "user"}]), "input[0]"),
        (
            "input",
            json!(["a", {"role": "user", "content": "b"}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"role": "user", "content": "b"}, {"type": "item_reference", "id": "x"}]),
            "input[1]",
        ),
        ("input", json!([{"type": "web_search_call"}]), "input[0]"),
        (
            "input",
            json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.invalid/a.png"}]}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "/etc/passwd"}]}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"type": "function_call_output", "output": "x"}]),
            "input[0]",
        ),
        (
            "input",
            json!([{"type": "reasoning", "summary": "x"}]),
            "input[0]",
        ),
        ("instructions", json!(["a"]), "instructions"),
        ("max_output_tokens", json!(0), "max_output_tokens"),
        ("max_output_tokens", json!(-1), "max_output_tokens"),
        ("max_tool_calls", json!(3), "max_tool_calls"),
        ("top_logprobs", json!(2), "top_logprobs"),
        ("temperature", json!("hot"), "temperature"),
        ("parallel_tool_calls", json!("no"), "parallel_tool_calls"),
        ("tools", json!("x"), "tools"),
        ("tools", json!([{"type": "web_search"}]), "tools[0]"),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
            "tools[0]",
        ),
        (
            "tools",
            json!([{"type": "function", "name": "f", "parameters": [1]}]),
            "tools[0]",
        ),
        ("tools", json!([{"name": "f"}]), "tools[0]"),
        ("tool_choice", json!("maybe"), "tool_choice"),
        ("tool_choice", json!({"type": "function"}), "tool_choice"),
        (
            "tool_choice",
            json!({"type": "allowed_tools", "tools": []}),
            "tool_choice",
        ),
        ("text", json!("json"), "text"),
        ("text", json!({"format": {"type": "xml"}}), "text.format"),
        (
            "text",
            json!({"format": {"type": "json_schema", "name": "x"}}),
            "text.format",
        ),
        (
            "text",
            json!({"format": {"type": "json_schema", "schema": 3}}),
            "text.format",
        ),
        ("reasoning", json!({"effort": "max"}), "reasoning.effort"),
        ("reasoning", json!("high"), "reasoning"),
        ("speculation", json!({"mode": "warp"}), "speculation"),
    ] {
        let e = with(k, v.clone());
        assert_eq!(e.status, 400, "{k}: {v}");
        assert_eq!(e.param.as_deref(), Some(param), "{k}: {v}: {}", e.message);
    }
    // a named tool that is not offered: the chat route's own check
    let mut b = base();
    b["tools"] = json!([{"type": "function", "name": "f"}]);
    b["tool_choice"] = json!({"type": "function", "name": "g"});
    assert!(read(b).unwrap_err().message.contains("`g`"));
    // the server's limits hold for the Responses shapes too, named as they are sent
    let limits = Limits {
        max_messages: 2,
        max_content_parts: 2,
        max_tools: 1,
        max_prompt_bytes: 64,
        ..Limits::default()
    };
    let over = |b: Value| parse(&b, &limits).unwrap_err();
    let e = over(json!({"input": rep(json!({"role": "user", "content": "a"}), 3)}));
    assert_eq!(
        (e.code.as_deref(), e.param.as_deref()),
        (Some("over_limit"), Some("input"))
    );
    let e = over(
        json!({"input": [{"role": "user", "content": rep(json!({"type": "input_text", "text": "a"}), 3)}]}),
    );
    assert_eq!(
        (e.code.as_deref(), e.param.as_deref()),
        (Some("over_limit"), Some("input[0]"))
    );
    let e = over(json!({"input": "a", "tools": rep(json!({"type": "function", "name": "f"}), 2)}));
    assert_eq!(
        (e.code.as_deref(), e.param.as_deref()),
        (Some("over_limit"), Some("tools"))
    );
    let e = over(json!({"input": "a".repeat(100)}));
    assert_eq!(
        (e.status.as_u16(), e.param.as_deref()),
        (413, Some("input"))
    );
    // the chat route's message count, after instructions are added, names `input` too
    let e = over(
        json!({"instructions": "s", "input": rep(json!({"role": "user", "content": "a"}), 2)}),
    );
    assert_eq!(e.param.as_deref(), Some("input"), "{}", e.message);
}

fn done(content: &str, reasoning: Option<&str>, finish: FinishReason) -> GenerateResponse {
    let off = mtp_contract::resolve(None, Some(&false.into()));
    let report = mtp_contract::SpeculationReport::not_used(
        &off,
        "test",
        mtp_contract::Reason::DisabledByRequest,
        None,
    );
    GenerateResponse {
        content: content.into(),
        reasoning_content: reasoning.map(str::to_string),
        token_ids: None,
        finish_reason: finish,
        usage: mtp_contract::Usage {
            input_tokens: 7,
            output_tokens: 3,
            cached_input_tokens: 2,
        },
        metadata: mtp_contract::Metadata {
            speculation: report,
            timings: Default::default(),
        },
        partial: false,
        warnings: Vec::new(),
        tool_calls: Vec::new(),
        stop_sequence: None,
        prompt_logprobs: None,
        logprobs: None,
    }
}

#[test]
fn the_whole_answers_items() {
    let r = done("hi", Some("hm"), FinishReason::Stop);
    let items = serde_json::to_value(output(&r, "resp_4")).unwrap();
    assert_eq!(
        items,
        json!([{"type": "reasoning", "id": "rs_4_0", "summary": [], "status": "completed",
                "content": [{"type": "reasoning_text", "text": "hm"}]},
               {"type": "message", "id": "msg_4_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]}])
    );
    let cut = output(&done("hi", None, FinishReason::Length), "resp_4");
    assert!(matches!(
        &cut[0],
        OutputItem::Message {
            status: "incomplete",
            ..
        }
    ));
    assert_eq!(
        ending(&done("", None, FinishReason::Length))
            .1
            .unwrap()
            .reason,
        Some("max_output_tokens")
    );
    let mut calls = done("", None, FinishReason::ToolCalls);
    calls.tool_calls = vec![
        mtp_contract::ToolCall::function("call_x", "f", json!("{\"a\": 1}")),
        mtp_contract::ToolCall {
            id: None,
            ..mtp_contract::ToolCall::function("", "g", json!({"b": 2}))
        },
    ];
    let items = serde_json::to_value(output(&calls, "resp_4")).unwrap();
    assert_eq!(
        items,
        json!([{"type": "function_call", "id": "fc_4_0", "call_id": "call_x", "name": "f",
                "arguments": "{\"a\": 1}", "status": "completed"},
               {"type": "function_call", "id": "fc_4_1", "call_id": "call_4_1", "name": "g",
                "arguments": "{\"b\":2}", "status": "completed"}])
    );
}
