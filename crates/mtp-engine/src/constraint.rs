//! Constrained decoding: a reply that must follow a JSON Schema, a regex or a Lark grammar,
//! enforced token by token with `llguidance` (the library llama.cpp, vLLM and mlx-vlm use).
//!
//! A [`Constraint`] (the grammar state, `mtp_grammar`'s, shared with the in-process llama.cpp
//! lane) sits in the request's [`crate::sampling::Sampler`]: every pick (the target's and the
//! drafter's) is drawn from logits whose disallowed tokens are set to `-inf`, with the grammar
//! state after the tokens before that position. With MTP the state advances through the
//! drafts and rolls back to the accepted prefix (see `mtp_grammar::Constraint`). What lives
//! here is the engine's side: its `tokenizer.json` as llguidance's vocabulary.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
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
    /// Each token's bytes from a `tokenizer.json` (tokens marked `special`, and the end ids
    /// `eos`, as specials: grammar text is never spelled with them), as llguidance's own
    /// `token_bytes_from_tokenizer_json` reads them. An added token that is not special (Qwen's
    /// `<tool_call>`, `</think>`) is the text it stands for: the model writes its tool-call
    /// and reasoning markup with those tokens, and a grammar of that markup (a forced tool
    /// call) must let it.
    ///
    /// Written here rather than taken from `toktrie_hf_tokenizers` or llguidance's
    /// `token_bytes_from_tokenizer_json`: the first pins `tokenizers` 0.21 (the engine is on
    /// 0.23, and two copies would not share types), and both panic on vocabularies they do not
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
                *word = if a.special || eos.contains(&id32) {
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
pub type ConstraintCompiler = mtp_grammar::Compiler;

/// The grammar state of one reply ([`mtp_grammar::Constraint`]).
pub type Constraint = mtp_grammar::Constraint;

/// A compiler over `tok` whose replies end with any of `eos`.
pub fn compiler(tok: &tokenizers::Tokenizer, eos: &[u32]) -> Result<ConstraintCompiler> {
    let env: TokEnv = Arc::new(ByteVocab::new(tok, eos)?);
    Ok(mtp_grammar::Compiler::new(&env)?)
}

impl From<mtp_grammar::Error> for Error {
    fn from(e: mtp_grammar::Error) -> Self {
        match e {
            mtp_grammar::Error::Compile { kind, message }
            | mtp_grammar::Error::Reply { kind, message }
            | mtp_grammar::Error::Check { kind, message } => Error::Constraint { kind, message },
            mtp_grammar::Error::Vocabulary(m) => {
                Error::Unsupported(format!("constrained decoding: {m}"))
            }
        }
    }
}
