//! OpenAI's Responses API (`POST /v1/responses`), the protocol of Codex CLI, the
//! `openai-agents` SDK's default model and `client.responses.create`: the request body
//! ([`ResponsesRequest`], read with the crate's [`Field`] conventions so the server can name a
//! bad field), and the answer and its stream events ([`Response`], [`StreamEvent`]), which only
//! the server writes (so they are `Serialize` only).
//!
//! ```
//! use mtp_openai::responses::{Input, ResponsesRequest};
//! let r: ResponsesRequest = serde_json::from_value(serde_json::json!({
//!     "model": "m", "instructions": "Be brief.", "max_output_tokens": 64,
//!     "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
//!               {"type": "function_call_output", "call_id": "call_1", "output": "sun"}],
//!     "temperature": "hot", "store": false}))
//! .unwrap();
//! assert_eq!(r.max_output_tokens.as_ref().and_then(|f| f.ok()), Some(&64));
//! assert!(r.temperature.as_ref().unwrap().invalid().is_some()); // the server's 400 names it
//! let items = match r.input.unwrap().into_ok().unwrap() { Input::Items(i) => i, _ => panic!() };
//! assert_eq!(items[1].ok().unwrap().kind_str(), Some("function_call_output"));
//! ```

use mtp_contract::{Speculation, SpeculationReport};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::Field;

/// The body of `POST /v1/responses`.
///
/// Every field is `Option<Field<T>>` (absent or `null` is `None`; a value of the wrong type is
/// kept for the server's 400); fields it does not know land in `extra` (`metadata`, `user`,
/// `include`, `truncation`, `service_tier`, ...), which the server ignores.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponsesRequest {
    /// The model id (the server serves one model and ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Field<String>>,
    /// The conversation: a string (one user message) or a list of items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Field<Input>>,
    /// The system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<Field<String>>,
    /// The token limit of the reply, reasoning included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<Field<u64>>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<Field<f64>>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<Field<f64>>,
    /// Tools: function tools in the flat form (`{"type": "function", "name", "parameters"}`),
    /// or OpenAI's hosted tools (which the server refuses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Field<Vec<Field<Tool>>>>,
    /// `auto`, `none`, `required`, or `{"type": "function", "name"}`; free-form, read by the
    /// server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// `false`: at most one tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<Field<bool>>,
    /// The most tool calls of the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<Field<u64>>,
    /// `format`: the shape of the reply's text (`text`, `json_object`, `json_schema`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Field<TextConfig>>,
    /// `effort`: how much the model reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Field<ReasoningConfig>>,
    /// Answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Field<bool>>,
    /// Whether OpenAI keeps the response for later retrieval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<Field<bool>>,
    /// A stored response to continue from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<Value>,
    /// A stored conversation to continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<Value>,
    /// Run in the background, to be polled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<Field<bool>>,
    /// A stored prompt template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Value>,
    /// Log probabilities of the most likely tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Field<u64>>,
    /// A key under which the runtime may reuse the conversation's prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<Field<String>>,
    /// mtp's `speculation` block, read by the contract's [`Speculation`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Field<Speculation>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `input`: a string or items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Input {
    /// One user message.
    Text(String),
    /// Messages, function calls and their outputs, reasoning, in order.
    Items(Vec<Field<InputItem>>),
}

/// One item of `input`, every kind in one shape (as OpenAI's content parts are read): a
/// message (`type: "message"` or none; `role`, `content`), a `function_call` (`call_id`,
/// `name`, `arguments`), a `function_call_output` (`call_id`, `output`) or a `reasoning` item
/// (`summary`, `content`). `id`, `status`, `encrypted_content` and the like land in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputItem {
    /// The item's kind (absent for a message).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// A message's role: `user`, `assistant`, `system` or `developer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Field<String>>,
    /// A message's content (a string or parts), or a reasoning item's `reasoning_text` parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Field<MessageContent>>,
    /// A reasoning item's summary: `summary_text` parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Field<Vec<Field<ContentPart>>>>,
    /// The call a `function_call` makes and a `function_call_output` answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<Field<String>>,
    /// A `function_call`'s function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// A `function_call`'s arguments: a JSON object as a string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Field<String>>,
    /// A `function_call_output`'s output: a string or parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Field<MessageContent>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl InputItem {
    /// The item's `type`, when it is a string.
    pub fn kind_str(&self) -> Option<&str> {
        self.kind.as_ref()?.ok().map(String::as_str)
    }
}

