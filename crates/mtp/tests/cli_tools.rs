//! Tool calling on the command line: `--tools`, `--tool-choice`, `--no-parallel-tool-calls`
//! and chat's `/tool` and `/tools`, in-process through `mtp::cli::run_with` with the fake
//! provider, and the real binary for what needs no model.

#[path = "cli_fake_provider.rs"]
mod fake;
#[path = "support/cli.rs"]
mod support;

use std::process::ExitCode;

use predicates::prelude::*;
use serde_json::Value;
use support::*;

// ---------------------------------------------------------------- tools

/// Two OpenAI tool objects, as a `--tools` file holds them.
fn tool_list() -> Value {
    serde_json::json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}},
        {"type": "function", "function": {"name": "now", "description": "The time."}}
    ])
}

/// A `--tools` file holding [`tool_list`]; the directory lives as long as the returned guard.
fn tools_file() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.json");
    std::fs::write(&path, tool_list().to_string()).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

/// The tool calls `mtp generate` printed: one line of OpenAI's JSON each, nothing else.
fn printed_calls(stdout: &str) -> Vec<Value> {
    stdout.lines().map(json).collect()
}

/// `--tools`, `--tool-choice` and `--no-parallel-tool-calls` reach the provider exactly; each
/// call is one line of OpenAI's JSON on stdout, and the summary counts them.
#[test]
fn generate_tools_reach_the_provider_and_calls_print_as_openai_json() {
    let (_dir, path) = tools_file();
    let base = [
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--tools",
        &path,
    ];
    let run = |extra: &[&str], prompt: &str| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args.push(prompt);
        let (code, out, err) = mtp(&args);
        assert_eq!(code, OK, "{extra:?}: {err}");
        let reqs = requests_for(prompt);
        assert_eq!(reqs.len(), 1, "{prompt}");
        assert_eq!(
            Value::Array(reqs[0].tools.clone()),
            tool_list(),
            "the file's tools, as written"
        );
        (out, err, reqs[0].clone())
    };

    // required, at most one call
    let (out, err, r) = run(
        &["--tool-choice", "required", "--no-parallel-tool-calls"],
        "gen-tools-required use every tool",
    );
    assert_eq!(r.tool_choice, mtp::ToolChoice::Required);
    assert_eq!(r.parallel_tool_calls, Some(false));
    assert_eq!(
        printed_calls(&out),
        [serde_json::json!({"id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"i\": 0}"}})]
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("1 tool call ·"), "{err}");

    // a named function
    let (out, err, r) = run(&["--tool-choice", "now"], "gen-tools-named");
    assert_eq!(r.tool_choice, mtp::ToolChoice::Function("now".into()));
    assert_eq!(r.parallel_tool_calls, None);
    let calls = printed_calls(&out);
    assert_eq!(calls.len(), 1, "{out}");
    assert_eq!(calls[0]["function"]["name"], "now");
    assert!(err.contains("1 tool call"), "{err}");

    // auto (the default): the model calls both when asked
    let (out, err, r) = run(&[], "gen-tools-auto use every tool");
    assert_eq!(r.tool_choice, mtp::ToolChoice::Auto);
    assert_eq!(r.parallel_tool_calls, None);
    let calls = printed_calls(&out);
    let names: Vec<&str> = calls
        .iter()
        .map(|c| c["function"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["get_weather", "now"], "{out}");
    assert!(err.contains("2 tool calls"), "{err}");

    // auto, not asked: text, and the summary says nothing of tools
    let (out, err, _) = run(&["--max-tokens", "4"], "gen-tools-text");
    assert_eq!(out, format!("{}\n", fake::expected_text(4)));
    assert!(!err.contains("tool call"), "{err}");

    // none: the tools are not shown, so the model answers in text
    let (out, err, r) = run(
        &["--tool-choice", "none", "--max-tokens", "4"],
        "gen-tools-none use every tool",
    );
    assert_eq!(r.tool_choice, mtp::ToolChoice::None);
    assert_eq!(out, format!("{}\n", fake::expected_text(4)));
    assert!(!err.contains("tool call"), "{err}");
}

