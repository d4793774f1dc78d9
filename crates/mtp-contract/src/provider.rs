//! The seam between the facade and every runtime: the [`Provider`] trait, its construction
//! options, and the one function that decides whether a call speculates.

use std::collections::BTreeMap;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::error::ProviderError;
use crate::extra::OptionError;
use crate::logprob::Vocabulary;
use crate::reason::Reason;
use crate::report::{DraftStats, SpeculationReport};
use crate::request::{GenerateRequest, GenerateResponse, StreamEvent};
use crate::sampling::Sampling;
use crate::speculation::{resolve, DepthSource, ResolvedSpeculation, Speculation, SpeculationMode};

/// Options given to `create_llm` (the facade) and passed to a provider factory.
///
/// ```
/// use mtp_contract::{ProviderOptions, Speculation};
/// let o = ProviderOptions::default().speculation(Speculation::native_mtp());
/// assert!(o.speculation.is_some());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProviderOptions {
    /// Provider-level speculation default.
    #[serde(default)]
    pub speculation: Option<Speculation>,
    /// Base URL of an HTTP runtime.
    #[serde(default)]
    pub base_url: Option<String>,
    /// API key of an HTTP runtime (never logged).
    #[serde(default, skip_serializing)]
    pub api_key: Option<String>,
    /// Provider-specific settings (e.g. `device`, `prompt_cache_bytes`), as strings; each
    /// provider reads them with [`Extra`](crate::Extra), one rule per kind of value.
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

impl ProviderOptions {
    /// Sets the speculation default.
    pub fn speculation(mut self, s: impl Into<Speculation>) -> Self {
        self.speculation = Some(s.into());
        self
    }
    /// Sets the base URL.
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }
    /// Sets the API key.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }
    /// Sets a provider-specific option.
    pub fn extra(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra.insert(key.into(), value.into());
        self
    }
    /// For a provider given its own options typed (`typed` names their type): an `extra`
    /// string beside them would be ignored, so any is an [`OptionError::BesideTyped`] naming
    /// it.
    ///
    /// ```
    /// use mtp_contract::ProviderOptions;
    /// assert!(ProviderOptions::default().refuse_extra("GgufOptions").is_ok());
    /// let e = ProviderOptions::default().extra("threads", "2").refuse_extra("GgufOptions");
    /// assert!(e.unwrap_err().to_string().contains("`threads`"));
    /// ```
    pub fn refuse_extra(&self, typed: &str) -> Result<(), ProviderError> {
        match self.extra.keys().next() {
            Some(k) => Err(OptionError::BesideTyped {
                key: k.clone(),
                typed: typed.to_string(),
            }
            .into()),
            None => Ok(()),
        }
    }
}

/// What a runtime can do with its loaded model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Provider name (`native`, `llama-server`, …).
    pub provider: String,
    /// What executes (`mtp-engine-cpu`, `llama.cpp b11434`, …).
    pub runtime: String,
    /// Streams tokens.
    pub streaming: bool,
    /// Reuses prompt prefixes under `prompt_cache_key`.
    pub prompt_cache: bool,
    /// Accepts image input.
    pub images: bool,
    /// Speculation can be switched per request (false for servers configured at launch).
    pub per_request_speculation: bool,
}

/// Whether an MTP lane is loaded, as `/speculation` in the REPL shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeculationStatus {
    /// An MTP drafter is loaded (or the server shows one).
    pub lane_loaded: bool,
    /// The drafter (repo id, path, or `embedded`).
    pub drafter: Option<String>,
    /// The default depth.
    pub num_draft_tokens: Option<u32>,
    /// The provider default's mode.
    pub default_mode: SpeculationMode,
    /// Why no lane is loaded.
    pub reason: Option<Reason>,
    /// A sentence for the person.
    pub message: Option<String>,
    /// Whether greedy output is known to be preserved.
    pub output_preserving: Option<bool>,
    /// The default depth is chosen each round (`num_draft_tokens: "auto"`), up to
    /// `num_draft_tokens`.
    #[serde(default)]
    pub auto_depth: bool,
}

