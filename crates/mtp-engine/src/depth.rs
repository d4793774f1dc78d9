//! Choosing each round's depth for `num_draft_tokens: "auto"`.
//!
//! A round of depth `k` costs one target forward over `k + 1` rows, `k` drafter forwards
//! (the seed's, computed when the drafter catches up with the last round, and `k - 1`
//! recurrent drafts) and the bookkeeping of a verified round (acceptance walk, cache rollback);
//! depth 0 is a plain target step with no drafter work and nothing to roll back. It yields
//! `1 + g_1 + … + g_k` tokens on average, where `g_j` is the probability that the first `j`
//! drafts are all accepted. The depth is the one that makes tokens per millisecond largest.
//!
//! In a batch the step is shared: every sequence's rows go through one forward, so the
//! choice is joint. Each extra draft of each sequence is an increment with gain `g_ij` and a
//! cost of one row plus one drafter forward; increments are taken in order of gain (within a
//! sequence the gains fall, so the taken set is always a prefix of each sequence's drafts),
//! and the number taken is the one that makes the step's tokens per millisecond largest. A
//! fuller batch makes rows dearer relative to what they buy, so depths fall as it fills and
//! reach 0 where a round would cost more than it gains.
//!
//! Both sides are measured, never assumed once there is data:
//! - [`Acceptance`]: per sequence, the conditional acceptance of each draft position
//!   (accepted given that the ones before it were), counts decayed so the estimate follows
//!   the text, shrunk toward the sequence's pooled rate and, before its first rounds, toward
//!   the rate of the sequences before it.
//! - [`CostModel`]: per loaded model, the milliseconds of the target forward by number of rows
//!   (a weighted least-squares line over decayed per-row-count means) and of a drafter forward.
//!   Until two row counts have been seen the line's slope comes from a prior, and every eighth
//!   choice then steps one row off the best depth to measure a second point.
//!
//! The depth changes only the speed: every depth gives the same tokens (verify rows are
//! computed as single steps are), so a wrong estimate costs time, never text.

/// Decay of the acceptance counts per round (a window of ~30 rounds).
const ACCEPT_DECAY: f64 = 0.97;
/// Decay per plain step: a sequence that stopped drafting drifts back toward its prior, so
/// it tries again once the evidence against drafting has aged (the text may have changed).
const IDLE_DECAY: f64 = 0.95;
/// Pseudo-trials that pull a position's rate toward the pooled one.
const SHRINK: f64 = 3.0;
/// Pseudo-trials of the prior before a sequence's own rounds.
const PRIOR_TRIALS: f64 = 4.0;
/// Acceptance assumed before anything was measured on this model.
const FIRST_PRIOR: f64 = 0.6;
/// Decay of the per-row-count timing means per observation.
const COST_DECAY: f64 = 0.995;
/// Row counts tracked (a step of more rows is not recorded).
const MAX_ROWS: usize = 256;
/// Before the slope is measured: one more row costs this fraction of a one-row forward.
const PRIOR_ROW_SLOPE: f64 = 0.25;
/// The decayed weight at which a row count's own mean stands in for the fitted line.
const MEAN_WEIGHT: f64 = 2.0;
/// Before a drafter forward is measured: its cost as a fraction of a one-row target forward.
const PRIOR_HEAD_FRACTION: f64 = 0.15;

/// One sequence's measured acceptance by draft position.
#[derive(Debug, Clone)]
pub(crate) struct Acceptance {
    /// Decayed rounds that reached position `j` (the drafts before it accepted).
    trials: Vec<f64>,
    /// Decayed rounds in which position `j` was accepted.
    accepts: Vec<f64>,
    /// The rate assumed before this sequence's own rounds.
    prior: f64,
}

impl Acceptance {
    /// An estimate that starts at `prior` (clamped to a probability).
    pub(crate) fn new(prior: f64) -> Self {
        Acceptance {
            trials: Vec::new(),
            accepts: Vec::new(),
            prior: prior.clamp(0.0, 1.0),
        }
    }

