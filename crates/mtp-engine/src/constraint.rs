//! Constrained decoding: a reply that must follow a JSON Schema, a regex or a Lark grammar,
//! enforced token by token with `llguidance` (the library llama.cpp, vLLM and mlx-vlm use).
//!
//! A [`Constraint`] sits in the request's [`crate::sampling::Sampler`]: every pick (the
//! target's and the drafter's) is drawn from logits whose disallowed tokens are set to `-inf`,
//! with the grammar state after the tokens before that position. With MTP the state advances
//! through the drafts and rolls back to the accepted prefix; masks are kept along the path, so
//! a verify position reuses the mask computed while drafting (each position's mask is computed
//! once per round). Greedy constrained output is therefore the same with and without MTP.
//!
//! End-of-sequence ids are never fed to the grammar: they are allowed exactly when the grammar
//! accepts, and generation ends when the grammar is complete (nothing but EOS could follow).

use std::sync::Arc;
use std::time::Instant;

use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use mtp_contract::ResponseFormat;
use serde_json::Value;

use crate::error::{Error, Result};

/// The tokenizer as llguidance sees it: each token's bytes, specials marked.
pub(crate) struct ByteVocab {
    trie: TokTrie,
    tok: tokenizers::Tokenizer,
}

impl TokenizerEnv for ByteVocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Valid UTF-8 goes through the real tokenizer; bytes that are not (a token boundary
        // inside a character) fall back to the trie's greedy split.
        match std::str::from_utf8(s) {
            Ok(text) => match self.tok.encode(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                Err(_) => self.trie.greedy_tokenize(s),
            },
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// GPT-2's byte-to-character table of byte-level BPE vocabularies, inverted.
fn byte_level_table() -> std::collections::HashMap<char, u8> {
    let mut map = std::collections::HashMap::new();
    let mut next = 256u32;
    for b in 0..=255u8 {
        let c = b as char;
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        if printable {
            map.insert(c, b);
        } else if let Some(c) = char::from_u32(next) {
            map.insert(c, b);
            next += 1;
        }
    }
    map
}

/// How a vocabulary spells bytes in its token strings.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Spelling {
    /// GPT-2 byte-level BPE (Qwen, Llama 3, ...).
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xNN>` byte tokens.
    SentencePiece,
}

fn spelling(tok: &tokenizers::Tokenizer) -> Option<Spelling> {
    fn walk(v: &Value, found: &mut Option<Spelling>) {
        match v.get("type").and_then(Value::as_str) {
            Some("ByteLevel") => *found = Some(Spelling::ByteLevel),
            Some("ByteFallback") | Some("Metaspace") if found.is_none() => {
                *found = Some(Spelling::SentencePiece)
            }
            Some("Sequence") => {
                for d in v
                    .get("decoders")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    walk(d, found);
                }
            }
            _ => {}
        }
    }
    let v = serde_json::to_value(tok.get_decoder()?).ok()?;
    let mut found = None;
    walk(&v, &mut found);
    found
}

impl ByteVocab {
    /// Each token's bytes from a `tokenizer.json` (special and `<...>` added tokens marked as
    /// specials, so grammar text is never spelled with them), with `eos` as the end ids.
    ///
    /// Written here rather than taken from `toktrie_hf_tokenizers` or llguidance's
    /// `token_bytes_from_tokenizer_json`: the first pins `tokenizers` 0.21 (the engine is on
    /// 0.22, and two copies would not share types), and both panic on vocabularies they do not
    /// expect (a `<0xZZ>` token, an unknown decoder); a checkpoint's tokenizer.json is outside
    /// input, so this returns a typed error instead.
    pub(crate) fn new(tok: &tokenizers::Tokenizer, eos: &[u32]) -> Result<Self> {
        let unsupported = |m: String| Error::Unsupported(format!("constrained decoding: {m}"));
        let spelling = spelling(tok).ok_or_else(|| {
            unsupported(
                "the tokenizer's decoder is neither byte-level BPE nor SentencePiece, so token \
                 bytes are unknown"
                    .into(),
            )
        })?;
        let n = tok.get_vocab_size(true);
        let added = tok.get_added_tokens_decoder();
        let table = byte_level_table();
        let mut words: Vec<Vec<u8>> = vec![Vec::new(); n];
        for (id, word) in words.iter_mut().enumerate() {
            let id32 = id as u32;
            if let Some(a) = added.get(&id32) {
                let c = &a.content;
                *word =
                    if a.special || (c.starts_with('<') && c.ends_with('>')) || eos.contains(&id32)
                    {
                        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                        w.extend_from_slice(c.as_bytes());
                        w
                    } else {
                        c.as_bytes().to_vec()
                    };
                continue;
            }
            let Some(s) = tok.id_to_token(id32) else {
                continue;
            };
            *word = match spelling {
                Spelling::ByteLevel => match s.chars().map(|c| table.get(&c).copied()).collect() {
                    Some(b) => b,
                    // not byte-level spelled: the token can never be produced as text
                    None => continue,
                },
                Spelling::SentencePiece => {
                    let hex = s
                        .strip_prefix("<0x")
                        .and_then(|h| h.strip_suffix('>'))
                        .filter(|h| h.len() == 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok());
                    match hex {
                        Some(b) => vec![b],
                        None => s.replace('\u{2581}', " ").into_bytes(),
                    }
                }
            };
        }
        let eos_in: Vec<u32> = eos.iter().copied().filter(|&e| (e as usize) < n).collect();
        let Some(&first) = eos_in.first() else {
            return Err(unsupported(
                "the checkpoint names no end-of-sequence token inside its vocabulary, so a \
                 constrained reply could never end"
                    .into(),
            ));
        };
        let info = TokRxInfo::new(n as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_in);
        Ok(ByteVocab {
            trie,
            tok: tok.clone(),
        })
    }
}

/// Compiles constraints for one tokenizer (built once per engine: the token trie and
/// llguidance's slicer take a while on a 250k vocabulary).
pub struct ConstraintCompiler {
    factory: ParserFactory,
    eos: Vec<u32>,
}

impl std::fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl ConstraintCompiler {
    /// A compiler over `tok` whose replies end with any of `eos`.
    pub fn new(tok: &tokenizers::Tokenizer, eos: &[u32]) -> Result<Self> {
        let vocab = ByteVocab::new(tok, eos)?;
        let env: TokEnv = Arc::new(vocab);
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Unsupported(format!("constrained decoding: {e}")))?;
        // library code never prints: llguidance logs to stderr unless told not to
        factory.quiet();
        let eos = env.tok_trie().eos_tokens().to_vec();
        Ok(ConstraintCompiler { factory, eos })
    }

    /// A fresh constraint state for one reply; a format that does not compile (a schema
    /// keyword llguidance does not know, a bad regex, a grammar error, an unsatisfiable
    /// schema) is an [`Error::Constraint`] here, before any generation.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<Constraint>> {
        let Some(grammar) = mtp_grammar::grammar(format) else {
            return Ok(None);
        };
        let kind = format.kind();
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::Constraint {
                kind,
                message: e.to_string(),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::Constraint { kind, message: e });
        }
        let mut c = Constraint {
            matcher: Box::new(matcher),
            kind,
            eos: self.eos.clone(),
            path: Vec::new(),
            len: 0,
            masks: Vec::new(),
            mask_ms: 0.0,
            masks_computed: 0,
        };
        // a grammar that allows nothing at all (e.g. an unsatisfiable schema) fails now
        let allowed = c.mask()?.num_set();
        if allowed == 0 {
            return Err(Error::Constraint {
                kind,
                message: "the constraint allows no token at the start of the reply".into(),
            });
        }
        Ok(Some(c))
    }
}

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
    mask_ms: f64,
    masks_computed: u64,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("kind", &self.kind)
            .field("consumed", &self.len)
            .finish()
    }
}

/// Masks kept behind the current position (a rollback deeper than this recomputes).
const KEPT_BEHIND: usize = 32;

impl Constraint {
    fn fail(&self, message: impl std::fmt::Display) -> Error {
        Error::Constraint {
            kind: self.kind,
            message: message.to_string(),
        }
    }

    fn mask(&mut self) -> Result<&SimpleVob> {
        let pos = self.len;
        if let Some(i) = self.masks.iter().position(|(p, _)| *p == pos) {
            return Ok(&self.masks[i].1);
        }
        let t = Instant::now();
        let m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.fail(e))?;
        self.mask_ms += t.elapsed().as_secs_f64() * 1e3;
        self.masks_computed += 1;
        self.masks.retain(|(p, _)| p + KEPT_BEHIND >= pos);
        self.masks.push((pos, m));
        Ok(&self.masks.last().expect("just pushed").1)
    }

    /// Sets the logits of tokens the grammar does not allow here to `-inf` (ids past the
    /// tokenizer's vocabulary, padding rows of the LM head, are never allowed). End ids are
    /// allowed exactly when the grammar accepts.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
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
            return Err(
                self.fail("no token the grammar allows here is in the model's output (all masked)")
            );
        }
        Ok(())
    }

    /// True for an end-of-sequence id (never fed to the grammar).
    pub fn is_end(&self, tok: u32) -> bool {
        self.eos.contains(&tok)
    }

    /// Feeds one generated token (end ids are not fed: the reply ends there).
    pub fn advance(&mut self, tok: u32) -> Result<()> {
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
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        let n = n.min(self.len);
        if n == 0 {
            return Ok(());
        }
        self.matcher.rollback(n).map_err(|e| self.fail(e))?;
        self.len -= n;
        Ok(())
    }

    /// Tokens fed so far.
    pub fn consumed(&self) -> usize {
        self.len
    }

    /// True when the grammar is complete: nothing but the end could follow.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// Milliseconds spent computing masks, and how many were computed.
    pub fn mask_cost(&self) -> (f64, u64) {
        (self.mask_ms, self.masks_computed)
    }
}
