//! The grammar state of one constrained reply, token by token, for any vocabulary.
//!
//! A [`Compiler`] is built once per vocabulary (llguidance's token trie and slicer take a while
//! on a 250k vocabulary): the native engine builds it from its `tokenizer.json`, the in-process
//! llama.cpp lane from the GGUF's vocabulary. [`Compiler::compile`] turns a [`ResponseFormat`]
//! into a [`Constraint`], whose mask at each position sets what the next token may be.
//!
//! With MTP the state advances through the drafts and rolls back to the accepted prefix; masks
//! are kept along the path, so a verify position reuses the mask computed while drafting (each
//! position's mask is computed once per round). Greedy constrained output is therefore the same
//! with and without MTP.
//!
//! End-of-sequence ids are never fed to the grammar: they are allowed exactly when the grammar
//! accepts, and a reply ends when the grammar is complete (nothing but an end could follow).

use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokenId};
use llguidance::{Matcher, ParserFactory};
use mtp_contract::ResponseFormat;

use crate::{grammar, Error};

/// Compiles constraints for one vocabulary.
pub struct Compiler {
    factory: ParserFactory,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl Compiler {
    /// A compiler over the vocabulary `env` (its trie's end ids end a reply). A vocabulary
    /// llguidance cannot use is an [`Error::Vocabulary`].
    pub fn new(env: &TokEnv) -> Result<Self, Error> {
        let mut factory =
            ParserFactory::new_simple(env).map_err(|e| Error::Vocabulary(e.to_string()))?;
        // library code never prints: llguidance logs to stderr unless told not to
        factory.quiet();
        let eos = env.tok_trie().eos_tokens().to_vec();
        if eos.is_empty() {
            return Err(Error::Vocabulary(
                "the vocabulary names no end-of-sequence token, so a constrained reply could \
                 never end"
                    .into(),
            ));
        }
        Ok(Compiler { factory, eos })
    }

    /// A fresh constraint state for one reply (`None` for free text). A format that does not
    /// compile (a schema keyword llguidance does not know, a bad regex, a grammar error, an
    /// unsatisfiable schema) is an [`Error::Compile`] here, before any generation.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<Constraint>, Error> {
        let Some(g) = grammar(format) else {
            return Ok(None);
        };
        let kind = format.kind();
        // client data: bounded, then compiled on a stack of its own (see `guard`)
        crate::guard::check(format)?;
        crate::guard::run(kind, || self.start(g, kind))
    }

    fn start(&self, g: TopLevelGrammar, kind: &'static str) -> Result<Option<Constraint>, Error> {
        let compile = |message: String| Error::Compile { kind, message };
        let parser = self
            .factory
            .create_parser(g)
            .map_err(|e| compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(compile(e));
        }
        let mut c = Constraint {
            matcher: Box::new(matcher),
            kind,
            eos: self.eos.clone(),
            path: Vec::new(),
            len: 0,
            masks: Vec::new(),
            mask_ms: 0.0,
            ahead_ms: 0.0,
            masks_computed: 0,
            preparing: false,
        };
        // a grammar that allows nothing at all (e.g. an unsatisfiable schema) fails now
        let allowed = c.mask().map_err(|e| compile(e.to_string()))?.num_set();
        if allowed == 0 {
            return Err(compile(
                "the constraint allows no token at the start of the reply".into(),
            ));
        }
        Ok(Some(c))
    }
}

/// Why a pick failed when every token the grammar allows is already at `-inf`.
const ALL_MASKED: &str = "no token the grammar allows here is in the model's output (all masked)";

/// The grammar state of one reply (see the module docs).
pub struct Constraint {
    matcher: Box<Matcher>,
    kind: &'static str,
    eos: Vec<u32>,
    /// Tokens along the current path: `path[..len]` are consumed; the rest were consumed and
    /// rolled back (their masks stay valid while the same tokens are consumed again).
    path: Vec<u32>,
    len: usize,
    /// `(position, mask at that position)`, positions counted in consumed tokens.
    masks: Vec<(usize, SimpleVob)>,
    /// Milliseconds of mask computation a pick waited for, and of computation done ahead
    /// ([`Constraint::prepare`], beside a forward).
    mask_ms: f64,
    ahead_ms: f64,
    masks_computed: u64,
    /// True while [`Constraint::prepare`] runs (its time goes to `ahead_ms`).
    preparing: bool,
}