/// A message's content or a function call's output: a string or parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Parts, in order.
    Parts(Vec<Field<ContentPart>>),
}

/// One content part, every kind in one shape: `input_text`, `output_text`, `refusal`,
/// `reasoning_text` and `summary_text` (`text`; a refusal's in `refusal`), `input_image`
/// (`image_url`, or a `file_id` the server refuses), `input_file` (refused).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// The part's kind.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// A text part's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Field<String>>,
    /// A refusal's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Field<String>>,
    /// An image's URL (`data:` only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<Field<String>>,
    /// Every other field, as sent (`detail`, `file_id`, `annotations`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ContentPart {
    /// The part's `type`, when it is a string.
    pub fn kind_str(&self) -> Option<&str> {
        self.kind.as_ref()?.ok().map(String::as_str)
    }
}

/// A tool: a function tool in the Responses API's flat form, or a hosted tool (`web_search`,
/// `file_search`, ...: the `type` says which).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// `function`, or a hosted tool's type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// The function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<Field<String>>,
    /// Its arguments' JSON Schema (an object), free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Whether the arguments must follow the schema exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<Field<bool>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `text`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    /// The reply's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Field<TextFormat>>,
    /// Every other field, as sent (`verbosity`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `text.format`: `{"type": "text"}`, `{"type": "json_object"}`, or `{"type": "json_schema",
/// "name", "schema", "strict"}` (flat, unlike the chat route's `response_format`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Field<String>>,
    /// The schema's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Field<String>>,
    /// The JSON Schema, free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Whether the reply must follow the schema exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<Field<bool>>,
    /// Every other field, as sent (`description`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `reasoning`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReasoningConfig {
    /// `none`, `minimal`, `low`, `medium`, `high` or `xhigh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<Field<String>>,
    /// Every other field, as sent (`summary`, `generate_summary`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A whole answer (`"object": "response"`), and the `response` of the stream's lifecycle
/// events. The request's settings are echoed as OpenAI echoes them.
///
/// ```
/// use mtp_openai::responses::{ContentPart, OutputItem, Response};
/// let mut r = Response::new("resp_1", 0, "m");
/// r.output.push(OutputItem::message("msg_1", "completed", "hi"));
/// let v = serde_json::to_value(&r).unwrap();
/// assert_eq!(v["object"], "response");
/// assert_eq!(v["output"][0]["content"][0],
///     serde_json::json!({"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}));
/// assert!(v["error"].is_null() && v.get("speculation").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    /// `resp_...`.
    pub id: String,
    /// Always `response`.
    pub object: &'static str,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    /// Why the reply is incomplete (`null` unless it is).
    pub incomplete_details: Option<IncompleteDetails>,
    /// What failed (`null` unless the response failed).
    pub error: Option<ResponseError>,
    /// The model id.
    pub model: String,
    /// The reply's items: reasoning, a message, function calls.
    pub output: Vec<OutputItem>,
    /// Token counts (`null` until the reply is done).
    pub usage: Option<ResponseUsage>,
    /// The request's `instructions`.
    pub instructions: Option<String>,
    /// The request's `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// The request's `parallel_tool_calls` (default `true`).
    pub parallel_tool_calls: bool,
    /// The request's `tool_choice` (default `auto`).
    pub tool_choice: Value,
    /// The request's tools.
    pub tools: Vec<Value>,
    /// The request's `temperature`.
    pub temperature: Option<f64>,
    /// The request's `top_p`.
    pub top_p: Option<f64>,
    /// The request's `text` (default `{"format": {"type": "text"}}`).
    pub text: Value,
    /// The request's `reasoning` (default `{"effort": null, "summary": null}`).
    pub reasoning: Value,
    /// The request's `metadata` (default `{}`).
    pub metadata: Value,
    /// Always `null`: no response is stored, none continues another.
    pub previous_response_id: Option<String>,
    /// Always `false`: no response is stored.
    pub store: bool,
    /// Always `disabled`: a conversation longer than the context is refused, not cut.
    pub truncation: &'static str,
    /// mtp's speculation report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationReport>,
}

