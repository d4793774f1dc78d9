//! # mtp-chat
//!
//! Chat for every provider of the workspace, in one place:
//!
//! - [`ChatTemplate`]: a model's Jinja chat template rendered exactly as Hugging Face
//!   transformers' `apply_chat_template` renders it (jinja2's sandbox settings, transformers'
//!   `tojson`, `raise_exception`, `strftime_now`, Python's string methods and spellings), so
//!   the prompt is byte for byte what the model was trained on. Tested against transformers on
//!   the 72 published templates that llama.cpp b11434 ships (`tests/templates/`).
//! - [`ChatTemplates`]: a checkpoint's templates and special tokens, found where transformers
//!   finds them (`chat_template.jinja`, `tokenizer_config.json`, `chat_template.json`).
//! - [`ChatTemplates::render_request`]: a [`GenerateRequest`](mtp_contract::GenerateRequest)
//!   (system prompt, history with reasoning and tool calls, tools, `thinking`) to prompt text.
//! - [`ChatTemplates::render_guarded`]: the same, with special-token strings written in the
//!   request's own text kept as text (where they are in the prompt, for the tokenizer), so a
//!   message cannot forge the template's turns.
//! - [`ReplyText`]: the reply as it streams in, cut at stop strings and split into reasoning
//!   and answer (`<think>…</think>`), with work per piece independent of the text so far.
//! - [`toolcall`]: the reply's tool calls in the template's own markup (Qwen3.5's XML, Hermes
//!   JSON) as OpenAI `tool_calls`, whole or streamed, and the grammar that forces them.
//!
//! ```
//! use mtp_chat::{ChatTemplate, ChatTemplates};
//! use mtp_contract::GenerateRequest;
//!
//! let qwen = ChatTemplate::new(
//!     "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}\
//!      <|im_end|>\n{% endfor %}\
//!      {%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
//!     "example",
//! )
//! .unwrap();
//! let templates = ChatTemplates::single(qwen, Default::default());
//! let prompt = templates
//!     .render_request(&GenerateRequest::new("Hi").system_prompt("Be brief."))
//!     .unwrap();
//! assert_eq!(
//!     prompt.text,
//!     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
//!      <|im_start|>assistant\n<think>\n"
//! );
//! assert!(prompt.reasoning.unwrap().opened); // the reply starts inside <think>
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod checkpoint;
mod conversation;
mod literal;
mod pyfmt;
mod stream;
mod template;
pub mod toolcall;

pub use checkpoint::{token_string, ChatTemplates, CheckpointError, SPECIAL_TOKEN_KEYS};
pub use conversation::{
    conversation, template_message, tool_decoding, ChatError, Prompt, ReasoningStart, ReplyText,
    ToolDecoding,
};
pub use literal::{GuardedPrompt, SpecialStrings};
pub use stream::{ReasoningParser, Split, StopScanner, ThinkTags};
pub use template::{
    normalize_messages, ChatTemplate, Clock, RenderInput, TemplateError, MAX_RENDERED_BYTES,
};
pub use toolcall::{
    call_grammar, parse as parse_tool_calls, CallIds, Forced, ParsedReply, StreamEvent, ToolCall,
    ToolCallError, ToolCallFormat, ToolCallStream,
};
