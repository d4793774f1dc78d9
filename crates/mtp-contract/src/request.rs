//! Requests and responses shared by every provider.

use serde::{Deserialize, Serialize};

use crate::cancel::Cancel;
use crate::error::ProviderError;
use crate::format::ResponseFormat;
use crate::logprob::TokenLogprob;
use crate::report::{SpeculationReport, Timings};
use crate::sampling::Sampling;
use crate::speculation::Speculation;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The person.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// The role as chat templates and OpenAI-style APIs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of a conversation history, in the OpenAI chat shape that chat templates read.
///
/// ```
/// use mtp_contract::{Message, ToolCall};
/// let call = ToolCall::function("call_1", "get_weather", serde_json::json!({"city": "Paris"}));
/// let history = vec![
///     Message::user("What's the weather in Paris?"),
///     Message::assistant("").with_tool_calls(vec![call]),
///     Message::tool("call_1", "{\"temperature\": 21}"),
/// ];
/// assert_eq!(history[2].tool_call_id.as_deref(), Some("call_1"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// The text.
    pub content: String,
    /// An assistant turn's reasoning (what a thinking model wrote between `<think>` tags),
    /// given back to templates that render or drop it for earlier turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tools an assistant turn called.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a `tool` message: the tool's name (some templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Images attached to the message (paths or URLs). Text-only runtimes reject them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
}

impl Message {
    /// A text message.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            images: Vec::new(),
        }
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::new(Role::User, content)
    }
    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::new(Role::Assistant, content)
    }
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::new(Role::System, content)
    }
    /// A tool result answering the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(tool_call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }
    /// Sets the reasoning of an assistant turn.
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        self.reasoning_content = Some(reasoning.into());
        self
    }
    /// Sets the tool calls of an assistant turn.
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }
}

/// What an image reference of a request ([`GenerateRequest::images`], [`Message::images`])
/// names, from its scheme alone (ASCII case ignored): the one place the schemes are told apart.
///
/// ```
/// use mtp_contract::ImageRef;
/// assert_eq!(ImageRef::of("data:image/png;base64,iVBOR"), ImageRef::Inline);
/// assert_eq!(ImageRef::of("HTTPS://example.invalid/a.png"), ImageRef::Remote);
/// assert_eq!(ImageRef::of("file:///tmp/a.png"), ImageRef::File("/tmp/a.png"));
/// assert_eq!(ImageRef::of("photos/a.png"), ImageRef::File("photos/a.png"));
/// assert_eq!(ImageRef::of("ftp://host/a.png"), ImageRef::Other);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageRef<'a> {
    /// A `data:` URL: the image itself.
    Inline,
    /// An `http(s)` URL, which only a server that fetches can read.
    Remote,
    /// A local file: a path, or a `file://` URL (the path it names).
    File(&'a str),
    /// Another URL scheme.
    Other,
}

impl<'a> ImageRef<'a> {
    /// Classifies `spec` (surrounding whitespace ignored).
    pub fn of(spec: &'a str) -> Self {
        let spec = spec.trim();
        let strip = |p: &str| {
            spec.get(..p.len())
                .filter(|h| h.eq_ignore_ascii_case(p))
                .map(|_| &spec[p.len()..])
        };
        if strip("data:").is_some() {
            ImageRef::Inline
        } else if strip("http://").is_some() || strip("https://").is_some() {
            ImageRef::Remote
        } else if let Some(path) = strip("file://") {
            ImageRef::File(path)
        } else if spec.contains("://") {
            ImageRef::Other
        } else {
            ImageRef::File(spec)
        }
    }
}

/// One tool call of an assistant turn (OpenAI shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the `tool` message answering it repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function` today.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// What was called.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".into()
}

/// The function a tool call names, with its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object, or (as the OpenAI API sends them) a string holding one.
    /// Chat templates are given an object either way.
    #[serde(default)]
    pub arguments: serde_json::Value,
}