impl SpeculationStatus {
    /// The default depth in words: `3`, `auto (up to 8)`, or `None` when not reported.
    pub fn depth_phrase(&self) -> Option<String> {
        let n = self.num_draft_tokens?;
        Some(if self.auto_depth {
            format!("auto (up to {n})")
        } else {
            n.to_string()
        })
    }
}

/// What a runtime knows about its drafter before a call: the input of [`plan`].
#[derive(Debug, Clone, PartialEq)]
pub enum Lane {
    /// A drafter is ready.
    Ready {
        /// Its name for reports.
        drafter: String,
        /// The depth to use when the request names none.
        default_depth: u32,
        /// Where `default_depth` came from: the drafter's config, the registry, or built in.
        depth_source: DepthSource,
        /// Whether greedy output is known to be preserved.
        output_preserving: Option<bool>,
    },
    /// No drafter can run, for this reason.
    Unavailable {
        /// The named reason.
        reason: Reason,
        /// What to do next.
        message: String,
    },
}

/// The decision for one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Speculate with this drafter and depth.
    Speculate {
        /// The resolved settings.
        resolved: ResolvedSpeculation,
        /// The drafter's report name.
        drafter: String,
        /// Proposals per round.
        depth: u32,
        /// Which level decided `depth`.
        depth_source: DepthSource,
        /// Known output preservation.
        output_preserving: Option<bool>,
    },
    /// Run target-only and report why.
    TargetOnly {
        /// The resolved settings.
        resolved: ResolvedSpeculation,
        /// The named reason.
        reason: Reason,
        /// The sentence for the report.
        message: String,
    },
}

impl Plan {
    /// The report for a target-only plan, or `None` for a speculative one (whose report is
    /// built from its statistics with [`SpeculationReport::used`]).
    pub fn target_only_report(&self, runtime: &str) -> Option<SpeculationReport> {
        match self {
            Plan::TargetOnly {
                resolved,
                reason,
                message,
            } => Some(SpeculationReport::not_used(
                resolved,
                runtime,
                *reason,
                Some(message.clone()),
            )),
            Plan::Speculate { .. } => None,
        }
    }

    /// The call's report once it has run: from the draft statistics when the plan speculated,
    /// else the target-only report with the plan's reason.
    pub fn report(&self, runtime: &str, stats: &DraftStats) -> SpeculationReport {
        match self {
            Plan::Speculate {
                resolved,
                drafter,
                depth,
                depth_source,
                output_preserving,
            } => SpeculationReport::used(
                resolved,
                runtime,
                drafter.clone(),
                *depth,
                stats,
                *output_preserving,
            )
            .with_depth_source(*depth_source),
            Plan::TargetOnly {
                resolved,
                reason,
                message,
            } => SpeculationReport::not_used(resolved, runtime, *reason, Some(message.clone())),
        }
    }
}

