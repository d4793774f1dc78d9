//! Tool calls read from a streamed reply (`ReplyText::with_tool_calls`) and the constraint a
//! forced call decodes under (`ChatTemplates::tool_call_constraint`), on the Qwen3.5 template
//! as published: the rendered prompt, then replies written in its markup.

use mtp_chat::{ChatTemplates, ReplyText};
use mtp_contract::{GenerateRequest, Message, ToolChoice};
use mtp_grammar::{check_text, Check};
use serde_json::{json, Value};

fn qwen35() -> (tempfile::TempDir, ChatTemplates) {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/templates/Qwen3.5-4B.jinja"
    ))
    .unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), src).unwrap();
    let t = ChatTemplates::from_dir(dir.path()).unwrap();
    (dir, t)
}

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer"}}, "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string"}}}}}),
    ]
}

fn request(choice: ToolChoice, thinking: bool) -> GenerateRequest {
    GenerateRequest::new("")
        .messages(vec![Message::user("Weather in Paris for 3 days?")])
        .tools(tools())
        .tool_choice(choice)
        .thinking(thinking)
}

const CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
                    <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

/// The reply read piece by piece: text before the call is content, the call comes out as
/// pieces whose arguments join to the typed JSON, and no markup reaches the content.
#[test]
fn a_streamed_reply_gives_text_and_calls() {
    let (_d, t) = qwen35();
    let req = request(ToolChoice::Auto, false);
    let prompt = t.render_request(&req).unwrap();
    let format = t.tool_call_format(&req);
    assert!(format.is_some());
    let mut r = ReplyText::new(vec!["<|im_end|>".into()], prompt.reasoning.clone())
        .with_tool_calls(format, &req);
    let reply = format!("Checking.\n\n{CALL}<|im_end|>");
    let mut content = String::new();
    let mut pieces = Vec::new();
    let chars: Vec<char> = reply.chars().collect();
    for chunk in chars.chunks(3) {
        let s = r.push(&chunk.iter().collect::<String>());
        content.push_str(&s.content);
        pieces.extend(s.tool_calls);
    }
    let s = r.finish();
    content.push_str(&s.content);
    pieces.extend(s.tool_calls);
    assert_eq!(content, "Checking.");
    assert_eq!(r.content(), "Checking.");
    let calls = r.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].function.name, "get_weather");
    assert_eq!(
        calls[0].function.arguments,
        json!(r#"{"city": "Paris", "days": 3}"#)
    );
    assert!(calls[0].id.as_deref().unwrap().starts_with("call_"));
    // the first piece names the call; the pieces' arguments join to the whole
    assert_eq!(pieces[0].name.as_deref(), Some("get_weather"));
    let joined: String = pieces.iter().map(|p| p.arguments.as_str()).collect();
    assert_eq!(Value::String(joined), calls[0].function.arguments);
}

/// `parallel_tool_calls: false` keeps the first call and says so; `tool_choice: "none"`
/// shows no tools and reads no calls.
#[test]
fn parallel_false_keeps_one_call_and_none_reads_none() {
    let (_d, t) = qwen35();
    let req = request(ToolChoice::Auto, false).parallel_tool_calls(false);
    let mut r = ReplyText::new(vec![], None).with_tool_calls(t.tool_call_format(&req), &req);
    let second = CALL.replace("Paris", "Rome");
    r.push(&format!("{CALL}\n{second}"));
    r.finish();
    assert_eq!(r.tool_calls().len(), 1);
    assert!(r
        .tool_call_warnings()
        .iter()
        .any(|w| w.contains("parallel_tool_calls")));

    let none = request(ToolChoice::None, false);
    assert!(t.tool_call_format(&none).is_none());
    let prompt = t.render_request(&none).unwrap();
    assert!(
        !prompt.text.contains("get_weather"),
        "tools were shown under tool_choice none"
    );
    let mut r = ReplyText::new(vec![], None).with_tool_calls(t.tool_call_format(&none), &none);
    r.push(CALL);
    r.finish();
    assert!(r.tool_calls().is_empty());
    assert_eq!(r.content(), CALL);
}