impl Response {
    /// A response in progress with no output and the default settings.
    pub fn new(id: impl Into<String>, created_at: u64, model: impl Into<String>) -> Response {
        Response {
            id: id.into(),
            object: "response",
            created_at,
            status: "in_progress",
            incomplete_details: None,
            error: None,
            model: model.into(),
            output: Vec::new(),
            usage: None,
            instructions: None,
            max_output_tokens: None,
            parallel_tool_calls: true,
            tool_choice: Value::String("auto".into()),
            tools: Vec::new(),
            temperature: None,
            top_p: None,
            text: serde_json::json!({"format": {"type": "text"}}),
            reasoning: serde_json::json!({"effort": null, "summary": null}),
            metadata: Value::Object(Map::new()),
            previous_response_id: None,
            store: false,
            truncation: "disabled",
            speculation: None,
        }
    }
}

/// `incomplete_details`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens`, or `null` when the reply broke off for another reason.
    pub reason: Option<&'static str>,
}

/// A failed response's `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResponseError {
    /// OpenAI's code (`server_error`, `rate_limit_exceeded`, ...).
    pub code: String,
    /// What failed.
    pub message: String,
}

/// One item of a response's `output`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The model's reasoning, as `reasoning_text` content (no summary is written).
    Reasoning {
        /// `rs_...`.
        id: String,
        /// Always empty.
        summary: Vec<ContentPartOut>,
        /// The reasoning text.
        content: Vec<ContentPartOut>,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
    /// The assistant's text.
    Message {
        /// `msg_...`.
        id: String,
        /// Always `assistant`.
        role: &'static str,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
        /// `output_text` parts.
        content: Vec<ContentPartOut>,
    },
    /// A function call for the client to run.
    FunctionCall {
        /// `fc_...`.
        id: String,
        /// The id the `function_call_output` answering it repeats.
        call_id: String,
        /// The function.
        name: String,
        /// The arguments: a JSON object as a string.
        arguments: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
}

impl OutputItem {
    /// A message holding `text` as one `output_text` part.
    pub fn message(id: impl Into<String>, status: &'static str, text: impl Into<String>) -> Self {
        OutputItem::Message {
            id: id.into(),
            role: "assistant",
            status,
            content: vec![ContentPartOut::output_text(text)],
        }
    }

    /// A reasoning item holding `text` as one `reasoning_text` part.
    pub fn reasoning(id: impl Into<String>, status: &'static str, text: impl Into<String>) -> Self {
        OutputItem::Reasoning {
            id: id.into(),
            summary: Vec::new(),
            content: vec![ContentPartOut::ReasoningText { text: text.into() }],
            status,
        }
    }

    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            OutputItem::Reasoning { id, .. }
            | OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. } => id,
        }
    }
}

/// A content part of an answer's item.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPartOut {
    /// A message's text.
    OutputText {
        /// The text.
        text: String,
        /// Always empty.
        annotations: Vec<Value>,
        /// Always empty (log probabilities are not returned).
        logprobs: Vec<Value>,
    },
    /// A reasoning item's text.
    ReasoningText {
        /// The text.
        text: String,
    },
}