/// Decides, before any generation, whether a call speculates. Every in-process provider calls
/// this one function so the rules live in one place:
///
/// 1. speculation not requested → target-only, `disabled_by_request` / `disabled_by_default`;
/// 2. the lane is unavailable → target-only with the lane's reason, or
///    `SpeculationUnavailable` when `require_acceleration`;
/// 3. a drafter named in a block that is not the loaded one → target-only with
///    `drafter_not_loaded`, or `SpeculationUnavailable` when `require_acceleration`;
/// 4. penalties or logit bias → target-only with `sampling_requires_target_only`, or
///    `SpeculationUnavailable` when `require_acceleration`;
/// 5. otherwise speculate at the request's depth, else the provider's, else the lane default
///    (the drafter's config, the registry, or built in: [`DepthSource`]).
///
/// ```
/// use mtp_contract::{plan, DepthSource, Lane, Plan, Reason, Sampling, Speculation};
/// let lane = Lane::Ready { drafter: "embedded".into(), default_depth: 3, depth_source: DepthSource::BuiltIn, output_preserving: Some(true) };
/// let p = plan(Some(&Speculation::native_mtp()), None, &Sampling::default(), &lane).unwrap();
/// assert!(matches!(p, Plan::Speculate { depth: 3, .. }));
/// let pen = Sampling { presence_penalty: Some(0.5), ..Default::default() };
/// let p = plan(Some(&Speculation::native_mtp()), None, &pen, &lane).unwrap();
/// assert!(matches!(p, Plan::TargetOnly { reason: Reason::SamplingRequiresTargetOnly, .. }));
/// let strict = Speculation::native_mtp().with_require_acceleration(true);
/// assert!(plan(Some(&strict), None, &pen, &lane).is_err());
/// ```
pub fn plan(
    provider_default: Option<&Speculation>,
    request: Option<&Speculation>,
    sampling: &Sampling,
    lane: &Lane,
) -> Result<Plan, ProviderError> {
    let resolved = resolve(provider_default, request);
    if let Some(reason) = resolved.disabled_reason() {
        return Ok(Plan::TargetOnly {
            message: reason.default_message().to_string(),
            resolved,
            reason,
        });
    }
    let (drafter, default_depth, default_source, output_preserving) = match lane {
        Lane::Ready {
            drafter,
            default_depth,
            depth_source,
            output_preserving,
        } => (
            drafter.clone(),
            *default_depth,
            *depth_source,
            *output_preserving,
        ),
        Lane::Unavailable { reason, message } => {
            if resolved.require_acceleration {
                return Err(ProviderError::SpeculationUnavailable {
                    reason: *reason,
                    message: message.clone(),
                });
            }
            return Ok(Plan::TargetOnly {
                resolved,
                reason: *reason,
                message: message.clone(),
            });
        }
    };
    // a drafter the request (or the provider's block) names must be the one loaded: running
    // the loaded head under another name would be a silent no-op of the block
    if let Some(want) = resolved
        .drafter
        .as_deref()
        .filter(|w| !same_drafter(w, &drafter))
    {
        let message = format!(
            "MTP acceleration off: the request names the drafter `{want}`, but this provider \
             loaded `{drafter}`; a request cannot switch drafters: start the provider with \
             `{want}` (--drafter), or leave `drafter` out of the request to use `{drafter}`."
        );
        if resolved.require_acceleration {
            return Err(ProviderError::SpeculationUnavailable {
                reason: Reason::DrafterNotLoaded,
                message,
            });
        }
        return Ok(Plan::TargetOnly {
            resolved,
            reason: Reason::DrafterNotLoaded,
            message,
        });
    }
    let controls = sampling.target_only_controls();
    if !controls.is_empty() {
        let message = format!(
            "MTP acceleration off: {} need target-only decoding; drop {} or pass speculation=false to make this explicit.",
            controls.join(", "),
            if controls.len() == 1 { "it" } else { "them" }
        );
        if resolved.require_acceleration {
            return Err(ProviderError::SpeculationUnavailable {
                reason: Reason::SamplingRequiresTargetOnly,
                message,
            });
        }
        return Ok(Plan::TargetOnly {
            resolved,
            reason: Reason::SamplingRequiresTargetOnly,
            message,
        });
    }
    let (depth, depth_source) = resolved.depth_and_source(default_depth, default_source);
    Ok(Plan::Speculate {
        resolved,
        drafter,
        depth,
        depth_source,
        output_preserving,
    })
}

/// The one rule for a depth a runtime cannot verify in one round: `depth` proposals against
/// the most (`most`) its verify forward computes with each row's arithmetic that of a single
/// step (what keeps greedy output exactly the target's). Every in-process runtime and the
/// engine under it refuse through this function, so the refusal and its words live here.
///
/// ```
/// use mtp_contract::{check_depth, ProviderError};
/// assert!(check_depth(31, Some(31)).is_ok());
/// assert!(check_depth(3, None).is_ok());
/// let e = check_depth(32, Some(31)).unwrap_err();
/// assert!(matches!(e, ProviderError::InvalidRequest { field: "speculation", .. }));
/// assert!(e.to_string().contains("at most 31"), "{e}");
/// ```
pub fn check_depth(depth: u32, most: Option<u32>) -> Result<(), ProviderError> {
    match most.filter(|&m| depth > m) {
        None => Ok(()),
        Some(most) => Err(ProviderError::InvalidRequest {
            field: "speculation",
            message: format!(
                "num_draft_tokens {depth} is more than this runtime verifies in one round: at \
                 most {most} proposals, so that every verified row is computed as a single step \
                 is and output stays exactly the target's; ask for {most} or fewer"
            ),
        }),
    }
}