impl ToolCall {
    /// A function call with an id.
    pub fn function(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        ToolCall {
            id: Some(id.into()),
            kind: function_kind(),
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// Chat-template variables that come from the request's own fields, so that
/// `chat_template_kwargs` cannot set them.
pub const RESERVED_TEMPLATE_VARIABLES: [&str; 4] =
    ["messages", "tools", "documents", "add_generation_prompt"];

/// The most bytes of request text a provider reads per token of its context before refusing
/// a prompt unread: a prompt whose text is longer than the context times this cannot fit
/// (text averages about 4 bytes a token; only runs of whitespace or of one repeated
/// character reach tens of bytes a token, never a whole prompt), so it is refused before it
/// costs a tokenizer's time and memory.
pub const MAX_PROMPT_BYTES_PER_TOKEN: usize = 64;

/// The longest `prompt_cache_key` a request may carry, in bytes: a key names a conversation
/// or a user (OpenAI's own are short identifiers); it is kept in memory and written into the
/// prefix cache's files with every checkpoint, so it must not be a place to store data.
pub const MAX_PROMPT_CACHE_KEY_BYTES: usize = 256;

/// One generation request.
///
/// `messages: None` and `Some(vec![])` differ: with a `prompt_cache_key`, an omitted history
/// is an error (so that prefix reuse is never confused with a hidden append), while an
/// explicit empty history means "a standalone prompt".
///
/// ```
/// use mtp_contract::{GenerateRequest, Speculation};
/// let req = GenerateRequest::new("Write an LRU cache in Rust.")
///     .max_output_tokens(64)
///     .speculation(Speculation::depth(5).unwrap());
/// assert!(req.validate().is_ok());
/// let bad = GenerateRequest::new("hi").prompt_cache_key("s1");
/// assert!(bad.validate().is_err()); // history omitted
/// assert!(bad.messages(vec![]).validate().is_ok());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// The new user turn.
    pub prompt: String,
    /// Images of the new user turn (paths, `file://` or `data:` URLs), shown before its text.
    /// Text-only runtimes reject them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    /// The complete history before `prompt`.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    /// A system prompt placed before the history.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Upper bound on generated tokens; `None`: to the end of the context (the native
    /// provider, as vLLM and llama-server do), or the server's own default behind an HTTP
    /// runtime.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// Ask a reasoning model to think (`enable_thinking` in chat templates).
    #[serde(default)]
    pub thinking: Option<bool>,
    /// Sampling controls.
    #[serde(default)]
    pub sampling: Sampling,
    /// Per-request speculation override (only for this request).
    #[serde(default)]
    pub speculation: Option<Speculation>,
    /// Key under which the runtime may reuse this conversation's prefix.
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// Stop sequences.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Use the prompt verbatim (no chat template).
    #[serde(default)]
    pub raw_prompt: bool,
    /// Tools the model may call (OpenAI tool schemas, `{"type": "function", "function":
    /// {...}}`), shown to it by the chat template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
    /// Extra variables for the chat template (as vLLM's and llama-server's
    /// `chat_template_kwargs`); `thinking` sets `enable_thinking` and wins over a value here.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The shape the reply must take (JSON Schema, JSON object, regex, Lark grammar), enforced
    /// while decoding. A runtime that cannot enforce it refuses the request; none ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// For a runtime that cannot enforce `response_format` (a server whose API has no field
    /// for a regex or a grammar): `true` lets it ask for the shape in the prompt instead
    /// ([`ResponseFormat::instruction`], in the system message) and check the finished reply;
    /// the response's warnings then say the shape was asked for, not enforced, and whether the
    /// reply follows it. `false` (the default) refuses such a request. Runtimes that enforce
    /// the constraint never fall back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompted_fallback: bool,
    /// Which tool calls the reply may or must make (OpenAI's `tool_choice`); `auto` by
    /// default.
    #[serde(default, skip_serializing_if = "ToolChoice::is_auto")]
    pub tool_choice: ToolChoice,
    /// `Some(false)`: at most one tool call (OpenAI's `parallel_tool_calls: false`); unset or
    /// `true`: as many as the model makes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Who may cancel this request, and the work that runs for it (see [`Cancel`]): every
    /// stage of a runtime checks it. Not part of the request's content (never serialized;
    /// tokens compare equal).
    #[serde(skip)]
    pub cancel: Cancel,
    /// Report each generated token's log probability with this many alternatives (0: the
    /// token's alone; at most [`crate::MAX_TOP_LOGPROBS`]), in
    /// [`GenerateResponse::logprobs`] and each streamed delta. Runtimes that cannot refuse it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Also report the prompt's tokens with their log probabilities
    /// ([`GenerateResponse::prompt_logprobs`], with `logprobs` alternatives each): OpenAI's
    /// `echo` with `logprobs`, what loglikelihood evaluations read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub echo: bool,
    /// A raw prompt given as token ids instead of text (`raw_prompt`, with `prompt` empty):
    /// OpenAI's token-id prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// Which tool calls a reply may or must make (OpenAI's `tool_choice`).
///
/// ```
/// use mtp_contract::ToolChoice;
/// assert_eq!(ToolChoice::from_openai(&serde_json::json!("required")).unwrap(), ToolChoice::Required);
/// let named = serde_json::json!({"type": "function", "function": {"name": "get_weather"}});
/// assert_eq!(ToolChoice::from_openai(&named).unwrap(), ToolChoice::Function("get_weather".into()));
/// assert!(ToolChoice::from_openai(&serde_json::json!("always")).is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides whether to call a tool (the default).
    #[default]
    Auto,
    /// No tool call: the tools are not shown to the model.
    None,
    /// At least one call: the reply is constrained to the template's tool-call format, each
    /// call's arguments valid against its tool's `parameters` schema.
    Required,
    /// One call of this function, constrained as `Required` is.
    Function(String),
}

impl ToolChoice {
    /// True for the default, `auto`.
    pub fn is_auto(&self) -> bool {
        *self == ToolChoice::Auto
    }

    /// True when the reply must be tool calls (`required` or a named function).
    pub fn forces_a_call(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Function(_))
    }

    /// OpenAI's spellings: `"auto"`, `"none"`, `"required"`, or
    /// `{"type": "function", "function": {"name": ...}}`; anything else is an error saying
    /// what is accepted.
    pub fn from_openai(v: &serde_json::Value) -> Result<ToolChoice, String> {
        match v {
            serde_json::Value::String(s) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(format!(
                    "`tool_choice` \"{other}\" is not known; use \"auto\", \"none\", \"required\" or \
                     {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                )),
            },
            serde_json::Value::Object(o) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(serde_json::Value::as_str)
                    .filter(|n| !n.is_empty());
                match (o.get("type").and_then(serde_json::Value::as_str), name) {
                    (Some("function"), Some(n)) => Ok(ToolChoice::Function(n.to_string())),
                    _ => Err(format!(
                        "`tool_choice` {v} is not a named function; use \
                         {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    )),
                }
            }
            other => Err(format!(
                "`tool_choice` must be a string or an object, got {other}"
            )),
        }
    }

    /// The OpenAI spelling.
    pub fn to_openai(&self) -> serde_json::Value {
        match self {
            ToolChoice::Auto => "auto".into(),
            ToolChoice::None => "none".into(),
            ToolChoice::Required => "required".into(),
            ToolChoice::Function(n) => {
                serde_json::json!({"type": "function", "function": {"name": n}})
            }
        }
    }
}

/// The name of an OpenAI tool schema (`{"type": "function", "function": {"name": ...}}`).
pub fn tool_name(tool: &serde_json::Value) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .and_then(serde_json::Value::as_str)
}

impl GenerateRequest {
    /// A request with a prompt and defaults everywhere else.
    pub fn new(prompt: impl Into<String>) -> Self {
        GenerateRequest {
            prompt: prompt.into(),
            ..Default::default()
        }
    }
    /// Adds an image to the prompt (a path, `file://` or `data:` URL).
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.images.push(image.into());
        self
    }
    /// Sets the history.
    pub fn messages(mut self, messages: Vec<Message>) -> Self {
        self.messages = Some(messages);
        self
    }
    /// Sets the system prompt.
    pub fn system_prompt(mut self, s: impl Into<String>) -> Self {
        self.system_prompt = Some(s.into());
        self
    }
    /// Sets the generation bound.
    pub fn max_output_tokens(mut self, n: u32) -> Self {
        self.max_output_tokens = Some(n);
        self
    }
    /// Sets `thinking`.
    pub fn thinking(mut self, on: bool) -> Self {
        self.thinking = Some(on);
        self
    }
    /// Sets the sampling controls.
    pub fn sampling(mut self, s: Sampling) -> Self {
        self.sampling = s;
        self
    }
    /// Sets the per-request speculation override.
    pub fn speculation(mut self, s: impl Into<Speculation>) -> Self {
        self.speculation = Some(s.into());
        self
    }
    /// Sets the prefix-cache key.
    pub fn prompt_cache_key(mut self, k: impl Into<String>) -> Self {
        self.prompt_cache_key = Some(k.into());
        self
    }
    /// Adds a stop sequence.
    pub fn stop(mut self, s: impl Into<String>) -> Self {
        self.stop.push(s.into());
        self
    }
    /// Uses the prompt verbatim, without the chat template.
    pub fn raw(mut self) -> Self {
        self.raw_prompt = true;
        self
    }
    /// Sets which tool calls the reply may or must make.
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = choice;
        self
    }