impl ContentPartOut {
    /// An `output_text` part.
    pub fn output_text(text: impl Into<String>) -> ContentPartOut {
        ContentPartOut::OutputText {
            text: text.into(),
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// A response's `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ResponseUsage {
    /// Prompt tokens, those resumed from the prefix cache included.
    pub input_tokens: u64,
    /// `cached_tokens` (resumed from the prefix cache), `cache_write_tokens` (always 0).
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// `reasoning_tokens`.
    pub output_tokens_details: OutputTokensDetails,
    /// Input and output.
    pub total_tokens: u64,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct InputTokensDetails {
    /// Prompt tokens resumed from the prefix cache.
    pub cached_tokens: u64,
    /// Prompt tokens written to a cache (always 0: the prefix cache's writes are not billed).
    pub cache_write_tokens: u64,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OutputTokensDetails {
    /// Tokens of reasoning (not counted apart by the runtimes: always 0, `output_tokens`
    /// counts reasoning and answer together).
    pub reasoning_tokens: u64,
}

impl ResponseUsage {
    /// The contract's counts.
    pub fn of(u: &mtp_contract::Usage) -> ResponseUsage {
        ResponseUsage {
            input_tokens: u.input_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.cached_input_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: u.output_tokens,
            output_tokens_details: OutputTokensDetails::default(),
            total_tokens: u.input_tokens.saturating_add(u.output_tokens),
        }
    }
}

/// One event of a streamed response, written as `event: NAME` and `data: {"type": NAME,
/// "sequence_number": N, ...}` ([`StreamEvent::name`], [`Sequenced`]).
///
/// ```
/// use mtp_openai::responses::{Sequenced, StreamEvent};
/// let e = StreamEvent::OutputTextDelta {
///     item_id: "msg_1".into(), output_index: 0, content_index: 0, delta: "a".into(), logprobs: vec![] };
/// assert_eq!(e.name(), "response.output_text.delta");
/// assert_eq!(serde_json::to_string(&Sequenced { event: &e, sequence_number: 3 }).unwrap(),
///     r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"a","logprobs":[],"sequence_number":3}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    /// The response exists (`in_progress`, no output).
    #[serde(rename = "response.created")]
    Created {
        /// The response so far.
        response: Box<Response>,
    },
    /// The response is being generated.
    #[serde(rename = "response.in_progress")]
    InProgress {
        /// The response so far.
        response: Box<Response>,
    },
    /// An output item opens.
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        /// Its place in `output`.
        output_index: usize,
        /// The item as it starts (no text yet, `in_progress`).
        item: OutputItem,
    },
    /// An output item is complete.
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        /// Its place in `output`.
        output_index: usize,
        /// The whole item.
        item: OutputItem,
    },
    /// A content part of an item opens.
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The part's place in the item's `content`.
        content_index: usize,
        /// The part, empty.
        part: ContentPartOut,
    },
    /// A content part is complete.
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The part's place in the item's `content`.
        content_index: usize,
        /// The whole part.
        part: ContentPartOut,
    },
    /// More of a message's text.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The part's place in the item's `content`.
        content_index: usize,
        /// The text added.
        delta: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// A message's text is complete.
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The part's place in the item's `content`.
        content_index: usize,
        /// The whole text.
        text: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// More reasoning.
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The part's place in the item's `content`.
        content_index: usize,
        /// The text added.
        delta: String,
    },
    /// The reasoning is complete.
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The part's place in the item's `content`.
        content_index: usize,
        /// The whole text.
        text: String,
    },
    /// More of a function call's arguments (JSON text; the pieces join to the arguments).
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The text added.
        delta: String,
    },
    /// A function call's arguments are complete.
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        /// The item's id.
        item_id: String,
        /// The item's place in `output`.
        output_index: usize,
        /// The function.
        name: String,
        /// The whole arguments.
        arguments: String,
    },
    /// The response is complete.
    #[serde(rename = "response.completed")]
    Completed {
        /// The whole response.
        response: Box<Response>,
    },
    /// The response ended early (the token limit).
    #[serde(rename = "response.incomplete")]
    Incomplete {
        /// The whole response.
        response: Box<Response>,
    },
    /// The response failed after the stream began.
    #[serde(rename = "response.failed")]
    Failed {
        /// The response, `error` set.
        response: Box<Response>,
    },
}