impl Clone for Constraint {
    /// An independent copy of the state (llguidance's deep clone): a constraint compiled once
    /// ahead of a request, off the thread that decodes it, is handed over as a copy.
    fn clone(&self) -> Self {
        Constraint {
            matcher: Box::new(self.matcher.deep_clone()),
            kind: self.kind,
            eos: self.eos.clone(),
            path: self.path.clone(),
            len: self.len,
            masks: self.masks.clone(),
            mask_ms: self.mask_ms,
            ahead_ms: self.ahead_ms,
            masks_computed: self.masks_computed,
            preparing: false,
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("kind", &self.kind)
            .field("consumed", &self.len)
            .finish()
    }
}

/// A mask must cost at least this much (milliseconds, on average so far) before [`beside`]
/// computes one ahead on a thread of its own: below it, starting and joining the thread (tens
/// of microseconds) would cost more than the wait it saves.
pub const AHEAD_MIN_MS: f64 = 0.1;

/// Runs `work` (a forward) on this thread while, on one scoped thread beside it, each
/// constraint of `ahead` computes the mask its next pick will need: the one at the position
/// after its tokens ([`Constraint::prepare`]). The pick then finds the mask ready instead of
/// computing it after the forward (llguidance's masks on a 150k vocabulary take a millisecond
/// or more). Nothing changes in what is computed, only when: a mask depends on the grammar
/// state alone.
///
/// Only where it pays: when the machine has a core beyond the `forward_threads` the forward
/// keeps busy (on a machine whose every core runs the forward, the thread only takes time from
/// it: measured on 2 cores, target-only decode 272 → 238 tok/s with a 2-thread forward, 246 →
/// 257 with a 1-thread one), and for constraints whose masks cost more than a thread start
/// ([`AHEAD_MIN_MS`]) and are not kept already. An error computing ahead is dropped: the pick
/// computes that mask again and reports it.
pub fn beside<R>(
    ahead: Vec<(&mut Constraint, &[u32])>,
    forward_threads: usize,
    work: impl FnOnce() -> R,
) -> R {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if forward_threads >= cores {
        return work();
    }
    beside_above(ahead, AHEAD_MIN_MS, work)
}

/// [`beside`] on a spare core, for masks of at least `min_ms`.
fn beside_above<R>(
    ahead: Vec<(&mut Constraint, &[u32])>,
    min_ms: f64,
    work: impl FnOnce() -> R,
) -> R {
    let due: Vec<(&mut Constraint, &[u32])> = ahead
        .into_iter()
        .filter(|(c, toks)| c.mean_mask_ms() >= min_ms && !c.is_ready(toks))
        .collect();
    if due.is_empty() {
        return work();
    }
    std::thread::scope(|scope| {
        scope.spawn(move || {
            for (c, toks) in due {
                let _ = c.prepare(toks);
            }
        });
        work()
    })
}

/// Masks kept behind the current position (a rollback deeper than this recomputes).
const KEPT_BEHIND: usize = 32;

impl Constraint {
    fn fail(&self, message: impl std::fmt::Display) -> Error {
        Error::Reply {
            kind: self.kind,
            message: message.to_string(),
        }
    }

    /// The mask at the current position (computed once per position along the path).
    fn mask(&mut self) -> Result<&SimpleVob, Error> {
        let pos = self.len;
        if let Some(i) = self.masks.iter().position(|(p, _)| *p == pos) {
            return Ok(&self.masks[i].1);
        }
        let t = Instant::now();
        let m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.fail(e))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if self.preparing {
            self.ahead_ms += ms;
        } else {
            self.mask_ms += ms;
        }
        self.masks_computed += 1;
        self.masks.retain(|(p, _)| p + KEPT_BEHIND >= pos);
        self.masks.push((pos, m));
        Ok(&self.masks.last().expect("just pushed").1)
    }

