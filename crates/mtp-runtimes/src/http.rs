//! The transport under every adapter: one reqwest client, bounded connect retries, idle
//! timeouts and size caps on every body read, and the mapping of failures to typed
//! [`ProviderError`]s that name the server and the cause.

use std::time::Duration;

use futures::StreamExt;
use mtp_contract::ProviderError;
use serde_json::Value;

use crate::options::{HttpOptions, ServerKind};

/// A connection to one server.
#[derive(Debug)]
pub(crate) struct Transport {
    client: reqwest::Client,
    pub(crate) opts: HttpOptions,
    pub(crate) kind: ServerKind,
    pub(crate) model: String,
}

/// What a body read produced.
pub(crate) enum BodyRead {
    /// The whole body.
    Complete(Vec<u8>),
    /// The body ended early after these bytes: the connection broke, or (only where a
    /// prefix is enough, see [`Transport::read_error_body`]) reading stopped at the cap. The
    /// text says which.
    Cut(Vec<u8>, String),
}

/// A body read up to a cap.
enum Capped {
    /// Within the cap.
    Within(BodyRead),
    /// The first `cap` bytes of a longer body; the rest was never read.
    Over(Vec<u8>),
}

/// The most of an error body (a non-2xx answer) that is read: its message is all we use.
const ERROR_BODY_BYTES: usize = 1 << 20;

/// A byte count for messages: `64 MiB`, `1 KiB`, or `1000 bytes`.
pub(crate) fn human_bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

impl Transport {
    pub(crate) fn new(
        kind: ServerKind,
        model: String,
        opts: HttpOptions,
    ) -> Result<Self, ProviderError> {
        let client = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .build()
            .map_err(|e| ProviderError::Api {
                provider: kind.name().into(),
                model: model.clone(),
                status: None,
                message: format!("cannot build the HTTP client: {}", chain(&e)),
            })?;
        Ok(Transport {
            client,
            opts,
            kind,
            model,
        })
    }

