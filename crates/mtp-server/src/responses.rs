//! OpenAI's Responses API (`POST /v1/responses`) over the same request path as the chat route,
//! for Codex CLI, the `openai-agents` SDK, `litellm.responses` and `client.responses`.
//!
//! A Responses body is read into [`rs::ResponsesRequest`], checked for what only the Responses
//! shapes can get wrong (input items, flat function tools, `tool_choice`, `text.format`,
//! `reasoning`, the stateful fields), and rewritten into the chat route's body
//! ([`oa::ChatCompletionRequest`]), which [`openai::parse_request`] validates and turns into the
//! contract's request: one validation, one set of limits, one admission, one provider call. The
//! rewriting:
//!
//! - `instructions` is the first message (`system`); `input` as a string is one user message;
//! - a `message` item (`type` may be left out) of role `user`, `system`, `developer` or
//!   `assistant` is a message of that role (`developer` as `system`), its content a string or
//!   parts: `input_text`, `output_text` and `refusal` as text, `input_image` with a `data:` URL
//!   as an image (the server never fetches a URL or reads a `file_id`);
//! - a `function_call` item (`call_id`, `name`, `arguments`) is a tool call of the assistant
//!   turn it follows (or of a new one), a `function_call_output` item (`call_id`, `output`) a
//!   `tool` message answering it;
//! - a `reasoning` item's text (its `reasoning_text` content, else its `summary` text) is the
//!   reasoning of the assistant message or function call that follows it; one followed by
//!   neither is dropped (`encrypted_content` is never read);
//! - `tools` (flat function tools: `name`, `description`, `parameters`, `strict`), `tool_choice`
//!   (`auto`, `none`, `required`, `{"type": "function", "name"}`), `parallel_tool_calls`
//!   (`max_tool_calls: 1` is `parallel_tool_calls: false`), `text.format` (`json_schema`,
//!   `json_object`, `text`) as `response_format`, `reasoning.effort` as the template's
//!   `enable_thinking` (`none` and `minimal` off, the others on), `max_output_tokens`,
//!   `temperature`, `top_p`, `prompt_cache_key`, `stream` and the `speculation` block as the chat
//!   route's fields of the same meaning. `store` is read and nothing is stored; `metadata`,
//!   `user`, `include`, `truncation` and other fields are ignored.
//!
//! Nothing is kept between requests: `previous_response_id`, `conversation`, `background: true`
//! and a stored `prompt` are refused with a 400 naming the field.
//!
//! Answers are response objects (`output`: a `reasoning` item where the model thought, a
//! `message` item with the text, a `function_call` item per call; `usage`; the request's
//! settings echoed; the speculation report as an extra field), a stream as the Responses
//! events, errors in OpenAI's shape naming the Responses field.

use std::collections::HashMap;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use mtp_contract::{FinishReason, GenerateResponse, ProviderError, StreamEvent, ToolChoice};
use mtp_openai::responses::{self as rs, ContentPartOut, MessageContent, OutputItem};
use mtp_openai::{self as oa, Field};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::openai::{self, Endpoint, Limits, Parsed};
use crate::segments::{Kind, Segments, Step};
use crate::Run;

/// Reads a Responses body within `limits`: the chat route's parsed request, and the response
/// object the answer starts from (the request's settings, as OpenAI echoes them).
pub fn parse(body: &Value, limits: &Limits) -> Result<(Parsed, rs::Response), ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    }
    // every field of the wire type reads any JSON, so an object always deserializes
    let b = rs::ResponsesRequest::deserialize(body)
        .map_err(|e| ApiError::invalid("body", format!("the request body cannot be read: {e}")))?;
    let (chat, echo) = to_chat(&b, limits)?;
    let parsed = openai::parse_request(Endpoint::Chat, &chat, limits).map_err(renamed)?;
    Ok((parsed, echo))
}

/// An error of the chat route's validation naming the Responses field the chat field came
/// from.
fn renamed(mut e: ApiError) -> ApiError {
    let to = match e.param.as_deref() {
        Some(p) if p == "messages" || p.starts_with("messages[") => "input",
        Some("max_tokens" | "max_completion_tokens") => "max_output_tokens",
        Some("response_format") => "text.format",
        Some("chat_template_kwargs") => "reasoning",
        _ => return e,
    };
    e.param = Some(to.into());
    e
}

/// `e` as this route's answer: OpenAI's error shape, the field named as the Responses API
/// names it.
pub fn error(e: ApiError) -> Response {
    renamed(e).into_response()
}

/// A value as a message shows it: `(none)` when absent.
fn shown(v: Option<Result<&String, &Value>>) -> String {
    match v {
        None => "(none)".into(),
        Some(Ok(s)) => format!("`{s}`"),
        Some(Err(v)) => v.to_string(),
    }
}

