//! # mtp-contract
//!
//! The shared vocabulary of the `mtp` workspace: the `speculation` request block and its
//! validation, the per-request override rules, the response's speculation report, the typed
//! errors, and the [`Provider`] trait every runtime implements. It does no I/O and has no
//! heavy dependencies.
//!
//! ```
//! use mtp_contract::{DepthSource, GenerateRequest, Speculation, plan, Lane, Plan, Sampling};
//!
//! // A provider default of depth 3, and one request that asks for depth 5.
//! let default = Speculation::native_mtp().with_num_draft_tokens(3).unwrap();
//! let req = GenerateRequest::new("Write a small LRU cache.")
//!     .speculation(Speculation::depth(5).unwrap());
//! let lane = Lane::Ready {
//!     drafter: "embedded".into(),
//!     default_depth: 2,
//!     depth_source: DepthSource::Registry,
//!     output_preserving: Some(true),
//! };
//! match plan(Some(&default), req.speculation.as_ref(), &req.sampling, &lane).unwrap() {
//!     Plan::Speculate { depth, depth_source, .. } => {
//!         assert_eq!((depth, depth_source), (5, DepthSource::Request))
//!     }
//!     Plan::TargetOnly { .. } => unreachable!(),
//! }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod cancel;
mod error;
mod extra;
mod format;
mod kind;
mod kv;
mod logprob;
mod provider;
mod reason;
mod report;
mod request;
mod sampling;
mod speculation;

pub use cancel::{Cancel, Idle, Lease};
pub use error::ProviderError;
pub use extra::{parse_flag, Extra, IntRange, OptionError, FLAG_SPELLINGS, MIN_CTX_SIZE};
pub use format::{json_kind, JsonSchemaFormat, ResponseFormat, MAX_CONSTRAINT_BYTES};
pub use kind::ProviderKind;
pub use kv::KvType;
pub use logprob::{TokenLogprob, TokenizerInfo, TopLogprob, Vocabulary, MAX_TOP_LOGPROBS};
pub use provider::{
    check_depth, plan, sampling_is_speculation_compatible, Capabilities, EventStream, Lane, Plan,
    Provider, ProviderOptions, RenderedText, SpeculationStatus,
};
pub use reason::Reason;
pub use report::{DraftKind, DraftStats, SpeculationReport, Timings};
pub use request::{
    tool_name, FinishReason, FunctionCall, GenerateRequest, GenerateResponse, ImageInput, ImageRef,
    Message, Metadata, ProgressSink, PromptProgress, Role, StreamEvent, ToolCall, ToolCallDelta,
    ToolChoice, Usage, MAX_PROMPT_BYTES_PER_TOKEN, MAX_PROMPT_CACHE_KEY_BYTES,
    RESERVED_TEMPLATE_VARIABLES,
};
pub use sampling::Sampling;
pub use speculation::{
    resolve, DepthSource, DraftDepth, ResolvedSpeculation, Source, Speculation, SpeculationError,
    SpeculationMode, AUTO_MAX_DRAFT_TOKENS, BUILTIN_DEPTH, TESTED_MAX_DRAFT_TOKENS, VALID_KEYS,
};