    /// Records a round: `drafted` proposals, the first `accepted` of them accepted.
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        self.decay(ACCEPT_DECAY);
        let accepted = accepted.min(drafted);
        // positions 0..=accepted were reached (the one after the last accepted was rejected,
        // unless every draft was accepted)
        let reached = (accepted + 1).min(drafted);
        if self.trials.len() < reached {
            self.trials.resize(reached, 0.0);
            self.accepts.resize(reached, 0.0);
        }
        for j in 0..reached {
            self.trials[j] += 1.0;
            if j < accepted {
                self.accepts[j] += 1.0;
            }
        }
    }

    fn decay(&mut self, f: f64) {
        self.trials.iter_mut().for_each(|x| *x *= f);
        self.accepts.iter_mut().for_each(|x| *x *= f);
    }

    /// The rate over every position, with the prior's pseudo-trials.
    pub(crate) fn pooled(&self) -> f64 {
        let t: f64 = self.trials.iter().sum();
        let a: f64 = self.accepts.iter().sum();
        (a + PRIOR_TRIALS * self.prior) / (t + PRIOR_TRIALS)
    }

    /// `g_j` for `j = 1..=k`: the probability that the first `j` drafts are all accepted.
    pub(crate) fn gains(&self, k: usize) -> Vec<f64> {
        let pool = self.pooled();
        let mut g = Vec::with_capacity(k);
        let mut p = 1.0;
        for j in 0..k {
            let (t, a) = (
                self.trials.get(j).copied().unwrap_or(0.0),
                self.accepts.get(j).copied().unwrap_or(0.0),
            );
            p *= ((a + SHRINK * pool) / (t + SHRINK)).clamp(0.0, 1.0);
            g.push(p);
        }
        g
    }
}

/// Measured costs of the pieces of a round, for one loaded model.
#[derive(Debug, Clone)]
pub(crate) struct CostModel {
    /// Per row count `r` (index `r`): decayed weight and weighted sum of forward milliseconds.
    forward: Vec<(f64, f64)>,
    /// Decayed count and sum of drafter-forward milliseconds.
    head: (f64, f64),
    /// Decayed count and sum of the milliseconds after the forward of rounds that drafted
    /// (`.0`) and of plain steps (`.1`): acceptance, rollback, queueing the drafter's pairs.
    after: [(f64, f64); 2],
    /// Choices made (for the exploration step).
    choices: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            forward: vec![(0.0, 0.0); MAX_ROWS + 1],
            head: (0.0, 0.0),
            after: [(0.0, 0.0); 2],
            choices: 0,
        }
    }
}

impl CostModel {
    /// Records a target forward over `rows` decode/verify rows that took `ms`.
    pub(crate) fn record_forward(&mut self, rows: usize, ms: f64) {
        if rows == 0 || rows > MAX_ROWS || !ms.is_finite() || ms <= 0.0 {
            return;
        }
        for (w, s) in &mut self.forward {
            *w *= COST_DECAY;
            *s *= COST_DECAY;
        }
        self.forward[rows].0 += 1.0;
        self.forward[rows].1 += ms;
    }

    /// Records `n` drafter forwards (with their logits) that took `ms` together.
    pub(crate) fn record_heads(&mut self, n: usize, ms: f64) {
        if n == 0 || !ms.is_finite() || ms <= 0.0 {
            return;
        }
        self.head.0 = self.head.0 * COST_DECAY + n as f64;
        self.head.1 = self.head.1 * COST_DECAY + ms;
    }

    /// Records the milliseconds a round took after its forward (`drafted`: it verified drafts).
    pub(crate) fn record_after(&mut self, drafted: bool, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        let e = &mut self.after[usize::from(!drafted)];
        e.0 = e.0 * COST_DECAY + 1.0;
        e.1 = e.1 * COST_DECAY + ms;
    }

    /// What a round that drafts costs after its forward beyond what a plain step costs.
    fn round_overhead(&self) -> f64 {
        let mean = |(w, s): (f64, f64)| (w > 0.3).then(|| s / w);
        match (mean(self.after[0]), mean(self.after[1])) {
            (Some(d), Some(p)) => (d - p).max(0.0),
            (Some(d), None) => d,
            _ => 0.0,
        }
    }