    pub(crate) fn server(&self) -> &str {
        &self.opts.base_url
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.opts.base_url, path)
    }

    pub(crate) fn api_error(&self, status: Option<u16>, message: String) -> ProviderError {
        ProviderError::Api {
            provider: self.kind.name().into(),
            model: self.model.clone(),
            status,
            message,
        }
    }

    fn timeout_error(&self, what: String) -> ProviderError {
        ProviderError::Timeout {
            server: self.server().to_string(),
            message: what,
        }
    }

    /// Sends a request built by `build`, retrying only when the connection could not be
    /// established (the request never reached the server), at most `connect_retries` times.
    async fn send(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ProviderError> {
        let mut attempt = 0u32;
        loop {
            let mut rb = build();
            if let Some(key) = &self.opts.api_key {
                rb = rb.bearer_auth(key.expose());
            }
            match tokio::time::timeout(self.opts.request_timeout, rb.send()).await {
                Err(_) => {
                    return Err(self.timeout_error(format!(
                        "no response headers within {} ms (request_timeout_ms)",
                        self.opts.request_timeout.as_millis()
                    )))
                }
                Ok(Ok(resp)) => return Ok(resp),
                Ok(Err(e)) if e.is_connect() => {
                    if attempt < self.opts.connect_retries {
                        let backoff = Duration::from_millis(100u64 << attempt.min(5));
                        tracing::debug!(server = %self.server(), attempt, "connect failed, retrying: {}", chain(&e));
                        tokio::time::sleep(backoff).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(ProviderError::Connection {
                        server: self.server().to_string(),
                        message: format!(
                            "{} (after {} attempt{}); is the {} server running there?",
                            chain(&e),
                            attempt + 1,
                            if attempt == 0 { "" } else { "s" },
                            self.kind
                        ),
                    });
                }
                Ok(Err(e)) if e.is_timeout() => {
                    return Err(self.timeout_error(format!("request timed out: {}", chain(&e))))
                }
                Ok(Err(e)) => {
                    return Err(self.api_error(None, format!("request failed: {}", chain(&e))))
                }
            }
        }
    }

    /// POSTs JSON; a non-2xx answer becomes an `Api` error carrying the server's message.
    pub(crate) async fn post_json(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<reqwest::Response, ProviderError> {
        let url = self.url(path);
        tracing::debug!(server = %self.server(), path, "POST");
        let resp = self.send(|| self.client.post(&url).json(body)).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.refused(resp, path, true).await)
    }

    /// The `Api` error of a non-2xx answer to `path`: its status and the server's message,
    /// with a hint for a refused key and (when `model_hint`, a request about the model) for a
    /// 404.
    async fn refused(
        &self,
        resp: reqwest::Response,
        path: &str,
        model_hint: bool,
    ) -> ProviderError {
        let status = resp.status();
        let text = match self.read_error_body(resp).await {
            Ok(BodyRead::Complete(b)) | Ok(BodyRead::Cut(b, _)) => b,
            Err(_) => Vec::new(),
        };
        let mut message = format!(
            "HTTP {} from {}{}: {}",
            status.as_u16(),
            self.server(),
            path,
            server_message(&text)
        );
        if status.as_u16() == 401 || status.as_u16() == 403 {
            message.push_str(" (check the api_key given to the provider)");
        }
        if model_hint && status.as_u16() == 404 {
            message.push_str(&format!(
                " (is this a {} server, and is model `{}` served there?)",
                self.kind, self.model
            ));
        }
        self.api_error(Some(status.as_u16()), message)
    }

    /// GETs a page that must exist; a non-2xx answer is an `Api` error carrying the server's
    /// message, a body over `max_body_bytes` or cut short is an `Api` error naming `path`.
    pub(crate) async fn get_required(&self, path: &str) -> Result<Vec<u8>, ProviderError> {
        let url = self.url(path);
        tracing::debug!(server = %self.server(), path, "GET");
        let resp = self.send(|| self.client.get(&url)).await?;
        if !resp.status().is_success() {
            return Err(self.refused(resp, path, false).await);
        }
        match self.read_body(resp, path).await? {
            BodyRead::Complete(b) => Ok(b),
            BodyRead::Cut(_, why) => Err(self.api_error(
                None,
                format!("the answer of {}{path} was cut short: {why}", self.server()),
            )),
        }
    }

    /// GETs a page that may not exist: `Ok(None)` for a non-2xx answer or a cut body, an
    /// error when the server cannot be reached, stalls, or sends more than `max_body_bytes`.
    pub(crate) async fn get_optional(&self, path: &str) -> Result<Option<String>, ProviderError> {
        let url = self.url(path);
        let resp = self.send(|| self.client.get(&url)).await?;
        if !resp.status().is_success() {
            tracing::debug!(server = %self.server(), path, status = resp.status().as_u16(), "optional endpoint unavailable");
            return Ok(None);
        }
        match self.read_body(resp, path).await? {
            BodyRead::Complete(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            BodyRead::Cut(_, _) => Ok(None),
        }
    }

    /// Reads a whole body of at most `max_body_bytes`, allowing at most `idle_timeout`
    /// between chunks. A longer body (announced by `Content-Length`, or found while reading)
    /// is an `Api` error naming `path`, the cap and the option; at most the cap is held.
    pub(crate) async fn read_body(
        &self,
        resp: reqwest::Response,
        path: &str,
    ) -> Result<BodyRead, ProviderError> {
        let cap = self.opts.max_body_bytes;
        if let Some(announced) = resp.content_length().filter(|&n| n > cap as u64) {
            return Err(self.body_too_large(path, &format!("announces {announced} bytes")));
        }
        match self.read_capped(resp, cap).await? {
            Capped::Within(read) => Ok(read),
            Capped::Over(_) => Err(self.body_too_large(path, "goes on past it")),
        }
    }

    /// The first bytes of an error body (at most `ERROR_BODY_BYTES`, and never more than
    /// `max_body_bytes`): enough for the server's message, whatever the server sends.
    async fn read_error_body(&self, resp: reqwest::Response) -> Result<BodyRead, ProviderError> {
        let cap = self.opts.max_body_bytes.min(ERROR_BODY_BYTES);
        Ok(match self.read_capped(resp, cap).await? {
            Capped::Within(read) => read,
            Capped::Over(prefix) => {
                BodyRead::Cut(prefix, format!("stopped reading at {}", human_bytes(cap)))
            }
        })
    }

    /// Reads a body until its end or until it holds `cap` bytes, allowing at most
    /// `idle_timeout` between chunks.
    async fn read_capped(
        &self,
        resp: reqwest::Response,
        cap: usize,
    ) -> Result<Capped, ProviderError> {
        let mut stream = resp.bytes_stream();
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(self.opts.idle_timeout, stream.next()).await {
                Err(_) => {
                    return Err(self.timeout_error(format!(
                        "the server sent nothing for {} ms while sending the response (idle_timeout_ms)",
                        self.opts.idle_timeout.as_millis()
                    )))
                }
                Ok(None) => return Ok(Capped::Within(BodyRead::Complete(out))),
                Ok(Some(Ok(chunk))) => {
                    let room = cap - out.len();
                    if chunk.len() > room {
                        out.extend_from_slice(&chunk[..room]);
                        return Ok(Capped::Over(out));
                    }
                    out.extend_from_slice(&chunk);
                }
                Ok(Some(Err(e))) => return Ok(Capped::Within(BodyRead::Cut(out, chain(&e)))),
            }
        }
    }

    /// The error for a response body over `max_body_bytes`.
    fn body_too_large(&self, path: &str, how: &str) -> ProviderError {
        let cap = self.opts.max_body_bytes;
        let mut message = format!(
            "the response body from {}{path} {how}, over the {} cap ({cap} bytes); stopped \
             reading. Raise the provider option `max_body_bytes` (a `ProviderOptions` extra \
             key) if the server really sends that much",
            self.server(),
            human_bytes(cap),
        );
        if path == "/metrics" {
            message.push_str(", or set the option `metrics` to off");
        }
        self.api_error(None, message)
    }

    /// The error for a streamed line or event over `max_sse_event_bytes`.
    pub(crate) fn event_too_large(&self, path: &str, cap: usize) -> ProviderError {
        self.api_error(
            None,
            format!(
                "a line or event of the event stream from {}{path} went over the {} cap \
                 ({cap} bytes) before it ended; stopped reading. Raise the provider option \
                 `max_sse_event_bytes` (a `ProviderOptions` extra key) if the server really \
                 sends that much",
                self.server(),
                human_bytes(cap),
            ),
        )
    }

    /// The error for a streamed reply whose text went over `max_body_bytes`.
    pub(crate) fn reply_too_large(&self, path: &str) -> ProviderError {
        let cap = self.opts.max_body_bytes;
        self.api_error(
            None,
            format!(
                "the reply streamed from {}{path} went over the {} cap ({cap} bytes of text, \
                 tool calls and token ids); stopped reading. Raise the provider option `max_body_bytes` (a \
                 `ProviderOptions` extra key) if the server really sends that much",
                self.server(),
                human_bytes(cap),
            ),
        )
    }

    /// The body stream of a streaming response; the caller applies the idle timeout.
    pub(crate) fn idle_timeout(&self) -> Duration {
        self.opts.idle_timeout
    }
}

/// An error and its sources, joined with `: ` (reqwest's own message hides the cause).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        src = inner.source();
    }
    s
}

