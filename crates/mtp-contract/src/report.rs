//! What a response says about speculation (`response.metadata.speculation`) and the
//! statistics every runtime collects in one place.

use serde::{Deserialize, Serialize};

use crate::reason::Reason;
use crate::speculation::{
    DepthSource, ResolvedSpeculation, SpeculationMode, TESTED_MAX_DRAFT_TOKENS,
};

/// The kind of drafter that produced proposals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftKind {
    /// The model's own multi-token-prediction head.
    Mtp,
}

/// Draft statistics, collected in one place by every speculative loop.
///
/// ```
/// use mtp_contract::DraftStats;
/// let mut s = DraftStats::default();
/// s.record_round(3, 2); // drafted 3, first 2 accepted
/// s.record_round(3, 3);
/// assert_eq!((s.drafted, s.accepted, s.rounds), (6, 5, 2));
/// assert_eq!(s.accepted_per_position, vec![2, 2, 1]);
/// assert!((s.acceptance_rate().unwrap() - 5.0 / 6.0).abs() < 1e-12);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DraftStats {
    /// Tokens proposed by the drafter.
    pub drafted: u64,
    /// Proposals the target accepted.
    pub accepted: u64,
    /// Draft/verify rounds.
    pub rounds: u64,
    /// `accepted_per_position[i]`: rounds in which draft position `i + 1` was accepted.
    pub accepted_per_position: Vec<u64>,
    /// `drafted_per_position[i]`: rounds in which draft position `i + 1` was proposed.
    pub drafted_per_position: Vec<u64>,
}

impl DraftStats {
    /// Records one round: `drafted` proposals, of which the first `accepted` matched.
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        let accepted = accepted.min(drafted);
        self.rounds += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        if self.accepted_per_position.len() < drafted {
            self.accepted_per_position.resize(drafted, 0);
            self.drafted_per_position.resize(drafted, 0);
        }
        for i in 0..drafted {
            self.drafted_per_position[i] += 1;
            if i < accepted {
                self.accepted_per_position[i] += 1;
            }
        }
    }

    /// `accepted / drafted`, `None` before any proposal.
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// `rounds_per_depth()[d]`: rounds that drafted `d` proposals (`0`: a plain target step
    /// of a call whose depth is chosen per round). Empty before any round.
    ///
    /// ```
    /// let mut s = mtp_contract::DraftStats::default();
    /// s.record_round(3, 1);
    /// s.record_round(0, 0);
    /// s.record_round(1, 1);
    /// assert_eq!(s.rounds_per_depth(), vec![1, 1, 0, 1]);
    /// ```
    pub fn rounds_per_depth(&self) -> Vec<u64> {
        if self.rounds == 0 {
            return Vec::new();
        }
        let at_least = |d: usize| match d {
            0 => self.rounds,
            d => self.drafted_per_position.get(d - 1).copied().unwrap_or(0),
        };
        (0..=self.drafted_per_position.len())
            .map(|d| at_least(d).saturating_sub(at_least(d + 1)))
            .collect()
    }

    /// Mean tokens produced per round (accepted proposals plus the target's own token).
    pub fn tokens_per_round(&self) -> Option<f64> {
        (self.rounds > 0).then(|| (self.accepted + self.rounds) as f64 / self.rounds as f64)
    }

    /// Adds another run's statistics (for benchmarks and sessions).
    pub fn merge(&mut self, other: &DraftStats) {
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.rounds += other.rounds;
        let n = self
            .accepted_per_position
            .len()
            .max(other.accepted_per_position.len());
        self.accepted_per_position.resize(n, 0);
        self.drafted_per_position.resize(n, 0);
        for (i, v) in other.accepted_per_position.iter().enumerate() {
            self.accepted_per_position[i] += v;
        }
        for (i, v) in other.drafted_per_position.iter().enumerate() {
            self.drafted_per_position[i] += v;
        }
    }
}

