//! The small GET endpoints: OpenAI's `/v1/models` and `/health`.

use mtp_contract::SpeculationStatus;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::{lenient, Field};

/// `GET /v1/models`: `{"object": "list", "data": [...]}`. A model that is not an object with
/// an `id` string is kept as sent ([`Field::Invalid`]), for a message naming it.
///
/// ```
/// let list: mtp_openai::ModelList = serde_json::from_str(
///     r#"{"object": "list", "data": [{"id": "qwen", "object": "model"}, 3]}"#).unwrap();
/// assert_eq!(list.ids().collect::<Vec<_>>(), [Some("qwen"), None]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub object: Option<String>,
    /// The models.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub data: Option<Vec<Field<Model>>>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ModelList {
    /// The list of `models`.
    pub fn of(models: Vec<Model>) -> ModelList {
        ModelList {
            object: Some("list".into()),
            data: Some(models.into_iter().map(Field::Ok).collect()),
            extra: Map::new(),
        }
    }

    /// Each entry's id, `None` for an entry that is not a model.
    pub fn ids(&self) -> impl Iterator<Item = Option<&str>> {
        self.data
            .iter()
            .flatten()
            .map(|m| m.ok().map(|m| m.id.as_str()))
    }
}

/// One model of `/v1/models`, with mtp's `runtime` and `speculation` status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// The id clients send as `model`.
    pub id: String,
    /// `model`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub object: Option<String>,
    /// Unix seconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub created: Option<u64>,
    /// The owner.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub owned_by: Option<String>,
    /// mtp: the runtime that serves it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub runtime: Option<String>,
    /// mtp: the speculation lane and its defaults.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub speculation: Option<SpeculationStatus>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `GET /health`: `ok`, or `shutting_down` while the server drains.
///
/// ```
/// assert_eq!(serde_json::to_string(&mtp_openai::Health::new("ok")).unwrap(), r#"{"status":"ok"}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok` or `shutting_down`.
    pub status: String,
}

impl Health {
    /// A status.
    pub fn new(status: impl Into<String>) -> Health {
        Health {
            status: status.into(),
        }
    }
}
