//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) over the
//! same request path as the chat route, for Claude Code and the `anthropic` SDKs.
//!
//! A Messages body is read into [`an::MessagesRequest`], checked for what only Anthropic's
//! shapes can get wrong (content blocks, tools, `tool_choice`, `thinking`, a missing
//! `max_tokens`), and rewritten into the chat route's body ([`oa::ChatCompletionRequest`]),
//! which [`openai::parse_request`] validates and turns into the contract's request, as vLLM's
//! and llama-server's Anthropic endpoints do: one validation, one set of limits, one
//! admission, one provider call. The rewriting:
//!
//! - `system` (a string or text blocks, joined by a blank line) is the first message;
//! - a user turn's `text` and `image` blocks (base64 only: the server never fetches a `url`
//!   source) are its content parts; each `tool_result` block is a `tool` message answering its
//!   `tool_use_id` (named after the call it answers; `is_error` results start with
//!   `Error: `), in the order sent;
//! - an assistant turn's `text` is its content, `thinking` its reasoning, `tool_use` blocks its
//!   tool calls (`redacted_thinking` is dropped: nothing here can read it);
//! - `tools` (`input_schema` as the function's `parameters`), `tool_choice` (`any` is
//!   OpenAI's `required`, `tool` a named function, `disable_parallel_tool_use` is
//!   `parallel_tool_calls: false`), `thinking` (`enabled`/`disabled` as the template's
//!   `enable_thinking`; `budget_tokens` is read and not enforced), `stop_sequences`,
//!   `temperature`, `top_p`, `top_k`, `stream` and the `speculation` block as the chat route's
//!   fields of the same meaning. `metadata` and other fields are ignored.
//!
//! Answers are Anthropic's: `content` blocks (`thinking` with a `signature`, `text`,
//! `tool_use` with an object `input`), `stop_reason`, `usage` (prompt tokens resumed from the
//! prefix cache as `cache_read_input_tokens`), the speculation report as an extra field; a
//! stream as Anthropic's events; every error as `{"type": "error", "error": {"type",
//! "message"}}`.

use std::collections::HashMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use mtp_contract::{FinishReason, GenerateResponse, ProviderError, StreamEvent, ToolChoice};
use mtp_openai::anthropic::{self as an, Block, BlockDelta, MessageContent};
use mtp_openai::{self as oa, Field};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai::{self, Endpoint, Limits, Parsed};
use crate::segments::{Kind, Segments, Step};
use crate::Run;

/// The `signature` of the thinking blocks this server writes. Anthropic signs its own so that
/// they come back unaltered; nothing here checks it, and a client sends it back as it got it.
pub const THINKING_SIGNATURE: &str = "mtp-unsigned";

/// Reads a Messages body within `limits`. `count_only` reads a `count_tokens` body, where
/// `max_tokens` is not required.
pub fn parse(body: &Value, limits: &Limits, count_only: bool) -> Result<Parsed, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    }
    // every field of the wire type reads any JSON, so an object always deserializes
    let b = an::MessagesRequest::deserialize(body)
        .map_err(|e| ApiError::invalid("body", format!("the request body cannot be read: {e}")))?;
    let chat = to_chat(&b, limits, count_only)?;
    openai::parse_request(Endpoint::Chat, &chat, limits)
}

/// The chat route's body saying what `b` says.
fn to_chat(
    b: &an::MessagesRequest,
    limits: &Limits,
    count_only: bool,
) -> Result<oa::ChatCompletionRequest, ApiError> {
    if b.max_tokens.is_none() && !count_only {
        return Err(ApiError::invalid(
            "max_tokens",
            "`max_tokens` is required: the most tokens the reply may have",
        ));
    }
    let stop = match &b.stop_sequences {
        None => None,
        Some(Field::Ok(s)) => Some(Field::Ok(oa::Stop::Many(s.clone()))),
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "stop_sequences",
                format!("`stop_sequences` must be a list of strings, got {value}"),
            ))
        }
    };
    let (tool_choice, parallel) = tool_choice(b)?;
    let mut kwargs = serde_json::Map::new();
    if let Some(on) = thinking(b)? {
        kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    Ok(oa::ChatCompletionRequest {
        model: b.model.clone(),
        messages: Some(Field::Ok(messages(b, limits)?)),
        tools: tools(b)?.map(Field::Ok),
        tool_choice,
        parallel_tool_calls: parallel.map(Field::Ok),
        stream: if count_only { None } else { b.stream.clone() },
        max_tokens: if count_only {
            None
        } else {
            b.max_tokens.clone()
        },
        temperature: b.temperature.clone(),
        top_p: b.top_p.clone(),
        top_k: b.top_k.clone(),
        stop,
        chat_template_kwargs: (!kwargs.is_empty()).then_some(Field::Ok(kwargs)),
        speculation: b.speculation.clone(),
        json_schema: output_schema(b)?,
        ..Default::default()
    })
}

