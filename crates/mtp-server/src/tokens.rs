//! The tokenizer routes that eval harnesses and llama-server's clients call, over the
//! provider's [`mtp_contract::Vocabulary`] and [`Provider::render_prompt`]:
//!
//! - `POST /tokenize`: llama-server's body (`content`, `add_special`, `parse_special`,
//!   `with_pieces`) or vLLM's (`prompt`, `add_special_tokens`, `return_token_strs`, or chat
//!   `messages` rendered with the template); answers `tokens` (ids, or `{id, piece}` with
//!   `with_pieces`: the piece a string when it is UTF-8, else its bytes, as llama-server
//!   writes it), `count` and `max_model_len`. Defaults: no special tokens added, special-token
//!   text parsed (llama-server's).
//! - `POST /detokenize`: `tokens` → `content` (llama-server) and `prompt` (vLLM).
//! - `GET /tokenizer_info`: vLLM's, what lm-evaluation-harness's remote tokenizer reads
//!   (`eos_token`, `bos_token`, `pad_token`, `chat_template`, `model_max_length`).
//! - `POST /apply-template`: llama-server's: a chat body's prompt as the model is given it
//!   (`prompt`), without generating.
//!
//! Each runs its CPU work on the blocking pool; bodies are bounded as every route's are, and a
//! text past `--max-prompt-bytes` is a 413 before it is tokenized.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mtp_contract::{Provider, ProviderError, Vocabulary};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai::{self, Endpoint};
use crate::Shared;

/// The provider's vocabulary, or the 400 of a runtime that has none.
fn vocabulary(llm: &dyn Provider) -> Result<Arc<dyn Vocabulary>, ApiError> {
    llm.vocabulary().ok_or_else(|| {
        ApiError::from_provider(&ProviderError::Unsupported {
            provider: llm.name().to_string(),
            what: "tokenizing (the runtime has no tokenizer at hand)".into(),
        })
    })
}

/// An optional boolean field of `body` (`None` when absent), a 400 naming it when not a
/// boolean.
fn flag(body: &Value, k: &str) -> Result<Option<bool>, ApiError> {
    match body.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::invalid(
            k,
            format!("`{k}` must be true or false, got {v}"),
        )),
    }
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProviderError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            param: None,
            code: None,
            message: format!("tokenizing failed: {e}"),
            retry_after: None,
        })?
        .map_err(|e| ApiError::from_provider(&e))
}

/// `POST /tokenize`.
pub(crate) async fn tokenize(State(s): State<Shared>, body: Body) -> Response {
    match tokenize_body(&s, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            s.metrics.rejected();
            e.into_response()
        }
    }
}

async fn tokenize_body(s: &Shared, body: Body) -> Result<Value, ApiError> {
    let body = crate::read_body(s, body).await?;
    if !body.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    }
    let with_pieces = flag(&body, "with_pieces")?.unwrap_or(false);
    let token_strs = flag(&body, "return_token_strs")?.unwrap_or(false);
    let ids = if body.get("messages").is_some() {
        // vLLM's chat form: the prompt the chat body gives the model
        let mut parsed = openai::parse(Endpoint::Chat, &body, &s.limits)?;
        parsed.request.max_output_tokens = Some(1);
        s.llm
            .render_prompt(parsed.request)
            .await
            .map_err(|e| ApiError::from_provider(&e))?
            .token_ids
    } else {
        let (key, text) = match (body.get("content"), body.get("prompt")) {
            (Some(t), _) => ("content", t),
            (None, Some(t)) => ("prompt", t),
            (None, None) => {
                return Err(ApiError::invalid(
                    "content",
                    "`content` (or `prompt`, or chat `messages`) is required",
                ))
            }
        };
        let Some(text) = text.as_str().map(str::to_string) else {
            return Err(ApiError::invalid(key, format!("`{key}` must be a string")));
        };
        if text.len() > s.limits.max_prompt_bytes {
            return Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                ..ApiError::over_limit(
                    key,
                    "bytes of text",
                    text.len(),
                    s.limits.max_prompt_bytes,
                    "--max-prompt-bytes",
                )
            });
        }
        let add = match (
            flag(&body, "add_special")?,
            flag(&body, "add_special_tokens")?,
        ) {
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => false,
        };
        let parse = flag(&body, "parse_special")?.unwrap_or(true);
        let vocab = vocabulary(s.llm.as_ref())?;
        blocking(move || vocab.encode(&text, add, parse)).await?
    };
    let mut out = json!({
        "count": ids.len(),
        "max_model_len": s.llm.context_length(),
    });
    if with_pieces || token_strs {
        let vocab = vocabulary(s.llm.as_ref())?;
        let texts: Vec<(String, Vec<u8>)> = ids.iter().map(|&id| vocab.token_text(id)).collect();
        if token_strs {
            out["token_strs"] = texts.iter().map(|(t, _)| Value::from(t.as_str())).collect();
        }
        if with_pieces {
            out["tokens"] = ids
                .iter()
                .zip(&texts)
                .map(|(&id, (_, bytes))| {
                    let piece = match std::str::from_utf8(bytes) {
                        Ok(t) => Value::from(t),
                        Err(_) => Value::from(bytes.clone()),
                    };
                    json!({"id": id, "piece": piece})
                })
                .collect();
            return Ok(out);
        }
    }
    out["tokens"] = Value::from(ids);
    Ok(out)
}

/// `POST /detokenize`.
pub(crate) async fn detokenize(State(s): State<Shared>, body: Body) -> Response {
    let r = async {
        let body = crate::read_body(&s, body).await?;
        let bad = || ApiError::invalid("tokens", "`tokens` must be a list of token ids");
        let ids: Vec<u32> = body
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(bad)?
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(bad)
            })
            .collect::<Result<_, _>>()?;
        let vocab = vocabulary(s.llm.as_ref())?;
        let text = blocking(move || vocab.decode(&ids)).await?;
        Ok::<_, ApiError>(json!({"content": text, "prompt": text}))
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            s.metrics.rejected();
            e.into_response()
        }
    }
}

/// `GET /tokenizer_info`.
pub(crate) async fn tokenizer_info(State(s): State<Shared>) -> Response {
    match vocabulary(s.llm.as_ref()) {
        Ok(v) => {
            let mut info = v.info();
            if let Some(c) = s.llm.context_length() {
                info.model_max_length = Some(c);
            }
            Json(info).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `POST /apply-template`: the chat body's prompt, rendered, without generating.
pub(crate) async fn apply_template(State(s): State<Shared>, body: Body) -> Response {
    let r = async {
        let body = crate::read_body(&s, body).await?;
        let mut parsed = openai::parse(Endpoint::Chat, &body, &s.limits)?;
        parsed.request.max_output_tokens = Some(1);
        let r = s
            .llm
            .render_prompt(parsed.request)
            .await
            .map_err(|e| ApiError::from_provider(&e))?;
        Ok::<_, ApiError>(json!({"prompt": r.text}))
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            s.metrics.rejected();
            e.into_response()
        }
    }
}

/// `GET /v1/models/{id}`: the served model, or OpenAI's 404 `model_not_found`.
pub(crate) async fn model(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    if id != s.model_id {
        return ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("model_not_found".into()),
            ..ApiError::invalid(
                "model",
                format!(
                    "the model `{id}` does not exist here; this server serves `{}`",
                    s.model_id
                ),
            )
        }
        .into_response();
    }
    Json(crate::model_entry(&s)).into_response()
}
