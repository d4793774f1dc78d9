//! The native prefix cache: memory-only, bounded, least-recently-used, keyed by
//! `prompt_cache_key`, holding a few checkpoints of the full decoding state per key.
//!
//! A hybrid model's recurrent state cannot be trimmed back to an arbitrary position, so the
//! cache stores whole-state checkpoints at known token positions (by default three per key: the
//! end of the last conversation before its generation prompt, which the next chat turn renders
//! again even when the template rewrites earlier answers (Qwen3.5 drops their reasoning); the
//! end of the last prompt; and the end of the last answer). A new request resumes from the
//! longest checkpoint whose tokens are a strict prefix of its own prompt, and computes only the
//! rest.

use std::collections::HashMap;
use std::sync::Arc;

/// A decoding state that can be stored in the cache.
pub trait CacheState: Send + Sync {
    /// Bytes this state holds (counted against the cache budget).
    fn bytes(&self) -> usize;
    /// Tokens of the sequence this state covers (its first `tokens()` tokens).
    fn tokens(&self) -> usize;
    /// The state as bytes, for a prefix cache on disk (`None`: kept in memory only); the
    /// backend reads them back ([`Backend::state_from_bytes`](super::backend::Backend)).
    fn to_bytes(&self) -> Option<Vec<u8>> {
        None
    }
}

/// Default budget: 512 MiB.
pub const DEFAULT_BUDGET_BYTES: usize = 512 * 1024 * 1024;
/// Default checkpoints kept per key.
pub const DEFAULT_CHECKPOINTS_PER_KEY: usize = 3;

struct Checkpoint<S> {
    tokens: Vec<u32>,
    state: Arc<S>,
    bytes: usize,
    last_used: u64,
}

/// A bounded LRU cache of decoding-state checkpoints.
pub struct PrefixCache<S> {
    entries: HashMap<String, Vec<Checkpoint<S>>>,
    budget: usize,
    per_key: usize,
    used: usize,
    tick: u64,
}

/// A hit: the number of prompt tokens covered and the state after them.
pub struct Hit<S> {
    /// Tokens of the prompt the state already covers.
    pub tokens: usize,
    /// The state after those tokens.
    pub state: Arc<S>,
}

impl<S: CacheState> PrefixCache<S> {
    /// An empty cache with a byte budget and a checkpoint count per key.
    pub fn new(budget_bytes: usize, checkpoints_per_key: usize) -> Self {
        PrefixCache {
            entries: HashMap::new(),
            budget: budget_bytes,
            per_key: checkpoints_per_key.max(1),
            used: 0,
            tick: 0,
        }
    }

    /// Bytes currently held.
    pub fn used_bytes(&self) -> usize {
        self.used
    }

    /// Number of checkpoints held.
    pub fn len(&self) -> usize {
        self.entries.values().map(Vec::len).sum()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The longest checkpoint under `key` whose tokens are a strict prefix of `prompt`.
    pub fn lookup(&mut self, key: &str, prompt: &[u32]) -> Option<Hit<S>> {
        self.tick += 1;
        let tick = self.tick;
        let list = self.entries.get_mut(key)?;
        let best = list
            .iter_mut()
            .filter(|c| c.tokens.len() < prompt.len() && prompt.starts_with(&c.tokens))
            .max_by_key(|c| c.tokens.len())?;
        best.last_used = tick;
        Some(Hit {
            tokens: best.tokens.len(),
            state: Arc::clone(&best.state),
        })
    }

    /// Stores a checkpoint under `key`; the oldest checkpoint of the key goes when it has too
    /// many, and least-recently-used checkpoints of any key go while over budget. A checkpoint
    /// larger than the whole budget is not stored. Every byte it leaves behind is charged:
    /// the state, its tokens, and its copy of the key.
    pub fn insert(&mut self, key: &str, tokens: Vec<u32>, state: Arc<S>) {
        let bytes = checkpoint_bytes(key, &tokens, state.bytes());
        if bytes > self.budget || tokens.is_empty() {
            return;
        }
        self.tick += 1;
        let tick = self.tick;
        let list = self.entries.entry(key.to_string()).or_default();
        if let Some(pos) = list.iter().position(|c| c.tokens == tokens) {
            let old = list.remove(pos);
            self.used -= old.bytes;
        }
        list.push(Checkpoint {
            tokens,
            state,
            bytes,
            last_used: tick,
        });
        self.used += bytes;
        while list.len() > self.per_key {
            let (idx, _) = list
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.last_used)
                .expect("non-empty");
            let old = list.remove(idx);
            self.used -= old.bytes;
        }
        while self.used > self.budget {
            if !self.evict_lru() {
                break;
            }
        }
    }