/// `output_config.format`'s JSON Schema, given to the chat route as llama-server's
/// `json_schema` (compiled and enforced by the same grammar engine, within its bounds).
fn output_schema(b: &an::MessagesRequest) -> Result<Option<Value>, ApiError> {
    let bad = |what: String| ApiError::invalid("output_config", what);
    let format = match &b.output_config {
        None => return Ok(None),
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!(
                "`output_config` must be an object, got {value}"
            )))
        }
        Some(Field::Ok(c)) => match &c.format {
            None => return Ok(None),
            Some(Field::Invalid { value, .. }) => {
                return Err(bad(format!(
                    "`output_config.format` must be an object, got {value}"
                )))
            }
            Some(Field::Ok(f)) => f,
        },
    };
    match (format.kind.as_ref().map(Field::as_result), &format.schema) {
        (Some(Ok(k)), Some(s @ Value::Object(_))) if k == "json_schema" => Ok(Some(s.clone())),
        (Some(Ok(k)), _) if k == "json_schema" => Err(bad(
            "`output_config.format.schema` must be a JSON Schema object".into(),
        )),
        (other, _) => Err(bad(format!(
            "`output_config.format.type` must be `json_schema`, got {}",
            shown(other)
        ))),
    }
}

/// `thinking`: `Some(true)` for `enabled`, `Some(false)` for `disabled`, `None` (the
/// template's default) for `adaptive` or when absent.
fn thinking(b: &an::MessagesRequest) -> Result<Option<bool>, ApiError> {
    let bad = |what: String| ApiError::invalid("thinking", what);
    match &b.thinking {
        None => Ok(None),
        Some(Field::Invalid { value, .. }) => Err(bad(format!(
            "`thinking` must be an object such as {{\"type\": \"enabled\", \"budget_tokens\": \
             1024}}, got {value}"
        ))),
        Some(Field::Ok(t)) => {
            if let Some(Field::Invalid { value, .. }) = &t.budget_tokens {
                return Err(bad(format!(
                    "`thinking.budget_tokens` must be a non-negative integer, got {value}"
                )));
            }
            match t.kind.as_ref().map(Field::as_result) {
                Some(Ok(k)) if k == "enabled" => Ok(Some(true)),
                Some(Ok(k)) if k == "disabled" => Ok(Some(false)),
                // the model decides: the template's default
                Some(Ok(k)) if k == "adaptive" => Ok(None),
                other => Err(bad(format!(
                    "`thinking.type` must be `enabled`, `disabled` or `adaptive`, got {}",
                    shown(other)
                ))),
            }
        }
    }
}

/// A value as a message shows it: `(none)` when absent.
fn shown(v: Option<Result<&String, &Value>>) -> String {
    match v {
        None => "(none)".into(),
        Some(Ok(s)) => format!("`{s}`"),
        Some(Err(v)) => v.to_string(),
    }
}

/// `tool_choice` in OpenAI's terms, and `parallel_tool_calls` from
/// `disable_parallel_tool_use`.
type ChatToolChoice = (Option<Field<oa::OpenAiToolChoice>>, Option<bool>);

fn tool_choice(b: &an::MessagesRequest) -> Result<ChatToolChoice, ApiError> {
    let bad = |what: String| ApiError::invalid("tool_choice", what);
    let c = match &b.tool_choice {
        None => return Ok((None, None)),
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!(
                "`tool_choice` must be an object such as {{\"type\": \"auto\"}}, got {value}"
            )))
        }
        Some(Field::Ok(c)) => c,
    };
    let choice = match c.kind.as_ref().map(Field::as_result) {
        Some(Ok(k)) if k == "auto" => ToolChoice::Auto,
        Some(Ok(k)) if k == "any" => ToolChoice::Required,
        Some(Ok(k)) if k == "none" => ToolChoice::None,
        Some(Ok(k)) if k == "tool" => match c.name.as_ref().and_then(Field::ok) {
            Some(name) => ToolChoice::Function(name.clone()),
            None => {
                return Err(bad(
                    "`tool_choice` of type `tool` needs the tool's `name`".into()
                ))
            }
        },
        other => {
            return Err(bad(format!(
                "`tool_choice.type` must be `auto`, `any`, `tool` or `none`, got {}",
                shown(other)
            )))
        }
    };
    let parallel = match &c.disable_parallel_tool_use {
        None => None,
        Some(Field::Ok(disable)) => Some(!disable),
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!(
                "`tool_choice.disable_parallel_tool_use` must be true or false, got {value}"
            )))
        }
    };
    Ok((Some(Field::Ok(oa::OpenAiToolChoice(choice))), parallel))
}