/// The chat route's body saying what `b` says, and the settings the answer echoes.
fn to_chat(
    b: &rs::ResponsesRequest,
    limits: &Limits,
) -> Result<(oa::ChatCompletionRequest, rs::Response), ApiError> {
    stateless(b)?;
    let max_output_tokens = match &b.max_output_tokens {
        None => None,
        Some(Field::Ok(0)) => {
            return Err(ApiError::invalid(
                "max_output_tokens",
                "`max_output_tokens` must be at least 1",
            ))
        }
        Some(Field::Ok(n)) => Some(*n),
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "max_output_tokens",
                format!("`max_output_tokens` must be a positive integer, got {value}"),
            ))
        }
    };
    match &b.top_logprobs {
        None | Some(Field::Ok(0)) => {}
        Some(Field::Ok(_)) => {
            return Err(ApiError::unsupported(
                "top_logprobs",
                "log probabilities are not returned by this server",
            ))
        }
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be a non-negative integer, got {value}"),
            ))
        }
    }
    let mut parallel = match &b.parallel_tool_calls {
        None => None,
        Some(Field::Ok(p)) => Some(*p),
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                format!("`parallel_tool_calls` must be true or false, got {value}"),
            ))
        }
    };
    match &b.max_tool_calls {
        None => {}
        Some(Field::Ok(1)) => parallel = Some(false),
        Some(Field::Ok(n)) => {
            return Err(ApiError::unsupported(
                "max_tool_calls",
                format!(
                    "this server bounds a reply's tool calls at one (`max_tool_calls: 1`, or \
                     `parallel_tool_calls: false`) or not at all, not at {n}"
                ),
            ))
        }
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "max_tool_calls",
                format!("`max_tool_calls` must be a positive integer, got {value}"),
            ))
        }
    }
    let (tools, echo_tools) = tools(b, limits)?;
    let (tool_choice, echo_choice) = tool_choice(b)?;
    let (response_format, echo_text) = text_format(b)?;
    let (thinking, echo_reasoning) = reasoning(b)?;
    let mut kwargs = Map::new();
    if let Some(on) = thinking {
        kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    let chat = oa::ChatCompletionRequest {
        model: b.model.clone(),
        messages: Some(Field::Ok(messages(b, limits)?)),
        tools: tools.map(Field::Ok),
        tool_choice,
        parallel_tool_calls: parallel.map(Field::Ok),
        stream: b.stream.clone(),
        max_tokens: max_output_tokens.map(Field::Ok),
        temperature: b.temperature.clone(),
        top_p: b.top_p.clone(),
        response_format: response_format.map(Field::Ok),
        chat_template_kwargs: (!kwargs.is_empty()).then_some(Field::Ok(kwargs)),
        speculation: b.speculation.clone(),
        prompt_cache_key: b.prompt_cache_key.clone(),
        ..Default::default()
    };
    let mut echo = rs::Response::new("", 0, "");
    echo.instructions = b.instructions.as_ref().and_then(Field::ok).cloned();
    echo.max_output_tokens = max_output_tokens;
    echo.parallel_tool_calls = parallel.unwrap_or(true);
    echo.tool_choice = echo_choice;
    echo.tools = echo_tools;
    echo.temperature = b.temperature.as_ref().and_then(Field::ok).copied();
    echo.top_p = b.top_p.as_ref().and_then(Field::ok).copied();
    echo.text = echo_text;
    echo.reasoning = echo_reasoning;
    if let Some(m @ Value::Object(_)) = b.extra.get("metadata") {
        echo.metadata = m.clone();
    }
    Ok((chat, echo))
}

/// The fields that need a response or conversation kept between requests, which this server
/// never keeps, are refused by name; `store` is read (and nothing is stored).
fn stateless(b: &rs::ResponsesRequest) -> Result<(), ApiError> {
    let keeps_nothing = "this server keeps no responses or conversations between requests: send \
                         the whole conversation in `input` each time";
    if b.previous_response_id.is_some() {
        return Err(ApiError::unsupported(
            "previous_response_id",
            format!("`previous_response_id` is not supported; {keeps_nothing}"),
        ));
    }
    if b.conversation.is_some() {
        return Err(ApiError::unsupported(
            "conversation",
            format!("`conversation` is not supported; {keeps_nothing}"),
        ));
    }
    if b.prompt.is_some() {
        return Err(ApiError::unsupported(
            "prompt",
            "stored prompt templates (`prompt`) are not supported; send `instructions` and \
             `input`",
        ));
    }
    match &b.background {
        None | Some(Field::Ok(false)) => {}
        Some(Field::Ok(true)) => {
            return Err(ApiError::unsupported(
                "background",
                format!(
                    "`background: true` is not supported (there is nothing to poll); \
                     {keeps_nothing}; stream the answer instead"
                ),
            ))
        }
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "background",
                format!("`background` must be true or false, got {value}"),
            ))
        }
    }
    if let Some(Field::Invalid { value, .. }) = &b.store {
        return Err(ApiError::invalid(
            "store",
            format!("`store` must be true or false, got {value}"),
        ));
    }
    Ok(())
}

/// `tools` as the chat route's function tools, and as the answer echoes them.
type Tools = (Option<Vec<Value>>, Vec<Value>);