    fn evict_lru(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .flat_map(|(k, v)| v.iter().enumerate().map(move |(i, c)| (k, i, c.last_used)))
            .min_by_key(|(_, _, t)| *t)
            .map(|(k, i, _)| (k.clone(), i));
        let Some((key, idx)) = victim else {
            return false;
        };
        if let Some(list) = self.entries.get_mut(&key) {
            let old = list.remove(idx);
            self.used -= old.bytes;
            if list.is_empty() {
                self.entries.remove(&key);
            }
        }
        true
    }

    /// Clears everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.used = 0;
    }
}

/// What one checkpoint holds in memory: its state, its token ids, its key (each key's list
/// is kept under its own copy) and the bookkeeping beside them.
fn checkpoint_bytes(key: &str, tokens: &[u32], state: usize) -> usize {
    const BOOKKEEPING: usize = 128;
    state
        .saturating_add(std::mem::size_of_val(tokens))
        .saturating_add(key.len())
        .saturating_add(BOOKKEEPING)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct St(usize);
    impl CacheState for St {
        fn bytes(&self) -> usize {
            self.0
        }
        fn tokens(&self) -> usize {
            0
        }
    }

    #[test]
    fn longest_strict_prefix_wins() {
        let mut c = PrefixCache::new(1000, 2);
        c.insert("k", vec![1, 2], Arc::new(St(10)));
        c.insert("k", vec![1, 2, 3, 4], Arc::new(St(10)));
        assert_eq!(c.lookup("k", &[1, 2, 3, 4, 5]).unwrap().tokens, 4);
        // A checkpoint equal to the whole prompt is not a hit (at least one token must run).
        assert_eq!(c.lookup("k", &[1, 2, 3, 4]).unwrap().tokens, 2);
        assert!(c.lookup("k", &[9, 9, 9]).is_none());
        assert!(c.lookup("other", &[1, 2, 3]).is_none());
    }

    #[test]
    fn per_key_limit_and_budget_evict_lru() {
        let cost = |key: &str, n: usize, state: usize| checkpoint_bytes(key, &vec![0; n], state);
        let budget = cost("a", 2, 1000) + cost("a", 3, 1000) + cost("b", 1, 1500) - 1;
        let mut c = PrefixCache::new(budget, 2);
        c.insert("a", vec![1], Arc::new(St(1000)));
        c.insert("a", vec![1, 2], Arc::new(St(1000)));
        c.insert("a", vec![1, 2, 3], Arc::new(St(1000)));
        assert_eq!(c.len(), 2);
        assert_eq!(c.used_bytes(), cost("a", 2, 1000) + cost("a", 3, 1000));
        c.lookup("a", &[1, 2, 3, 4]); // touch [1,2,3]
        c.insert("b", vec![5], Arc::new(St(1500)));
        // Over budget by one byte: the least recently used ([1,2]) goes.
        assert_eq!(c.used_bytes(), cost("a", 3, 1000) + cost("b", 1, 1500));
        assert_eq!(c.lookup("a", &[1, 2, 3, 4]).unwrap().tokens, 3);
        assert_eq!(c.lookup("a", &[1, 2, 9]).map(|h| h.tokens), None);
        c.insert("huge", vec![1], Arc::new(St(budget)));
        assert!(c.lookup("huge", &[1, 2]).is_none());
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.used_bytes(), 0);
    }

    #[test]
    fn keys_and_tokens_are_charged_to_the_budget() {
        // states of no size at all: what a checkpoint leaves is its key and its tokens
        let budget = 1 << 20;
        let mut c = PrefixCache::new(budget, 3);
        for i in 0..40u32 {
            let key = format!("{i}{}", "k".repeat(100_000));
            c.insert(&key, vec![i; 10_000], Arc::new(St(0)));
            assert!(c.used_bytes() <= budget, "{} > {budget}", c.used_bytes());
        }
        // each holds 100,000 key bytes and 40,000 token bytes: at most seven fit
        assert!((1..=7).contains(&c.len()), "{}", c.len());
    }
}
