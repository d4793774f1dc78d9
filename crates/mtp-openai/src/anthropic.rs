//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), the
//! protocol Claude Code and the `anthropic` SDKs speak: the request body ([`MessagesRequest`],
//! read with the crate's [`Field`] conventions so the server can name a bad field), and the
//! answer, its stream events and its errors ([`Message`], [`StreamEvent`], [`ErrorResponse`]),
//! which only the server writes (no runtime of this workspace reads Anthropic answers, so they
//! are `Serialize` only).
//!
//! ```
//! use mtp_openai::anthropic::{MessageContent, MessagesRequest};
//! let r: MessagesRequest = serde_json::from_value(serde_json::json!({
//!     "model": "m", "max_tokens": 64, "system": "Be brief.",
//!     "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
//!     "temperature": "hot", "metadata": {"user_id": "u"}}))
//! .unwrap();
//! assert_eq!(r.max_tokens.as_ref().and_then(|f| f.ok()), Some(&64));
//! assert!(r.temperature.as_ref().unwrap().invalid().is_some()); // the server's 400 names it
//! let m = r.messages.unwrap().into_ok().unwrap().remove(0).into_ok().unwrap();
//! assert!(matches!(m.content.and_then(|c| c.into_ok()), Some(MessageContent::Blocks(b)) if b.len() == 1));
//! ```

use mtp_contract::{Speculation, SpeculationReport};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::Field;

/// The body of `POST /v1/messages` (and of `/v1/messages/count_tokens`, which takes the same
/// fields less `max_tokens` and `stream`).
///
/// Every field is `Option<Field<T>>` (absent or `null` is `None`; a value of the wrong type is
/// kept for the server's 400); fields it does not know land in `extra` (`metadata`,
/// `service_tier`, `container`, ...), which the server ignores.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    /// The model id (the server serves one model and ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Field<String>>,
    /// The token limit; required by the Messages API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<Field<u64>>,
    /// The system prompt: a string or a list of text blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Field<MessageContent>>,
    /// The conversation: `user` and `assistant` turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Field<Vec<Field<InputMessage>>>>,
    /// Tools with `name`, `description` and `input_schema` (a JSON Schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Field<Vec<Field<Tool>>>>,
    /// `{"type": "auto" | "any" | "tool" | "none"}` (`tool` with a `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Field<ToolChoice>>,
    /// Extended thinking: `{"type": "enabled", "budget_tokens": n}` or `{"type": "disabled"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Field<Thinking>>,
    /// Structured output (`format`: `{"type": "json_schema", "schema": ...}`) and `effort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_config: Option<Field<OutputConfig>>,
    /// Strings that end the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequences: Option<Field<Vec<String>>>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<Field<f64>>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<Field<f64>>,
    /// Top-k sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<Field<u64>>,
    /// Answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Field<bool>>,
    /// mtp's `speculation` block, read by the contract's [`Speculation`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Field<Speculation>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One turn of the conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputMessage {
    /// `user` or `assistant`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Field<String>>,
    /// A string, or content blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Field<MessageContent>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A message's (or the system prompt's, or a tool result's) content: a string or blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content blocks, in order.
    Blocks(Vec<Field<ContentBlock>>),
}

/// One content block of a request, every kind in one shape (as OpenAI's content parts are
/// read): `text` (`text`), `image` (`source`), `tool_use` (`id`, `name`, `input`),
/// `tool_result` (`tool_use_id`, `content`, `is_error`), `thinking` (`thinking`, `signature`)
/// and `redacted_thinking` (`data`, in `extra`). `cache_control` and the like land in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentBlock {
    /// The block's kind.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// A text block's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Field<String>>,
    /// An image block's source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Field<ImageSource>>,
    /// A `tool_use` block's id (`toolu_...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Field<String>>,
    /// A `tool_use` block's tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// A `tool_use` block's arguments (an object), free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// A `tool_result` block's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<Field<String>>,
    /// A `tool_result` block's content: a string or blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Field<MessageContent>>,
    /// A `tool_result` block's error flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<Field<bool>>,
    /// A `thinking` block's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Field<String>>,
    /// A `thinking` block's signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Field<String>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> ContentBlock {
        ContentBlock {
            kind: Some("text".to_string().into()),
            text: Some(text.into().into()),
            ..Default::default()
        }
    }

    /// The block's `type`, when it is a string.
    pub fn kind_str(&self) -> Option<&str> {
        self.kind.as_ref()?.ok().map(String::as_str)
    }
}

/// An image block's `source`: `{"type": "base64", "media_type", "data"}`, or a `url` / `file`
/// source (which this server refuses: it never fetches).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageSource {
    /// `base64`, `url` or `file`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// `image/png`, `image/jpeg`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<Field<String>>,
    /// The image, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Field<String>>,
    /// A `url` source's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Field<String>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A tool the model may call. Client tools have no `type` (or `custom`); Anthropic's server