/// `tools` as OpenAI function tools.
fn tools(b: &an::MessagesRequest) -> Result<Option<Vec<Value>>, ApiError> {
    let list = match &b.tools {
        None => return Ok(None),
        Some(Field::Ok(list)) => list,
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "tools",
                format!("`tools` must be a list, got {value}"),
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        let bad = |what: String| ApiError::invalid(&param, format!("tool {i}: {what}"));
        let t = t
            .ok()
            .ok_or_else(|| bad("must be an object with `name` and `input_schema`".into()))?;
        match t.kind.as_ref().map(Field::as_result) {
            None => {}
            Some(Ok(k)) if k == "custom" => {}
            Some(Ok(k)) => {
                return Err(ApiError::unsupported(
                    &param,
                    format!(
                        "tool {i}: `{k}` is one of Anthropic's server tools, which run on \
                         Anthropic's servers; this server offers the model client tools only \
                         (`name`, `description`, `input_schema`)"
                    ),
                ))
            }
            Some(Err(v)) => return Err(bad(format!("`type` must be a string, got {v}"))),
        }
        let name = t
            .name
            .as_ref()
            .and_then(Field::ok)
            .ok_or_else(|| bad("`name` is missing or not a string".into()))?;
        let schema = match &t.input_schema {
            Some(s @ Value::Object(_)) => s.clone(),
            _ => return Err(bad("`input_schema` must be a JSON Schema object".into())),
        };
        let mut function = json!({"name": name});
        match &t.description {
            None => {}
            Some(Field::Ok(d)) => function["description"] = Value::String(d.clone()),
            Some(Field::Invalid { .. }) => {
                return Err(bad("`description` must be a string".into()))
            }
        }
        function["parameters"] = schema;
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Some(out))
}

/// `system` and `messages` as the chat route's messages.
fn messages(
    b: &an::MessagesRequest,
    limits: &Limits,
) -> Result<Vec<Field<oa::ChatMessage>>, ApiError> {
    let list = match &b.messages {
        None => {
            return Err(ApiError::invalid(
                "messages",
                "`messages` is required: a list of {\"role\", \"content\"} objects",
            ))
        }
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "messages",
                format!("`messages` must be a list, got {value}"),
            ))
        }
        Some(Field::Ok(list)) => list,
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    // bounded before any work in proportion to it (the chat route checks its own count again)
    if list.len() > limits.max_messages {
        return Err(ApiError::over_limit(
            "messages",
            "messages",
            list.len(),
            limits.max_messages,
            "--max-messages",
        ));
    }
    let mut out = Vec::with_capacity(list.len() + 1);
    match &b.system {
        None => {}
        Some(Field::Ok(c)) => {
            let text = plain_text(c, "system", limits)?;
            out.push(Field::Ok(oa::ChatMessage::text("system", text)));
        }
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "system",
                format!("`system` must be a string or a list of text blocks, got {value}"),
            ))
        }
    }
    // the tool each call id named, for the results that answer it
    let mut called: HashMap<String, String> = HashMap::new();
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let bad = |what: String| ApiError::invalid(&param, format!("message {i}: {what}"));
        let m = m
            .ok()
            .ok_or_else(|| bad("must be an object with `role` and `content`".into()))?;
        let role = match m.role.as_ref().map(Field::as_result) {
            Some(Ok(r)) if r == "user" || r == "assistant" => r.as_str(),
            other => {
                return Err(bad(format!(
                    "`role` must be `user` or `assistant`, got {}",
                    shown(other)
                )))
            }
        };
        let blocks = match m.content.as_ref().map(Field::as_result) {
            None => return Err(bad("`content` is missing".into())),
            Some(Err(v)) => {
                return Err(bad(format!(
                    "`content` must be a string or a list of blocks, got {v}"
                )))
            }
            Some(Ok(MessageContent::Text(s))) => {
                out.push(Field::Ok(oa::ChatMessage::text(role, s.clone())));
                continue;
            }
            Some(Ok(MessageContent::Blocks(blocks))) => blocks,
        };
        if blocks.len() > limits.max_content_parts {
            return Err(ApiError::over_limit(
                &param,
                "content blocks in one message",
                blocks.len(),
                limits.max_content_parts,
                "--max-content-parts",
            ));
        }
        if role == "user" {
            user_turn(blocks, &called, &mut out, &bad)?;
        } else {
            out.push(Field::Ok(assistant_turn(blocks, &mut called, &bad)?));
        }
    }
    Ok(out)
}

