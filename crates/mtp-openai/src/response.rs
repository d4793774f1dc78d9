//! The answer of the completion endpoints: a whole answer, a stream chunk, or llama-server's
//! native `/completion` object, with the fields llama-server (`timings`), vLLM (`metrics`),
//! LM Studio (`stats`) and mtp (`speculation`, `warnings`) add.
//!
//! A client reads what a server sends: every field is read with [`crate::field::lenient`] or
//! one of its relatives, so a field of the wrong type reads as absent instead of failing the
//! object, and unknown fields land in `extra`. Tool calls are the exception: they are
//! [`Field`]s, so a malformed call is reported naming where it is
//! ([`crate::ToolCall`]).

use mtp_contract::{FinishReason, GenerateResponse, SpeculationReport};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::{amount, count, counts_or_zero, integers, lenient, nullable, present, Field};
use crate::{ChatMessage, ErrorDetail, ToolCall};

/// One object of a completion answer: a whole chat or text completion (`chat.completion`,
/// `text_completion`), a stream chunk (`chat.completion.chunk`), or llama-server's native
/// `/completion` object (whole, or one event of its stream). Which fields are set says which;
/// fields are written in declaration order, which is each shape's order (`id`, `object`,
/// `created`, `model`, `choices`, `usage`, then the extensions; the native object starts with
/// `content`).
///
/// ```
/// use mtp_openai::Completion;
/// let chunk: Completion = serde_json::from_str(r#"{"id": "c1", "object": "chat.completion.chunk",
///     "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}],
///     "usage": null, "system_fingerprint": "fp"}"#).unwrap();
/// assert_eq!(chunk.first_choice().and_then(|c| c.delta.as_ref()?.content.as_deref()), Some("Hi"));
/// assert_eq!(chunk.usage, Some(None));
/// assert!(chunk.extra.contains_key("system_fingerprint"));
/// // a field of the wrong type is not a reason to refuse the rest
/// let odd: Completion = serde_json::from_str(r#"{"usage": "lots", "content": "x"}"#).unwrap();
/// assert_eq!((odd.usage, odd.content.as_deref()), (None, Some("x")));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// llama-server native: the text (of this event, when streamed).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub content: Option<String>,
    /// The completion's id (`chatcmpl-…`, `cmpl-…`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub id: Option<String>,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub object: Option<String>,
    /// Unix seconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub created: Option<u64>,
    /// The model that answered.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub model: Option<String>,
    /// The choices (one here; an empty list in the last chunk of a stream with usage).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub choices: Option<Vec<Field<Choice>>>,
    /// llama-server native: `true` on the last object.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub stop: Option<bool>,
    /// llama-server native: `eos`, `limit`, `word` or `none`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub stop_type: Option<String>,
    /// llama-server native: the stop string that ended the reply.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub stopping_word: Option<String>,
    /// llama-server native: tokens generated.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub tokens_predicted: Option<u64>,
    /// llama-server native: prompt tokens (the whole prompt).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub tokens_evaluated: Option<u64>,
    /// llama-server native: the prompt was cut to fit.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub truncated: Option<bool>,
    /// Token counts; `Some(None)` is an explicit `null` (every chunk but the last under
    /// `stream_options.include_usage`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "nullable"
    )]
    pub usage: Option<Option<Usage>>,
    /// llama-server's `prompt_progress` (a streamed chunk with no choices, under
    /// `return_progress`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub prompt_progress: Option<mtp_contract::PromptProgress>,
    /// llama-server's timings (with its draft counts).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub timings: Option<Timings>,
    /// mtp's speculation report.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub speculation: Option<SpeculationReport>,
    /// mtp's warnings about how the call ran.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub warnings: Option<Vec<String>>,
    /// llama-server native (`return_tokens`): the token ids; entries that are not
    /// non-negative integers are dropped when read.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "integers"
    )]
    pub tokens: Option<Vec<u64>>,
    /// LM Studio's `stats` (timings, draft counters).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub stats: Option<LmStudioStats>,
    /// vLLM's per-request `metrics`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub metrics: Option<ServerMetrics>,
    /// An error sent in place of (or in the middle of) an answer; present when the key is,
    /// whatever it holds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub error: Option<Field<ErrorDetail>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Completion {
    /// `choices[0]`, when there is one: `Some(empty choice)` when it is not an object.
    pub fn first_choice(&self) -> Option<&Choice> {
        static EMPTY: std::sync::OnceLock<Choice> = std::sync::OnceLock::new();
        let first = self.choices.as_ref()?.first()?;
        Some(
            first
                .ok()
                .unwrap_or_else(|| EMPTY.get_or_init(Choice::default)),
        )
    }

    /// The message of the error the server sent: its `message`, a string sent as the error,
    /// or the JSON as sent.
    pub fn error_message(&self) -> Option<String> {
        Some(match self.error.as_ref()? {
            Field::Ok(e) => e.message.clone(),
            Field::Invalid {
                value: Value::String(s),
                ..
            } => s.clone(),
            Field::Invalid { value, .. } => value.to_string(),
        })
    }
}

