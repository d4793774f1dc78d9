//! The error body OpenAI, vLLM and llama-server answer with:
//! `{"error": {"message", "type", "param", "code"}}`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::field::lenient;

/// `{"error": {...}}`: a refused or failed request (also the last event of a stream that
/// fails).
///
/// ```
/// use mtp_openai::{ErrorBody, ErrorDetail};
/// let body = ErrorBody::new(ErrorDetail::new("`n` must be 1", "invalid_request_error")
///     .param("n"));
/// assert_eq!(serde_json::to_string(&body).unwrap(),
///     r#"{"error":{"message":"`n` must be 1","type":"invalid_request_error","param":"n","code":null}}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

impl ErrorBody {
    /// The body around `error`.
    pub fn new(error: ErrorDetail) -> ErrorBody {
        ErrorBody { error }
    }
}

/// The error object. `type`, `param` and `code` are always written (`null` when unset), as
/// OpenAI writes them; a server's `code` may be a string or a number (llama-server sends the
/// HTTP status).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// What is wrong and what to do.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    #[serde(rename = "type", default, deserialize_with = "lenient")]
    pub kind: Option<String>,
    /// The request field at fault.
    #[serde(default, deserialize_with = "lenient")]
    pub param: Option<String>,
    /// A machine-readable code.
    #[serde(default, deserialize_with = "lenient")]
    pub code: Option<ErrorCode>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ErrorDetail {
    /// An error of `kind` saying `message`.
    pub fn new(message: impl Into<String>, kind: impl Into<String>) -> ErrorDetail {
        ErrorDetail {
            message: message.into(),
            kind: Some(kind.into()),
            param: None,
            code: None,
            extra: Map::new(),
        }
    }

    /// With the field at fault.
    pub fn param(mut self, param: impl Into<String>) -> ErrorDetail {
        self.param = Some(param.into());
        self
    }

    /// With a code.
    pub fn code(mut self, code: impl Into<String>) -> ErrorDetail {
        self.code = Some(ErrorCode::Text(code.into()));
        self
    }
}

/// An error's `code`: a name (`invalid_api_key`, `queue_full`), or a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErrorCode {
    /// A name.
    Text(String),
    /// A number (llama-server: the HTTP status).
    Number(i64),
}
