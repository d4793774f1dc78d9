//! A request resolved once, before it joins a batch: [`SeqSpec`].
//!
//! Every rule that decides how a sequence runs is applied here, in one pass over the request
//! and the engine: the request's checks ([`Engine::check`]), whether it speculates and why not
//! (the contract's [`mtp_contract::plan`], so the sampling rule and the reason codes are the
//! contract's), the depth limit ([`mtp_contract::check_depth`]), its sampler and constraint,
//! its stop ids, the prefix-cache state it may resume from and the room its caches need. A
//! [`crate::sequence::Sequence`] is built from the spec alone and never calls back into these
//! rules.

use std::sync::Arc;

use mtp_contract::{DraftDepth, Lane, Plan as ContractPlan, Speculation};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::request::{GenerateOptions, ProgressSink, SpeculationOutcome, MAX_VERIFY_DEPTH};
use crate::resume::{Keep, PromptState};
use crate::sampling::Sampler;
use crate::vision::MultimodalPrompt;
use crate::LogprobSink;

/// The most reply positions a sequence's KV caches get room for up front, beyond its prompt
/// (see [`crate::SeqCache::reserve`]): the room is address space, not memory, but a limit
/// keeps a request for a huge `max_tokens` from reserving gigabytes of it (which a host that
/// does not overcommit would refuse); a longer reply grows its caches as it goes, a doubling
/// at a time.
const REPLY_ROOM: usize = 8192;

/// How a sequence decodes, decided once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoding {
    /// MTP rounds (the engine has a drafter and the plan speculates).
    pub(crate) speculate: bool,
    /// Proposals per round (with `auto`, the most a round drafts).
    pub(crate) depth: usize,
    /// Each round's depth is chosen.
    pub(crate) auto: bool,
}

/// Everything a joining sequence needs, resolved from its request and the engine.
pub(crate) struct SeqSpec {
    pub(crate) prompt: Vec<u32>,
    pub(crate) decoding: Decoding,
    /// The speculation outcome to fill, when speculation was asked for (with the contract's
    /// reason when it does not run).
    pub(crate) outcome: Option<SpeculationOutcome>,
    pub(crate) sampler: Sampler,
    /// Token ids that end it: the request's, and EOS unless ignored.
    pub(crate) stops: Vec<u32>,
    pub(crate) max_tokens: usize,
    /// The state it resumes from: one that leaves a token to compute, holds the same images
    /// and, when it speculates, carries the drafter's cache.
    pub(crate) resume: Option<Arc<PromptState>>,
    pub(crate) images: Option<Arc<MultimodalPrompt>>,
    pub(crate) keep: Keep,
    pub(crate) progress: Option<ProgressSink>,
    pub(crate) cancel: Option<mtp_contract::Cancel>,
    /// Alternatives per token's log probability, when they are reported.
    pub(crate) top_logprobs: Option<usize>,
    pub(crate) on_logprobs: Option<LogprobSink>,
    /// The positions its caches get room for up front: prompt, reply (up to [`REPLY_ROOM`])
    /// and a verify's rows.
    pub(crate) room: usize,
}

impl SeqSpec {
    /// Resolves a request against `engine`: every check and decision, before any model work.
    pub(crate) fn resolve(engine: &Engine, prompt: &[u32], opts: &GenerateOptions) -> Result<Self> {
        engine.check(prompt, opts)?;
        let (outcome, speculate) = speculation(engine, opts)?;
        let decoding = Decoding {
            speculate,
            depth: opts.num_draft_tokens.unwrap_or(0),
            auto: opts.auto_depth,
        };
        let resume = opts
            .resume
            .as_ref()
            .filter(|st| {
                st.tokens() < prompt.len()
                    && st.same_images(opts.images.as_ref())
                    && (!speculate || st.has_drafter_cache())
            })
            .cloned();
        let mut stops = opts.stop_token_ids.clone();
        if !opts.ignore_eos {
            stops.extend_from_slice(engine.eos_token_ids());
        }
        Ok(SeqSpec {
            prompt: prompt.to_vec(),
            decoding,
            outcome,
            sampler: Sampler::new(&opts.sampling).with_constraint(engine.constraint(opts)?),
            stops,
            max_tokens: opts.max_tokens,
            resume,
            images: opts.images.clone(),
            keep: opts.keep(),
            progress: opts.on_prompt_progress.clone(),
            cancel: opts.cancel.clone(),
            top_logprobs: opts.logprobs,
            on_logprobs: opts.on_logprobs.clone(),
            room: prompt
                .len()
                .saturating_add(opts.max_tokens.min(REPLY_ROOM))
                .saturating_add(crate::kernels::MAX_ROWS),
        })
    }
}

/// Whether a call speculates, decided by the contract's [`mtp_contract::plan`] over this
/// engine's lane (its drafter, or `no_mtp_head`): the outcome to fill when speculation was
/// asked for (with the plan's reason when it does not run), and true when MTP rounds will run.
/// A depth past [`MAX_VERIFY_DEPTH`] is refused ([`mtp_contract::check_depth`]).
fn speculation(
    engine: &Engine,
    opts: &GenerateOptions,
) -> Result<(Option<SpeculationOutcome>, bool)> {
    let depth = opts.num_draft_tokens.unwrap_or(0);
    if depth == 0 {
        return Ok((None, false));
    }
    let refused = |e: mtp_contract::ProviderError| match e {
        mtp_contract::ProviderError::InvalidRequest { message, .. } => {
            Error::InvalidRequest(message)
        }
        e => Error::InvalidRequest(e.to_string()),
    };
    let d = u32::try_from(depth).unwrap_or(u32::MAX);
    mtp_contract::check_depth(d, Some(MAX_VERIFY_DEPTH as u32)).map_err(refused)?;
    let lane = match engine.drafter() {
        Some(_) => Lane::Ready {
            drafter: "mtp".into(),
            default_depth: d,
            depth_source: mtp_contract::DepthSource::BuiltIn,
            output_preserving: Some(true),
        },
        None => Lane::Unavailable {
            reason: mtp_contract::Reason::NoMtpHead,
            message: "the checkpoint has no MTP head and no drafter was given".into(),
        },
    };
    let block = Speculation::native_mtp()
        .with_num_draft_tokens(if opts.auto_depth {
            DraftDepth::Auto
        } else {
            DraftDepth::Fixed(d)
        })
        .map_err(|e| Error::InvalidRequest(e.to_string()))?;
    let mut outcome = SpeculationOutcome {
        num_draft_tokens: depth,
        auto_depth: opts.auto_depth,
        ..Default::default()
    };
    let speculate =
        match mtp_contract::plan(None, Some(&block), &opts.sampling, &lane).map_err(refused)? {
            ContractPlan::Speculate { .. } => true,
            ContractPlan::TargetOnly {
                reason, message, ..
            } => {
                outcome.not_used_reason = Some(reason);
                outcome.not_used_message = Some(message);
                false
            }
        };
    Ok((Some(outcome), speculate))
}