    /// Sets the logits of tokens the grammar does not allow here to `-inf` (ids past the
    /// vocabulary, padding rows of an LM head, are never allowed). End ids are allowed exactly
    /// when the grammar accepts. Every allowed token already at `-inf` is an error: nothing
    /// could be drawn.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), Error> {
        let mask = self.mask()?;
        let n = mask.len();
        let mut any = false;
        for (i, l) in logits.iter_mut().enumerate() {
            if i < n && mask.is_allowed(i as TokenId) {
                any |= *l > f32::NEG_INFINITY;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if !any {
            return Err(self.fail(ALL_MASKED));
        }
        Ok(())
    }

    /// The tokens the grammar allows here with their logits from `logits` (ids in the row and
    /// not at `-inf`), in id order: what [`Constraint::apply`] leaves, without copying the row.
    /// The set bits of the mask are walked a word at a time, so a narrow mask (a JSON key, a
    /// number) costs a few hundred candidates rather than a pass over the whole vocabulary.
    /// None allowed is an error, as in [`Constraint::apply`].
    pub fn candidates(&mut self, logits: &[f32]) -> Result<Vec<(u32, f32)>, Error> {
        let mask = self.mask()?;
        let mut out = Vec::new();
        mask.iter_set_entries(|i| {
            if let Some(&l) = logits.get(i) {
                if l > f32::NEG_INFINITY {
                    out.push((i as u32, l));
                }
            }
        });
        if out.is_empty() {
            return Err(self.fail(ALL_MASKED));
        }
        Ok(out)
    }

    /// Whether the grammar allows `tok` at the current position (an end id: whether the
    /// grammar accepts here).
    pub fn allows(&mut self, tok: u32) -> Result<bool, Error> {
        let mask = self.mask()?;
        Ok((tok as usize) < mask.len() && mask.is_allowed(tok as TokenId))
    }

    /// True for an end-of-sequence id (never fed to the grammar).
    pub fn is_end(&self, tok: u32) -> bool {
        self.eos.contains(&tok)
    }

    /// Feeds one generated token (end ids are not fed: the reply ends there). A token the
    /// grammar does not allow is an [`Error::Reply`].
    pub fn advance(&mut self, tok: u32) -> Result<(), Error> {
        if self.is_end(tok) {
            return Ok(());
        }
        self.matcher
            .consume_token(tok)
            .map_err(|e| self.fail(format!("token {tok} rejected: {e}")))?;
        if self.path.get(self.len) != Some(&tok) {
            // a new branch: masks past here belonged to the old one
            self.path.truncate(self.len);
            self.path.push(tok);
            let len = self.len;
            self.masks.retain(|(p, _)| *p <= len);
        }
        self.len += 1;
        Ok(())
    }

    /// Takes back the last `n` fed tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), Error> {
        let n = n.min(self.len);
        if n == 0 {
            return Ok(());
        }
        self.matcher.rollback(n).map_err(|e| self.fail(e))?;
        self.len -= n;
        Ok(())
    }

    /// How many of `drafts` the grammar allows in a row from the current position (an end id
    /// counts, and ends the walk). The state is left where it was; the masks computed on the
    /// way are kept, so verifying those positions does not compute them again.
    pub fn allowed_prefix(&mut self, drafts: &[u32]) -> Result<usize, Error> {
        let mut fed = 0;
        let mut n = 0;
        for &d in drafts {
            if !self.allows(d)? {
                break;
            }
            n += 1;
            if self.is_end(d) {
                break;
            }
            self.advance(d)?;
            fed += 1;
        }
        self.rollback(fed)?;
        Ok(n)
    }

    /// Tokens fed so far.
    pub fn consumed(&self) -> usize {
        self.len
    }

    /// True when the grammar is complete: nothing but the end could follow.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// Milliseconds a pick (or a walk through drafts) waited for masks to be computed, and how
    /// many masks were computed in all (those computed ahead included).
    pub fn mask_cost(&self) -> (f64, u64) {
        (self.mask_ms, self.masks_computed)
    }

    /// Milliseconds of masks computed ahead, by [`Constraint::prepare`] (beside a forward:
    /// off the critical path, so not in [`Constraint::mask_cost`]'s wait).
    pub fn ahead_ms(&self) -> f64 {
        self.ahead_ms
    }

    /// The mean cost of one mask so far, milliseconds (what computing the next one ahead
    /// would save).
    pub fn mean_mask_ms(&self) -> f64 {
        if self.masks_computed == 0 {
            return 0.0;
        }
        (self.mask_ms + self.ahead_ms) / self.masks_computed as f64
    }

    /// Whether the mask at the position after feeding `ahead` is kept already (`ahead` along
    /// the current path, as drafts are).
    pub fn is_ready(&self, ahead: &[u32]) -> bool {
        let pos = self.len + ahead.len();
        (ahead.is_empty() || self.path.get(self.len..pos) == Some(ahead))
            && self.masks.iter().any(|(p, _)| *p == pos)
    }