/// tools (`web_search_...`, `bash_...`) have one and no `input_schema`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// `custom`, absent, or a server tool's versioned type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// The tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<Field<String>>,
    /// Its arguments' JSON Schema (an object), free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// Every other field, as sent (`cache_control`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `tool_choice`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolChoice {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// The tool `tool` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// `true`: at most one call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_parallel_tool_use: Option<Field<bool>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `thinking`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Thinking {
    /// `enabled`, `disabled` or `adaptive`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// The most tokens to think for (read, not enforced by this server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<Field<u64>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `output_config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputConfig {
    /// The shape the reply must take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Field<OutputFormat>>,
    /// Every other field, as sent (`effort`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `output_config.format`: `{"type": "json_schema", "schema": {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputFormat {
    /// `json_schema`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// The JSON Schema, free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A whole answer (`"type": "message"`), and the `message` of a stream's `message_start`.
///
/// ```
/// use mtp_openai::anthropic::{Block, Message, MessageUsage};
/// let m = Message::new("msg_1", "m", vec![Block::Text { text: "hi".into() }], MessageUsage::default());
/// let v = serde_json::to_value(&m).unwrap();
/// assert_eq!(v["type"], "message");
/// assert_eq!(v["content"][0], serde_json::json!({"type": "text", "text": "hi"}));
/// assert!(v["stop_reason"].is_null() && v.get("speculation").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// `msg_...`.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    /// The model id.
    pub model: String,
    /// The reply's blocks: thinking, text, tool calls.
    pub content: Vec<Block>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use` (`null` in `message_start`).
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the reply.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: MessageUsage,
    /// mtp's speculation report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationReport>,
}

impl Message {
    /// An answer with no stop reason yet and no report.
    pub fn new(
        id: impl Into<String>,
        model: impl Into<String>,
        content: Vec<Block>,
        usage: MessageUsage,
    ) -> Message {
        Message {
            id: id.into(),
            kind: "message",
            role: "assistant",
            model: model.into(),
            content,
            stop_reason: None,
            stop_sequence: None,
            usage,
            speculation: None,
        }
    }
}

/// One block of an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Anthropic's signature of the block (any string here: nothing checks it).
        signature: String,
    },
    /// A tool call.
    ToolUse {
        /// `toolu_...`, which the `tool_result` answering it repeats.
        id: String,
        /// The tool.
        name: String,
        /// The arguments, a JSON object.
        input: Value,
    },
}

/// An answer's `usage`. Anthropic counts cached prompt tokens apart: `input_tokens` are those
/// computed, `cache_read_input_tokens` those resumed from the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MessageUsage {
    /// Prompt tokens computed for this request.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens written to a cache (always 0: the prefix cache's writes are not billed).
    pub cache_creation_input_tokens: u64,
    /// Prompt tokens resumed from the prefix cache.
    pub cache_read_input_tokens: u64,
}

impl MessageUsage {
    /// The contract's counts in Anthropic's split.
    pub fn of(u: &mtp_contract::Usage) -> MessageUsage {
        MessageUsage {
            input_tokens: u.input_tokens.saturating_sub(u.cached_input_tokens),
            output_tokens: u.output_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: u.cached_input_tokens,
        }
    }
}

/// One event of a streamed answer, written as `event: NAME` and `data: {"type": NAME, ...}`
/// ([`StreamEvent::name`]).
///
/// ```
/// use mtp_openai::anthropic::{BlockDelta, StreamEvent};
/// let e = StreamEvent::ContentBlockDelta { index: 0, delta: BlockDelta::TextDelta { text: "a".into() } };
/// assert_eq!(e.name(), "content_block_delta");
/// assert_eq!(serde_json::to_string(&e).unwrap(),
///     r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// The answer's start: its id, model and usage so far, no content.
    MessageStart {
        /// The message, `content` empty.
        message: Message,
    },
    /// A block opens (a thinking or text block empty, a `tool_use` block with `input: {}`).
    ContentBlockStart {
        /// The block's place in `content`.
        index: usize,
        /// The block as it starts.
        content_block: Block,
    },
    /// More of an open block.
    ContentBlockDelta {
        /// The block's place in `content`.
        index: usize,
        /// What it adds.
        delta: BlockDelta,
    },
    /// A block is complete.
    ContentBlockStop {
        /// The block's place in `content`.
        index: usize,
    },
    /// The answer's end: why it stopped, and the final usage.
    MessageDelta {
        /// `stop_reason` and `stop_sequence`.
        delta: MessageDeltaBody,
        /// Token counts.
        usage: MessageUsage,
        /// mtp's speculation report.
        #[serde(skip_serializing_if = "Option::is_none")]
        speculation: Option<SpeculationReport>,
    },
    /// The stream is over.
    MessageStop,
    /// Keeps the connection alive.
    Ping,
    /// The request failed after the stream began.
    Error {
        /// What failed.
        error: ErrorDetail,
    },
}

impl StreamEvent {
    /// The SSE event name, the same as the data's `type`.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Ping => "ping",
            StreamEvent::Error { .. } => "error",
        }
    }
}