/// `--json` is the whole response: `tool_calls` in OpenAI's shape, `finish_reason`
/// `tool_calls`, no text.
#[test]
fn generate_json_carries_tool_calls_and_their_finish_reason() {
    let (_dir, path) = tools_file();
    let (code, out, err) = mtp(&[
        "generate",
        "--provider",
        "fake",
        "--model",
        "m",
        "--tools",
        &path,
        "--json",
        "gen-tools-json use every tool",
    ]);
    assert_eq!(code, OK, "{err}");
    assert!(err.is_empty(), "--json writes nothing else: {err}");
    let v = json(&out);
    assert_eq!(v["finish_reason"], "tool_calls");
    assert_eq!(v["content"], "");
    assert_eq!(
        v["tool_calls"],
        serde_json::json!([
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"i\": 0}"}},
            {"id": "call_1", "type": "function",
             "function": {"name": "now", "arguments": "{\"i\": 1}"}}
        ])
    );
    assert_eq!(v["usage"]["output_tokens"], 2 * fake::CALL_TOKENS as u64);
}

/// A tools flag that cannot be used is one error line, exit 2, before the model loads and
/// before anything reaches the provider.
#[test]
fn generate_tool_flag_errors_are_one_line_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (_tools_dir, good) = tools_file();
    let bad_json = file("bad.json", "[{\"type\": \"function\",");
    let object = file(
        "object.json",
        &serde_json::json!({"tools": tool_list()}).to_string(),
    );
    let single = file("single.json", &tool_list()[0].to_string());
    let strings = file("strings.json", "[\"get_weather\"]");
    let nameless = file("nameless.json", r#"[{"type": "function", "function": {}}]"#);
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((16 << 20) + 1)
        .unwrap();
    let big = big.to_str().unwrap().to_string();
    let missing = dir.path().join("missing.json");
    let missing = missing.to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--tools", &missing],
            vec!["invalid --tools: cannot read", "missing.json"],
        ),
        (
            vec!["--tools", &bad_json],
            vec!["invalid --tools:", "bad.json is not JSON"],
        ),
        (
            vec!["--tools", &object],
            vec![
                "object.json: expected a JSON list of OpenAI tool objects",
                "got an object",
            ],
        ),
        (
            vec!["--tools", &single],
            vec!["single.json: expected a JSON list of OpenAI tool objects"],
        ),
        (
            vec!["--tools", &strings],
            vec!["tool 0: expected an OpenAI tool object, got a string"],
        ),
        (
            vec!["--tools", &nameless],
            vec!["tool 0: `function.name` must be a non-empty string"],
        ),
        (
            vec!["--tools", &big],
            vec!["big.json is larger than 16 MiB"],
        ),
        (
            vec!["--tools", &good, "--tool-choice", "get_time"],
            vec![
                "invalid --tool-choice: `get_time` is not auto, none, required, nor one of ",
                "tools.json's tools (get_weather, now)",
            ],
        ),
        (
            vec!["--tool-choice", "required"],
            vec!["invalid --tool-choice: goes with --tools FILE"],
        ),
        (
            vec!["--tool-choice", "get_weather"],
            vec!["invalid --tool-choice: goes with --tools FILE"],
        ),
        (
            vec!["--no-parallel-tool-calls"],
            vec!["invalid --no-parallel-tool-calls: goes with --tools FILE"],
        ),
        (
            vec!["--tools", &good, "--raw"],
            vec!["invalid --tools:", "--raw"],
        ),
        (
            vec![
                "--tools",
                &good,
                "--tool-choice",
                "required",
                "--json-object",
            ],
            vec![
                "invalid request:",
                "a forced tool call and `response_format`",
            ],
        ),
    ];
    for (extra, expected) in &cases {
        let mut args = vec!["generate", "--provider", "fake", "--model", "m"];
        args.extend_from_slice(extra);
        args.push("gen-tool-errors");
        let (code, out, err) = mtp(&args);
        assert_eq!(code, ExitCode::from(2), "{extra:?}: {err}");
        assert!(out.is_empty(), "{extra:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: {err}");
        for e in expected {
            assert!(err.contains(e), "{extra:?}: missing {e:?} in {err}");
        }
    }
    assert!(requests_for("gen-tool-errors").is_empty());
}

