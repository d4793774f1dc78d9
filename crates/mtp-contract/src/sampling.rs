//! Sampling parameters and which of them are compatible with speculation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::ProviderError;

/// Sampling controls for one request. `None` means "the runtime's default" (greedy when
/// temperature is unset or 0).
///
/// ```
/// use mtp_contract::Sampling;
/// let s = Sampling { temperature: Some(0.7), top_p: Some(0.9), seed: Some(7), ..Default::default() };
/// assert!(s.target_only_controls().is_empty());
/// let p = Sampling { repetition_penalty: Some(1.1), ..Default::default() };
/// assert_eq!(p.target_only_controls(), vec!["repetition_penalty"]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    /// Softmax temperature; 0 or unset is greedy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Drop tokens below `min_p` × the top probability, in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Seed for deterministic sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Multiplicative penalty on tokens already seen (1.0 = neutral).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Additive penalty on tokens already seen (0.0 = neutral).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Additive penalty per occurrence (0.0 = neutral).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Added to the logit of a token id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub logit_bias: BTreeMap<u32, f32>,
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Sampling::default()
    }

    /// True when decoding is argmax (temperature unset or 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_none_or(|t| t == 0.0)
    }

    /// True when any decoding field (temperature, top-p, top-k, min-p) is set.
    pub fn chooses_decoding(&self) -> bool {
        self.temperature.is_some()
            || self.top_p.is_some()
            || self.top_k.is_some()
            || self.min_p.is_some()
    }

    /// These controls, with the decoding of `recommended` (a model's `generation_config.json`,
    /// [`crate::Provider::recommended_sampling`]) when they choose none, as transformers,
    /// mlx-vlm and vLLM use it; seed, penalties and bias stay the caller's. Returns the
    /// recommendation when it was taken.
    ///
    /// ```
    /// use mtp_contract::Sampling;
    /// let rec = Sampling { temperature: Some(0.6), top_p: Some(0.95), ..Default::default() };
    /// let mine = Sampling { seed: Some(7), ..Default::default() };
    /// let (s, taken) = mine.or_recommended(Some(&rec));
    /// assert_eq!((s.temperature, s.seed), (Some(0.6), Some(7)));
    /// assert!(taken.is_some());
    /// let chosen = Sampling { temperature: Some(0.0), ..Default::default() };
    /// assert!(chosen.or_recommended(Some(&rec)).1.is_none());
    /// ```
    pub fn or_recommended(self, recommended: Option<&Sampling>) -> (Sampling, Option<Sampling>) {
        match recommended.filter(|_| !self.chooses_decoding()) {
            Some(r) => (
                Sampling {
                    temperature: r.temperature,
                    top_p: r.top_p,
                    top_k: r.top_k,
                    min_p: r.min_p,
                    ..self
                },
                Some(r.clone()),
            ),
            None => (self, None),
        }
    }

    /// The non-neutral controls that force target-only decoding, by request field name.
    pub fn target_only_controls(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.repetition_penalty.is_some_and(|p| p != 1.0) {
            out.push("repetition_penalty");
        }
        if self.presence_penalty.is_some_and(|p| p != 0.0) {
            out.push("presence_penalty");
        }
        if self.frequency_penalty.is_some_and(|p| p != 0.0) {
            out.push("frequency_penalty");
        }
        if self.logit_bias.values().any(|b| *b != 0.0) {
            out.push("logit_bias");
        }
        out
    }

    /// Checks every value's range; the error names the field and the valid range.
    ///
    /// ```
    /// use mtp_contract::Sampling;
    /// assert!(Sampling { top_p: Some(1.5), ..Default::default() }.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ProviderError> {
        fn bad(field: &'static str, msg: String) -> ProviderError {
            ProviderError::InvalidRequest {
                field,
                message: msg,
            }
        }
        let finite = |field: &'static str, v: Option<f32>| -> Result<(), ProviderError> {
            match v {
                Some(x) if !x.is_finite() => Err(bad(field, format!("{x} is not a finite number"))),
                _ => Ok(()),
            }
        };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("repetition_penalty", self.repetition_penalty)?;
        finite("presence_penalty", self.presence_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        if let Some(t) = self.temperature {
            if t < 0.0 {
                return Err(bad(
                    "temperature",
                    format!("{t} is negative; use 0 for greedy or a value > 0"),
                ));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(bad("top_p", format!("{p} is outside (0, 1]")));
            }
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(bad("min_p", format!("{p} is outside [0, 1]")));
            }
        }
        if let Some(p) = self.repetition_penalty {
            if p <= 0.0 {
                return Err(bad(
                    "repetition_penalty",
                    format!("{p} must be > 0 (1.0 is neutral)"),
                ));
            }
        }
        for (tok, b) in &self.logit_bias {
            if !b.is_finite() {
                return Err(bad(
                    "logit_bias",
                    format!("bias {b} for token {tok} is not finite"),
                ));
            }
        }
        Ok(())
    }
}
