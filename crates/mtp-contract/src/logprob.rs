//! Tokens as callers see them: a token's log probability with its alternatives (OpenAI's
//! `logprobs`), and a runtime's vocabulary as a service (`/tokenize`, `/detokenize`,
//! `/tokenizer_info`).

use serde::{Deserialize, Serialize};

use crate::error::ProviderError;

/// The most alternatives a token's log probability may list (OpenAI's `top_logprobs` bound).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// One token with its natural-log probability under the model, and the most likely tokens at
/// its position with theirs (OpenAI's `logprobs.content[i]`).
///
/// Generated tokens' log probabilities are the model's own distribution at that position,
/// before penalties, temperature and a constraint's mask (vLLM's default `raw_logprobs`): with
/// MTP on they are those of target-only decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token id.
    pub id: u32,
    /// Its text (invalid UTF-8, a piece of a character, shown with replacement characters).
    pub token: String,
    /// Its exact bytes.
    pub bytes: Vec<u8>,
    /// Its log probability; `None` for a prompt's first token, which nothing comes before.
    pub logprob: Option<f32>,
    /// The most likely tokens at its position, most likely first (as many as asked for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopLogprob>,
}

impl TokenLogprob {
    /// A token with no log probability (a prompt's first, or `echo` without `logprobs`),
    /// with its text and bytes.
    pub fn unscored(id: u32, (token, bytes): (String, Vec<u8>)) -> TokenLogprob {
        TokenLogprob {
            id,
            token,
            bytes,
            logprob: None,
            top: Vec::new(),
        }
    }
}

/// An alternative at a token's position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token id.
    pub id: u32,
    /// Its text.
    pub token: String,
    /// Its exact bytes.
    pub bytes: Vec<u8>,
    /// Its log probability.
    pub logprob: f32,
}

/// What a tokenizer's callers read about it (vLLM's `/tokenizer_info`, which
/// lm-evaluation-harness's remote tokenizer reads).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// The tokenizer's class as its `tokenizer_config.json` names it.
    pub tokenizer_class: Option<String>,
    /// The end-of-sequence token's text.
    pub eos_token: Option<String>,
    /// The beginning-of-sequence token's text.
    pub bos_token: Option<String>,
    /// The padding token's text.
    pub pad_token: Option<String>,
    /// The chat template (the default one), as its source.
    pub chat_template: Option<String>,
    /// The vocabulary's size, added tokens included.
    pub vocab_size: usize,
    /// The context length the model is served with.
    pub model_max_length: Option<usize>,
}

/// A runtime's vocabulary: what `/tokenize` and `/detokenize` answer with. Its calls are CPU
/// work in proportion to the text: callers on an async runtime run them on a blocking pool.
pub trait Vocabulary: Send + Sync {
    /// The tokens of `text`: with `add_special`, the tokens the tokenizer adds around a text
    /// (a BOS); with `parse_special`, special-token text (`<|im_end|>`) is that token, else it
    /// is plain text.
    fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, ProviderError>;

    /// The text of `ids` (special tokens included as their text). An id outside the
    /// vocabulary is an `InvalidRequest` naming `tokens`.
    fn decode(&self, ids: &[u32]) -> Result<String, ProviderError>;

    /// The exact bytes of token `id` (`None` outside the vocabulary).
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>>;

    /// What the tokenizer's callers read about it.
    fn info(&self) -> TokenizerInfo;

    /// `id` as a [`TopLogprob`]'s text and bytes.
    fn token_text(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.token_bytes(id).unwrap_or_default();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }
}
