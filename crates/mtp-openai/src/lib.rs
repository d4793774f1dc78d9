//! # mtp-openai
//!
//! The OpenAI-style wire protocol, typed once for both ends of it: `mtp serve` reads requests
//! and writes answers with these types (crate `mtp-server`), and the HTTP runtimes write
//! requests and read answers of llama-server, vLLM, LM Studio and Ollama with the same types
//! (crate `mtp-runtimes`).
//!
//! - [`ChatCompletionRequest`]: the body of the chat and text completion endpoints (messages
//!   with text and image parts, tools, `tool_choice`, `response_format` and the other
//!   constraint fields, sampling, `stream` / `stream_options`, the `speculation` block);
//! - [`Completion`]: a whole answer, a stream chunk or llama-server's native object, with
//!   [`Choice`], [`Delta`], [`ToolCall`], [`Usage`], llama-server's [`Timings`] and the
//!   speculation report;
//! - [`ErrorBody`], [`ModelList`], [`Health`], and llama-server's [`Props`] and [`Slot`];
//! - [`anthropic`]: Anthropic's Messages API (the request with its content blocks, tools,
//!   `tool_choice` and `thinking`; the answer, its stream events and errors), which `mtp serve`
//!   also speaks for Claude Code and the `anthropic` SDKs;
//! - [`responses`]: OpenAI's Responses API (the request with its input items, flat function
//!   tools, `text.format` and `reasoning`; the response object and its stream events), for
//!   Codex CLI, the `openai-agents` SDK and `client.responses`.
//!
//! ## Strict and tolerant readings of the same types
//!
//! The server answers a bad request field with a 400 naming it; a client ignores the fields
//! of an answer it cannot use. So no type here refuses a whole object over one field:
//! request fields are [`Field`]s (a wrong value is kept, and the server's validation names
//! it), answer fields are read leniently (a wrong value reads as absent), and unknown fields
//! land in each type's `extra` map. Refusing is the reader's decision, not the type's.
//!
//! Fields are written in the order they are declared, which keeps the byte layout the server
//! and the runtimes have always sent; numbers are `u64` and `f64`, written as serde_json
//! writes them.
//!
//! ```
//! use mtp_openai::{ChatCompletionRequest, Completion};
//! let req: ChatCompletionRequest = serde_json::from_str(
//!     r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}"#).unwrap();
//! assert!(req.max_tokens.unwrap().invalid().is_some()); // the server's 400 names it
//! let answer: Completion = serde_json::from_str(
//!     r#"{"choices": [{"message": {"role": "assistant", "content": "hello"}}], "usage": 5}"#).unwrap();
//! assert_eq!(answer.first_choice().unwrap().message.as_ref().unwrap().content_text(), Some("hello"));
//! assert_eq!(answer.usage, None); // the client reads on
//! ```
//!
//! **Never**: I/O, or a panic on what a peer sent. Depends on serde, serde_json and
//! mtp-contract only (whose `ResponseFormat`, `Speculation`, `ToolChoice` and reports are
//! read and written here as they are).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod anthropic;
mod error;
pub mod field;
mod llama;
mod logprobs;
mod request;
mod response;
pub mod responses;
mod service;
mod tool;

pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use field::Field;
pub use llama::{GenerationSettings, Props, Slot, SpeculativeParams, SpeculativeTypes};
pub use logprobs::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, LogprobsParam,
    LOGPROB_FLOOR,
};
pub use request::{
    ChatCompletionRequest, ChatMessage, Content, ContentPart, ImageUrl, LogitBias,
    OpenAiToolChoice, Prompt, Stop, StreamOptions, StructuredOutputs,
};
pub use response::{
    finish_reason, read_finish_reason, stop_type, Choice, Completion, Delta, LmStudioStats,
    PromptTokensDetails, ServerMetrics, SpecDecodeMetrics, Timings, Usage,
};
pub use service::{Health, Model, ModelList};
pub use tool::{FunctionCall, ToolCall};