/// A forced call's constraint: the call in the template's markup, arguments valid against the
/// schema; with thinking on (the prompt opens `<think>`), free reasoning up to `</think>`
/// first.
#[test]
fn forced_calls_are_a_grammar_of_the_templates_markup() {
    let (_d, t) = qwen35();
    let named = request(ToolChoice::Function("get_weather".into()), false);
    let prompt = t.render_request(&named).unwrap();
    let format = t
        .tool_call_constraint(&named, prompt.reasoning.as_ref())
        .unwrap()
        .unwrap();
    assert_eq!(check_text(&format, CALL).unwrap(), Check::Follows);
    let other = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
    assert!(matches!(
        check_text(&format, other).unwrap(),
        Check::Leaves { .. }
    ));
    assert!(matches!(
        check_text(&format, "Sure!").unwrap(),
        Check::Leaves { .. }
    ));
    let required = request(ToolChoice::Required, false);
    let format = t
        .tool_call_constraint(&required, prompt.reasoning.as_ref())
        .unwrap()
        .unwrap();
    assert_eq!(check_text(&format, other).unwrap(), Check::Follows);

    let thinking = request(ToolChoice::Function("get_weather".into()), true);
    let prompt = t.render_request(&thinking).unwrap();
    assert!(
        prompt.reasoning.as_ref().is_some_and(|r| r.opened),
        "{}",
        prompt.text
    );
    let format = t
        .tool_call_constraint(&thinking, prompt.reasoning.as_ref())
        .unwrap()
        .unwrap();
    let reply = format!("The user wants weather.\n</think>\n\n{CALL}");
    assert_eq!(check_text(&format, &reply).unwrap(), Check::Follows);
    // the reasoning cannot close twice, and the call must follow it
    let twice = format!("a</think>b</think>\n{CALL}");
    assert!(matches!(
        check_text(&format, &twice).unwrap(),
        Check::Leaves { .. }
    ));
    assert!(matches!(
        check_text(&format, "a</think>\nSure.").unwrap(),
        Check::Leaves { .. }
    ));

    assert!(t
        .tool_call_constraint(&request(ToolChoice::Auto, false), prompt.reasoning.as_ref())
        .unwrap()
        .is_none());
}

/// A reply the token limit cuts inside a call: the call is incomplete, so the whole answer
/// has no such call (its markup is content, as vLLM returns text it cannot read as a call),
/// and no streamed piece closes its arguments; calls completed before it stand. Ended by the
/// model instead, the same text is a call (closed with what it has).
#[test]
fn a_call_the_token_limit_cuts_is_incomplete() {
    let (_d, t) = qwen35();
    let req = request(ToolChoice::Auto, false);
    let format = t.tool_call_format(&req);
    // every place the limit can cut the call, from inside `<function=` to before
    // `</tool_call>`
    let start = CALL.find("<function=").unwrap() + "<function=get_weather>".len();
    for end in start..CALL.len() {
        let cut = &CALL[..end];
        let mut r = ReplyText::new(vec![], None).with_tool_calls(format, &req);
        let mut args = String::new();
        let pieces = vec![r.push("Checking.\n\n"), r.push(cut), r.finish_cut()];
        for p in &pieces {
            assert!(
                !p.content.contains("<tool_call>"),
                "markup streamed as text"
            );
            for d in &p.tool_calls {
                args.push_str(&d.arguments);
            }
        }
        assert!(r.tool_calls().is_empty(), "{cut:?}: {:?}", r.tool_calls());
        assert_eq!(r.content(), format!("Checking.\n\n{cut}"), "{cut:?}");
        // what was streamed of the arguments is not a whole JSON object
        assert!(
            serde_json::from_str::<Value>(&args).is_err(),
            "{cut:?}: streamed {args:?} as if complete"
        );
        assert!(r
            .tool_call_warnings()
            .iter()
            .any(|w| w.contains("token limit")));
        // the model ending the reply there instead: the call stands
        let mut r = ReplyText::new(vec![], None).with_tool_calls(format, &req);
        r.push(cut);
        r.finish();
        assert_eq!(r.tool_calls().len(), 1, "{cut:?}");
    }
    // a complete call, then one the limit cuts: the first stands
    let mut r = ReplyText::new(vec![], None).with_tool_calls(format, &req);
    r.push(&format!("{CALL}\n{}", &CALL[..CALL.len() - 5]));
    r.finish_cut();
    assert_eq!(r.tool_calls().len(), 1);
    assert_eq!(r.content(), &CALL[..CALL.len() - 5]);
    // cut after the calls, or in text: nothing is incomplete
    for reply in [
        CALL.to_string(),
        format!("{CALL}\nand th"),
        "Just te".to_string(),
    ] {
        let mut r = ReplyText::new(vec![], None).with_tool_calls(format, &req);
        r.push(&reply);
        r.finish_cut();
        let mut whole = ReplyText::new(vec![], None).with_tool_calls(format, &req);
        whole.push(&reply);
        whole.finish();
        let calls = |r: &ReplyText| {
            r.tool_calls()
                .iter()
                .map(|c| (c.function.name.clone(), c.function.arguments.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(calls(&r), calls(&whole));
        assert_eq!(r.content(), whole.content());
    }
}
