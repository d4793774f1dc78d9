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

use crate::error::{Error, Result};
use crate::tokenizer::{token_bytes, TokenBytes};

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

impl ByteVocab {
    /// Each token's bytes from a `tokenizer.json` (tokens marked `special`, and the end ids
    /// `eos`, as specials: grammar text is never spelled with them), as llguidance's own
    /// `token_bytes_from_tokenizer_json` reads them. An added token that is not special (Qwen's
    /// `<tool_call>`, `</think>`) is the text it stands for: the model writes its tool-call
    /// and reasoning markup with those tokens, and a grammar of that markup (a forced tool
    /// call) must let it.
    pub(crate) fn new(tok: &tokenizers::Tokenizer, eos: &[u32]) -> Result<Self> {
        let unsupported = |m: String| Error::Unsupported(format!("constrained decoding: {m}"));
        let TokenBytes {
            mut words,
            special,
            added,
        } = token_bytes(tok).map_err(|e| match e {
            Error::Tokenizer(m) => unsupported(m),
            other => other,
        })?;
        for (id, word) in words.iter_mut().enumerate() {
            if added[id] && (special[id] || eos.contains(&(id as u32))) {
                word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
        }
        let n = words.len();
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
