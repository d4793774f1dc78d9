//! `--messages FILE`: a conversation in the OpenAI chat shape, read into the contract's
//! messages.
//!
//! Accepted: a JSON array of messages, or an object with a `messages` array (a whole chat
//! request body). Each message has a `role` (`system`, `developer` (read as system), `user`,
//! `assistant`, `tool`) and a `content` that is a string, `null`, or a list of parts (`text`
//! parts are joined; `image_url` / `image` parts are kept as the message's images, which
//! text-only runtimes refuse). `reasoning_content` (or `reasoning`), `tool_calls`,
//! `tool_call_id` and `name` are kept.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::cli::error::CliError;
use crate::{FunctionCall, Message, Role, ToolCall};

/// The largest messages file read (a long conversation is a few MB).
const MAX_BYTES: u64 = 64 << 20;

fn bad(message: String) -> CliError {
    CliError::InvalidFlag {
        flag: "--messages",
        message,
    }
}

/// The text of `path` (`-` for stdin), at most 64 MiB of UTF-8; the error names the file.
pub(crate) fn read_text(path: &Path) -> Result<String, String> {
    let shown = path.display().to_string();
    let mut text = String::new();
    let read = if shown == "-" {
        std::io::stdin()
            .take(MAX_BYTES + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_BYTES + 1).read_to_string(&mut text))
    };
    read.map_err(|e| format!("cannot read {shown}: {e}"))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(format!("{shown} is larger than {MAX_BYTES} bytes"));
    }
    Ok(text)
}

/// Reads `path` (`-` for stdin) into messages.
pub(crate) fn read(path: &Path) -> Result<Vec<Message>, CliError> {
    let shown = path.display().to_string();
    let text = read_text(path).map_err(bad)?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("{shown} is not JSON: {e}")))?;
    parse(&v).map_err(|m| bad(format!("{shown}: {m}")))
}

/// Parses a messages array (or an object holding one under `messages`).
pub(crate) fn parse(v: &Value) -> Result<Vec<Message>, String> {
    let list = match v {
        Value::Array(a) => a,
        Value::Object(o) => o
            .get("messages")
            .and_then(Value::as_array)
            .ok_or("an object must hold a `messages` array")?,
        _ => return Err("expected a JSON array of messages".into()),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| message(m).map_err(|e| format!("message {i}: {e}")))
        .collect()
}

fn message(v: &Value) -> Result<Message, String> {
    let o = v.as_object().ok_or("not a JSON object")?;
    let role = match o.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(other) => {
            return Err(format!(
                "unknown role `{other}` (system, developer, user, assistant or tool)"
            ))
        }
        None => return Err("no `role` string".into()),
    };
    let mut m = Message::new(role, "");
    match o.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => m.content = s.clone(),
        Some(Value::Array(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let t = p
                            .get("text")
                            .and_then(Value::as_str)
                            .ok_or(format!("content part {j}: a text part needs `text`"))?;
                        m.content.push_str(t);
                    }
                    Some("image_url") => {
                        let url = p
                            .pointer("/image_url/url")
                            .or_else(|| p.get("image_url"))
                            .and_then(Value::as_str)
                            .ok_or(format!("content part {j}: an image_url part needs a url"))?;
                        m.images.push(url.to_string());
                    }
                    Some("image") => {
                        let src = ["image", "url", "path"]
                            .iter()
                            .find_map(|k| p.get(*k).and_then(Value::as_str))
                            .unwrap_or("image");
                        m.images.push(src.to_string());
                    }
                    Some(other) => {
                        return Err(format!("content part {j}: unknown type `{other}`"));
                    }
                    None => return Err(format!("content part {j}: no `type`")),
                }
            }
        }
        Some(_) => return Err("`content` must be a string, null or a list of parts".into()),
    }
    m.reasoning_content = o
        .get("reasoning_content")
        .or_else(|| o.get("reasoning"))
        .and_then(Value::as_str)
        .map(str::to_string);
    m.tool_call_id = o
        .get("tool_call_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    m.name = o.get("name").and_then(Value::as_str).map(str::to_string);
    if let Some(calls) = o.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls.as_array().ok_or("`tool_calls` must be a list")?;
        for (j, c) in calls.iter().enumerate() {
            let f = c
                .get("function")
                .ok_or(format!("tool call {j}: no `function`"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or(format!("tool call {j}: no function `name`"))?;
            m.tool_calls.push(ToolCall {
                id: c.get("id").and_then(Value::as_str).map(str::to_string),
                kind: c
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("function")
                    .to_string(),
                function: FunctionCall {
                    name: name.to_string(),
                    arguments: f.get("arguments").cloned().unwrap_or(Value::Null),
                },
            });
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shapes() {
        let v = serde_json::json!({"model": "x", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "reasoning_content": "hmm",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"}
        ]});
        let m = parse(&v).unwrap();
        assert_eq!(m[0].role, Role::System);
        assert_eq!(m[1].content, "ab");
        assert_eq!(m[2].content, "");
        assert_eq!(m[2].reasoning_content.as_deref(), Some("hmm"));
        assert_eq!(m[2].tool_calls[0].function.arguments, "{\"x\": 1}");
        assert_eq!(m[3].tool_call_id.as_deref(), Some("c1"));
    }

    #[test]
    fn errors_name_the_message() {
        for (v, says) in [
            (serde_json::json!(5), "expected a JSON array"),
            (
                serde_json::json!([{"content": "x"}]),
                "message 0: no `role`",
            ),
            (
                serde_json::json!([{"role": "user"}, {"role": "robot"}]),
                "message 1: unknown role `robot`",
            ),
            (
                serde_json::json!([{"role": "user", "content": [{"type": "audio"}]}]),
                "content part 0: unknown type `audio`",
            ),
            (
                serde_json::json!([{"role": "assistant", "tool_calls": [{"function": {}}]}]),
                "tool call 0: no function `name`",
            ),
        ] {
            let e = parse(&v).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
