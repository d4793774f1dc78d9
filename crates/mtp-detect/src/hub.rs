//! Reading a Hub repository over HTTP: the file listing, small JSON files, and `Range`
//! prefixes of weights files. Never whole weights.
//!
//! The endpoint comes from `HF_ENDPOINT` (there is no built-in default host), the token from
//! `HF_TOKEN`; the token is sent as a bearer header and never logged or printed.
//!
//! URL layout: `{endpoint}/api/models/{repo}/tree/{rev}?recursive=true` for the listing and
//! `{endpoint}/{repo}/resolve/{rev}/{file}` for file contents.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::DetectError;
use crate::repo::{validate_revision, RepoId};
use crate::source::{is_safe_relative, FileEntry, Reader};

/// The largest listing accepted.
const MAX_LISTING: u64 = 16 * 1024 * 1024;

/// Hub endpoint and credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Base URL, e.g. the value of `HF_ENDPOINT`, without a trailing `/`.
    pub endpoint: String,
    /// Bearer token (from `HF_TOKEN`). Never logged.
    pub token: Option<String>,
}

impl fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl HubConfig {
    /// An endpoint with no token.
    pub fn new(endpoint: impl Into<String>) -> Self {
        HubConfig {
            endpoint: endpoint.into().trim_end_matches('/').to_string(),
            token: None,
        }
    }

    /// `HF_ENDPOINT` and `HF_TOKEN`; `None` when `HF_ENDPOINT` is unset or empty.
    pub fn from_env() -> Option<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The same rule over any variable lookup.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let endpoint = get("HF_ENDPOINT").filter(|e| !e.trim().is_empty())?;
        let mut c = HubConfig::new(endpoint.trim());
        c.token = get("HF_TOKEN").filter(|t| !t.is_empty());
        Some(c)
    }
}

/// Percent-encodes one path (keeping `/`).
fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A Hub repository read over HTTP, on its own single-threaded runtime so that synchronous
/// callers (the engine, the CLI) can use it.
pub struct HubReader {
    cfg: HubConfig,
    repo: RepoId,
    revision: String,
    client: reqwest::Client,
    rt: Option<tokio::runtime::Runtime>,
    bytes: AtomicU64,
}

impl Drop for HubReader {
    fn drop(&mut self) {
        // Dropping a runtime blocks; inside an async context that would panic.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl fmt::Debug for HubReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubReader")
            .field("cfg", &self.cfg)
            .field("repo", &self.repo)
            .field("revision", &self.revision)
            .finish()
    }
}

impl HubReader {
    /// A reader for `repo` at `revision`.
    pub fn new(cfg: HubConfig, repo: RepoId, revision: &str) -> Result<Self, DetectError> {
        validate_revision(revision)?;
        let http = |m: String| DetectError::Http {
            url: cfg.endpoint.clone(),
            status: None,
            message: m,
        };
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| http(format!("cannot build HTTP client: {e}")))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| http(format!("cannot start the I/O runtime: {e}")))?;
        Ok(HubReader {
            cfg,
            repo,
            revision: revision.to_string(),
            client,
            rt: Some(rt),
            bytes: AtomicU64::new(0),
        })
    }

    /// Runs a future to completion, on a fresh thread when called from inside a runtime.
    fn block<T: Send>(
        &self,
        fut: impl std::future::Future<Output = Result<T, DetectError>> + Send,
    ) -> Result<T, DetectError> {
        let Some(rt) = &self.rt else {
            return Err(DetectError::Http {
                url: self.cfg.endpoint.clone(),
                status: None,
                message: "the I/O runtime is gone".into(),
            });
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| rt.block_on(fut))
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        } else {
            rt.block_on(fut)
        }
    }

    fn file_url(&self, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            self.cfg.endpoint,
            self.repo,
            self.revision,
            encode_path(file)
        )
    }

    fn request(&self, url: &str) -> reqwest::RequestBuilder {
        let rb = self.client.get(url);
        match &self.cfg.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// GET with an optional range; returns status, headers and at most `cap` body bytes.
    async fn get(
        &self,
        url: &str,
        range: Option<(u64, u64)>,
        cap: u64,
    ) -> Result<(u16, reqwest::header::HeaderMap, Vec<u8>), DetectError> {
        let mut rb = self.request(url);
        if let Some((start, end)) = range {
            rb = rb.header(reqwest::header::RANGE, format!("bytes={start}-{end}"));
        }
        tracing::debug!(url, ?range, "hub request");
        let err = |status: Option<u16>, message: String| DetectError::Http {
            url: url.to_string(),
            status,
            message,
        };
        let mut resp = rb.send().await.map_err(|e| err(None, e.to_string()))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        if status == 404 {
            return Ok((status, headers, Vec::new()));
        }
        if !(200..300).contains(&status) {
            let msg = match status {
                401 | 403 => "access denied (a gated or private repository needs HF_TOKEN)".into(),
                _ => format!("the Hub answered HTTP {status}"),
            };
            return Err(err(Some(status), msg));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| err(Some(status), e.to_string()))?
        {
            let room = cap.saturating_sub(body.len() as u64) as usize;
            let take = room.min(chunk.len());
            body.extend_from_slice(&chunk[..take]);
            self.bytes.fetch_add(take as u64, Ordering::Relaxed);
            if take < chunk.len() || body.len() as u64 >= cap {
                break;
            }
        }
        Ok((status, headers, body))
    }
}