fn tools(b: &rs::ResponsesRequest, limits: &Limits) -> Result<Tools, ApiError> {
    let list = match &b.tools {
        None => return Ok((None, Vec::new())),
        Some(Field::Ok(list)) => list,
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "tools",
                format!("`tools` must be a list, got {value}"),
            ))
        }
    };
    // bounded before any work in proportion to it (the chat route checks its own count again)
    if list.len() > limits.max_tools {
        return Err(ApiError::over_limit(
            "tools",
            "tools",
            list.len(),
            limits.max_tools,
            "--max-tools",
        ));
    }
    let (mut chat, mut echo) = (
        Vec::with_capacity(list.len()),
        Vec::with_capacity(list.len()),
    );
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        let bad = |what: String| ApiError::invalid(&param, format!("tool {i}: {what}"));
        let t = t.ok().ok_or_else(|| {
            bad(
                "must be an object such as {\"type\": \"function\", \"name\", \"parameters\"}"
                    .into(),
            )
        })?;
        match t.kind.as_ref().map(Field::as_result) {
            Some(Ok(k)) if k == "function" => {}
            Some(Ok(k)) => {
                return Err(ApiError::unsupported(
                    &param,
                    format!(
                        "tool {i}: `{k}` tools run on OpenAI's servers; this server offers the \
                         model function tools only (`{{\"type\": \"function\", \"name\", \
                         \"description\", \"parameters\"}}`)"
                    ),
                ))
            }
            other => {
                return Err(bad(format!(
                    "`type` must be `function`, got {}",
                    shown(other)
                )))
            }
        }
        let name = match &t.name {
            Some(Field::Ok(n)) => n,
            _ if t.extra.contains_key("function") => {
                return Err(bad(
                    "a Responses function tool is flat (`{\"type\": \"function\", \"name\", \
                     \"parameters\"}`); the chat route's nested `function` object is not read \
                     here"
                        .into(),
                ))
            }
            _ => return Err(bad("`name` is missing or not a string".into())),
        };
        let parameters = match &t.parameters {
            Some(s @ Value::Object(_)) => s.clone(),
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(v) => {
                return Err(bad(format!(
                    "`parameters` must be a JSON Schema object, got {v}"
                )))
            }
        };
        let description = match &t.description {
            None => None,
            Some(Field::Ok(d)) => Some(d.clone()),
            Some(Field::Invalid { value, .. }) => {
                return Err(bad(format!("`description` must be a string, got {value}")))
            }
        };
        let strict = match &t.strict {
            None => None,
            Some(Field::Ok(s)) => Some(*s),
            Some(Field::Invalid { value, .. }) => {
                return Err(bad(format!("`strict` must be true or false, got {value}")))
            }
        };
        let mut function = json!({"name": name});
        if let Some(d) = &description {
            function["description"] = Value::String(d.clone());
        }
        function["parameters"] = parameters.clone();
        if let Some(s) = strict {
            function["strict"] = Value::Bool(s);
        }
        chat.push(json!({"type": "function", "function": function}));
        echo.push(
            json!({"type": "function", "name": name, "description": description,
                         "parameters": parameters, "strict": strict}),
        );
    }
    Ok((Some(chat), echo))
}

/// `tool_choice` in the chat route's terms, and as the answer echoes it.
fn tool_choice(
    b: &rs::ResponsesRequest,
) -> Result<(Option<Field<oa::OpenAiToolChoice>>, Value), ApiError> {
    let Some(v) = &b.tool_choice else {
        return Ok((None, Value::String("auto".into())));
    };
    let choice = match v {
        Value::String(s) if s == "auto" => ToolChoice::Auto,
        Value::String(s) if s == "none" => ToolChoice::None,
        Value::String(s) if s == "required" => ToolChoice::Required,
        Value::Object(o) => match (o.get("type").and_then(Value::as_str), o.get("name")) {
            (Some("function"), Some(Value::String(name))) => ToolChoice::Function(name.clone()),
            (Some("function"), _) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` of type `function` needs the function's `name` (a string)",
                ))
            }
            (Some(kind), _) => {
                return Err(ApiError::unsupported(
                    "tool_choice",
                    format!(
                        "`tool_choice` of type `{kind}` is not supported: `auto`, `none`, \
                         `required` or {{\"type\": \"function\", \"name\": ...}}"
                    ),
                ))
            }
            (None, _) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` as an object needs a `type` (`function`)",
                ))
            }
        },
        other => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "`tool_choice` must be `auto`, `none`, `required` or {{\"type\": \
                     \"function\", \"name\": ...}}, got {other}"
                ),
            ))
        }
    };
    Ok((Some(Field::Ok(oa::OpenAiToolChoice(choice))), v.clone()))
}

/// `text.format` as the chat route's `response_format` (compiled and enforced by the same
/// grammar engine), and `text` as the answer echoes it.
fn text_format(
    b: &rs::ResponsesRequest,
) -> Result<(Option<mtp_contract::ResponseFormat>, Value), ApiError> {
    let default = json!({"format": {"type": "text"}});
    let bad = |what: String| ApiError::invalid("text.format", what);
    let config = match &b.text {
        None => return Ok((None, default)),
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "text",
                format!("`text` must be an object such as {{\"format\": {{\"type\": \"text\"}}}}, got {value}"),
            ))
        }
        Some(Field::Ok(c)) => c,
    };
    let mut echo = serde_json::to_value(config).unwrap_or_else(|_| default.clone());
    let f = match &config.format {
        None => {
            echo["format"] = json!({"type": "text"});
            return Ok((None, echo));
        }
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!("`text.format` must be an object, got {value}")))
        }
        Some(Field::Ok(f)) => f,
    };
    let format = match f.kind.as_ref().map(Field::as_result) {
        Some(Ok(k)) if k == "text" => return Ok((None, echo)),
        Some(Ok(k)) if k == "json_object" => json!({"type": "json_object"}),
        Some(Ok(k)) if k == "json_schema" => {
            let schema = match &f.schema {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => s.clone(),
                _ => {
                    return Err(bad(
                        "`text.format.schema` must be a JSON Schema object".into()
                    ))
                }
            };
            let mut inner = json!({"schema": schema});
            match &f.name {
                None => {}
                Some(Field::Ok(n)) => inner["name"] = Value::String(n.clone()),
                Some(Field::Invalid { value, .. }) => {
                    return Err(bad(format!(
                        "`text.format.name` must be a string, got {value}"
                    )))
                }
            }
            match &f.strict {
                None => {}
                Some(Field::Ok(s)) => inner["strict"] = Value::Bool(*s),
                Some(Field::Invalid { value, .. }) => {
                    return Err(bad(format!(
                        "`text.format.strict` must be true or false, got {value}"
                    )))
                }
            }
            json!({"type": "json_schema", "json_schema": inner})
        }
        other => {
            return Err(bad(format!(
                "`text.format.type` must be `text`, `json_object` or `json_schema`, got {}",
                shown(other)
            )))
        }
    };
    // the contract's reading, with its messages
    let f = mtp_contract::ResponseFormat::from_json(&format).map_err(|e| {
        let e = ApiError::from_provider(&e);
        ApiError {
            param: Some("text.format".into()),
            ..e
        }
    })?;
    Ok((Some(f), echo))
}

