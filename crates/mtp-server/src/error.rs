//! The server's errors and their OpenAI-shaped answers (`{"error": {"message", "type", "param",
//! "code"}}`, as OpenAI, vLLM and llama-server send them).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mtp_contract::ProviderError;
use mtp_openai::{ErrorBody, ErrorCode, ErrorDetail};

/// Starting or running the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// `host:port` as given.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A setting is out of range.
    #[error("invalid server setting `{setting}`: {message}")]
    Config {
        /// The setting at fault.
        setting: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Serving stopped on an I/O error.
    #[error("the server stopped: {0}")]
    Io(#[from] std::io::Error),
}

/// One refused or failed request, as the client sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's error `type` (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code (a speculation reason code where there is one).
    pub code: Option<String>,
    /// What is wrong and what to do.
    pub message: String,
    /// Seconds to wait (`Retry-After`), for 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 naming the field at fault.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
            message: message.into(),
            retry_after: None,
        }
    }

    /// A 400 for a request feature this server does not offer.
    pub fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("unsupported".into()),
            ..ApiError::invalid(param, message)
        }
    }

    /// 401: no or a wrong bearer key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key".into()),
            message: "this server needs an API key: send `Authorization: Bearer <key>` (or \
                      `x-api-key: <key>`) with the key given to `mtp serve --api-key`"
                .into(),
            retry_after: None,
        }
    }

    /// 429: the queue is full.
    pub fn queue_full(max_queue: usize, retry_after: u64) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full".into()),
            message: format!(
                "the server is busy: {max_queue} request(s) are already waiting (--max-queue); \
                 retry in about {retry_after} s"
            ),
            retry_after: Some(retry_after),
        }
    }

    /// 503 while shutting down.
    pub fn shutting_down() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            param: None,
            code: Some("shutting_down".into()),
            message: "the server is shutting down and takes no new requests".into(),
            retry_after: None,
        }
    }

    /// 503 for a connection over `--max-connections` (sent before its request is read).
    pub fn too_many_connections(max: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            param: None,
            code: Some("too_many_connections".into()),
            message: format!(
                "the server has {max} connections open, its limit (--max-connections); retry \
                 in a moment, or reuse a connection"
            ),
            retry_after: Some(1),
        }
    }

    /// 408: the body did not arrive in time.
    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            code: Some("body_timeout".into()),
            ..ApiError::invalid(
                "body",
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    limit.as_secs_f64()
                ),
            )
        }
    }

    /// 400 for a request over one of the server's caps, naming the cap and its flag.
    pub fn over_limit(param: &str, what: &str, n: usize, max: usize, flag: &str) -> ApiError {
        ApiError {
            code: Some("over_limit".into()),
            ..ApiError::invalid(
                param,
                format!(
                    "the request has {n} {what}, over this server's limit of {max} ({flag} \
                     raises it)"
                ),
            )
        }
    }

    /// The answer to a provider's error.
    pub fn from_provider(e: &ProviderError) -> ApiError {
        let message = e.to_string();
        let (status, kind, param, code) = match e {
            ProviderError::InvalidRequest { field, .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some(field.to_string()),
                None,
            ),
            // (a provider's options are set when it is made, not by a request; an error about
            // one still names the option, should a provider refuse one late)
            ProviderError::InvalidOption(o) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some(o.key().to_string()),
                Some("invalid_option".into()),
            ),
            // OpenAI's and vLLM's code, which litellm and agent frameworks look for
            ProviderError::ContextLengthExceeded { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("messages".into()),
                Some("context_length_exceeded".into()),
            ),
            ProviderError::InvalidSpeculation(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("speculation".into()),
                Some("invalid_speculation".into()),
            ),
            // `require_acceleration` and no lane: the request cannot be served as asked
            ProviderError::SpeculationUnavailable { reason, .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                Some("speculation".into()),
                Some(reason.as_str().into()),
            ),
            ProviderError::Unsupported { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                Some("unsupported".into()),
            ),
            ProviderError::Busy { .. } | ProviderError::Unloaded { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error", None, None)
            }
            ProviderError::Api { .. } | ProviderError::Connection { .. } => {
                (StatusCode::BAD_GATEWAY, "server_error", None, None)
            }
            ProviderError::Timeout { .. } => {
                (StatusCode::GATEWAY_TIMEOUT, "server_error", None, None)
            }
            ProviderError::ModelLoad { .. } | ProviderError::Cancelled => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                None,
            ),
        };
        ApiError {
            status,
            kind,
            param,
            code,
            message,
            retry_after: None,
        }
    }

    /// The JSON body (also sent as the last event of a stream that fails).
    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(ErrorDetail {
            message: self.message.clone(),
            kind: Some(self.kind.to_string()),
            param: self.param.clone(),
            code: self.code.clone().map(ErrorCode::Text),
            extra: Default::default(),
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}
