//! Logit processing and token sampling: greedy, temperature, top-k, top-p, min-p, position-keyed
//! seeded draws, presence / frequency / repetition penalties and logit bias.
//!
//! Order: penalties and bias (target-only controls) → temperature → softmax → top-k → top-p →
//! min-p → renormalise → draw. With a seed, the draw for generated token `i` uses a uniform
//! number that depends only on `(seed, i)`, so plain and speculative decoding that see the same
//! distributions pick the same tokens.

use std::borrow::Cow;

use mtp_contract::Sampling;
use rand::{Rng, SeedableRng};

use crate::constraint::Constraint;
use crate::error::Result;

/// Tokens of context the penalties look at (mlx-lm's default).
pub const PENALTY_CONTEXT: usize = 20;

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// A uniform draw in `[0, 1)` keyed by `(seed, stream, position)`.
pub fn position_uniform(seed: u64, stream: u64, position: u64) -> f64 {
    // Same mixing as mlx-vlm's `_position_seed` (row id = stream), then splitmix64.
    let mut x: u64 = (seed ^ 0x9E37_79B9) & 0xFFFF_FFFF;
    x = (x + (stream + 1) * 0x85EB_CA6B) & 0xFFFF_FFFF;
    x = (x ^ ((position + 1) * 0xC2B2_AE35)) & 0xFFFF_FFFF;
    let mut z = x.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// [`mtp_grammar::beside`] for samplers: `work` (a forward on the engine's worker team) runs
/// while each constrained sampler of `ahead` computes, beside it, the mask its next pick will
/// need (the one after its tokens), where a core is left over from the team. Samplers without
/// a constraint are left alone.
pub(crate) fn masks_beside<R>(ahead: Vec<(&mut Sampler, &[u32])>, work: impl FnOnce() -> R) -> R {
    let ahead = ahead
        .into_iter()
        .filter_map(|(s, toks)| Some((s.constraint.as_mut()?, toks)))
        .collect();
    mtp_grammar::beside(ahead, crate::team::threads(), work)
}

/// The sampling state of one request.
#[derive(Debug)]
pub struct Sampler {
    params: Sampling,
    rng: rand::rngs::StdRng,
    /// The reply's grammar state, when its shape is constrained.
    constraint: Option<Constraint>,
}

impl Sampler {
    /// A sampler for `params`; unseeded sampling draws from the OS entropy source.
    pub fn new(params: &Sampling) -> Self {
        Sampler {
            params: params.clone(),
            rng: rand::rngs::StdRng::from_os_rng(),
            constraint: None,
        }
    }

    /// Constrains every pick of this sampler (the target's and the drafter's) to `c`.
    pub fn with_constraint(mut self, c: Option<Constraint>) -> Self {
        self.constraint = c;
        self
    }

    /// The constraint, when there is one.
    pub fn constraint(&self) -> Option<&Constraint> {
        self.constraint.as_ref()
    }

    /// `logits` with the tokens the constraint does not allow at the current position set to
    /// `-inf` (unchanged without a constraint).
    pub fn constrain<'l>(&mut self, logits: &'l [f32]) -> Result<Cow<'l, [f32]>> {
        match self.constraint.as_mut() {
            None => Ok(Cow::Borrowed(logits)),
            Some(c) => {
                let mut l = logits.to_vec();
                c.apply(&mut l)?;
                Ok(Cow::Owned(l))
            }
        }
    }

    /// Feeds a chosen token to the constraint (nothing without one).
    pub fn advance(&mut self, tok: u32) -> Result<()> {
        match self.constraint.as_mut() {
            Some(c) => Ok(c.advance(tok)?),
            None => Ok(()),
        }
    }

    /// Takes the last `n` fed tokens back from the constraint.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        match self.constraint.as_mut() {
            Some(c) => Ok(c.rollback(n)?),
            None => Ok(()),
        }
    }

    /// True for an end id under a constraint (where drafting stops).
    pub fn is_constrained_end(&self, tok: u32) -> bool {
        self.constraint.as_ref().is_some_and(|c| c.is_end(tok))
    }

    /// True when the constraint is complete: the reply must end here.
    pub fn constraint_complete(&self) -> bool {
        self.constraint
            .as_ref()
            .is_some_and(Constraint::is_complete)
    }

    /// Samples generated token `position` under the constraint and feeds it to it.
    pub fn pick(&mut self, logits: &[f32], position: usize) -> Result<u32> {
        let l = self.constrain(logits)?;
        let t = self.sample(&l, position);
        self.advance(t)?;
        Ok(t)
    }

    /// The parameters.
    pub fn params(&self) -> &Sampling {
        &self.params
    }

    /// True for argmax decoding.
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// True when draws are position-keyed.
    pub fn is_seeded(&self) -> bool {
        self.params.seed.is_some()
    }

    /// Whether [`Sampler::apply_penalties`] may change a row (a penalty or a bias is set).
    pub(crate) fn alters_logits(&self) -> bool {
        !self.params.target_only_controls().is_empty()
    }

    /// Applies repetition / presence / frequency penalties over the last [`PENALTY_CONTEXT`]
    /// tokens of `history`, and the logit bias, in place.
    pub fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        let ctx = &history[history.len().saturating_sub(PENALTY_CONTEXT)..];
        if !ctx.is_empty() {
            let mut counts: std::collections::BTreeMap<u32, u32> = Default::default();
            for t in ctx {
                *counts.entry(*t).or_default() += 1;
            }
            for (t, c) in counts {
                let Some(l) = logits.get_mut(t as usize) else {
                    continue;
                };
                if let Some(r) = p.repetition_penalty.filter(|r| *r != 1.0) {
                    *l = if *l < 0.0 { *l * r } else { *l / r };
                }
                if let Some(pp) = p.presence_penalty {
                    *l -= pp;
                }
                if let Some(fp) = p.frequency_penalty {
                    *l -= fp * c as f32;
                }
            }
        }
        for (t, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(*t as usize) {
                *l += b;
            }
        }
    }

    /// The sampling distribution over the vocabulary after temperature, top-k, top-p and min-p
    /// (all zeros but one for greedy).
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let n = logits.len();
        let mut probs = vec![0f32; n];
        if self.is_greedy() {
            probs[argmax(logits) as usize] = 1.0;
            return probs;
        }
        let temp = self.params.temperature.unwrap_or(1.0).max(1e-6);
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for (p, l) in probs.iter_mut().zip(logits) {
            *p = ((l - max) / temp).exp();
            sum += *p as f64;
        }
        probs.iter_mut().for_each(|p| *p = (*p as f64 / sum) as f32);
        let top_k = self.params.top_k.unwrap_or(0) as usize;
        let top_p = self.params.top_p.unwrap_or(1.0);
        let min_p = self.params.min_p.unwrap_or(0.0);
        if (top_k > 0 && top_k < n) || top_p < 1.0 || min_p > 0.0 {
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]).then(a.cmp(b)));
            let mut keep = vec![false; n];
            let mut cum = 0f32;
            let pmax = probs[order[0]];
            for (rank, &i) in order.iter().enumerate() {
                if top_k > 0 && rank >= top_k {
                    break;
                }
                if min_p > 0.0 && probs[i] < min_p * pmax {
                    break;
                }
                keep[i] = true;
                cum += probs[i];
                if cum >= top_p {
                    break;
                }
            }
            let mut s = 0f64;
            for (p, k) in probs.iter_mut().zip(&keep) {
                if !k {
                    *p = 0.0;
                }
                s += *p as f64;
            }
            probs.iter_mut().for_each(|p| *p = (*p as f64 / s) as f32);
        }
        probs
    }

    /// Inverse-CDF draw from `probs` with uniform `u`.
    pub fn draw(probs: &[f32], u: f64) -> u32 {
        let mut cum = 0f64;
        let mut last = 0usize;
        for (i, p) in probs.iter().enumerate() {
            if *p <= 0.0 {
                continue;
            }
            cum += *p as f64;
            last = i;
            if u < cum {
                return i as u32;
            }
        }
        last as u32
    }

    /// A uniform number for generated token `position` (position-keyed with a seed, else from
    /// the sampler's RNG). `stream` separates independent uses (0 = target draws).
    pub fn uniform(&mut self, stream: u64, position: usize) -> f64 {
        match self.params.seed {
            Some(seed) => position_uniform(seed, stream, position as u64),
            None => self.rng.random::<f64>(),
        }
    }

    /// Samples generated token `position` from processed logits.
    pub fn sample(&mut self, logits: &[f32], position: usize) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let probs = self.distribution(logits);
        let u = self.uniform(0, position);
        Self::draw(&probs, u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let s = Sampler::new(&Sampling::greedy());
        let mut s = s;
        assert_eq!(s.sample(&[0.1, 3.0, 2.0], 0), 1);
    }

    #[test]
    fn top_k_one_is_argmax() {
        let mut s = Sampler::new(&Sampling {
            temperature: Some(1.0),
            top_k: Some(1),
            ..Default::default()
        });
        for i in 0..20 {
            assert_eq!(s.sample(&[0.1, 3.0, 2.9], i), 1);
        }
    }

    #[test]
    fn seeded_draws_depend_on_position_only() {
        let p = Sampling {
            temperature: Some(1.0),
            seed: Some(7),
            ..Default::default()
        };
        let logits = [1.0, 1.0, 1.0, 1.0];
        let a: Vec<u32> = (0..16)
            .map(|i| Sampler::new(&p).sample(&logits, i))
            .collect();
        let mut s = Sampler::new(&p);
        let b: Vec<u32> = (0..16).map(|i| s.sample(&logits, i)).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|t| *t != a[0]));
    }

    #[test]
    fn penalties_and_bias() {
        let s = Sampler::new(&Sampling {
            repetition_penalty: Some(2.0),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(0.25),
            logit_bias: [(0u32, 1.0f32)].into_iter().collect(),
            ..Default::default()
        });
        let mut l = vec![2.0, -2.0, 1.0];
        s.apply_penalties(&mut l, &[1, 1, 2]);
        assert_eq!(l, vec![3.0, -4.0 - 0.5 - 0.5, 0.5 - 0.5 - 0.25]);
    }
}