impl StreamEvent {
    /// The SSE event name, the same as the data's `type`.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::Created { .. } => "response.created",
            StreamEvent::InProgress { .. } => "response.in_progress",
            StreamEvent::OutputItemAdded { .. } => "response.output_item.added",
            StreamEvent::OutputItemDone { .. } => "response.output_item.done",
            StreamEvent::ContentPartAdded { .. } => "response.content_part.added",
            StreamEvent::ContentPartDone { .. } => "response.content_part.done",
            StreamEvent::OutputTextDelta { .. } => "response.output_text.delta",
            StreamEvent::OutputTextDone { .. } => "response.output_text.done",
            StreamEvent::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            StreamEvent::ReasoningTextDone { .. } => "response.reasoning_text.done",
            StreamEvent::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            StreamEvent::FunctionCallArgumentsDone { .. } => {
                "response.function_call_arguments.done"
            }
            StreamEvent::Completed { .. } => "response.completed",
            StreamEvent::Incomplete { .. } => "response.incomplete",
            StreamEvent::Failed { .. } => "response.failed",
        }
    }
}

/// An event with its place in the stream (`sequence_number`, from 0), as it is written.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sequenced<'a> {
    /// The event.
    #[serde(flatten)]
    pub event: &'a StreamEvent,
    /// Its place in the stream.
    pub sequence_number: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_item_kind_reads_into_one_shape() {
        let r: ResponsesRequest = serde_json::from_value(json!({
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "auto"},
                    {"type": "input_text", "text": "what?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
                    "content": [{"type": "reasoning_text", "text": "hm"}], "encrypted_content": "x"},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "ok"}]}
            ],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true},
                      {"type": "web_search"}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}, "verbosity": "low"},
            "reasoning": {"effort": "low", "summary": "auto"},
            "include": ["reasoning.encrypted_content"], "store": false, "speculation": false
        }))
        .unwrap();
        let Some(Field::Ok(Input::Items(items))) = r.input else {
            panic!()
        };
        let item = |i: usize| items[i].ok().unwrap().clone();
        assert_eq!(item(0).kind, None);
        assert_eq!(item(2).summary.unwrap().into_ok().unwrap().len(), 1);
        assert!(item(2).extra.contains_key("encrypted_content"));
        assert_eq!(item(3).arguments, Some(Field::Ok("{}".into())));
        assert!(matches!(
            item(4).output.and_then(Field::into_ok),
            Some(MessageContent::Parts(p)) if p.len() == 1
        ));
        let tools = r.tools.unwrap().into_ok().unwrap();
        assert_eq!(
            tools[1].ok().unwrap().kind,
            Some(Field::Ok("web_search".into()))
        );
        assert!(r.extra.contains_key("include"));
        assert_eq!(r.speculation, Some(Field::Ok(Speculation::off())));
        // a wrong value is kept, never a refusal of the whole body
        let bad: ResponsesRequest =
            serde_json::from_value(json!({"input": [1, {"role": 2}], "tools": "x", "input_x": 1}))
                .unwrap();
        assert!(bad.tools.unwrap().invalid().is_some());
        let Some(Field::Ok(Input::Items(items))) = bad.input else {
            panic!()
        };
        assert!(items[0].invalid().is_some());
        assert!(items[1]
            .ok()
            .unwrap()
            .role
            .as_ref()
            .unwrap()
            .invalid()
            .is_some());
    }

    #[test]
    fn usage_and_events_take_openais_shape() {
        let u = ResponseUsage::of(&mtp_contract::Usage {
            input_tokens: 10,
            output_tokens: 3,
            cached_input_tokens: 4,
        });
        assert_eq!(
            serde_json::to_value(u).unwrap(),
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                   "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13})
        );
        let call = OutputItem::FunctionCall {
            id: "fc_1".into(),
            call_id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
            status: "completed",
        };
        let e = StreamEvent::OutputItemDone {
            output_index: 2,
            item: call,
        };
        let v = serde_json::to_value(Sequenced {
            event: &e,
            sequence_number: 9,
        })
        .unwrap();
        assert_eq!(v["type"], e.name());
        assert_eq!(v["item"]["type"], "function_call");
        assert_eq!(v["sequence_number"], 9);
        let r = OutputItem::reasoning("rs_1", "completed", "hm");
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"type": "reasoning", "id": "rs_1", "summary": [],
                   "content": [{"type": "reasoning_text", "text": "hm"}], "status": "completed"})
        );
        assert_eq!(r.id(), "rs_1");
    }
}