    /// `false`: at most one tool call.
    pub fn parallel_tool_calls(mut self, parallel: bool) -> Self {
        self.parallel_tool_calls = Some(parallel);
        self
    }

    /// The tools shown to the model: none under `tool_choice: "none"`.
    pub fn offered_tools(&self) -> &[serde_json::Value] {
        if self.tool_choice == ToolChoice::None {
            &[]
        } else {
            &self.tools
        }
    }

    /// Sets the tools the model may call.
    pub fn tools(mut self, tools: Vec<serde_json::Value>) -> Self {
        self.tools = tools;
        self
    }
    /// Sets one extra chat-template variable.
    pub fn chat_template_kwarg(mut self, key: impl Into<String>, value: serde_json::Value) -> Self {
        self.chat_template_kwargs.insert(key.into(), value);
        self
    }

    /// Sets the shape the reply must take.
    pub fn response_format(mut self, f: ResponseFormat) -> Self {
        self.response_format = Some(f);
        self
    }

    /// Lets a runtime that cannot enforce the constraint ask for it in the prompt and check
    /// the reply (see [`GenerateRequest::prompted_fallback`]).
    pub fn prompted_fallback(mut self, allow: bool) -> Self {
        self.prompted_fallback = allow;
        self
    }

    /// The reply's constraint, when it has one (`text` is none).
    pub fn constraint(&self) -> Option<&ResponseFormat> {
        self.response_format.as_ref().filter(|f| f.is_constrained())
    }