fn content_range_total(h: &reqwest::header::HeaderMap) -> Option<u64> {
    let v = h.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    v.rsplit_once('/')?.1.trim().parse().ok()
}

fn content_length(h: &reqwest::header::HeaderMap) -> Option<u64> {
    h.get(reqwest::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl Reader for HubReader {
    fn place(&self) -> String {
        format!("{}@{}", self.repo, self.revision)
    }

    fn describe(&self, file: &str) -> String {
        format!("{}:{}", self.repo, file)
    }

    fn list(&self) -> Result<Vec<FileEntry>, DetectError> {
        let url = format!(
            "{}/api/models/{}/tree/{}?recursive=true",
            self.cfg.endpoint, self.repo, self.revision
        );
        let (status, _, body) = self.block(self.get(&url, None, MAX_LISTING + 1))?;
        if status == 404 {
            return Err(DetectError::Http {
                url,
                status: Some(404),
                message: format!(
                    "repository `{}` (revision {}) not found; check the id, or set HF_TOKEN for a private one",
                    self.repo, self.revision
                ),
            });
        }
        if body.len() as u64 > MAX_LISTING {
            return Err(DetectError::TooLarge {
                file: url,
                size: body.len() as u64,
                limit: MAX_LISTING,
            });
        }
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| DetectError::json(&url, format!("listing is not valid JSON ({e})")))?;
        let arr = v
            .as_array()
            .ok_or_else(|| DetectError::json(&url, "listing is not a JSON array"))?;
        let mut out = Vec::new();
        for e in arr {
            if e.get("type").and_then(|t| t.as_str()) != Some("file") {
                continue;
            }
            let Some(path) = e.get("path").and_then(|p| p.as_str()) else {
                continue;
            };
            if !is_safe_relative(path) {
                let path = crate::source::shown_name(path);
                tracing::warn!(%path, "listing names an unsafe path; skipped");
                continue;
            }
            out.push(FileEntry {
                path: path.to_string(),
                size: e.get("size").and_then(|s| s.as_u64()),
            });
        }
        Ok(out)
    }

    fn read_small(&self, file: &str, cap: u64) -> Result<Option<Vec<u8>>, DetectError> {
        if !is_safe_relative(file) {
            return Ok(None);
        }
        let url = self.file_url(file);
        let (status, headers, body) = self.block(self.get(&url, None, cap + 1))?;
        if status == 404 {
            return Ok(None);
        }
        let size = content_length(&headers).unwrap_or(body.len() as u64);
        if size > cap || body.len() as u64 > cap {
            return Err(DetectError::TooLarge {
                file: self.describe(file),
                size: size.max(body.len() as u64),
                limit: cap,
            });
        }
        Ok(Some(body))
    }

    fn read_range(&self, file: &str, start: u64, len: u64) -> Result<(Vec<u8>, u64), DetectError> {
        if len == 0 {
            return Ok((Vec::new(), 0));
        }
        let url = self.file_url(file);
        let end = start.saturating_add(len - 1);
        let (status, headers, body) = self.block(self.get(&url, Some((start, end)), len))?;
        let http = |status, message: String| DetectError::Http {
            url: url.clone(),
            status: Some(status),
            message,
        };
        match status {
            404 => Err(http(404, format!("{} not found", self.describe(file)))),
            206 => {
                let total = content_range_total(&headers).ok_or_else(|| {
                    http(206, "partial response without a Content-Range total".into())
                })?;
                Ok((body, total))
            }
            200 if start == 0 => {
                // The server ignored Range; the body was cut at `len` bytes.
                let total = content_length(&headers).unwrap_or(body.len() as u64);
                Ok((body, total))
            }
            s => Err(http(
                s,
                format!("the server ignored the Range request (HTTP {s}); refusing to download the whole file"),
            )),
        }
    }

    fn bytes_read(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn is_remote(&self) -> bool {
        true
    }
}