/// `response.metadata.speculation`: what really happened. Every key is always serialized;
/// a value the runtime cannot know is `null`, and `message` says so.
///
/// ```
/// use mtp_contract::{SpeculationReport, Reason, resolve};
/// let r = resolve(None, Some(&false.into()));
/// let rep = SpeculationReport::not_used(&r, "mtp-engine-cpu", Reason::DisabledByRequest, None);
/// let v = serde_json::to_value(&rep).unwrap();
/// assert_eq!(v["used"], false);
/// assert_eq!(v["reason"], "disabled_by_request");
/// assert!(v["message"].as_str().unwrap().contains("speculation was turned off"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeculationReport {
    /// The request (after resolution) asked for acceleration.
    pub requested: bool,
    /// The effective mode.
    pub mode: SpeculationMode,
    /// Drafting really happened for this call.
    pub used: bool,
    /// The drafter that ran or would have run (repo id, path, or "embedded").
    pub drafter: Option<String>,
    /// Proposals per round that were (or would have been) used; with `auto_depth`, the most
    /// any round could draft.
    pub num_draft_tokens: Option<u32>,
    /// Which level decided `num_draft_tokens` (the request, the provider, the drafter's
    /// config, the registry or built in); `null` when unknown (a server's own launch depth).
    #[serde(default)]
    pub depth_source: Option<DepthSource>,
    /// The depth was chosen round by round (`num_draft_tokens: "auto"` honoured); see
    /// `rounds_per_depth` for the depths used.
    #[serde(default)]
    pub auto_depth: bool,
    /// `rounds_per_depth[d]`: rounds that drafted `d` proposals (see
    /// [`DraftStats::rounds_per_depth`]); `null` when unknown.
    #[serde(default)]
    pub rounds_per_depth: Option<Vec<u64>>,
    /// What really executed, e.g. `mtp-engine-cpu`, `llama.cpp b11434`, `llama-server`.
    pub runtime: String,
    /// The drafter kind, when used.
    pub draft_kind: Option<DraftKind>,
    /// Proposals made.
    pub drafted: Option<u64>,
    /// Proposals accepted.
    pub accepted: Option<u64>,
    /// Draft/verify rounds.
    pub rounds: Option<u64>,
    /// `accepted / drafted`.
    pub acceptance_rate: Option<f64>,
    /// Acceptance count of draft position 1..k.
    pub accepted_per_position: Option<Vec<u64>>,
    /// Whether this runtime/drafter pairing is known to leave greedy output unchanged.
    pub output_preserving: Option<bool>,
    /// Why `used` is false (or why the figures are unknown).
    pub reason: Option<Reason>,
    /// A sentence that says what to do next.
    pub message: Option<String>,
}

impl SpeculationReport {
    /// A report for a call that ran without drafting.
    pub fn not_used(
        resolved: &ResolvedSpeculation,
        runtime: impl Into<String>,
        reason: Reason,
        message: Option<String>,
    ) -> Self {
        SpeculationReport {
            requested: resolved.requested,
            mode: resolved.mode,
            used: false,
            drafter: resolved.drafter.clone(),
            num_draft_tokens: resolved.num_draft_tokens,
            depth_source: resolved.num_draft_tokens.and(resolved.depth_source),
            auto_depth: false,
            rounds_per_depth: None,
            runtime: runtime.into(),
            draft_kind: None,
            drafted: None,
            accepted: None,
            rounds: None,
            acceptance_rate: None,
            accepted_per_position: None,
            output_preserving: None,
            reason: Some(reason),
            message: Some(message.unwrap_or_else(|| reason.default_message().to_string())),
        }
    }