/// What a `content_block_delta` adds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    /// Text of a text block.
    TextDelta {
        /// The text.
        text: String,
    },
    /// Reasoning of a thinking block.
    ThinkingDelta {
        /// The reasoning text.
        thinking: String,
    },
    /// A thinking block's signature, last before it stops.
    SignatureDelta {
        /// The signature.
        signature: String,
    },
    /// A piece of a `tool_use` block's arguments, as JSON text (the pieces join to the
    /// object).
    InputJsonDelta {
        /// The JSON text.
        partial_json: String,
    },
}

/// `message_delta`'s `delta`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageDeltaBody {
    /// Why the reply stopped.
    pub stop_reason: Option<String>,
    /// The stop sequence that ended it.
    pub stop_sequence: Option<String>,
}

/// An error answer: `{"type": "error", "error": {"type", "message"}}`.
///
/// ```
/// use mtp_openai::anthropic::ErrorResponse;
/// let e = ErrorResponse::new("invalid_request_error", "max_tokens: Field required");
/// assert_eq!(serde_json::to_string(&e).unwrap(),
///     r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorResponse {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What failed.
    pub error: ErrorDetail,
}

impl ErrorResponse {
    /// An error of Anthropic's `kind` (`invalid_request_error`, `authentication_error`,
    /// `not_found_error`, `request_too_large`, `rate_limit_error`, `api_error`,
    /// `overloaded_error`).
    pub fn new(kind: &'static str, message: impl Into<String>) -> ErrorResponse {
        ErrorResponse {
            kind: "error",
            error: ErrorDetail {
                kind,
                message: message.into(),
            },
        }
    }
}

/// An error's `type` and `message`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorDetail {
    /// Anthropic's error type.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

/// The answer of `POST /v1/messages/count_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenCount {
    /// The prompt's tokens, as the request would be rendered for generation.
    pub input_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_block_kind_reads_into_one_shape() {
        let r: MessagesRequest = serde_json::from_value(json!({
            "max_tokens": 8,
            "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                    {"type": "text", "text": "what?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}], "is_error": false}]},
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "f"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "stop_sequences": ["\n\n"], "top_k": 5, "stream": true,
            "speculation": false, "service_tier": "auto"
        }))
        .unwrap();
        let msgs = r.messages.unwrap().into_ok().unwrap();
        let blocks = |i: usize| match msgs[i].ok().unwrap().content.as_ref().unwrap().ok() {
            Some(MessageContent::Blocks(b)) => b.clone(),
            other => panic!("{other:?}"),
        };
        let img = blocks(0)[0].ok().unwrap().source.clone().unwrap();
        assert_eq!(img.ok().unwrap().data, Some(Field::Ok("AA==".into())));
        let call = blocks(1)[1].ok().unwrap().clone();
        assert_eq!(call.kind_str(), Some("tool_use"));
        assert_eq!(call.input, Some(json!({"a": 1})));
        let result = blocks(2)[0].ok().unwrap().clone();
        assert_eq!(result.is_error, Some(Field::Ok(false)));
        assert!(r.extra.contains_key("service_tier"));
        assert_eq!(r.speculation, Some(Field::Ok(Speculation::off())));
        // a wrong value is kept, never a refusal of the whole body
        let bad: MessagesRequest =
            serde_json::from_value(json!({"messages": [1, {"role": 2}], "tools": "x"})).unwrap();
        assert!(bad.tools.unwrap().invalid().is_some());
        let m = bad.messages.unwrap().into_ok().unwrap();
        assert!(
            m[0].invalid().is_some()
                && m[1]
                    .ok()
                    .unwrap()
                    .role
                    .as_ref()
                    .unwrap()
                    .invalid()
                    .is_some()
        );
    }

    #[test]
    fn stream_events_carry_their_type() {
        let usage = MessageUsage::of(&mtp_contract::Usage {
            input_tokens: 10,
            output_tokens: 3,
            cached_input_tokens: 4,
        });
        assert_eq!((usage.input_tokens, usage.cache_read_input_tokens), (6, 4));
        for (e, name) in [
            (StreamEvent::MessageStop, "message_stop"),
            (StreamEvent::Ping, "ping"),
            (
                StreamEvent::ContentBlockStop { index: 2 },
                "content_block_stop",
            ),
            (
                StreamEvent::MessageDelta {
                    delta: MessageDeltaBody {
                        stop_reason: Some("end_turn".into()),
                        stop_sequence: None,
                    },
                    usage,
                    speculation: None,
                },
                "message_delta",
            ),
            (
                StreamEvent::ContentBlockStart {
                    index: 0,
                    content_block: Block::ToolUse {
                        id: "toolu_1".into(),
                        name: "f".into(),
                        input: json!({}),
                    },
                },
                "content_block_start",
            ),
        ] {
            let v = serde_json::to_value(&e).unwrap();
            assert_eq!(v["type"], name);
            assert_eq!(e.name(), name);
        }
    }
}