    /// Refuses what only a runtime that reads the model's token-level output can honour
    /// (`logprobs`, `echo`, a token-id prompt), for the runtimes that cannot: never answered
    /// without them silently.
    ///
    /// ```
    /// use mtp_contract::GenerateRequest;
    /// assert!(GenerateRequest::new("hi").refuse_token_level("gguf").is_ok());
    /// let mut r = GenerateRequest::new("hi");
    /// r.logprobs = Some(2);
    /// assert!(r.refuse_token_level("gguf").unwrap_err().to_string().contains("log probabilities"));
    /// ```
    pub fn refuse_token_level(&self, provider: &str) -> Result<(), ProviderError> {
        let what = if self.logprobs.is_some() {
            "log probabilities (`logprobs`)"
        } else if self.echo {
            "the prompt's tokens (`echo`)"
        } else if self.prompt_token_ids.is_some() {
            "a prompt of token ids"
        } else {
            return Ok(());
        };
        Err(ProviderError::Unsupported {
            provider: provider.to_string(),
            what: format!("{what}: serve the model with the native provider"),
        })
    }

    /// Checks the request before any model work; the error names the field at fault.
    pub fn validate(&self) -> Result<(), ProviderError> {
        if let Some(f) = &self.response_format {
            f.validate()?;
        }
        if self.prompt_cache_key.is_some() && self.messages.is_none() {
            return Err(ProviderError::InvalidRequest {
                field: "messages",
                message: "a prompt_cache_key needs the complete history in `messages` each time \
                          (use an explicit empty list for a standalone prompt)"
                    .into(),
            });
        }
        if let Some(k) = &self.prompt_cache_key {
            if k.is_empty() {
                return Err(ProviderError::InvalidRequest {
                    field: "prompt_cache_key",
                    message: "must not be empty".into(),
                });
            }
            if k.len() > MAX_PROMPT_CACHE_KEY_BYTES {
                return Err(ProviderError::InvalidRequest {
                    field: "prompt_cache_key",
                    message: format!(
                        "is {} bytes, more than the {MAX_PROMPT_CACHE_KEY_BYTES} a key may have \
                         (a key names a conversation; hash a longer one)",
                        k.len()
                    ),
                });
            }
        }
        // (none at all, with `echo`: the prompt's log probabilities alone)
        if self.max_output_tokens == Some(0) && !self.echo {
            return Err(ProviderError::InvalidRequest {
                field: "max_output_tokens",
                message: "must be at least 1 (0 only with `echo`, for the prompt's log \
                          probabilities alone)"
                    .into(),
            });
        }
        if let Some(n) = self.logprobs.filter(|&n| n > crate::MAX_TOP_LOGPROBS) {
            return Err(ProviderError::InvalidRequest {
                field: "logprobs",
                message: format!(
                    "asks for {n} alternatives per token; at most {}",
                    crate::MAX_TOP_LOGPROBS
                ),
            });
        }
        if let Some(ids) = &self.prompt_token_ids {
            if !self.raw_prompt || !self.prompt.is_empty() || self.messages.is_some() {
                return Err(ProviderError::InvalidRequest {
                    field: "prompt",
                    message: "token ids are a raw prompt on their own: no text, no messages".into(),
                });
            }
            if ids.is_empty() {
                return Err(ProviderError::InvalidRequest {
                    field: "prompt",
                    message: "has no tokens".into(),
                });
            }
        }
        if let Some(i) = self.tools.iter().position(|t| !t.is_object()) {
            return Err(ProviderError::InvalidRequest {
                field: "tools",
                message: format!("tool {i} is not a JSON object (expected an OpenAI tool schema)"),
            });
        }
        match &self.tool_choice {
            ToolChoice::Required if self.tools.is_empty() => {
                return Err(ProviderError::InvalidRequest {
                    field: "tool_choice",
                    message: "\"required\" forces a tool call, but the request has no tools".into(),
                })
            }
            ToolChoice::Function(n) if !self.tools.iter().any(|t| tool_name(t) == Some(n)) => {
                let known: Vec<&str> = self.tools.iter().filter_map(tool_name).collect();
                return Err(ProviderError::InvalidRequest {
                    field: "tool_choice",
                    message: format!(
                        "names the function `{n}`, which is not among the request's tools ({})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                });
            }
            c if c.forces_a_call() && self.response_format.is_some() => {
                return Err(ProviderError::InvalidRequest {
                    field: "tool_choice",
                    message: "a forced tool call and `response_format` both constrain the whole \
                              reply; send one of them"
                        .into(),
                });
            }
            _ => {}
        }
        if let Some(k) = self
            .chat_template_kwargs
            .keys()
            .find(|k| RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()))
        {
            return Err(ProviderError::InvalidRequest {
                field: "chat_template_kwargs",
                message: format!(
                    "`{k}` is set by the request itself, not through chat_template_kwargs"
                ),
            });
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(ProviderError::InvalidRequest {
                field: "stop",
                message: "stop sequences must not be empty".into(),
            });
        }
        self.sampling.validate()
    }

    /// Bytes of text the request brings to its prompt: the prompt, the system prompt, each
    /// message's content, reasoning, tool calls and names, the tools and the template's
    /// arguments (images are not text and are not counted). A provider compares it with its
    /// context before tokenizing anything (see [`MAX_PROMPT_BYTES_PER_TOKEN`]).
    pub fn text_bytes(&self) -> usize {
        let json = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.len(),
            v => v.to_string().len(),
        };
        let messages: usize = self
            .messages
            .iter()
            .flatten()
            .map(|m| {
                m.content.len()
                    + m.reasoning_content.as_ref().map_or(0, String::len)
                    + m.name.as_ref().map_or(0, String::len)
                    + m.tool_call_id.as_ref().map_or(0, String::len)
                    + m.tool_calls
                        .iter()
                        .map(|c| c.function.name.len() + json(&c.function.arguments))
                        .sum::<usize>()
            })
            .sum();
        self.prompt.len()
            + self.system_prompt.as_ref().map_or(0, String::len)
            + messages
            + self.tools.iter().map(json).sum::<usize>()
            + self
                .chat_template_kwargs
                .iter()
                .map(|(k, v)| k.len() + json(v))
                .sum::<usize>()
    }

    /// True when the prompt or any message carries images.
    pub fn has_images(&self) -> bool {
        self.image_count() > 0
    }

    /// Images of the request, the history's first, then the prompt's.
    pub fn image_count(&self) -> usize {
        self.messages
            .iter()
            .flatten()
            .map(|m| m.images.len())
            .sum::<usize>()
            + self.images.len()
    }

    /// The images in the order the conversation shows them: each history message's, then the
    /// prompt's.
    pub fn all_images(&self) -> Vec<&str> {
        self.messages
            .iter()
            .flatten()
            .flat_map(|m| m.images.iter())
            .chain(&self.images)
            .map(String::as_str)
            .collect()
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End-of-sequence token or a stop sequence.
    Stop,
    /// `max_output_tokens` reached.
    Length,
    /// The caller cancelled (dropped the stream).
    Cancelled,
    /// The stream broke off; the content is partial.
    Error,
    /// The reply ended with tool calls for the caller to run (OpenAI's `tool_calls`).
    ToolCalls,
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (including cached ones).
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from a prefix cache.
    pub cached_input_tokens: u64,
}

/// `response.metadata`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// What happened about speculation.
    pub speculation: SpeculationReport,
    /// Timing figures.
    pub timings: Timings,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateResponse {
    /// Generated text (the answer; a thinking model's reasoning is in `reasoning_content`).
    pub content: String,
    /// What a thinking model wrote between its reasoning tags, split from `content` as
    /// llama-server's and vLLM's reasoning parsers do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Generated token ids, when the runtime knows them.
    pub token_ids: Option<Vec<u32>>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Speculation report and timings.
    pub metadata: Metadata,
    /// True when the content is incomplete because the transport broke off.
    #[serde(default)]
    pub partial: bool,
    /// What the caller should know about how this call ran that the other fields do not say,
    /// e.g. that the reply stopped at the model's context length rather than at
    /// `max_output_tokens`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The tool calls the reply made (their `function.arguments` a JSON object as a string,
    /// as OpenAI sends them), parsed from the model's text in its template's format or
    /// passed on from the server that parsed them; the text around them is `content`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The request's stop sequence that ended the reply (`finish_reason` is then `stop`), when
    /// the runtime knows which one did: Anthropic's `stop_sequence`, llama-server's
    /// `stopping_word`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
    /// Each generated token's log probability, when the request asked for them
    /// ([`GenerateRequest::logprobs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// The prompt's tokens with their log probabilities, when the request asked for them
    /// ([`GenerateRequest::echo`]); the first has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
}

/// A piece of a tool call as it streams (OpenAI's `delta.tool_calls[i]`): the first piece of
/// call `index` carries its `id` and `name` (and `arguments` empty or a first fragment),
/// later pieces more argument text; a call's fragments joined are its `arguments`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call of the reply (0, 1, …).
    pub index: usize,
    /// The call's id, on its first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The function's name, on its first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Argument text.
    #[serde(default)]
    pub arguments: String,
}

/// How far a runtime has got through a request's prompt: llama-server's `prompt_progress`
/// (the same fields, which its clients already read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptProgress {
    /// The prompt's tokens.
    pub total: usize,
    /// Of them, the tokens taken from a prefix cache rather than computed.
    pub cache: usize,
    /// Tokens in the model so far, `cache` included (`total` when the prompt is in).
    pub processed: usize,
    /// Milliseconds since the prompt's computation began.
    pub time_ms: u64,
}