/// The server's own error message from an error body: OpenAI's `{"error":{"message"}}`,
/// Ollama's `{"error":"…"}`, vLLM's older `{"message"}`, FastAPI's `{"detail"}`, or the text.
pub(crate) fn server_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"));
        if let Some(m) = found {
            return match m {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".into()
    } else {
        truncate(text, 400)
    }
}

/// At most `n` characters, with an ellipsis when cut.
pub(crate) fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages() {
        let cases: &[(&[u8], &str)] = &[
            (
                br#"{"error":{"code":500,"message":"model crashed","type":"server_error"}}"#,
                "model crashed",
            ),
            (br#"{"error":"model 'x' not found"}"#, "model 'x' not found"),
            (
                br#"{"object":"error","message":"bad temp","type":"BadRequestError","code":400}"#,
                "bad temp",
            ),
            (br#"{"detail":"Not Found"}"#, "Not Found"),
            (b"plain text oops\n", "plain text oops"),
            (b"", "(empty body)"),
        ];
        for (body, want) in cases {
            assert_eq!(server_message(body), *want);
        }
        assert_eq!(truncate("abcdef", 3), "abc…");
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
        assert_eq!(human_bytes((1 << 20) + 1), "1048577 bytes");
        assert_eq!(truncate("ab", 3), "ab");
    }
}