    /// Computes and keeps the mask at the position after `ahead` (fed, then taken back; the
    /// state is left where it was), so that the pick there finds it ready: the engine calls
    /// this on a thread of its own while the forward that yields that pick's logits runs.
    /// Where `ahead` leaves the grammar (an end id, a refused token) or the grammar is complete,
    /// nothing is computed: the pick will meet that itself. Its time is
    /// [`Constraint::ahead_ms`].
    pub fn prepare(&mut self, ahead: &[u32]) -> Result<(), Error> {
        self.preparing = true;
        let r = self.prepare_inner(ahead);
        self.preparing = false;
        r
    }

    fn prepare_inner(&mut self, ahead: &[u32]) -> Result<(), Error> {
        let mut fed = 0;
        let mut reached = true;
        for &t in ahead {
            // `allows` before feeding: a refused token would put the matcher in error
            if self.is_end(t) || self.matcher.is_stopped() || !self.allows(t)? {
                reached = false;
                break;
            }
            self.advance(t)?;
            fed += 1;
        }
        let r = if reached && !self.matcher.is_stopped() {
            self.mask().map(|_| ())
        } else {
            Ok(())
        };
        self.rollback(fed)?;
        r
    }

    /// [`ResponseFormat::kind`] of the constraint.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use llguidance::toktrie::{ApproximateTokEnv, TokEnv};

    use super::*;

    fn compiler() -> Compiler {
        // one token per byte, and the trie's own end id
        let env: TokEnv = Arc::new(ApproximateTokEnv::single_byte());
        Compiler::new(&env).expect("compiler")
    }