/// One choice: a whole chat answer's `message`, a chunk's `delta`, or a text completion's
/// `text`. `finish_reason` is always written (`null` until the end).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// The choice's index (0).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub index: Option<u64>,
    /// A whole chat answer.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub message: Option<ChatMessage>,
    /// A chunk's new text, reasoning or tool-call pieces.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub delta: Option<Delta>,
    /// A text completion's text.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub text: Option<String>,
    /// A text completion's `logprobs` (`Some(None)`: the `null` this server sends).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "nullable"
    )]
    pub logprobs: Option<Option<Value>>,
    /// Why the reply ended, in the server's spelling (`stop`, `length`, `tool_calls`, ...).
    #[serde(default, deserialize_with = "lenient")]
    pub finish_reason: Option<String>,
    /// Every other field, as sent (vLLM's `stop_reason`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A chunk's `delta`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// `assistant`, on the first chunk.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub role: Option<String>,
    /// New reasoning text (llama-server, vLLM, LM Studio).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub reasoning_content: Option<String>,
    /// New answer text.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub content: Option<String>,
    /// Pieces of tool calls (kept as sent when malformed, to be reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Field<Vec<Field<ToolCall>>>>,
    /// New reasoning text as Ollama's OpenAI endpoint names it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub reasoning: Option<String>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `usage`: OpenAI's token counts, with LM Studio's draft counters where it puts them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (cached ones included).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub prompt_tokens: Option<u64>,
    /// Generated tokens.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub completion_tokens: Option<u64>,
    /// Their sum.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub total_tokens: Option<u64>,
    /// `cached_tokens`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// LM Studio: proposals made.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub total_draft_tokens_count: Option<u64>,
    /// LM Studio: proposals accepted.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub accepted_draft_tokens_count: Option<u64>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Usage {
    /// The contract's counts in OpenAI's shape.
    ///
    /// ```
    /// let u = mtp_openai::Usage::of(&mtp_contract::Usage {
    ///     input_tokens: 5, output_tokens: 2, cached_input_tokens: 1 });
    /// assert_eq!(serde_json::to_string(&u).unwrap(), r#"{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":1}}"#);
    /// ```
    pub fn of(u: &mtp_contract::Usage) -> Usage {
        Usage {
            prompt_tokens: Some(u.input_tokens),
            completion_tokens: Some(u.output_tokens),
            total_tokens: Some(u.input_tokens + u.output_tokens),
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: Some(u.cached_input_tokens),
                extra: Map::new(),
            }),
            ..Default::default()
        }
    }

    /// `prompt_tokens_details.cached_tokens`.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.prompt_tokens_details.as_ref()?.cached_tokens
    }
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from a prefix cache.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub cached_tokens: Option<u64>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// llama-server's `timings` (what its clients, and mtp's llama-server adapter, read): prompt
/// and predicted counts and rates, and `draft_n` / `draft_n_accepted`, which llama-server
/// writes only when drafting proposed something.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Prompt tokens reused from the cache.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub cache_n: Option<u64>,
    /// Prompt tokens computed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub prompt_n: Option<u64>,
    /// Prompt milliseconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "amount"
    )]
    pub prompt_ms: Option<f64>,
    /// Prompt tokens per second.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "amount"
    )]
    pub prompt_per_second: Option<f64>,
    /// Tokens generated.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub predicted_n: Option<u64>,
    /// Generation milliseconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "amount"
    )]
    pub predicted_ms: Option<f64>,
    /// Generated tokens per second.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "amount"
    )]
    pub predicted_per_second: Option<f64>,
    /// Proposals made.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub draft_n: Option<u64>,
    /// Proposals accepted.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub draft_n_accepted: Option<u64>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Timings {
    /// llama-server's timings of a contract response: `cache_n` and `prompt_n` from the
    /// usage, the rates that are known, and the draft counts when drafting ran.
    ///
    /// ```
    /// let mut r: mtp_contract::GenerateResponse = serde_json::from_value(serde_json::json!({
    ///     "content": "x", "token_ids": null, "finish_reason": "stop",
    ///     "usage": {"input_tokens": 5, "output_tokens": 2, "cached_input_tokens": 1},
    ///     "metadata": {"speculation": {"requested": false, "mode": "off", "used": false,
    ///         "drafter": null, "num_draft_tokens": null, "runtime": "t", "draft_kind": null,
    ///         "drafted": 4, "accepted": null, "rounds": null, "acceptance_rate": null,
    ///         "accepted_per_position": null, "output_preserving": null, "reason": null,
    ///         "message": null},
    ///     "timings": {"decode_ms": 10.0}}})).unwrap();
    /// let t = mtp_openai::Timings::of(&r);
    /// assert_eq!(serde_json::to_string(&t).unwrap(),
    ///     r#"{"cache_n":1,"prompt_n":4,"predicted_n":2,"predicted_ms":10.0,"draft_n":4,"draft_n_accepted":0}"#);
    /// ```
    pub fn of(r: &GenerateResponse) -> Timings {
        let t = &r.metadata.timings;
        let s = &r.metadata.speculation;
        Timings {
            cache_n: Some(r.usage.cached_input_tokens),
            prompt_n: Some(
                r.usage
                    .input_tokens
                    .saturating_sub(r.usage.cached_input_tokens),
            ),
            prompt_ms: t.prefill_ms,
            prompt_per_second: t.prefill_tokens_per_s,
            predicted_n: Some(r.usage.output_tokens),
            predicted_ms: t.decode_ms,
            predicted_per_second: t.decode_tokens_per_s,
            draft_n: s.drafted,
            draft_n_accepted: s.drafted.map(|_| s.accepted.unwrap_or(0)),
            extra: Map::new(),
        }
    }
}

