//! Requests and responses shared by every provider.

use serde::{Deserialize, Serialize};

use crate::error::ProviderError;
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

/// One message of a conversation history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// The text.
    pub content: String,
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
}

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
    /// The complete history before `prompt`.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    /// A system prompt placed before the history.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Upper bound on generated tokens.
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
}

impl GenerateRequest {
    /// A request with a prompt and defaults everywhere else.
    pub fn new(prompt: impl Into<String>) -> Self {
        GenerateRequest {
            prompt: prompt.into(),
            ..Default::default()
        }
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

    /// Checks the request before any model work; the error names the field at fault.
    pub fn validate(&self) -> Result<(), ProviderError> {
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
        }
        if self.max_output_tokens == Some(0) {
            return Err(ProviderError::InvalidRequest {
                field: "max_output_tokens",
                message: "must be at least 1".into(),
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

    /// True when any message carries images.
    pub fn has_images(&self) -> bool {
        self.messages
            .as_ref()
            .is_some_and(|m| m.iter().any(|m| !m.images.is_empty()))
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
    /// Generated text.
    pub content: String,
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
}

/// One item of a streamed generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// Newly accepted text (several tokens per round when speculating).
    Delta {
        /// The text.
        text: String,
        /// Its token ids, when known.
        token_ids: Vec<u32>,
    },
    /// The final response (content is the whole text).
    Done(Box<GenerateResponse>),
}