/// The real binary reads the tools file before it looks for the model.
#[test]
fn binary_bad_tools_file_is_refused_before_the_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.json");
    std::fs::write(&path, "{}").unwrap();
    bin()
        .args(["generate", "--model", "/no/such/model", "--tools"])
        .arg(&path)
        .arg("x")
        .assert()
        .code(2)
        .stdout("")
        .stderr(
            predicate::str::contains("invalid --tools:")
                .and(predicate::str::contains(
                    "expected a JSON list of OpenAI tool objects",
                ))
                .and(predicate::str::contains("/no/such/model").not())
                .and(predicate::function(|e: &str| e.lines().count() == 1)),
        );
}

/// `mtp chat --tools`: the tools go with every turn, the calls are shown and kept in the
/// history as the assistant turn's `tool_calls`, `/tool` answers them (by id or in order) and
/// the model answers once every call has its result; `/tools` shows and sets the choice.
#[test]
fn chat_tools_calls_history_and_tool_results() {
    let (_dir, path) = tools_file();
    let (code, out, err) = chat(
        &[
            "--provider",
            "fake",
            "--model",
            "m",
            "--max-tokens",
            "3",
            "--tools",
            &path,
        ],
        &[
            "/help",
            "/tools",
            "/tool 42",
            "chat-tools-1 use every tool",
            "/tools",
            "/tool call_1",
            "/tool call_1 12:00",
            "/tool sunny, 21 C",
            "/tool late",
            "/tools later",
            "/tools required",
            "chat-tools-3",
            "chat-tools-4",
        ],
    );
    assert_eq!(code, OK, "{err}");
    for needle in [
        // the banner and /help
        "tools: get_weather, now · tool choice auto (the model decides)",
        "/tool [ID] RESULT",
        "/tools [auto|none|required|NAME]",
        // /tools before any call
        "tools: get_weather, now\ntool choice: auto (the model decides)\nparallel tool calls: as many as the model makes",
        "> /tool 42\nno tool call is waiting for a result",
        // the calls, as before, with their ids
        "tool call: get_weather({\"i\": 0}) · id call_0\ntool call: now({\"i\": 1}) · id call_1\n(answer with /tool RESULT, or /tool ID RESULT for one call)",
        "waiting for results: call_0 (get_weather), call_1 (now)",
        "> /tool call_1\nusage: /tool [ID] RESULT",
        "result of call_1 (now) kept; waiting for: call_0 (get_weather)",
        // the last result: the model answers (3 tokens of text)
        &format!("> /tool sunny, 21 C\n{}\n", fake::expected_text(3)),
        "> /tool late\nno tool call is waiting for a result",
        "invalid /tools `later`: `later` is not auto, none, required, nor one of the tools (get_weather, now)",
        "tool choice required (every reply is tool calls) for the next turns.",
        "(the last answer's tool calls go unanswered: call_0 (get_weather))",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in {out}");
    }
    assert!(err.contains("2 tool calls"), "{err}");

    let first = &requests_for("chat-tools-1 use every tool")[0];
    assert_eq!(Value::Array(first.tools.clone()), tool_list());
    assert_eq!(first.tool_choice, mtp::ToolChoice::Auto);
    assert_eq!(first.parallel_tool_calls, None);
    // the answer to the tool results: no prompt, the history ends with both results
    let answered: Vec<mtp::GenerateRequest> = fake::REQUESTS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| {
            r.messages
                .as_ref()
                .and_then(|m| m.last())
                .is_some_and(|m| m.content == "sunny, 21 C")
        })
        .cloned()
        .collect();
    assert_eq!(answered.len(), 1);
    let r = &answered[0];
    assert_eq!(r.prompt, "");
    assert_eq!(r.prompt_cache_key, first.prompt_cache_key);
    assert_eq!(Value::Array(r.tools.clone()), tool_list());
    let h = r.messages.as_ref().unwrap();
    assert_eq!(h.len(), 4, "{h:?}");
    assert_eq!(h[0].content, "chat-tools-1 use every tool");
    assert_eq!(h[1].role, mtp::Role::Assistant);
    assert_eq!(h[1].content, "");
    let ids: Vec<Option<&str>> = h[1].tool_calls.iter().map(|c| c.id.as_deref()).collect();
    assert_eq!(ids, [Some("call_0"), Some("call_1")]);
    assert_eq!(h[1].tool_calls[1].function.name, "now");
    assert_eq!(
        h[1].tool_calls[0].function.arguments,
        Value::String("{\"i\": 0}".into())
    );
    assert_eq!(h[2].role, mtp::Role::Tool);
    assert_eq!(h[2].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(h[2].name.as_deref(), Some("now"));
    assert_eq!(h[2].content, "12:00");
    assert_eq!(h[3].role, mtp::Role::Tool);
    assert_eq!(h[3].tool_call_id.as_deref(), Some("call_0"));
    assert_eq!(h[3].name.as_deref(), Some("get_weather"));

    // /tools required: forced from the next turn on; the answer after the results is kept
    let third = &requests_for("chat-tools-3")[0];
    assert_eq!(third.tool_choice, mtp::ToolChoice::Required);
    let h = third.messages.as_ref().unwrap();
    assert_eq!(h.len(), 5);
    assert_eq!(h[4].content, fake::expected_text(3));
    assert!(h[4].tool_calls.is_empty());
    // its call went unanswered: the next user turn follows it directly
    let h = requests_for("chat-tools-4")[0].messages.clone().unwrap();
    assert_eq!(h.len(), 7);
    assert_eq!(h[6].tool_calls[0].function.name, "get_weather");
}