    /// Row counts with enough weight to count as measured.
    fn measured_rows(&self) -> impl Iterator<Item = (usize, f64, f64)> + '_ {
        self.forward
            .iter()
            .enumerate()
            .filter(|(_, (w, _))| *w > 0.3)
            .map(|(r, (w, s))| (r, *w, s / w))
    }

    /// The line `a + b * rows` through the measured means (milliseconds); `None` before any
    /// measurement.
    fn line(&self) -> Option<(f64, f64)> {
        let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
        let mut distinct = 0;
        for (r, w, y) in self.measured_rows() {
            let x = r as f64;
            sw += w;
            sx += w * x;
            sy += w * y;
            sxx += w * x * x;
            sxy += w * x * y;
            distinct += 1;
        }
        if sw == 0.0 {
            return None;
        }
        let (mx, my) = (sx / sw, sy / sw);
        let var = sxx / sw - mx * mx;
        if distinct >= 2 && var > 1e-9 {
            let b = ((sxy / sw - mx * my) / var).max(0.0);
            // a line through noisy means can dive below zero at one row; keep a floor
            let a = (my - b * mx).max(0.05 * my);
            Some((a, b))
        } else {
            // one row count seen: split its time with the prior slope
            let a = my / (1.0 + PRIOR_ROW_SLOPE * mx);
            Some((a, PRIOR_ROW_SLOPE * a))
        }
    }

    fn single_row_count(&self) -> Option<usize> {
        let mut it = self.measured_rows();
        match (it.next(), it.next()) {
            (Some((r, _, _)), None) => Some(r),
            _ => None,
        }
    }

    /// Predicted milliseconds of a forward over `rows` rows (relative units before any
    /// measurement), and of one drafter forward. A row count measured often enough
    /// ([`MEAN_WEIGHT`]) costs its own mean, others the fitted line: a forward's cost is no
    /// straight line in its rows (flat while reading the weights dominates, then rising with
    /// the arithmetic), and a line fitted over the flat part alone would take a compute-bound
    /// step for cheap until many measurements moved it.
    fn costs(&self) -> (impl Fn(usize) -> f64, f64) {
        let (a, b) = self.line().unwrap_or((1.0, PRIOR_ROW_SLOPE));
        let head = if self.head.0 > 0.3 {
            self.head.1 / self.head.0
        } else {
            PRIOR_HEAD_FRACTION * (a + b)
        };
        let means: Vec<Option<f64>> = self
            .forward
            .iter()
            .map(|&(w, s)| (w >= MEAN_WEIGHT).then(|| s / w))
            .collect();
        (
            move |rows: usize| {
                means
                    .get(rows)
                    .copied()
                    .flatten()
                    .unwrap_or(a + b * rows as f64)
            },
            head,
        )
    }
}

/// A sequence whose depth is chosen: its acceptance and its ceiling for this step.
pub(crate) struct Choice<'a> {
    pub(crate) acceptance: &'a Acceptance,
    /// The most drafts this round may make (the ceiling, less what the token budget leaves).
    pub(crate) max: usize,
}

/// What the step carries besides the chosen sequences: rows, expected tokens and drafter
/// forwards of target-only and fixed-depth sequences.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fixed {
    pub(crate) rows: usize,
    pub(crate) tokens: f64,
    pub(crate) heads: usize,
    /// Sequences whose round verifies drafts (each pays the round's bookkeeping).
    pub(crate) drafting: usize,
}

/// The depth of each chosen sequence for the next step (see the module docs).
pub(crate) fn choose(cost: &mut CostModel, fixed: Fixed, seqs: &[Choice<'_>]) -> Vec<usize> {
    let (forward, head) = cost.costs();
    // every increment (gain, sequence), best first; gains fall within a sequence, so any
    // prefix of this order is a prefix of each sequence's drafts
    let mut inc: Vec<(f64, usize)> = seqs
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.acceptance.gains(c.max).into_iter().map(move |g| (g, i)))
        .collect();
    inc.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let base_rows = fixed.rows + seqs.len();
    let overhead = cost.round_overhead();
    // a sequence's first draft also makes its round one that verifies and rolls back
    let rate = |n: usize, drafting: usize, tokens: f64| {
        let t = forward(base_rows + n)
            + head * (fixed.heads + n) as f64
            + overhead * (fixed.drafting + drafting) as f64;
        tokens / t.max(1e-12)
    };
    let mut tokens = fixed.tokens + seqs.len() as f64;
    let mut best = (rate(0, 0, tokens), 0);
    let mut drafting = vec![false; seqs.len()];
    let mut n_drafting = 0;
    for (n, &(g, i)) in inc.iter().enumerate() {
        tokens += g;
        if !drafting[i] {
            drafting[i] = true;
            n_drafting += 1;
        }
        let r = rate(n + 1, n_drafting, tokens);
        if r > best.0 {
            best = (r, n + 1);
        }
    }
    let mut n = best.1;
    tracing::trace!(
        line = ?cost.line(),
        head,
        increments = inc.len(),
        taken = n,
        "auto depth"
    );
    // Exploration: with one row count measured the slope is the prior's; now and then take
    // one increment more (or less) to measure another.
    cost.choices += 1;
    if cost.choices.is_multiple_of(8) {
        if let Some(r) = cost.single_row_count() {
            if base_rows + n == r {
                n = if n < inc.len() {
                    n + 1
                } else {
                    n.saturating_sub(1)
                };
            }
        }
    }
    let mut depth = vec![0; seqs.len()];
    for &(_, i) in &inc[..n] {
        depth[i] += 1;
    }
    depth
}

