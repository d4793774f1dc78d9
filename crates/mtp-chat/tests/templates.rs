//! Every published chat template in `tests/templates/` (llama.cpp b11434's
//! `models/templates/`: Qwen3.5, Qwen3, Qwen3-Coder, QwQ, Qwen2.5, DeepSeek, GLM, Llama 3.x,
//! Mistral, gpt-oss, Gemma, Granite, Kimi, … 72 in all) renders every conversation of
//! `cases.json` byte for byte as transformers' `apply_chat_template` did
//! (`goldens.json`, written by `make_goldens.py` with jinja2 and transformers); where the
//! template refused a conversation (`raise_exception`), ours refuses it too, with the same
//! message.
//!
//! The few places where jinja2 fails and minijinja does not are listed in [`accepted`], each
//! with its reason; nothing else may differ.

use std::path::{Path, PathBuf};

use mtp_chat::{ChatTemplate, Clock, RenderInput, TemplateError};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/templates")
}

fn read_json(name: &str) -> Value {
    let p = dir().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// jinja2 errors that minijinja does not reproduce, and why rendering instead is acceptable.
/// Returns the reason when `(template, golden error)` is one of them.
fn accepted(template: &str, golden_error: &str) -> Option<&'static str> {
    if golden_error.contains("'NoneType' object is not iterable") {
        // Tool-use-only templates iterate `tools` without checking it; jinja2 cannot iterate
        // None, minijinja iterates it as empty. Rendering a prompt without tools is harmless.
        return Some("minijinja iterates none as empty");
    }
    if golden_error.contains("Object of type generator is not JSON serializable") {
        // `tools | map(...) | tojson` without `| list`: jinja2's `map` is a generator that
        // json.dumps refuses; minijinja's is a list, and it serializes as the list.
        return Some("minijinja's map filter yields a list");
    }
    let _ = template;
    None
}

/// Rendered differences that are jinja2 quirks rather than template meaning, by template and
/// case, with the reason.
fn accepted_difference(template: &str, case: &str) -> Option<&'static str> {
    if template == "meetkai-functionary-medium-v3.1.jinja"
        && matches!(
            case,
            "tools"
                | "tools_system"
                | "tool_call_roundtrip"
                | "parallel_tool_calls"
                | "tool_call_values"
                | "tool_call_string_arguments"
        )
    {
        // `"..."|safe + t | tojson` in markupsafe HTML-escapes the plain string added to a
        // Markup one (`"` becomes `&#34;` inside the tool JSON): an escaping side effect of
        // Python's Markup class, not part of the template's format.
        return Some("markupsafe escapes what is added to a |safe string");
    }
    None
}