impl PromptProgress {
    /// The share of the tokens to compute that are computed (1 when there were none).
    pub fn fraction(&self) -> f64 {
        let todo = self.total.saturating_sub(self.cache);
        if todo == 0 {
            return 1.0;
        }
        self.processed.saturating_sub(self.cache).min(todo) as f64 / todo as f64
    }
}

/// One item of a streamed generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// Newly accepted text (several tokens per round when speculating).
    Delta {
        /// The answer's new text.
        text: String,
        /// Its token ids, when known.
        token_ids: Vec<u32>,
        /// New reasoning text of a thinking model (streamed before the answer).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reasoning: String,
        /// The log probabilities of `token_ids`, when the request asked for them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<TokenLogprob>,
    },
    /// A piece of a tool call, as the reply generates it (never raw markup in a `Delta`).
    ToolCall(ToolCallDelta),
    /// How far the runtime has got through the prompt, before the first token: one when it
    /// starts (with what came from its prefix cache), then as parts of a long prompt are
    /// computed, then when the whole prompt is in. A runtime that cannot tell sends none.
    PromptProgress(PromptProgress),
    /// The final response (content is the whole text).
    Done(Box<GenerateResponse>),
}

/// The bytes of one image of a request and the name errors give it (a path, or
/// `image N (data URL)`): what a runtime reads an image reference into before its vision
/// tower takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// A path, or `image N (data URL)`.
    pub name: String,
    /// The file's bytes (PNG, JPEG, WebP, ...).
    pub bytes: std::sync::Arc<[u8]>,
}

/// Where a generation reports its prompt's progress: called on the thread that computes the
/// prompt, when it starts (with the tokens resumed), after each part of a long prompt and when
/// the prompt is in, so it must return at once.
#[derive(Clone)]
pub struct ProgressSink(std::sync::Arc<dyn Fn(crate::PromptProgress) + Send + Sync>);

impl ProgressSink {
    /// A sink calling `f` with each report.
    pub fn new(f: impl Fn(crate::PromptProgress) + Send + Sync + 'static) -> Self {
        ProgressSink(std::sync::Arc::new(f))
    }

    /// Tells the sink of `p`.
    pub fn report(&self, p: crate::PromptProgress) {
        (self.0)(p)
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}