    /// A report for a call that drafted with the given statistics at a fixed `depth`. When the
    /// request asked for `num_draft_tokens: "auto"`, `message` says that this runtime drafted at
    /// its fixed depth instead; a runtime that did choose per round says so with
    /// [`SpeculationReport::chosen_per_round`].
    pub fn used(
        resolved: &ResolvedSpeculation,
        runtime: impl Into<String>,
        drafter: impl Into<String>,
        depth: u32,
        stats: &DraftStats,
        output_preserving: Option<bool>,
    ) -> Self {
        SpeculationReport {
            requested: resolved.requested,
            mode: resolved.mode,
            used: true,
            drafter: Some(drafter.into()),
            num_draft_tokens: Some(depth),
            depth_source: resolved
                .depth_source
                .filter(|_| resolved.num_draft_tokens == Some(depth)),
            auto_depth: false,
            // only from per-position counts that add up (a runtime may know the totals only)
            rounds_per_depth: (stats.drafted_per_position.iter().sum::<u64>() == stats.drafted)
                .then(|| stats.rounds_per_depth()),
            runtime: runtime.into(),
            draft_kind: Some(DraftKind::Mtp),
            drafted: Some(stats.drafted),
            accepted: Some(stats.accepted),
            rounds: Some(stats.rounds),
            acceptance_rate: stats.acceptance_rate(),
            accepted_per_position: Some(stats.accepted_per_position.clone()),
            output_preserving,
            reason: None,
            message: join_notes(
                resolved
                    .auto_depth
                    .then(|| SpeculationReport::auto_depth_not_chosen(Some(depth))),
                SpeculationReport::untested_depth(depth),
            ),
        }
    }

    /// The warning of a call drafting deeper than the measured range
    /// ([`TESTED_MAX_DRAFT_TOKENS`]), `None` within it.
    ///
    /// ```
    /// use mtp_contract::SpeculationReport;
    /// assert!(SpeculationReport::untested_depth(8).is_none());
    /// assert!(SpeculationReport::untested_depth(20).unwrap().contains("above the measured range"));
    /// ```
    pub fn untested_depth(depth: u32) -> Option<String> {
        (depth > TESTED_MAX_DRAFT_TOKENS).then(|| {
            format!(
                "num_draft_tokens {depth} is above the measured range (1 to \
                 {TESTED_MAX_DRAFT_TOKENS}): deeper rounds hold more proposals in memory and \
                 rarely pay; compare with a smaller depth"
            )
        })
    }

    /// The note of a runtime that was asked for `num_draft_tokens: "auto"` and drafted at a
    /// fixed depth (`None`: the server's own, not known here).
    pub fn auto_depth_not_chosen(depth: Option<u32>) -> String {
        let at = match depth {
            Some(d) => format!("{d} per round"),
            None => "its launch depth".into(),
        };
        format!("num_draft_tokens \"auto\" is chosen round by round only by the native engine; this runtime drafted {at}")
    }

    /// Sets which level decided the depth (the report of a [`crate::Plan`] knows it).
    pub fn with_depth_source(mut self, source: DepthSource) -> Self {
        self.depth_source = Some(source);
        self
    }

    /// Marks a used report as one whose depth was chosen round by round (up to
    /// `num_draft_tokens`), dropping the fixed-depth note of [`SpeculationReport::used`].
    pub fn chosen_per_round(mut self) -> Self {
        if self.used {
            self.auto_depth = true;
            self.message = self
                .num_draft_tokens
                .and_then(SpeculationReport::untested_depth);
        }
        self
    }
}

/// Two optional notes as one sentence pair.
fn join_notes(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    }
}

/// Timing figures of one call. Unknown figures are `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Request start to first generated token, milliseconds.
    pub time_to_first_token_ms: Option<f64>,
    /// Prompt processing time, milliseconds.
    pub prefill_ms: Option<f64>,
    /// Prompt tokens per second (tokens actually computed, not served from cache).
    pub prefill_tokens_per_s: Option<f64>,
    /// Generation time after the first token, milliseconds.
    pub decode_ms: Option<f64>,
    /// Generated tokens per second.
    pub decode_tokens_per_s: Option<f64>,
    /// Time spent drafting (speculative calls), milliseconds.
    pub draft_ms: Option<f64>,
    /// Time spent in verification forwards, milliseconds.
    pub verify_ms: Option<f64>,
    /// Time spent rolling caches back, milliseconds.
    pub rollback_ms: Option<f64>,
    /// Time a constrained reply (`response_format`) waited for its token masks,
    /// milliseconds; part of the draft and verify figures, not added to them. Masks computed
    /// ahead, on a thread beside a forward that was running anyway, are not counted: they
    /// cost no wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint_ms: Option<f64>,
}