/// `reasoning.effort` as the template's thinking switch (`None`: the template's default), and
/// `reasoning` as the answer echoes it.
fn reasoning(b: &rs::ResponsesRequest) -> Result<(Option<bool>, Value), ApiError> {
    let config = match &b.reasoning {
        None => return Ok((None, json!({"effort": null, "summary": null}))),
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "reasoning",
                format!(
                    "`reasoning` must be an object such as {{\"effort\": \"low\"}}, got {value}"
                ),
            ))
        }
        Some(Field::Ok(c)) => c,
    };
    let on = match config.effort.as_ref().map(Field::as_result) {
        None => None,
        Some(Ok(e)) if e == "none" || e == "minimal" => Some(false),
        Some(Ok(e)) if ["low", "medium", "high", "xhigh"].contains(&e.as_str()) => Some(true),
        other => {
            return Err(ApiError::invalid(
                "reasoning.effort",
                format!(
                    "`reasoning.effort` must be `none`, `minimal`, `low`, `medium`, `high` or \
                     `xhigh`, got {}",
                    shown(other)
                ),
            ))
        }
    };
    let effort = config.effort.as_ref().and_then(Field::ok).cloned();
    let summary = config.extra.get("summary").cloned().unwrap_or(Value::Null);
    Ok((on, json!({"effort": effort, "summary": summary})))
}

/// The assistant turn being built from consecutive output items of the history.
#[derive(Default)]
struct History {
    out: Vec<Field<oa::ChatMessage>>,
    /// The reasoning items' text waiting for the assistant message or call that follows.
    reasoning: Option<String>,
    /// The last message is an assistant turn that a function call joins.
    assistant_open: bool,
    /// The function each call id named, for the outputs that answer it.
    called: HashMap<String, String>,
}

impl History {
    /// Any message but an assistant turn: the reasoning waiting has nothing to join.
    fn push(&mut self, m: oa::ChatMessage) {
        self.reasoning = None;
        self.assistant_open = false;
        self.out.push(Field::Ok(m));
    }

    /// A new assistant turn, with the reasoning that came before it.
    fn push_assistant(&mut self, mut m: oa::ChatMessage) {
        m.reasoning_content = self.reasoning.take().map(Field::Ok);
        self.out.push(Field::Ok(m));
        self.assistant_open = true;
    }
}

/// `instructions` and `input` as the chat route's messages.
fn messages(
    b: &rs::ResponsesRequest,
    limits: &Limits,
) -> Result<Vec<Field<oa::ChatMessage>>, ApiError> {
    let mut h = History::default();
    match &b.instructions {
        None => {}
        Some(Field::Ok(s)) => h.push(oa::ChatMessage::text("system", s.clone())),
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "instructions",
                format!("`instructions` must be a string, got {value}"),
            ))
        }
    }
    let items = match &b.input {
        None => {
            return Err(ApiError::invalid(
                "input",
                "`input` is required: a string, or a list of message and function call items",
            ))
        }
        Some(Field::Invalid { value, .. }) => {
            return Err(ApiError::invalid(
                "input",
                format!("`input` must be a string or a list of items, got {value}"),
            ))
        }
        Some(Field::Ok(rs::Input::Text(s))) => {
            h.push(oa::ChatMessage::text("user", s.clone()));
            return Ok(h.out);
        }
        Some(Field::Ok(rs::Input::Items(items))) => items,
    };
    if items.is_empty() {
        return Err(ApiError::invalid("input", "`input` is empty"));
    }
    // bounded before any work in proportion to it (the chat route checks its own count again)
    if items.len() > limits.max_messages {
        return Err(ApiError::over_limit(
            "input",
            "input items",
            items.len(),
            limits.max_messages,
            "--max-messages",
        ));
    }
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let bad = |what: String| ApiError::invalid(&param, format!("item {i}: {what}"));
        let it = item.ok().ok_or_else(|| {
            bad(
                "must be an object: a message, `function_call`, `function_call_output` or \
                 `reasoning` item"
                    .into(),
            )
        })?;
        match it.kind.as_ref().map(Field::as_result) {
            None => message(it, &param, limits, &mut h, &bad)?,
            Some(Ok(k)) if k == "message" => message(it, &param, limits, &mut h, &bad)?,
            Some(Ok(k)) if k == "function_call" => function_call(it, &mut h, &bad)?,
            Some(Ok(k)) if k == "function_call_output" => function_output(it, &mut h, &bad)?,
            Some(Ok(k)) if k == "reasoning" => reasoning_item(it, &param, limits, &mut h, &bad)?,
            Some(Ok(k)) => {
                return Err(ApiError::unsupported(
                    &param,
                    format!(
                        "item {i}: `{k}` items are not taken (message, function_call, \
                         function_call_output, reasoning); this server keeps nothing to \
                         reference and runs no hosted tools"
                    ),
                ))
            }
            Some(Err(v)) => return Err(bad(format!("`type` must be a string, got {v}"))),
        }
    }
    Ok(h.out)
}

