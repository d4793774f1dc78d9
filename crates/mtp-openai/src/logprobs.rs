//! Log probabilities as OpenAI's answers carry them: a chat choice's `logprobs.content` (each
//! token with its `bytes` and `top_logprobs`), and a text completion's `logprobs` (parallel
//! lists `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`), built from the contract's
//! [`TokenLogprob`]s.

use mtp_contract::TokenLogprob;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The floor a log probability is written at: `-inf` (a token a mask or the model rules out)
/// is not JSON, and vLLM writes such tokens at -9999.0.
pub const LOGPROB_FLOOR: f32 = -9999.0;

fn finite(x: f32) -> f32 {
    if x.is_nan() {
        LOGPROB_FLOOR
    } else {
        x.max(LOGPROB_FLOOR)
    }
}

/// The request's `logprobs`: a chat request's switch (`true`), or a text completion's count of
/// alternatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LogprobsParam {
    /// Chat: whether to return them.
    Flag(bool),
    /// Text completions: how many alternatives per token (the token's own is always given).
    Count(u64),
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
    /// Always `null` here (no refusals).
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// A token of [`ChatLogprobs::content`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at its position.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// An alternative of [`ChatTokenLogprob::top_logprobs`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTopLogprob {
    /// Its text.
    pub token: String,
    /// Its log probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    /// The chat shape of `lps` (tokens without a log probability are left out: only a prompt's
    /// first token has none).
    pub fn of(lps: &[TokenLogprob]) -> ChatLogprobs {
        ChatLogprobs {
            content: lps
                .iter()
                .filter_map(|l| {
                    Some(ChatTokenLogprob {
                        token: l.token.clone(),
                        logprob: finite(l.logprob?),
                        bytes: l.bytes.clone(),
                        top_logprobs: l
                            .top
                            .iter()
                            .map(|t| ChatTopLogprob {
                                token: t.token.clone(),
                                logprob: finite(t.logprob),
                                bytes: t.bytes.clone(),
                            })
                            .collect(),
                    })
                })
                .collect(),
            refusal: None,
        }
    }
}

/// A text completion's `logprobs`: parallel lists, one entry per token (with `echo`, the
/// prompt's first: its log probability and alternatives `null`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log probability.
    pub token_logprobs: Vec<Option<f32>>,
    /// The most likely tokens at each position, text to log probability (the token's own
    /// among them, as vLLM gives it).
    pub top_logprobs: Vec<Option<Map<String, Value>>>,
    /// Where each token's text starts in the choice's text, in characters.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends `lps`, whose text starts `offset` characters into the choice's text; returns
    /// the offset after them.
    pub fn extend(&mut self, lps: &[TokenLogprob], mut offset: usize) -> usize {
        for l in lps {
            self.tokens.push(l.token.clone());
            self.token_logprobs.push(l.logprob.map(finite));
            self.top_logprobs.push(l.logprob.map(|own| {
                let mut m = Map::new();
                for t in &l.top {
                    m.entry(t.token.clone())
                        .or_insert_with(|| Value::from(finite(t.logprob)));
                }
                m.entry(l.token.clone())
                    .or_insert_with(|| Value::from(finite(own)));
                m
            }));
            self.text_offset.push(offset);
            offset += l.token.chars().count();
        }
        offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtp_contract::TopLogprob;

    fn lp(token: &str, logprob: Option<f32>, top: &[(&str, f32)]) -> TokenLogprob {
        TokenLogprob {
            id: 0,
            token: token.into(),
            bytes: token.as_bytes().to_vec(),
            logprob,
            top: top
                .iter()
                .map(|(t, l)| TopLogprob {
                    id: 1,
                    token: t.to_string(),
                    bytes: t.as_bytes().to_vec(),
                    logprob: *l,
                })
                .collect(),
        }
    }

    #[test]
    fn the_two_shapes() {
        let lps = [
            lp("He", None, &[]),
            lp(
                "llo",
                Some(-0.5),
                &[("llo", -0.5), ("y", f32::NEG_INFINITY)],
            ),
            lp("é", Some(-2.0), &[("a", -0.1)]),
        ];
        let chat = serde_json::to_value(ChatLogprobs::of(&lps)).unwrap();
        assert_eq!(chat["content"].as_array().unwrap().len(), 2);
        assert_eq!(chat["content"][0]["top_logprobs"][1]["logprob"], -9999.0);
        assert_eq!(chat["content"][1]["bytes"], serde_json::json!([195, 169]));
        assert!(chat["refusal"].is_null());
        let mut c = CompletionLogprobs::default();
        let end = c.extend(&lps, 0);
        assert_eq!(end, 6);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["text_offset"], serde_json::json!([0, 2, 5]));
        assert!(v["token_logprobs"][0].is_null() && v["top_logprobs"][0].is_null());
        // the token's own is among its alternatives
        assert_eq!(v["top_logprobs"][2]["é"], -2.0);
        assert_eq!(v["top_logprobs"][2]["a"], -0.1f32 as f64);
    }
}