#[test]
fn every_template_renders_as_transformers_does() {
    let cases = read_json("cases.json");
    let goldens = read_json("goldens.json");
    let now = chrono_now(cases["now"].as_str().expect("now"));
    let mut checked = 0;
    let mut failures = Vec::new();
    let templates = goldens["templates"].as_object().expect("templates");
    assert!(templates.len() >= 70, "{} templates", templates.len());
    for (name, results) in templates {
        let src = std::fs::read_to_string(dir().join(name)).expect("template file");
        let t = match ChatTemplate::new(src, name.clone()) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: does not compile: {e}"));
                continue;
            }
        };
        for case in cases["cases"].as_array().expect("cases") {
            let cname = case["name"].as_str().expect("case name");
            let mut variables = cases["special_tokens"]
                .as_object()
                .expect("special tokens")
                .clone();
            if let Some(kw) = case.get("kwargs").and_then(Value::as_object) {
                variables.extend(kw.clone());
            }
            let input = RenderInput {
                messages: case["messages"].as_array().expect("messages").clone(),
                tools: case
                    .get("tools")
                    .map(|_| cases["tools"].as_array().expect("tools").clone()),
                documents: None,
                add_generation_prompt: case["add_generation_prompt"].as_bool().expect("agp"),
                variables,
                clock: Clock::Fixed(now),
            };
            let golden = &results[cname];
            let got = t.render(&input);
            checked += 1;
            match (golden.get("ok").and_then(Value::as_str), got) {
                (Some(want), Ok(got)) if want == got => {}
                (Some(want), Ok(got)) => {
                    if accepted_difference(name, cname).is_none() {
                        let at = want
                            .chars()
                            .zip(got.chars())
                            .take_while(|(a, b)| a == b)
                            .count();
                        let around = |s: &str| -> String {
                            s.chars().skip(at.saturating_sub(30)).take(90).collect()
                        };
                        failures.push(format!(
                            "{name} / {cname}: differs at char {at}:\n  want {:?}\n  got  {:?}",
                            around(want),
                            around(&got)
                        ));
                    }
                }
                (Some(_), Err(e)) => failures.push(format!("{name} / {cname}: failed: {e}")),
                (None, got) => {
                    let want = golden["error"].as_str().expect("ok or error");
                    match (got, want.strip_prefix("TemplateError: ")) {
                        // the template's own refusal: same message
                        (Err(TemplateError::Raised { message, .. }), Some(w)) => {
                            if message != w {
                                failures.push(format!(
                                    "{name} / {cname}: refused with {message:?}, jinja2 with {w:?}"
                                ));
                            }
                        }
                        (Err(_), None) => {}
                        (Err(e), Some(_)) => failures.push(format!(
                            "{name} / {cname}: jinja2 raised {want:?}, we failed otherwise: {e}"
                        )),
                        (Ok(_), _) => {
                            if accepted(name, want).is_none() {
                                failures.push(format!(
                                    "{name} / {cname}: jinja2 failed ({want}) but we rendered"
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} renders differ from transformers:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked >= 70 * 20, "{checked}");
}

fn chrono_now(s: &str) -> chrono::NaiveDateTime {
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S").expect("cases.json now")
}

/// The Qwen3.5 template is the one this project is built around: check its thinking switch and
/// reasoning history explicitly too, so a regression names the behaviour and not a diff.
#[test]
fn qwen35_thinking_switch() {
    let src = std::fs::read_to_string(dir().join("Qwen3.5-4B.jinja")).expect("template");
    let t = ChatTemplate::new(src, "Qwen3.5-4B.jinja").expect("compiles");
    let render = |thinking: Option<bool>| {
        let mut input =
            RenderInput::new(vec![serde_json::json!({"role": "user", "content": "Hi"})]);
        if let Some(on) = thinking {
            input.variables.insert("enable_thinking".into(), on.into());
        }
        t.render(&input).expect("renders")
    };
    assert!(render(None).ends_with("<|im_start|>assistant\n<think>\n"));
    assert!(render(Some(true)).ends_with("<|im_start|>assistant\n<think>\n"));
    assert!(render(Some(false)).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

/// A template error names the template, its line and the construct at fault.
#[test]
fn errors_name_line_and_construct() {
    let src = "line one\n{{ messages[0].content.nosuchmethod() }}\n";
    let t = ChatTemplate::new(src, "bad.jinja").expect("compiles");
    let err = t
        .render(&RenderInput::new(vec![
            serde_json::json!({"role": "user", "content": "x"}),
        ]))
        .expect_err("unknown method");
    let msg = err.to_string();
    assert!(msg.contains("bad.jinja"), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
    assert!(msg.contains("nosuchmethod"), "{msg}");

    let err = ChatTemplate::new("ok\n{% if %}\n", "broken.jinja").expect_err("syntax");
    let msg = err.to_string();
    assert!(
        matches!(err, TemplateError::Syntax { line: Some(2), .. }),
        "{msg}"
    );
    assert!(msg.contains("broken.jinja"), "{msg}");

    let t = ChatTemplate::new(
        "{{ raise_exception('Only user and assistant roles are supported!') }}",
        "strict.jinja",
    )
    .expect("compiles");
    match t.render(&RenderInput::new(vec![])) {
        Err(TemplateError::Raised { message, .. }) => {
            assert_eq!(message, "Only user and assistant roles are supported!")
        }
        other => panic!("{other:?}"),
    }
}

/// A hostile template runs out of budget with an error instead of running for ever.
#[test]
fn runaway_templates_stop() {
    let t = ChatTemplate::new(
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        "loop.jinja",
    )
    .expect("compiles");
    let err = t
        .render(&RenderInput::new(vec![]))
        .expect_err("out of fuel");
    assert!(matches!(err, TemplateError::Render { .. }), "{err}");
}