/// Whether a drafter named in a block is the loaded one: the same name, compared as repo ids
/// compare (case-insensitively) and without a path's trailing separator.
fn same_drafter(named: &str, loaded: &str) -> bool {
    let trim = |s: &str| s.trim().trim_end_matches(['/', '\\']).to_string();
    trim(named).eq_ignore_ascii_case(&trim(loaded))
}

/// A stream of generation events; dropping it cancels generation.
pub type EventStream = BoxStream<'static, Result<StreamEvent, ProviderError>>;

/// A runtime that generates text and reports what it really did about speculation.
///
/// Every runtime (native engine, HTTP servers, in-process GGUF) implements this trait; the
/// facade hands out `Arc<dyn Provider>`.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// Provider name, e.g. `native`.
    fn name(&self) -> &str;

    /// The model as the caller named it.
    fn model(&self) -> &str;

    /// What this runtime can do.
    fn capabilities(&self) -> Capabilities;

    /// Whether an MTP lane is loaded, which drafter, default depth.
    fn speculation_status(&self) -> SpeculationStatus;

    /// Generates a full response.
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, ProviderError>;

    /// Streams deltas as tokens are accepted, then [`StreamEvent::Done`] with the report.
    /// Dropping the stream cancels generation.
    async fn generate_stream(&self, request: GenerateRequest)
        -> Result<EventStream, ProviderError>;

    /// The sampling the model's authors recommend (a checkpoint's `generation_config.json`:
    /// greedy when it says `do_sample: false`, else its temperature, top-p, top-k and min-p),
    /// for callers that set none themselves, as transformers and mlx-vlm use it; `None` when the
    /// runtime knows of none (an HTTP server applies its own defaults). Penalties a config may
    /// also recommend are left out: they would force target-only decoding.
    fn recommended_sampling(&self) -> Option<Sampling> {
        None
    }

    /// The number of prompt tokens `request` would be given to the model as (its chat
    /// template, system prompt, history, tools and images rendered and tokenized as
    /// [`generate`](Provider::generate) would), without generating: what Anthropic's
    /// `count_tokens` answers. The count equals the `usage.input_tokens` of the same request.
    /// Runtimes that cannot tell (an HTTP server with no tokenizing route) refuse it as
    /// `Unsupported`.
    async fn count_tokens(&self, request: GenerateRequest) -> Result<u64, ProviderError> {
        let _ = request;
        Err(ProviderError::Unsupported {
            provider: self.name().to_string(),
            what: "counting a prompt's tokens without generating".into(),
        })
    }

    /// The prompt `request` is given to the model as, text and token ids (its chat template,
    /// system prompt, history and tools rendered, images expanded to their placeholder
    /// tokens), without generating: llama-server's `/apply-template`. Runtimes that cannot
    /// tell refuse it as `Unsupported`.
    async fn render_prompt(&self, request: GenerateRequest) -> Result<RenderedText, ProviderError> {
        let _ = request;
        Err(ProviderError::Unsupported {
            provider: self.name().to_string(),
            what: "rendering a prompt without generating".into(),
        })
    }

    /// The model's vocabulary (`/tokenize`, `/detokenize`, `/tokenizer_info`); `None` when
    /// the runtime has no tokenizer at hand (an HTTP server).
    fn vocabulary(&self) -> Option<std::sync::Arc<dyn Vocabulary>> {
        None
    }

    /// The context length requests are served with (prompt and reply), when known.
    fn context_length(&self) -> Option<usize> {
        None
    }

    /// Clears the prompt cache for a key, or everything with `None`.
    fn prompt_cache_clear(&self, key: Option<&str>) -> Result<(), ProviderError> {
        let _ = key;
        Err(ProviderError::Unsupported {
            provider: self.name().to_string(),
            what: "prompt caching".into(),
        })
    }

    /// Releases this provider's hold on the model. Later calls fail with `Unloaded`.
    async fn unload(&self) -> Result<(), ProviderError>;
}

/// A prompt as the model is given it ([`Provider::render_prompt`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderedText {
    /// The rendered text.
    pub text: String,
    /// Its token ids.
    pub token_ids: Vec<u32>,
}

/// True when the sampling asks for nothing speculation cannot honour.
pub fn sampling_is_speculation_compatible(s: &Sampling) -> bool {
    s.target_only_controls().is_empty()
}