/// A message item.
fn message(
    it: &rs::InputItem,
    param: &str,
    limits: &Limits,
    h: &mut History,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<(), ApiError> {
    let role = match it.role.as_ref().map(Field::as_result) {
        Some(Ok(r)) if ["user", "assistant", "system", "developer"].contains(&r.as_str()) => {
            r.as_str()
        }
        other => {
            return Err(bad(format!(
                "`role` must be `user`, `assistant`, `system` or `developer`, got {}",
                shown(other)
            )))
        }
    };
    let chat_role = if role == "developer" { "system" } else { role };
    let parts = match it.content.as_ref().map(Field::as_result) {
        None => return Err(bad("`content` is missing".into())),
        Some(Err(v)) => {
            return Err(bad(format!(
                "`content` must be a string or a list of parts, got {v}"
            )))
        }
        Some(Ok(MessageContent::Text(s))) => {
            let m = oa::ChatMessage::text(chat_role, s.clone());
            if role == "assistant" {
                h.push_assistant(m);
            } else {
                h.push(m);
            }
            return Ok(());
        }
        Some(Ok(MessageContent::Parts(parts))) => parts,
    };
    if parts.len() > limits.max_content_parts {
        return Err(ApiError::over_limit(
            param,
            "content parts in one message",
            parts.len(),
            limits.max_content_parts,
            "--max-content-parts",
        ));
    }
    let mut out = Vec::with_capacity(parts.len());
    for (k, p) in parts.iter().enumerate() {
        let p = p
            .ok()
            .ok_or_else(|| bad(format!("content part {k} must be an object with a `type`")))?;
        let text_of = |f: &Option<Field<String>>, what: &str| {
            f.as_ref()
                .and_then(Field::ok)
                .cloned()
                .ok_or_else(|| bad(format!("{what} part {k} has no `{what}` string")))
        };
        match p.kind_str() {
            Some("input_text" | "output_text") => {
                out.push(oa::ContentPart::text(text_of(&p.text, "text")?))
            }
            Some("refusal") if role == "assistant" => {
                out.push(oa::ContentPart::text(text_of(&p.refusal, "refusal")?))
            }
            Some("input_image") if role != "assistant" => {
                out.push(oa::ContentPart::image(image_url(p, k, bad)?))
            }
            other => {
                let taken = if role == "assistant" {
                    "output_text, refusal"
                } else {
                    "input_text, input_image"
                };
                return Err(ApiError {
                    code: Some("unsupported".into()),
                    ..bad(format!(
                        "content part {k} of type {} is not taken in a {role} message ({taken})",
                        other
                            .map(|s| format!("`{s}`"))
                            .unwrap_or_else(|| "(none)".into())
                    ))
                });
            }
        }
    }
    if role == "assistant" {
        // the assistant's text, as one string (the chat route joins parts the same way)
        let text: String = out
            .iter()
            .filter_map(|p| p.text.as_ref().and_then(Field::ok).map(String::as_str))
            .collect();
        h.push_assistant(oa::ChatMessage::text("assistant", text));
    } else {
        h.push(oa::ChatMessage {
            role: Some(Field::Ok(chat_role.into())),
            content: Some(Field::Ok(oa::Content::Parts(
                out.into_iter().map(Field::Ok).collect(),
            ))),
            ..Default::default()
        });
    }
    Ok(())
}

/// An `input_image` part's URL: a `data:` URL only (the server never fetches a URL or reads a
/// file, nor keeps files to name by `file_id`).
fn image_url(
    p: &rs::ContentPart,
    k: usize,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<String, ApiError> {
    let unsupported = |what: String| ApiError {
        code: Some("unsupported".into()),
        ..bad(what)
    };
    let url = match &p.image_url {
        Some(Field::Ok(u)) => u,
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!(
                "input_image part {k}: `image_url` must be a string (a data: URL), got {value}"
            )))
        }
        None if p.extra.contains_key("file_id") => {
            return Err(unsupported(format!(
                "input_image part {k}: `file_id` is not taken; this server keeps no files: send \
                 the image inline as `image_url` (`data:image/png;base64,...`)"
            )))
        }
        None => return Err(bad(format!("input_image part {k} has no `image_url`"))),
    };
    if mtp_contract::ImageRef::of(url) != mtp_contract::ImageRef::Inline {
        return Err(unsupported(format!(
            "input_image part {k}: `{}` is not a data: URL; the server takes images inline only \
             (`data:image/png;base64,...`), never from its own files or the network",
            url.chars().take(64).collect::<String>()
        )));
    }
    Ok(url.clone())
}

/// A string field of an item, required.
fn required<'a>(
    f: &'a Option<Field<String>>,
    what: &str,
    kind: &str,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<&'a String, ApiError> {
    f.as_ref()
        .and_then(Field::ok)
        .ok_or_else(|| bad(format!("a {kind} item needs `{what}` (a string)")))
}