/// Bad tools flags end `mtp chat` before the model loads, as `generate`'s do; without
/// `--tools`, `/tools` and `/tool` say there are none.
#[test]
fn chat_tool_flag_errors_and_no_tools() {
    let (_dir, path) = tools_file();
    for (extra, expected) in [
        (
            vec!["--tool-choice", "required"],
            "invalid --tool-choice: goes with --tools FILE",
        ),
        (
            vec!["--tools", path.as_str(), "--tool-choice", "get_time"],
            "tools.json's tools (get_weather, now)",
        ),
        (
            vec!["--tools", "/no/such/tools.json"],
            "invalid --tools: cannot read /no/such/tools.json",
        ),
        (
            vec![
                "--tools",
                path.as_str(),
                "--tool-choice",
                "now",
                "--json-object",
            ],
            "a forced tool call and `response_format`",
        ),
    ] {
        let mut args = vec!["--provider", "fake", "--model", "m"];
        args.extend_from_slice(&extra);
        let (code, out, err) = chat(&args, &["chat-tool-errors"]);
        assert_eq!(code, ExitCode::from(2), "{extra:?}: {err}");
        assert!(!out.contains("mtp chat ·"), "no session started: {out}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
    assert!(requests_for("chat-tool-errors").is_empty());

    let (code, out, _) = chat(
        &["--provider", "fake", "--model", "m", "--max-tokens", "2"],
        &[
            "/tools",
            "/tools required",
            "/tool x",
            "chat-no-tools use a tool",
        ],
    );
    assert_eq!(code, OK);
    assert_eq!(
        out.matches("no tools are offered: start the chat with --tools FILE.")
            .count(),
        2,
        "{out}"
    );
    assert!(
        out.contains("no tool call is waiting for a result"),
        "{out}"
    );
    let r = &requests_for("chat-no-tools use a tool")[0];
    assert!(r.tools.is_empty());
    assert_eq!(r.tool_choice, mtp::ToolChoice::Auto);
}
