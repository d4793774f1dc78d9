//! llama-server's own endpoints that its clients read to learn how it was launched: `/props`
//! (the speculative settings) and `/slots` (whether a drafter context exists).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::{lenient, nullable, Field};

/// `GET /props`, the part clients read.
///
/// ```
/// let p: mtp_openai::Props = serde_json::from_str(r#"{"build_info": "b11434-abc",
///     "default_generation_settings": {"params": {"speculative.types": "ngram-simple,draft-mtp"}}}"#).unwrap();
/// let params = p.speculative_params().unwrap();
/// assert_eq!(params.types().unwrap().1, ["ngram-simple", "draft-mtp"]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Props {
    /// The model file loaded.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub model_path: Option<String>,
    /// The build, e.g. `b11434-abc1234`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub build_info: Option<String>,
    /// Parallel slots.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub total_slots: Option<u64>,
    /// The defaults requests start from.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub default_generation_settings: Option<GenerationSettings>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Props {
    /// Where the speculative settings are: `default_generation_settings.params` in current
    /// builds, `default_generation_settings` itself in older ones.
    pub fn speculative_params(&self) -> Option<&SpeculativeParams> {
        let s = self.default_generation_settings.as_ref()?;
        Some(s.params.as_ref().unwrap_or(&s.settings))
    }
}

/// `default_generation_settings`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationSettings {
    /// The sampling and speculative parameters (current builds).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub params: Option<SpeculativeParams>,
    /// The settings themselves (older builds put the parameters here), and the rest.
    #[serde(flatten)]
    pub settings: SpeculativeParams,
}

/// The speculative keys of llama-server's parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpeculativeParams {
    /// The drafter types (`none`, `draft-mtp`, ...): a comma-separated string in current
    /// builds.
    #[serde(
        rename = "speculative.types",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub types: Option<SpeculativeTypes>,
    /// The drafter type of older builds.
    #[serde(
        rename = "speculative.type",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub kind: Option<SpeculativeTypes>,
    /// Proposals per round; `Some(None)` is an explicit `null` (not known).
    #[serde(
        rename = "speculative.n_max",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "nullable"
    )]
    pub n_max: Option<Option<u64>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SpeculativeParams {
    /// The key the types were read from and the types, when either key names them.
    pub fn types(&self) -> Option<(&'static str, Vec<String>)> {
        match (&self.types, &self.kind) {
            (Some(t), _) => Some(("speculative.types", t.names())),
            (None, Some(t)) => Some(("speculative.type", t.names())),
            (None, None) => None,
        }
    }
}

/// A drafter type list: `"ngram-simple,draft-mtp"` or a list of names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SpeculativeTypes {
    /// Names separated by commas or spaces.
    Text(String),
    /// Names (entries that are not strings are skipped when read).
    List(Vec<Field<String>>),
}

impl SpeculativeTypes {
    /// The names.
    pub fn names(&self) -> Vec<String> {
        match self {
            SpeculativeTypes::Text(s) => s
                .split([',', ' '])
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect(),
            SpeculativeTypes::List(a) => a.iter().filter_map(|x| x.ok().cloned()).collect(),
        }
    }
}

/// One entry of `GET /slots`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// The server built a speculative context for this slot (a drafter was loaded).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub speculative: Option<bool>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