/// A `function_call` item: a call of the assistant turn it follows, or of a new one.
fn function_call(
    it: &rs::InputItem,
    h: &mut History,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<(), ApiError> {
    let call_id = required(&it.call_id, "call_id", "function_call", bad)?;
    let name = required(&it.name, "name", "function_call", bad)?;
    let arguments = match &it.arguments {
        None => "{}".to_string(),
        Some(Field::Ok(a)) => a.clone(),
        Some(Field::Invalid { value, .. }) => {
            return Err(bad(format!(
                "`arguments` must be a string (a JSON object as text), got {value}"
            )))
        }
    };
    h.called.insert(call_id.clone(), name.clone());
    let call = Field::Ok(oa::ToolCall::whole(
        call_id.clone(),
        "function",
        name.clone(),
        arguments,
    ));
    if h.assistant_open {
        if let Some(Field::Ok(m)) = h.out.last_mut() {
            match &mut m.tool_calls {
                Some(Field::Ok(calls)) => calls.push(call),
                _ => m.tool_calls = Some(Field::Ok(vec![call])),
            }
            return Ok(());
        }
    }
    let mut m = oa::ChatMessage::text("assistant", "");
    m.tool_calls = Some(Field::Ok(vec![call]));
    h.push_assistant(m);
    Ok(())
}

/// A `function_call_output` item: a `tool` message answering its call.
fn function_output(
    it: &rs::InputItem,
    h: &mut History,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<(), ApiError> {
    let call_id = required(&it.call_id, "call_id", "function_call_output", bad)?;
    let text = match it.output.as_ref().map(Field::as_result) {
        None => String::new(),
        Some(Ok(MessageContent::Text(s))) => s.clone(),
        Some(Ok(MessageContent::Parts(parts))) => {
            let mut acc = String::new();
            for (k, p) in parts.iter().enumerate() {
                match p.ok() {
                    Some(p) if matches!(p.kind_str(), Some("input_text" | "output_text")) => acc
                        .push_str(
                            p.text.as_ref().and_then(Field::ok).ok_or_else(|| {
                                bad(format!("output part {k} has no `text` string"))
                            })?,
                        ),
                    _ => {
                        return Err(ApiError {
                            code: Some("unsupported".into()),
                            ..bad(format!(
                                "output part {k}: only text (`input_text`) is taken in a \
                                 function call's output"
                            ))
                        })
                    }
                }
            }
            acc
        }
        Some(Err(v)) => {
            return Err(bad(format!(
                "`output` must be a string or a list of text parts, got {v}"
            )))
        }
    };
    let mut m = oa::ChatMessage::text("tool", text);
    m.tool_call_id = Some(Field::Ok(call_id.clone()));
    m.name = h.called.get(call_id).cloned().map(Field::Ok);
    h.push(m);
    Ok(())
}

/// A `reasoning` item: its `reasoning_text` content, else its `summary` text, waiting for the
/// assistant turn that follows.
fn reasoning_item(
    it: &rs::InputItem,
    param: &str,
    limits: &Limits,
    h: &mut History,
    bad: &dyn Fn(String) -> ApiError,
) -> Result<(), ApiError> {
    let texts = |parts: &[Field<rs::ContentPart>], what: &str| -> Result<String, ApiError> {
        if parts.len() > limits.max_content_parts {
            return Err(ApiError::over_limit(
                param,
                "parts in one reasoning item",
                parts.len(),
                limits.max_content_parts,
                "--max-content-parts",
            ));
        }
        let mut acc: Vec<&str> = Vec::with_capacity(parts.len());
        for (k, p) in parts.iter().enumerate() {
            acc.push(
                p.ok()
                    .and_then(|p| p.text.as_ref()?.ok())
                    .map(String::as_str)
                    .ok_or_else(|| bad(format!("{what} part {k} has no `text` string")))?,
            );
        }
        Ok(acc.join("\n"))
    };
    let content = match it.content.as_ref().map(Field::as_result) {
        None => String::new(),
        Some(Ok(MessageContent::Parts(parts))) => texts(parts, "content")?,
        Some(Ok(MessageContent::Text(s))) => s.clone(),
        Some(Err(v)) => {
            return Err(bad(format!(
                "a reasoning item's `content` must be a list of reasoning_text parts, got {v}"
            )))
        }
    };
    let text = if !content.is_empty() {
        content
    } else {
        match &it.summary {
            None => String::new(),
            Some(Field::Ok(parts)) => texts(parts, "summary")?,
            Some(Field::Invalid { value, .. }) => {
                return Err(bad(format!(
                    "a reasoning item's `summary` must be a list of summary_text parts, got \
                     {value}"
                )))
            }
        }
    };
    // a reasoning item opens the next assistant turn
    h.assistant_open = false;
    if !text.is_empty() {
        match &mut h.reasoning {
            Some(acc) => {
                acc.push('\n');
                acc.push_str(&text);
            }
            None => h.reasoning = Some(text),
        }
    }
    Ok(())
}

// ---- answers ----

/// The number of a response id (`resp_12`: `12`), which its items' ids carry.
fn number(resp_id: &str) -> &str {
    resp_id.strip_prefix("resp_").unwrap_or(resp_id)
}

/// The id of output item `index` of kind `prefix` (`rs`, `msg`, `fc`).
fn item_id(prefix: &str, resp_id: &str, index: usize) -> String {
    format!("{prefix}_{}_{index}", number(resp_id))
}

/// The `call_id` of call `index`: the runtime's own, or one unique across a conversation's
/// turns (the `function_call_output` answering it repeats it).
fn call_id(given: Option<&str>, resp_id: &str, index: usize) -> String {
    match given {
        Some(id) => id.to_string(),
        None => format!("call_{}_{index}", number(resp_id)),
    }
}

/// `status` and `incomplete_details` of a finished reply.
fn ending(r: &GenerateResponse) -> (&'static str, Option<rs::IncompleteDetails>) {
    match r.finish_reason {
        FinishReason::Length => (
            "incomplete",
            Some(rs::IncompleteDetails {
                reason: Some("max_output_tokens"),
            }),
        ),
        FinishReason::Error | FinishReason::Cancelled => {
            ("incomplete", Some(rs::IncompleteDetails { reason: None }))
        }
        FinishReason::Stop | FinishReason::ToolCalls => ("completed", None),
    }
}

/// The finished response: the echoed settings, `output`, `usage`, the report.
fn finished(
    mut echo: rs::Response,
    run: &Run,
    r: &GenerateResponse,
    output: Vec<OutputItem>,
) -> rs::Response {
    let (status, details) = ending(r);
    echo.id = run.id.clone();
    echo.created_at = run.created;
    echo.model = run.s.model_id.clone();
    echo.status = status;
    echo.incomplete_details = details;
    echo.output = output;
    echo.usage = Some(rs::ResponseUsage::of(&r.usage));
    echo.speculation = Some(r.metadata.speculation.clone());
    echo
}

/// The whole answer's items: reasoning, text, calls; the text or reasoning the token limit cut
/// is `incomplete`.
fn output(r: &GenerateResponse, resp_id: &str) -> Vec<OutputItem> {
    let cut = ending(r).0 == "incomplete";
    let mut out = Vec::new();
    let last_text = if !r.tool_calls.is_empty() {
        None
    } else if !r.content.is_empty() {
        Some("msg")
    } else {
        Some("rs")
    };
    let status = |kind: &str| {
        if cut && last_text == Some(kind) {
            "incomplete"
        } else {
            "completed"
        }
    };
    if let Some(t) = r.reasoning_content.as_ref().filter(|t| !t.is_empty()) {
        let id = item_id("rs", resp_id, out.len());
        out.push(OutputItem::reasoning(id, status("rs"), t.clone()));
    }
    if !r.content.is_empty() {
        let id = item_id("msg", resp_id, out.len());
        out.push(OutputItem::message(id, status("msg"), r.content.clone()));
    }
    for (i, c) in openai::tool_calls(&r.tool_calls).into_iter().enumerate() {
        let f = c.function.and_then(Field::into_ok).unwrap_or_default();
        out.push(OutputItem::FunctionCall {
            id: item_id("fc", resp_id, out.len()),
            call_id: call_id(r.tool_calls[i].id.as_deref(), resp_id, i),
            name: f.name.and_then(Field::into_ok).unwrap_or_default(),
            arguments: f
                .arguments
                .and_then(|a| a.as_str().map(str::to_string))
                .unwrap_or_default(),
            status: "completed",
        });
    }
    out
}

/// The whole answer, once the provider is done.
pub(crate) async fn whole(
    mut run: Run,
    events: mtp_contract::EventStream,
    echo: rs::Response,
) -> Response {
    match crate::answer(&mut run, events).await {
        Ok(r) => {
            let items = output(&r, &run.id);
            let headers = crate::speculation_headers(&r.metadata.speculation);
            (headers, Json(finished(echo, &run, &r, items))).into_response()
        }
        Err(e) => error(e),
    }
}

/// A stream's state between provider events.
struct Streamer {
    run: Run,
    events: mtp_contract::EventStream,
    /// The settings the response objects echo.
    echo: rs::Response,
    /// `response.created` was sent.
    started: bool,
    /// The reply's items: one per segment, at the segment's index.
    segments: Segments,
    /// The items so far, as they stand.
    output: Vec<OutputItem>,
    /// The tool calls streamed so far.
    calls: usize,
    /// The next event's `sequence_number`.
    seq: u64,
    ended: bool,
}

impl Streamer {
    /// The response as it stands (`in_progress`, the items so far).
    fn snapshot(&self) -> Box<rs::Response> {
        let mut r = self.echo.clone();
        r.id = self.run.id.clone();
        r.created_at = self.run.created;
        r.model = self.run.s.model_id.clone();
        r.output = self.output.clone();
        Box::new(r)
    }

    /// A segment's step as the Responses events of its output item; a closing item takes
    /// `status`.
    fn step(&mut self, step: Step, status: &'static str, out: &mut Vec<rs::StreamEvent>) {
        match step {
            Step::Open {
                index,
                kind,
                id,
                name,
            } => {
                let resp = self.run.id.as_str();
                let (item, part) = match kind {
                    Kind::Reasoning => (
                        OutputItem::reasoning(item_id("rs", resp, index), "in_progress", ""),
                        Some(ContentPartOut::ReasoningText {
                            text: String::new(),
                        }),
                    ),
                    Kind::Text => (
                        OutputItem::message(item_id("msg", resp, index), "in_progress", ""),
                        Some(ContentPartOut::output_text("")),
                    ),
                    Kind::Call(i) => {
                        self.calls = self.calls.max(i + 1);
                        let item = OutputItem::FunctionCall {
                            id: item_id("fc", resp, index),
                            call_id: call_id(id.as_deref(), resp, i),
                            name: name.unwrap_or_default(),
                            arguments: String::new(),
                            status: "in_progress",
                        };
                        (item, None)
                    }
                };
                // the item opens with no content; its part opens next
                let mut added = item.clone();
                if let OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. } =
                    &mut added
                {
                    content.clear();
                }
                let item_id = item.id().to_string();
                self.output.push(item);
                out.push(rs::StreamEvent::OutputItemAdded {
                    output_index: index,
                    item: added,
                });
                if let Some(part) = part {
                    out.push(rs::StreamEvent::ContentPartAdded {
                        item_id,
                        output_index: index,
                        content_index: 0,
                        part,
                    });
                }
            }
            Step::Add { index, text, .. } => {
                let Some(item) = self.output.get_mut(index) else {
                    return;
                };
                let item_id = item.id().to_string();
                match item {
                    OutputItem::Reasoning { content, .. } => {
                        if let Some(ContentPartOut::ReasoningText { text: t }) = content.first_mut()
                        {
                            t.push_str(&text);
                        }
                        out.push(rs::StreamEvent::ReasoningTextDelta {
                            item_id,
                            output_index: index,
                            content_index: 0,
                            delta: text,
                        });
                    }
                    OutputItem::Message { content, .. } => {
                        if let Some(ContentPartOut::OutputText { text: t, .. }) =
                            content.first_mut()
                        {
                            t.push_str(&text);
                        }
                        out.push(rs::StreamEvent::OutputTextDelta {
                            item_id,
                            output_index: index,
                            content_index: 0,
                            delta: text,
                            logprobs: Vec::new(),
                        });
                    }
                    OutputItem::FunctionCall { arguments, .. } => {
                        arguments.push_str(&text);
                        out.push(rs::StreamEvent::FunctionCallArgumentsDelta {
                            item_id,
                            output_index: index,
                            delta: text,
                        });
                    }
                }
            }
            Step::Close { index, .. } => {
                let Some(item) = self.output.get_mut(index) else {
                    return;
                };
                let item_id = item.id().to_string();
                match item {
                    OutputItem::Reasoning {
                        content, status: s, ..
                    }
                    | OutputItem::Message {
                        content, status: s, ..
                    } => {
                        *s = status;
                        if let Some(part) = content.first() {
                            out.push(match part {
                                ContentPartOut::ReasoningText { text } => {
                                    rs::StreamEvent::ReasoningTextDone {
                                        item_id: item_id.clone(),
                                        output_index: index,
                                        content_index: 0,
                                        text: text.clone(),
                                    }
                                }
                                ContentPartOut::OutputText { text, .. } => {
                                    rs::StreamEvent::OutputTextDone {
                                        item_id: item_id.clone(),
                                        output_index: index,
                                        content_index: 0,
                                        text: text.clone(),
                                        logprobs: Vec::new(),
                                    }
                                }
                            });
                            out.push(rs::StreamEvent::ContentPartDone {
                                item_id,
                                output_index: index,
                                content_index: 0,
                                part: part.clone(),
                            });
                        }
                    }
                    OutputItem::FunctionCall {
                        name,
                        arguments,
                        status: s,
                        ..
                    } => {
                        *s = "completed";
                        out.push(rs::StreamEvent::FunctionCallArgumentsDone {
                            item_id,
                            output_index: index,
                            name: name.clone(),
                            arguments: arguments.clone(),
                        });
                    }
                }
                out.push(rs::StreamEvent::OutputItemDone {
                    output_index: index,
                    item: item.clone(),
                });
            }
        }
    }

    /// The events one provider event makes.
    fn on(&mut self, ev: Option<Result<StreamEvent, ProviderError>>) -> Vec<rs::StreamEvent> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.push(rs::StreamEvent::Created {
                response: self.snapshot(),
            });
            out.push(rs::StreamEvent::InProgress {
                response: self.snapshot(),
            });
        }
        match ev {
            Some(Ok(StreamEvent::Done(r))) => {
                self.run.finish(&r);
                let (status, _) = ending(&r);
                if let Some(step) = self.segments.close() {
                    self.step(step, status, &mut out);
                }
                // calls the runtime gave only in its final answer
                for (i, c) in r.tool_calls.iter().enumerate().skip(self.calls) {
                    let index = self.output.len();
                    let kind = Kind::Call(i);
                    let arguments = match &c.function.arguments {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    for step in [
                        Step::Open {
                            index,
                            kind,
                            id: c.id.clone(),
                            name: Some(c.function.name.clone()),
                        },
                        Step::Add {
                            index,
                            kind,
                            text: arguments,
                        },
                        Step::Close { index, kind },
                    ] {
                        self.step(step, status, &mut out);
                    }
                }
                let whole = finished(self.echo.clone(), &self.run, &r, self.output.clone());
                out.push(if whole.status == "completed" {
                    rs::StreamEvent::Completed {
                        response: Box::new(whole),
                    }
                } else {
                    rs::StreamEvent::Incomplete {
                        response: Box::new(whole),
                    }
                });
                self.ended = true;
            }
            Some(Ok(ev)) => {
                for step in self.segments.on(ev) {
                    self.step(step, "completed", &mut out);
                }
            }
            Some(Err(e)) => {
                self.run.fail(&e);
                out.push(self.failed(&ApiError::from_provider(&e)));
                self.ended = true;
            }
            None => {
                self.run.fail(&ProviderError::Cancelled);
                out.push(self.failed(&ApiError::from_provider(&ProviderError::Cancelled)));
                self.ended = true;
            }
        }
        out
    }

    /// `response.failed`: the response so far, its `error` set.
    fn failed(&self, e: &ApiError) -> rs::StreamEvent {
        let mut r = self.snapshot();
        r.status = "failed";
        r.error = Some(rs::ResponseError {
            code: e.code.clone().unwrap_or_else(|| "server_error".into()),
            message: e.message.clone(),
        });
        rs::StreamEvent::Failed { response: r }
    }

    /// One SSE event: `event: NAME`, `data: {"type": NAME, ..., "sequence_number": N}`.
    fn sse(&mut self, e: &rs::StreamEvent) -> Event {
        let data = rs::Sequenced {
            event: e,
            sequence_number: self.seq,
        };
        self.seq += 1;
        Event::default()
            .event(e.name())
            .data(serde_json::to_string(&data).unwrap_or_else(|_| "{}".into()))
    }
}

/// The answer as the Responses API's stream of events.
pub(crate) fn stream(
    run: Run,
    events: mtp_contract::EventStream,
    echo: rs::Response,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    let state = Streamer {
        run,
        events,
        echo,
        started: false,
        segments: Segments::default(),
        output: Vec::new(),
        calls: 0,
        seq: 0,
        ended: false,
    };
    let out = futures::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        let ev = st.events.next().await;
        let events = st.on(ev);
        let out: Vec<Event> = events.iter().map(|e| st.sse(e)).collect();
        Some((out, st))
    })
    .flat_map(|evs| futures::stream::iter(evs.into_iter().map(Ok)));
    Sse::new(out).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests;