/// The engine's shared state for `auto` depths: the cost model of its model and the
/// acceptance of the sequences it ran (the prior of the next one).
#[derive(Debug, Clone)]
pub(crate) struct DepthModel {
    pub(crate) cost: CostModel,
    /// Decayed accepted and reached counts over every auto sequence's rounds.
    seen: (f64, f64),
}

impl Default for DepthModel {
    fn default() -> Self {
        DepthModel {
            cost: CostModel::default(),
            seen: (0.0, 0.0),
        }
    }
}

impl DepthModel {
    /// The acceptance estimate a new sequence starts from.
    pub(crate) fn new_sequence(&self) -> Acceptance {
        let (a, t) = self.seen;
        Acceptance::new((a + PRIOR_TRIALS * FIRST_PRIOR) / (t + PRIOR_TRIALS))
    }

    /// Records a round into both the sequence's estimate and the engine's prior; a plain step
    /// (nothing drafted) only ages the sequence's evidence.
    pub(crate) fn record_round(&mut self, seq: &mut Acceptance, drafted: usize, accepted: usize) {
        if drafted == 0 {
            seq.decay(IDLE_DECAY);
            return;
        }
        seq.record(drafted, accepted);
        let reached = (accepted + 1).min(drafted) as f64;
        self.seen.0 = self.seen.0 * 0.99 + accepted.min(drafted) as f64;
        self.seen.1 = self.seen.1 * 0.99 + reached;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(a: f64, b: f64, head: f64) -> CostModel {
        let mut c = CostModel::default();
        for _ in 0..20 {
            for r in 1..=12 {
                c.record_forward(r, a + b * r as f64);
            }
            c.record_heads(1, head);
        }
        c
    }

    fn seq(rate: f64) -> Acceptance {
        let mut a = Acceptance::new(rate);
        // rounds of depth 8 with a geometric acceptance of `rate`, as expected counts
        for _ in 0..200 {
            a.decay(ACCEPT_DECAY);
            let (t, ac) = (&mut a.trials, &mut a.accepts);
            t.resize(8, 0.0);
            ac.resize(8, 0.0);
            let mut reach = 1.0;
            for j in 0..8 {
                t[j] += reach;
                ac[j] += reach * rate;
                reach *= rate;
            }
        }
        a
    }

    #[test]
    fn the_fitted_line_is_the_measured_one() {
        let c = cost(10.0, 0.5, 1.0);
        let (a, b) = c.line().unwrap();
        assert!((a - 10.0).abs() < 1e-6 && (b - 0.5).abs() < 1e-6, "{a} {b}");
        let (_, h) = c.costs();
        assert!((h - 1.0).abs() < 1e-9);
    }

    #[test]
    fn geometric_acceptance_is_recovered() {
        let a = seq(0.8);
        let g = a.gains(4);
        for (j, g) in g.iter().enumerate() {
            assert!((g - 0.8f64.powi(j as i32 + 1)).abs() < 0.02, "{j}: {g}");
        }
        // recorded rounds: 3 drafted, 1 accepted -> positions 0 and 1 reached, 0 accepted
        let mut b = Acceptance::new(0.5);
        b.record(3, 1);
        assert_eq!(b.trials, vec![1.0, 1.0]);
        assert_eq!(b.accepts, vec![1.0, 0.0]);
        b.record(2, 2);
        assert_eq!(b.trials.len(), 2);
        assert!((b.accepts[1] - 1.0).abs() < 1e-12);
    }

    /// The depth that maximizes (1 + g_1 + .. + g_k) / (a + b (k + 1) + h k), by brute force.
    fn best_solo(rate: f64, a: f64, b: f64, h: f64, max: usize) -> usize {
        (0..=max)
            .map(|k| {
                let e: f64 = 1.0 + (1..=k).map(|j| rate.powi(j as i32)).sum::<f64>();
                (k, e / (a + b * (k + 1) as f64 + h * k as f64))
            })
            .max_by(|x, y| x.1.total_cmp(&y.1))
            .unwrap()
            .0
    }

    #[test]
    fn solo_depth_is_the_best_one() {
        for &(rate, a, b, h) in &[
            (0.9, 10.0, 0.2, 0.5),
            (0.7, 10.0, 0.5, 1.0),
            (0.5, 10.0, 2.0, 1.0),
            (0.3, 10.0, 3.0, 2.0),
            (0.95, 5.0, 0.1, 0.1),
            (0.1, 5.0, 1.0, 1.0),
        ] {
            let mut c = cost(a, b, h);
            let acc = seq(rate);
            let got = choose(
                &mut c,
                Fixed::default(),
                &[Choice {
                    acceptance: &acc,
                    max: 8,
                }],
            );
            let want = best_solo(acc.pooled(), a, b, h, 8);
            assert!(
                (got[0] as i64 - want as i64).abs() <= 1,
                "rate {rate} a {a} b {b} h {h}: chose {got:?}, best {want}"
            );
        }
    }

    #[test]
    fn a_dear_rollback_keeps_middling_drafts_off() {
        let acc = seq(0.6);
        let one = |c: &mut CostModel| {
            choose(
                c,
                Fixed::default(),
                &[Choice {
                    acceptance: &acc,
                    max: 8,
                }],
            )[0]
        };
        let mut cheap = cost(10.0, 1.0, 0.5);
        assert!(one(&mut cheap) >= 1);
        // a verified round costs 10 ms more than a plain step: 0.6 tokens are not worth it
        let mut dear = cost(10.0, 1.0, 0.5);
        for _ in 0..20 {
            dear.record_after(true, 10.5);
            dear.record_after(false, 0.5);
        }
        assert!((dear.round_overhead() - 10.0).abs() < 1e-9);
        assert_eq!(one(&mut dear), 0);
    }

    #[test]
    fn poor_acceptance_or_dear_rows_mean_no_drafts() {
        let mut c = cost(10.0, 10.0, 2.0); // every row costs as much as the weights
        let acc = seq(0.3);
        let got = choose(
            &mut c,
            Fixed::default(),
            &[Choice {
                acceptance: &acc,
                max: 8,
            }],
        );
        assert_eq!(got, vec![0]);
    }

    #[test]
    fn depths_fall_as_the_batch_fills() {
        // rows are cheap next to the weight pass until the step is compute-bound
        let mut c = cost(20.0, 1.0, 0.3);
        let acc: Vec<Acceptance> = (0..16).map(|_| seq(0.75)).collect();
        let mut last = usize::MAX;
        let mut depths = Vec::new();
        for n in [1, 2, 4, 8, 16] {
            let seqs: Vec<Choice> = acc[..n]
                .iter()
                .map(|a| Choice {
                    acceptance: a,
                    max: 8,
                })
                .collect();
            let d = choose(&mut c, Fixed::default(), &seqs);
            let total: usize = d.iter().sum();
            let mean = total / n;
            depths.push(mean);
            assert!(mean <= last, "batch {n}: depths {d:?} after mean {last}");
            last = mean;
        }
        assert!(depths[0] >= 2, "{depths:?}");
        assert!(depths[4] < depths[0], "{depths:?}");
    }

    /// A step that is flat in its rows up to 8 and compute-bound beyond (4 sequences at 100%
    /// acceptance): with only the flat part measured, drafting looks cheap; once the steep row
    /// counts have been measured twice, their own means stop it at once (a line fitted through
    /// all the measurements would still take 16 rows for cheap).
    #[test]
    fn measured_row_counts_cost_their_own_means() {
        let roof = |r: usize| 30.0f64.max(8.0 * r as f64);
        let mut c = CostModel::default();
        for _ in 0..200 {
            for r in 1..=4 {
                c.record_forward(r, roof(r));
            }
            c.record_heads(1, 2.5);
        }
        let acc: Vec<Acceptance> = (0..4).map(|_| seq(0.99)).collect();
        let seqs: Vec<Choice> = acc
            .iter()
            .map(|a| Choice {
                acceptance: a,
                max: 3,
            })
            .collect();
        let before: usize = choose(&mut c, Fixed::default(), &seqs).iter().sum();
        assert!(before >= 8, "flat so far: drafting pays ({before} drafts)");
        for r in 5..=16 {
            c.record_forward(r, roof(r));
            c.record_forward(r, roof(r));
        }
        let after: usize = choose(&mut c, Fixed::default(), &seqs).iter().sum();
        // the best under the true costs: 4 tokens per 32 ms beats 16 per 128 + 30 ms
        assert_eq!(after, 0, "compute-bound rows: no drafts");
    }

    #[test]
    fn a_better_sequence_drafts_deeper() {
        let mut c = cost(20.0, 2.0, 0.5);
        let (good, poor) = (seq(0.9), seq(0.4));
        let d = choose(
            &mut c,
            Fixed {
                rows: 4,
                tokens: 4.0,
                heads: 0,
                drafting: 0,
            },
            &[
                Choice {
                    acceptance: &good,
                    max: 8,
                },
                Choice {
                    acceptance: &poor,
                    max: 8,
                },
            ],
        );
        assert!(d[0] > d[1], "{d:?}");
    }

    #[test]
    fn the_ceiling_and_the_budget_bound_the_depth() {
        let mut c = cost(20.0, 0.01, 0.01);
        let acc = seq(0.99);
        let d = choose(
            &mut c,
            Fixed::default(),
            &[Choice {
                acceptance: &acc,
                max: 2,
            }],
        );
        assert_eq!(d, vec![2]);
        let d = choose(
            &mut c,
            Fixed::default(),
            &[Choice {
                acceptance: &acc,
                max: 0,
            }],
        );
        assert_eq!(d, vec![0]);
    }

    #[test]
    fn one_measured_row_count_is_explored_away_from() {
        let acc = seq(0.7);
        // the depth it takes with the prior slope, measured alone
        let mut c = CostModel::default();
        c.record_heads(1, 0.5);
        c.record_forward(1, 10.0);
        let one = Choice {
            acceptance: &acc,
            max: 8,
        };
        let k = choose(&mut CostModel::clone(&c), Fixed::default(), &[one])[0];
        let mut c = CostModel::default();
        c.record_heads(1, 0.5);
        for _ in 0..10 {
            c.record_forward(k + 1, 10.0);
        }
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..16 {
            let d = choose(
                &mut c,
                Fixed::default(),
                &[Choice {
                    acceptance: &acc,
                    max: 8,
                }],
            );
            seen.insert(d[0]);
        }
        assert!(seen.len() >= 2, "{seen:?}");
        // nothing measured: a choice is still made, from the priors
        let mut empty = CostModel::default();
        let d = choose(
            &mut empty,
            Fixed::default(),
            &[Choice {
                acceptance: &acc,
                max: 8,
            }],
        );
        assert!(d[0] <= 8);
    }

    #[test]
    fn the_prior_follows_the_sequences_run() {
        let mut m = DepthModel::default();
        let first = m.new_sequence().pooled();
        assert!((first - FIRST_PRIOR).abs() < 1e-12);
        let mut s = m.new_sequence();
        for _ in 0..50 {
            m.record_round(&mut s, 3, 3);
        }
        assert!(m.new_sequence().pooled() > 0.9);
        assert!(s.pooled() > 0.9);
        // plain steps only age the evidence: the estimate drifts back to the prior
        let mut poor = Acceptance::new(0.6);
        for _ in 0..30 {
            m.record_round(&mut poor, 2, 0);
        }
        let low = poor.pooled();
        assert!(low < 0.2, "{low}");
        for _ in 0..60 {
            m.record_round(&mut poor, 0, 0);
        }
        assert!(poor.pooled() > low + 0.2, "{} after {low}", poor.pooled());
    }
}