/// LM Studio's `stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LmStudioStats {
    /// Why the reply ended (`eosFound`, `maxPredictedTokensReached`, ...).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub stop_reason: Option<String>,
    /// Seconds to the first token.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "amount"
    )]
    pub time_to_first_token: Option<f64>,
    /// Seconds of generation.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "amount"
    )]
    pub generation_time: Option<f64>,
    /// Generated tokens per second.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "amount"
    )]
    pub tokens_per_second: Option<f64>,
    /// Proposals made.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub total_draft_tokens_count: Option<u64>,
    /// Proposals accepted.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub accepted_draft_tokens_count: Option<u64>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// vLLM's per-request `metrics` (`--enable-per-request-metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerMetrics {
    /// `--per-request-spec-decode-metrics`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub speculative_decoding: Option<SpecDecodeMetrics>,
    /// Every other field, as sent (timings).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// vLLM's `metrics.speculative_decoding`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecDecodeMetrics {
    /// Proposals made.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub num_draft_tokens: Option<u64>,
    /// Proposals accepted.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub num_accepted_draft_tokens: Option<u64>,
    /// Verify steps.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub num_spec_steps: Option<u64>,
    /// Proposals per step.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count"
    )]
    pub num_spec_tokens: Option<u64>,
    /// `acceptance_histogram[j]`: steps that accepted exactly `j` proposals (an entry that is
    /// not a count reads as 0).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "counts_or_zero"
    )]
    pub acceptance_histogram: Option<Vec<u64>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// OpenAI's `finish_reason` for the contract's.
///
/// ```
/// use mtp_contract::FinishReason;
/// assert_eq!(mtp_openai::finish_reason(FinishReason::ToolCalls), "tool_calls");
/// assert_eq!(mtp_openai::finish_reason(FinishReason::Cancelled), "abort");
/// ```
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        // a stream that broke off or was cancelled: OpenAI has no code; vLLM says "abort"
        FinishReason::Cancelled | FinishReason::Error => "abort",
    }
}

/// The contract's finish reason for every server's spelling: OpenAI's, llama-server's native
/// `stop_type` (`eos`, `word`, `limit`), LM Studio's `stop_reason`, vLLM's `abort`.
///
/// ```
/// use mtp_contract::FinishReason;
/// assert_eq!(mtp_openai::read_finish_reason("limit"), FinishReason::Length);
/// assert_eq!(mtp_openai::read_finish_reason("eosFound"), FinishReason::Stop);
/// ```
pub fn read_finish_reason(s: &str) -> FinishReason {
    match s {
        "length" | "limit" | "maxPredictedTokensReached" | "max_tokens" => FinishReason::Length,
        "tool_calls" => FinishReason::ToolCalls,
        "error" => FinishReason::Error,
        "cancelled" | "userStopped" | "abort" => FinishReason::Cancelled,
        _ => FinishReason::Stop,
    }
}

/// llama-server's `stop_type` for a finish reason (`eos` also for a stop string: the answer
/// does not say which ended it).
pub fn stop_type(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::ToolCalls => "eos",
        FinishReason::Length => "limit",
        FinishReason::Cancelled | FinishReason::Error => "none",
    }
}