    fn ids(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    #[test]
    fn drafts_are_cut_at_the_first_refused_token_and_the_state_stays() {
        let c = compiler();
        let mut k = c
            .compile(&ResponseFormat::regex("ab(c|d)e"))
            .unwrap()
            .expect("a constraint");
        assert_eq!(k.allowed_prefix(&ids("abxe")).unwrap(), 2);
        assert_eq!(k.consumed(), 0, "the walk leaves the state where it was");
        assert_eq!(k.allowed_prefix(&ids("abde")).unwrap(), 4);
        for t in ids("abd") {
            assert!(k.allows(t).unwrap());
            k.advance(t).unwrap();
        }
        assert!(!k.allows(u32::from(b'x')).unwrap());
        assert!(
            k.advance(u32::from(b'x')).is_err(),
            "a refused token is an error"
        );
    }

    #[test]
    fn candidates_are_what_apply_leaves() {
        let c = compiler();
        let mut k = c
            .compile(&ResponseFormat::regex("a[0-9]+(x|y)"))
            .unwrap()
            .expect("a constraint");
        k.advance(u32::from(b'a')).unwrap();
        k.advance(u32::from(b'7')).unwrap();
        // a row shorter than the vocabulary, one allowed token already at -inf
        let mut row: Vec<f32> = (0..200).map(|i| (i as f32 * 0.37).sin()).collect();
        row[usize::from(b'5')] = f32::NEG_INFINITY;
        let got = k.candidates(&row).unwrap();
        let mut masked = row.clone();
        k.apply(&mut masked).unwrap();
        let want: Vec<(u32, f32)> = masked
            .iter()
            .enumerate()
            .filter(|(_, l)| **l > f32::NEG_INFINITY)
            .map(|(i, l)| (i as u32, *l))
            .collect();
        assert_eq!(got, want);
        let ids: Vec<u32> = got.iter().map(|c| c.0).collect();
        let mut expected: Vec<u32> = (b'0'..=b'9')
            .filter(|b| *b != b'5')
            .map(u32::from)
            .collect();
        expected.extend([u32::from(b'x'), u32::from(b'y')]);
        assert_eq!(ids, expected);
        // nothing allowed in the row is an error naming the constraint
        let mut dead = row.clone();
        for b in ids {
            dead[b as usize] = f32::NEG_INFINITY;
        }
        assert!(matches!(k.candidates(&dead), Err(Error::Reply { .. })));
    }

    #[test]
    fn a_mask_prepared_ahead_is_the_one_a_pick_finds() {
        let c = compiler();
        let mut k = c
            .compile(&ResponseFormat::regex("a(b|c)d"))
            .unwrap()
            .expect("a constraint");
        // along drafts the walk has fed: the mask after both, the state unmoved
        assert_eq!(k.allowed_prefix(&ids("ab")).unwrap(), 2);
        assert!(!k.is_ready(&ids("ab")));
        k.prepare(&ids("ab")).unwrap();
        assert_eq!(k.consumed(), 0);
        assert!(k.is_ready(&ids("ab")));
        let computed = k.mask_cost().1;
        for t in ids("ab") {
            k.advance(t).unwrap();
        }
        assert!(k.allows(u32::from(b'd')).unwrap());
        assert!(!k.allows(u32::from(b'c')).unwrap());
        assert_eq!(
            k.mask_cost().1,
            computed,
            "the pick reused the prepared mask"
        );
        assert!(k.ahead_ms() > 0.0);
        assert!(k.is_ready(&[]), "the prepared mask is the current one");
        // a refused token ahead computes nothing and leaves the matcher usable
        k.prepare(&ids("x")).unwrap();
        assert_eq!(k.consumed(), 2);
        k.advance(u32::from(b'd')).unwrap();
        assert!(k.is_complete());
        k.prepare(&[]).unwrap();
        // at the current position, after a token fed without looking ahead
        let mut k = c
            .compile(&ResponseFormat::regex("a(b|c)d"))
            .unwrap()
            .expect("a constraint");
        k.advance(u32::from(b'a')).unwrap();
        assert!(!k.is_ready(&[]));
        k.prepare(&[]).unwrap();
        assert!(k.is_ready(&[]));
        assert!(k.allows(u32::from(b'c')).unwrap());
    }

    #[test]
    fn masks_computed_beside_a_forward_are_found_ready() {
        let c = compiler();
        let fresh = || {
            c.compile(&ResponseFormat::regex("(ab|ac)+d"))
                .unwrap()
                .expect("a constraint")
        };
        let (mut x, mut y) = (fresh(), fresh());
        x.advance(u32::from(b'a')).unwrap();
        y.advance(u32::from(b'a')).unwrap();
        assert_eq!(y.allowed_prefix(&ids("ba")).unwrap(), 2);
        let out = beside_above(vec![(&mut x, &[][..]), (&mut y, &ids("ba")[..])], 0.0, || 7);
        assert_eq!(out, 7, "the work's result");
        assert!(x.is_ready(&[]) && y.is_ready(&ids("ba")));
        assert_eq!((x.consumed(), y.consumed()), (1, 1), "states unmoved");
        // what a pick then sees is what it would have computed itself
        let mut z = fresh();
        z.advance(u32::from(b'a')).unwrap();
        for t in 0..256u32 {
            assert_eq!(x.allows(t).unwrap(), z.allows(t).unwrap(), "token {t}");
        }
        // masks cheaper than the bar are left to the pick
        let mut w = fresh();
        w.advance(u32::from(b'a')).unwrap();
        beside_above(vec![(&mut w, &[][..])], f64::INFINITY, || ());
        assert!(!w.is_ready(&[]));
    }

    #[test]
    fn masks_follow_the_path_through_rollback() {
        let c = compiler();
        let mut k = c
            .compile(&ResponseFormat::regex("(yes|no)"))
            .unwrap()
            .unwrap();
        let (_, before) = k.mask_cost();
        k.advance(u32::from(b'y')).unwrap();
        let mut logits = vec![0.0f32; 256];
        k.apply(&mut logits).unwrap();
        let allowed: Vec<usize> = (0..256).filter(|&i| logits[i] == 0.0).collect();
        assert_eq!(allowed, vec![usize::from(b'e')]);
        k.rollback(1).unwrap();
        let mut logits = vec![0.0f32; 256];
        k.apply(&mut logits).unwrap();
        let allowed: Vec<usize> = (0..256).filter(|&i| logits[i] == 0.0).collect();
        assert_eq!(allowed, vec![usize::from(b'n'), usize::from(b'y')]);
        // the start mask was kept: going back did not compute it again
        assert_eq!(k.mask_cost().1, before + 1);
        for t in ids("no") {
            k.advance(t).unwrap();
        }
        assert!(k.is_complete());
        // nothing the model could draw is allowed: a typed error, not a silent pick
        let mut logits = vec![f32::NEG_INFINITY; 256];
        assert!(matches!(
            k.apply(&mut logits),
            Err(Error::Reply { kind: "regex", .. })
        ));
    }

    #[test]
    fn formats_that_do_not_compile_are_compile_errors() {
        let c = compiler();
        assert!(c.compile(&ResponseFormat::Text).unwrap().is_none());
        assert!(matches!(
            c.compile(&ResponseFormat::regex("(open")),
            Err(Error::Compile { kind: "regex", .. })
        ));
    }
}
