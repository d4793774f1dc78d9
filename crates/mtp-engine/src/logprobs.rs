//! Log probabilities of tokens under the target model: of each generated token (from the row
//! of target logits it was picked from, before any sampling transform: penalties, temperature,
//! a constraint's mask, as vLLM's default `raw_logprobs` reports them) and of a prompt's
//! tokens (`echo`).
//!
//! With MTP the rows come from the verify forward, whose rows are the target's own: the log
//! probabilities are those of target-only decoding.

use std::sync::Arc;

/// The most alternatives a token's log probability may list (the contract's bound).
pub const MAX_TOP_LOGPROBS: usize = mtp_contract::MAX_TOP_LOGPROBS as usize;

/// Rows of prompt logits computed at once for [`Engine::prompt_logprobs`](crate::Engine::prompt_logprobs): each row is a
/// vocabulary of floats (about 1 MB on a 250k vocabulary), reduced to its log probabilities
/// before the next block.
pub(crate) const PROMPT_ROWS: usize = 16;

/// One token's log probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its natural-log probability.
    pub logprob: f32,
    /// The `n` most likely tokens at its position with theirs, most likely first (ties: the
    /// lower id first); `n` as asked for ([`GenerateOptions::logprobs`](crate::GenerateOptions::logprobs)).
    pub top: Vec<(u32, f32)>,
}

/// Where a generation's log probabilities go as they are produced
/// ([`GenerateOptions::on_logprobs`](crate::GenerateOptions::on_logprobs)): called with those of each chunk of tokens, just before
/// the chunk itself reaches the caller's callback (on the same thread), so a caller that
/// queues them here finds them when the tokens arrive.
#[derive(Clone)]
pub struct LogprobSink(Arc<LogprobFn>);

/// What a [`LogprobSink`] calls.
type LogprobFn = dyn Fn(&[TokenLogprob]) + Send + Sync;

impl LogprobSink {
    /// A sink calling `f` with each chunk's log probabilities.
    pub fn new(f: impl Fn(&[TokenLogprob]) + Send + Sync + 'static) -> Self {
        LogprobSink(Arc::new(f))
    }

    pub(crate) fn send(&self, lps: &[TokenLogprob]) {
        (self.0)(lps)
    }
}

impl std::fmt::Debug for LogprobSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogprobSink")
    }
}

/// The log-sum-exp of a row (accumulated in f64: a sum of 250k terms in f32 loses digits). A
/// row holding NaN gives NaN.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return f64::from(max);
    }
    let m = f64::from(max);
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - m).exp()).sum();
    m + sum.ln()
}

/// The `n` largest entries of `row` as `(id, value)`, largest first, ties by the lower id.
fn top_n(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (i, &x) in row.iter().enumerate() {
        if x.is_nan() || (top.len() == n && x <= top[n - 1].1) {
            continue;
        }
        // after the entries at least as large (an equal earlier id stays first)
        let at = top.partition_point(|&(_, v)| v >= x);
        top.insert(at, (i as u32, x));
        top.truncate(n);
    }
    top
}

/// The log probability of `id` under the logits `row`, with the `n` most likely alternatives.
pub(crate) fn of_row(row: &[f32], id: u32, n: usize) -> TokenLogprob {
    let lse = log_sum_exp(row);
    let lp = |x: f32| (f64::from(x) - lse) as f32;
    TokenLogprob {
        id,
        logprob: row.get(id as usize).map_or(f32::NEG_INFINITY, |&x| lp(x)),
        top: top_n(row, n).into_iter().map(|(t, x)| (t, lp(x))).collect(),
    }
}

/// The log probabilities of `ids`, the tokens picked from consecutive rows of `logits` (rows of
/// `vocab` values).
pub(crate) fn of_rows(logits: &[f32], vocab: usize, ids: &[u32], n: usize) -> Vec<TokenLogprob> {
    ids.iter()
        .enumerate()
        .filter_map(|(j, &id)| {
            logits
                .get(j * vocab..(j + 1) * vocab)
                .map(|row| of_row(row, id, n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_normalises_and_ranks() {
        let row = [1.0f32, 3.0, 2.0, 3.0, f32::NEG_INFINITY];
        let lp = of_row(&row, 2, 3);
        let z: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
        assert!((f64::from(lp.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        // ties: the lower id first
        assert_eq!(
            lp.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 3, 2]
        );
        let total: f64 = row.iter().map(|&x| (f64::from(x) - z.ln()).exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert_eq!(of_row(&row, 4, 0).logprob, f32::NEG_INFINITY);
        assert!(of_row(&row, 0, 0).top.is_empty());
        // an id past the row has no probability, and nothing panics
        assert_eq!(of_row(&row, 9, 1).logprob, f32::NEG_INFINITY);
    }
}