/// A user turn's blocks: text and images as one user message's parts (adjacent text blocks
/// joined by a newline), each tool result as a `tool` message, in the order sent.
fn user_turn(
    blocks: &[Field<an::ContentBlock>],
    called: &HashMap<String, String>,
    out: &mut Vec<Field<oa::ChatMessage>>,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<(), ApiError> {
    let mut parts: Vec<oa::ContentPart> = Vec::new();
    let mut text: Option<String> = None;
    // whether the turn held anything but tool results (an empty turn stays an empty message)
    let mut said = blocks.is_empty();
    let flush_text = |parts: &mut Vec<oa::ContentPart>, text: &mut Option<String>| {
        if let Some(t) = text.take() {
            parts.push(oa::ContentPart::text(t));
        }
    };
    let flush = |parts: &mut Vec<oa::ContentPart>, out: &mut Vec<Field<oa::ChatMessage>>| {
        if !parts.is_empty() {
            let m = oa::ChatMessage {
                role: Some(Field::Ok("user".into())),
                content: Some(Field::Ok(oa::Content::Parts(
                    parts.drain(..).map(Field::Ok).collect(),
                ))),
                ..Default::default()
            };
            out.push(Field::Ok(m));
        }
    };
    for (k, block) in blocks.iter().enumerate() {
        let b = block
            .ok()
            .ok_or_else(|| bad(format!("block {k} must be an object with a `type`")))?;
        match b.kind_str() {
            Some("text") => {
                said = true;
                let t = block_text(b, k, bad)?;
                match &mut text {
                    Some(acc) => {
                        acc.push('\n');
                        acc.push_str(t);
                    }
                    None => text = Some(t.to_string()),
                }
            }
            Some("image") => {
                said = true;
                flush_text(&mut parts, &mut text);
                parts.push(oa::ContentPart::image(image_url(b, k, bad)?));
            }
            Some("tool_result") => {
                flush_text(&mut parts, &mut text);
                flush(&mut parts, out);
                out.push(Field::Ok(tool_result(b, k, called, bad)?));
            }
            other => return Err(unsupported_block(other, k, "user", bad)),
        }
    }
    flush_text(&mut parts, &mut text);
    if parts.is_empty() && said {
        out.push(Field::Ok(oa::ChatMessage::text("user", "")));
    }
    flush(&mut parts, out);
    Ok(())
}

/// An assistant turn: its text, its reasoning, its tool calls.
fn assistant_turn(
    blocks: &[Field<an::ContentBlock>],
    called: &mut HashMap<String, String>,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<oa::ChatMessage, ApiError> {
    let mut text = String::new();
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    for (k, block) in blocks.iter().enumerate() {
        let b = block
            .ok()
            .ok_or_else(|| bad(format!("block {k} must be an object with a `type`")))?;
        match b.kind_str() {
            Some("text") => text.push_str(block_text(b, k, bad)?),
            Some("thinking") => {
                let t =
                    b.thinking.as_ref().and_then(Field::ok).ok_or_else(|| {
                        bad(format!("thinking block {k} has no `thinking` string"))
                    })?;
                reasoning.get_or_insert_with(String::new).push_str(t);
            }
            // encrypted by Anthropic: nothing here can read it
            Some("redacted_thinking") => {}
            Some("tool_use") => {
                let id = b.id.as_ref().and_then(Field::ok);
                let name = b.name.as_ref().and_then(Field::ok);
                let (Some(id), Some(name)) = (id, name) else {
                    return Err(bad(format!(
                        "tool_use block {k} needs an `id` and a `name` (strings)"
                    )));
                };
                let input = match &b.input {
                    Some(v @ Value::Object(_)) => v.to_string(),
                    None => "{}".to_string(),
                    Some(v) => {
                        return Err(bad(format!(
                            "tool_use block {k}: `input` must be an object, got {v}"
                        )))
                    }
                };
                called.insert(id.clone(), name.clone());
                calls.push(Field::Ok(oa::ToolCall::whole(
                    id.clone(),
                    "function",
                    name.clone(),
                    input,
                )));
            }
            other => return Err(unsupported_block(other, k, "assistant", bad)),
        }
    }
    let mut m = oa::ChatMessage::text("assistant", text);
    m.reasoning_content = reasoning.map(Field::Ok);
    if !calls.is_empty() {
        m.tool_calls = Some(Field::Ok(calls));
    }
    Ok(m)
}

fn unsupported_block(
    kind: Option<&str>,
    k: usize,
    role: &str,
    bad: &dyn Fn(String) -> ApiError,
) -> ApiError {
    let taken = if role == "user" {
        "text, image, tool_result"
    } else {
        "text, thinking, redacted_thinking, tool_use"
    };
    let e = bad(format!(
        "content block {k} of type {} is not taken in a {role} turn ({taken})",
        kind.map(|s| format!("`{s}`"))
            .unwrap_or_else(|| "(none)".into())
    ));
    ApiError {
        code: Some("unsupported".into()),
        ..e
    }
}

/// A text block's text.
fn block_text<'a>(
    b: &'a an::ContentBlock,
    k: usize,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<&'a str, ApiError> {
    b.text
        .as_ref()
        .and_then(Field::ok)
        .map(String::as_str)
        .ok_or_else(|| bad(format!("text block {k} has no `text` string")))
}

/// An image block as a `data:` URL: base64 sources only (the server never fetches a URL or
/// reads a file).
fn image_url(
    b: &an::ContentBlock,
    k: usize,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<String, ApiError> {
    let src = b
        .source
        .as_ref()
        .and_then(Field::ok)
        .ok_or_else(|| bad(format!("image block {k} has no `source` object")))?;
    match src.kind.as_ref().map(Field::as_result) {
        Some(Ok(k)) if k == "base64" => {}
        other => {
            let e = bad(format!(
                "image block {k}: source type {} is not taken; the server takes images inline \
                 only (`{{\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": \
                 ...}}`), never from the network or its own files",
                shown(other)
            ));
            return Err(ApiError {
                code: Some("unsupported".into()),
                ..e
            });
        }
    }
    let media = src.media_type.as_ref().and_then(Field::ok);
    let data = src.data.as_ref().and_then(Field::ok);
    match (media, data) {
        (Some(m), Some(d)) if m.starts_with("image/") && !m.contains([';', ',']) => {
            Ok(format!("data:{m};base64,{d}"))
        }
        _ => Err(bad(format!(
            "image block {k}: a base64 source needs `media_type` (image/png, image/jpeg, ...) \
             and `data` strings"
        ))),
    }
}

/// A `tool_result` block as a `tool` message answering its call.
fn tool_result(
    b: &an::ContentBlock,
    k: usize,
    called: &HashMap<String, String>,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<oa::ChatMessage, ApiError> {
    let id = b
        .tool_use_id
        .as_ref()
        .and_then(Field::ok)
        .ok_or_else(|| bad(format!("tool_result block {k} has no `tool_use_id` string")))?;
    let mut text = match b.content.as_ref().map(Field::as_result) {
        None => String::new(),
        Some(Ok(MessageContent::Text(s))) => s.clone(),
        Some(Ok(MessageContent::Blocks(parts))) => {
            let mut acc: Vec<&str> = Vec::with_capacity(parts.len());
            for p in parts {
                match p.ok() {
                    Some(p) if p.kind_str() == Some("text") => acc.push(block_text(p, k, bad)?),
                    Some(p) => {
                        return Err(bad(format!(
                            "tool_result block {k}: only text is taken in a tool result, not {}",
                            p.kind_str()
                                .map(|s| format!("`{s}`"))
                                .unwrap_or_else(|| "(no type)".into())
                        )))
                    }
                    None => return Err(bad(format!("tool_result block {k}: a bad block"))),
                }
            }
            acc.join("\n")
        }
        Some(Err(v)) => {
            return Err(bad(format!(
                "tool_result block {k}: `content` must be a string or text blocks, got {v}"
            )))
        }
    };
    match &b.is_error {
        None | Some(Field::Ok(false)) => {}
        Some(Field::Ok(true)) => text.insert_str(0, "Error: "),
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!(
                "tool_result block {k}: `is_error` must be true or false, got {value}"
            )))
        }
    }
    let mut m = oa::ChatMessage::text("tool", text);
    m.tool_call_id = Some(Field::Ok(id.clone()));
    m.name = called.get(id).cloned().map(Field::Ok);
    Ok(m)
}

/// Text content (the system prompt): a string, or text blocks joined by a blank line.
fn plain_text(c: &MessageContent, param: &str, limits: &Limits) -> Result<String, ApiError> {
    match c {
        MessageContent::Text(s) => Ok(s.clone()),
        MessageContent::Blocks(blocks) => {
            if blocks.len() > limits.max_content_parts {
                return Err(ApiError::over_limit(
                    param,
                    "content blocks",
                    blocks.len(),
                    limits.max_content_parts,
                    "--max-content-parts",
                ));
            }
            let bad = |what: String| ApiError::invalid(param, format!("`{param}`: {what}"));
            let mut acc = Vec::with_capacity(blocks.len());
            for (k, b) in blocks.iter().enumerate() {
                match b.ok() {
                    Some(b) if b.kind_str() == Some("text") => acc.push(block_text(b, k, &bad)?),
                    _ => return Err(bad(format!("block {k} is not a text block"))),
                }
            }
            Ok(acc.join("\n\n"))
        }
    }
}

/// Anthropic's `stop_reason` for how a reply ended.
pub fn stop_reason(r: &GenerateResponse) -> &'static str {
    match r.finish_reason {
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::Stop if r.stop_sequence.is_some() => "stop_sequence",
        FinishReason::Stop | FinishReason::Cancelled | FinishReason::Error => "end_turn",
    }
}

/// The id of call `index` of the message `msg_id`, in Anthropic's `toolu_` form: the runtime's
/// own (`call_X` becomes `toolu_X`), or one unique across a conversation's turns (the
/// `tool_result` answering it repeats it) when the runtime gave none.
fn tool_use_id(given: Option<&str>, msg_id: &str, index: usize) -> String {
    match given {
        Some(id) if id.starts_with("toolu_") => id.to_string(),
        Some(id) => format!("toolu_{}", id.strip_prefix("call_").unwrap_or(id)),
        None => format!("toolu_{}_{index}", msg_id.trim_start_matches("msg_")),
    }
}

/// A tool call's `input`: its arguments (a JSON object as a string) as the object.
fn tool_input(arguments: &Value) -> Value {
    let parsed = match arguments {
        Value::String(s) => serde_json::from_str::<Value>(s).ok(),
        other => Some(other.clone()),
    };
    match parsed {
        Some(v @ Value::Object(_)) => v,
        _ => {
            tracing::warn!(%arguments, "a tool call's arguments are not a JSON object");
            json!({})
        }
    }
}

/// The whole answer's blocks: thinking, text, tool calls.
fn blocks(r: &GenerateResponse, msg_id: &str) -> Vec<Block> {
    let mut out = Vec::new();
    if let Some(t) = r.reasoning_content.as_ref().filter(|t| !t.is_empty()) {
        out.push(Block::Thinking {
            thinking: t.clone(),
            signature: THINKING_SIGNATURE.into(),
        });
    }
    if !r.content.is_empty() {
        out.push(Block::Text {
            text: r.content.clone(),
        });
    }
    for (i, c) in r.tool_calls.iter().enumerate() {
        out.push(Block::ToolUse {
            id: tool_use_id(c.id.as_deref(), msg_id, i),
            name: c.function.name.clone(),
            input: tool_input(&c.function.arguments),
        });
    }
    out
}

/// The whole answer.
fn message(r: &GenerateResponse, msg_id: &str, model: &str) -> an::Message {
    let mut m = an::Message::new(
        msg_id,
        model,
        blocks(r, msg_id),
        an::MessageUsage::of(&r.usage),
    );
    m.stop_reason = Some(stop_reason(r).into());
    m.stop_sequence = r.stop_sequence.clone();
    m.speculation = Some(r.metadata.speculation.clone());
    m
}

/// Anthropic's error `type` for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// `e` in Anthropic's error shape.
pub fn error_body(e: &ApiError) -> an::ErrorResponse {
    an::ErrorResponse::new(error_type(e.status), e.message.clone())
}

/// `e` as Anthropic's error answer, with its status (and `Retry-After`).
pub fn error(e: ApiError) -> Response {
    let mut r = (e.status, Json(error_body(&e))).into_response();
    if let Some(s) = e.retry_after {
        if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    r
}

/// The whole answer, once the provider is done.
pub(crate) async fn whole(mut run: Run, events: mtp_contract::EventStream) -> Response {
    match crate::answer(&mut run, events).await {
        Ok(r) => {
            let headers = crate::speculation_headers(&r.metadata.speculation);
            (headers, Json(message(&r, &run.id, &run.s.model_id))).into_response()
        }
        Err(e) => error(e),
    }
}

/// A stream's state between provider events.
struct Streamer {
    run: Run,
    events: mtp_contract::EventStream,
    /// `message_start` was sent.
    started: bool,
    /// The reply's blocks: one per segment, at the segment's index.
    segments: Segments,
    ended: bool,
}

impl Streamer {
    fn start(&mut self, first: Option<&StreamEvent>) -> Vec<an::StreamEvent> {
        self.started = true;
        // the prompt's size when the runtime reported it first; `message_delta` has it anyway
        let usage = match first {
            Some(StreamEvent::PromptProgress(p)) => an::MessageUsage {
                input_tokens: p.total.saturating_sub(p.cache) as u64,
                cache_read_input_tokens: p.cache as u64,
                ..Default::default()
            },
            _ => an::MessageUsage::default(),
        };
        let m = an::Message::new(
            self.run.id.clone(),
            self.run.s.model_id.clone(),
            vec![],
            usage,
        );
        vec![
            an::StreamEvent::MessageStart { message: m },
            an::StreamEvent::Ping,
        ]
    }

    /// A segment's step as Anthropic's block events (a thinking block gets its signature
    /// before it stops).
    fn step(&self, step: Step, out: &mut Vec<an::StreamEvent>) {
        match step {
            Step::Open {
                index,
                kind,
                id,
                name,
            } => {
                let content_block = match kind {
                    Kind::Reasoning => Block::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    },
                    Kind::Text => Block::Text {
                        text: String::new(),
                    },
                    Kind::Call(i) => Block::ToolUse {
                        id: tool_use_id(id.as_deref(), &self.run.id, i),
                        name: name.unwrap_or_default(),
                        input: json!({}),
                    },
                };
                out.push(an::StreamEvent::ContentBlockStart {
                    index,
                    content_block,
                });
            }
            Step::Add { index, kind, text } => {
                let delta = match kind {
                    Kind::Reasoning => BlockDelta::ThinkingDelta { thinking: text },
                    Kind::Text => BlockDelta::TextDelta { text },
                    Kind::Call(_) => BlockDelta::InputJsonDelta { partial_json: text },
                };
                out.push(an::StreamEvent::ContentBlockDelta { index, delta });
            }
            Step::Close { index, kind } => {
                if kind == Kind::Reasoning {
                    out.push(an::StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::SignatureDelta {
                            signature: THINKING_SIGNATURE.into(),
                        },
                    });
                }
                out.push(an::StreamEvent::ContentBlockStop { index });
            }
        }
    }

    /// The events one provider event makes.
    fn on(&mut self, ev: Option<Result<StreamEvent, ProviderError>>) -> Vec<an::StreamEvent> {
        let mut out = Vec::new();
        if !self.started {
            out = self.start(match &ev {
                Some(Ok(e)) => Some(e),
                _ => None,
            });
        }
        match ev {
            Some(Ok(StreamEvent::Done(r))) => {
                self.run.finish(&r);
                if let Some(step) = self.segments.close() {
                    self.step(step, &mut out);
                }
                out.push(an::StreamEvent::MessageDelta {
                    delta: an::MessageDeltaBody {
                        stop_reason: Some(stop_reason(&r).into()),
                        stop_sequence: r.stop_sequence.clone(),
                    },
                    usage: an::MessageUsage::of(&r.usage),
                    speculation: Some(r.metadata.speculation.clone()),
                });
                out.push(an::StreamEvent::MessageStop);
                self.ended = true;
            }
            Some(Ok(ev)) => {
                for step in self.segments.on(ev) {
                    self.step(step, &mut out);
                }
            }
            Some(Err(e)) => {
                self.run.fail(&e);
                out.push(an::StreamEvent::Error {
                    error: error_body(&ApiError::from_provider(&e)).error,
                });
                self.ended = true;
            }
            None => {
                self.run.fail(&ProviderError::Cancelled);
                let e = ApiError::from_provider(&ProviderError::Cancelled);
                out.push(an::StreamEvent::Error {
                    error: error_body(&e).error,
                });
                self.ended = true;
            }
        }
        out
    }
}

/// One SSE event: `event: NAME`, `data: {"type": NAME, ...}`.
fn sse(e: &an::StreamEvent) -> Event {
    Event::default()
        .event(e.name())
        .data(serde_json::to_string(e).unwrap_or_else(|_| "{}".into()))
}

/// The answer as Anthropic's stream of events.
pub(crate) fn stream(
    run: Run,
    events: mtp_contract::EventStream,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    let state = Streamer {
        run,
        events,
        started: false,
        segments: Segments::default(),
        ended: false,
    };
    let out = futures::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        let ev = st.events.next().await;
        let out = st.on(ev);
        Some((out, st))
    })
    .flat_map(|evs| futures::stream::iter(evs.into_iter().map(|e| Ok(sse(&e)))));
    Sse::new(out).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtp_contract::Role;

    fn read(v: Value) -> Result<Parsed, ApiError> {
        parse(&v, &Limits::default(), false)
    }

    #[test]
    fn a_conversation_with_tools_becomes_the_chat_history() {
        let p = read(json!({
            "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": [{"type": "text", "text": "sun"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "rain", "is_error": true},
                    {"type": "text", "text": "and"}, {"type": "text", "text": "then?"}]}],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "disabled"}, "stop_sequences": ["END"],
            "temperature": 0.5, "top_k": 4, "metadata": {"user_id": "x"}, "stream": true
        }))
        .unwrap();
        let r = &p.request;
        let m = r.messages.as_ref().unwrap();
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool,
                Role::User
            ]
        );
        assert_eq!(m[0].content, "A\n\nB");
        assert_eq!(m[2].content, "Let me look.");
        assert_eq!(m[2].reasoning_content.as_deref(), Some("call it"));
        assert_eq!(m[2].tool_calls[0].function.name, "get_weather");
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_a"));
        assert_eq!(m[3].name.as_deref(), Some("get_weather"));
        assert_eq!(m[3].content, "sun");
        assert_eq!(m[4].content, "Error: rain");
        assert_eq!(m[5].content, "and\nthen?");
        assert_eq!(r.tool_choice, ToolChoice::Required);
        assert_eq!(r.parallel_tool_calls, Some(false));
        assert_eq!(r.thinking, Some(false));
        assert_eq!(r.stop, ["END"]);
        assert_eq!(r.max_output_tokens, Some(9));
        assert_eq!(r.sampling.temperature, Some(0.5));
        assert_eq!(r.sampling.top_k, Some(4));
        assert_eq!(
            r.tools[0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert!(p.stream);
    }

    #[test]
    fn what_anthropic_shapes_get_wrong_is_refused_by_name() {
        let base = || json!({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}]});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            read(b).unwrap_err()
        };
        let mut no_max = base();
        no_max.as_object_mut().unwrap().remove("max_tokens");
        assert_eq!(
            read(no_max.clone()).unwrap_err().param.as_deref(),
            Some("max_tokens")
        );
        assert!(parse(&no_max, &Limits::default(), true).is_ok());
        for (k, v, param) in [
            ("thinking", json!({"type": "maybe"}), "thinking"),
            ("tool_choice", json!({"type": "tool"}), "tool_choice"),
            ("tool_choice", json!("auto"), "tool_choice"),
            ("tools", json!([{"name": "f"}]), "tools[0]"),
            (
                "tools",
                json!([{"type": "web_search_20250305", "name": "w"}]),
                "tools[0]",
            ),
            ("stop_sequences", json!("END"), "stop_sequences"),
            ("temperature", json!("hot"), "temperature"),
            ("messages", json!([]), "messages"),
            (
                "messages",
                json!([{"role": "system", "content": "a"}]),
                "messages[0]",
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "document"}]}]),
                "messages[0]",
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "image",
                "source": {"type": "url", "url": "https://example.invalid/a.png"}}]}]),
                "messages[0]",
            ),
            (
                "messages",
                json!([{"role": "assistant", "content": [{"type": "tool_use",
                "id": "t", "name": "f", "input": [1]}]}]),
                "messages[0]",
            ),
        ] {
            let e = with(k, v.clone());
            assert_eq!(e.status, 400, "{k}: {v}");
            assert_eq!(e.param.as_deref(), Some(param), "{k}: {v}: {}", e.message);
        }
        // a named tool that is not offered: the chat route's own check
        let mut b = base();
        b["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        b["tool_choice"] = json!({"type": "tool", "name": "g"});
        assert!(read(b).unwrap_err().message.contains("`g`"));
        // the server's limits hold for Anthropic's shapes too
        let limits = Limits {
            max_stop: 1,
            max_content_parts: 2,
            ..Limits::default()
        };
        let mut b = base();
        b["stop_sequences"] = json!(["a", "b"]);
        assert_eq!(
            parse(&b, &limits, false).unwrap_err().code.as_deref(),
            Some("over_limit")
        );
        let mut b = base();
        b["messages"][0]["content"] = Value::Array(vec![json!({"type": "text", "text": "a"}); 3]);
        assert_eq!(
            parse(&b, &limits, false).unwrap_err().code.as_deref(),
            Some("over_limit")
        );
        // structured output through the chat route's constraint
        let mut b = base();
        b["output_config"] = json!({"format": {"type": "json_schema",
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}, "effort": "low"});
        assert!(read(b).unwrap().request.response_format.is_some());
        let mut b = base();
        b["output_config"] = json!({"format": {"type": "xml"}});
        assert_eq!(read(b).unwrap_err().param.as_deref(), Some("output_config"));
        let mut b = base();
        b["thinking"] = json!({"type": "adaptive"});
        assert_eq!(read(b).unwrap().request.thinking, None);
        // an inline image is a data: URL
        let mut b = base();
        b["messages"][0]["content"] = json!([{"type": "image", "source": {"type": "base64",
            "media_type": "image/png", "data": "iVBORw0KGgo="}}, {"type": "text", "text": "what?"}]);
        let p = read(b).unwrap();
        let m = &p.request.messages.unwrap()[0];
        assert_eq!(m.images, ["data:image/png;base64,iVBORw0KGgo="]);
        assert_eq!(m.content, "what?");
    }

    #[test]
    fn errors_take_anthropics_types() {
        for (e, kind) in [
            (ApiError::invalid("x", "m"), "invalid_request_error"),
            (ApiError::unauthorized(), "authentication_error"),
            (ApiError::queue_full(1, 2), "rate_limit_error"),
            (ApiError::shutting_down(), "overloaded_error"),
            (
                ApiError::from_provider(&ProviderError::Cancelled),
                "api_error",
            ),
        ] {
            let v = serde_json::to_value(error_body(&e)).unwrap();
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], kind, "{e:?}");
        }
    }
}
