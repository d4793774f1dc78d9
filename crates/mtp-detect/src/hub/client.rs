//! The Hub's HTTP API as `huggingface_hub` uses it:
//! - `GET {endpoint}/api/models/{repo}/revision/{revision}`: the commit a revision names;
//! - `GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true`: the file listing, in
//!   pages linked by `Link: <…>; rel="next"`;
//! - `HEAD {endpoint}/{repo}/resolve/{revision}/{file}`: ETag (`X-Linked-Etag` for LFS files,
//!   their sha256), size (`X-Linked-Size`), commit (`X-Repo-Commit`) and, for LFS files, the
//!   `Location` the bytes are served from;
//! - `GET` of that location or of the `resolve` URL, whole or with `Range`.
//!
//! Errors are read from the Hub's `X-Error-Code` header, as `huggingface_hub` reads them.
//! The token goes only to the endpoint's own origin, never to a CDN it redirects to.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use crate::hub::{HubConfig, HubError};
use crate::names::is_safe_relative;
use crate::repo::RepoId;

/// The largest JSON answer read (a listing page, a revision).
const MAX_JSON: u64 = 32 * 1024 * 1024;
/// The most listing pages followed.
const MAX_PAGES: usize = 100_000;
/// The most relative redirects followed by a `HEAD` (a renamed repository).
const MAX_RELATIVE_REDIRECTS: usize = 5;
/// Connection set-up limit.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A revision resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRevision {
    /// The revision asked for.
    pub revision: String,
    /// The commit it names (40 hex digits on the Hub).
    pub commit: String,
    /// The files the answer lists (`siblings`), unchecked.
    pub siblings: Vec<String>,
}

/// One file of a tree listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeFile {
    /// `/`-separated path in the repository (checked safe).
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// The git blob id.
    pub oid: String,
    /// The sha256 of an LFS file's bytes.
    pub lfs_sha256: Option<String>,
}

/// What `HEAD` says of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// `X-Repo-Commit`.
    pub commit: Option<String>,
    /// The ETag, normalised as `huggingface_hub` does (no `W/`, no quotes): the blob's name.
    pub etag: String,
    /// The file's size.
    pub size: Option<u64>,
    /// Where the bytes are (the `resolve` URL, or the CDN it redirects to).
    pub location: String,
    /// Whether the ETag came from `X-Linked-Etag` (an LFS file: it is the sha256).
    pub linked: bool,
}

#[derive(Deserialize)]
struct RevisionJson {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<SiblingJson>,
}

#[derive(Deserialize)]
struct SiblingJson {
    rfilename: String,
}

#[derive(Deserialize)]
struct TreeEntryJson {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    oid: Option<String>,
    #[serde(default)]
    lfs: Option<LfsJson>,
}

#[derive(Deserialize)]
struct LfsJson {
    #[serde(alias = "sha256")]
    oid: String,
}

/// Percent-encodes `s` as Python's `quote(s, safe=safe)` does.
pub(crate) fn quote(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `huggingface_hub`'s `_normalize_etag`: without `W/` and quotes.
pub(crate) fn normalize_etag(v: &str) -> String {
    v.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

/// Whether an ETag can name a file in `blobs/` (it comes from the server: nothing like `/`).
fn etag_is_safe(e: &str) -> bool {
    !e.is_empty()
        && e.len() <= 128
        && e.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// The `rel="next"` URL of a `Link` header.
pub(crate) fn next_link(headers: &HeaderMap) -> Option<String> {
    for v in headers.get_all(reqwest::header::LINK) {
        let Ok(v) = v.to_str() else { continue };
        for part in v.split(',') {
            let mut pieces = part.split(';');
            let url = pieces.next()?.trim();
            let is_next = pieces.any(|p| {
                let p = p.trim().replace(' ', "");
                p == "rel=\"next\"" || p == "rel=next"
            });
            if is_next {
                let url = url.strip_prefix('<')?.strip_suffix('>')?;
                return Some(url.to_string());
            }
        }
    }
    None
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
}

/// The Hub's API over HTTP.
#[derive(Clone)]
pub struct HubClient {
    cfg: HubConfig,
    /// Follows redirects (reqwest drops the token when one leaves the origin).
    http: reqwest::Client,
    /// Follows none: `HEAD` reads the redirect's own headers, as `huggingface_hub` does.
    head: reqwest::Client,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient").field("cfg", &self.cfg).finish()
    }
}

/// What a request is about, for the error it may become.
#[derive(Clone, Copy)]
pub(crate) struct Subject<'a> {
    pub repo: &'a str,
    pub revision: Option<&'a str>,
    pub file: Option<&'a str>,
}

impl HubClient {
    /// A client for `cfg`'s endpoint. TLS trusts the operating system's certificate store as
    /// well as the bundled roots, so internal mirrors with a private CA work.
    pub fn new(cfg: HubConfig) -> Result<Self, HubError> {
        let err = |e: reqwest::Error| HubError::Http {
            url: cfg.endpoint.clone(),
            status: None,
            message: format!("cannot build the HTTP client: {e}"),
        };
        let ua = format!("mtp/{}; hf_hub-compatible", env!("CARGO_PKG_VERSION"));
        let http = reqwest::Client::builder()
            .user_agent(ua.clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(10))
            .build()
            .map_err(err)?;
        let head = reqwest::Client::builder()
            .user_agent(ua)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(err)?;
        Ok(HubClient { cfg, http, head })
    }

    /// The configuration.
    pub fn config(&self) -> &HubConfig {
        &self.cfg
    }

    /// `Offline` when `HF_HUB_OFFLINE` forbids requests.
    fn online(&self, what: impl FnOnce() -> String) -> Result<(), HubError> {
        if self.cfg.offline {
            return Err(HubError::Offline {
                what: what(),
                cache: None,
            });
        }
        Ok(())
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{file}`, encoded as `huggingface_hub` does.
    pub fn file_url(&self, repo: &RepoId, revision: &str, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            self.cfg.endpoint,
            repo,
            quote(revision, false),
            quote(file, true)
        )
    }

    fn same_origin(&self, url: &str) -> bool {
        let origin = |u: &str| {
            reqwest::Url::parse(u).ok().map(|u| {
                (
                    u.scheme().to_string(),
                    u.host_str().map(str::to_string),
                    u.port_or_known_default(),
                )
            })
        };
        origin(url).is_some() && origin(url) == origin(&self.cfg.endpoint)
    }

    /// A request with the token when `url` is on the endpoint's origin.
    pub(crate) fn request(
        &self,
        method: Method,
        url: &str,
        follow: bool,
    ) -> reqwest::RequestBuilder {
        let c = if follow { &self.http } else { &self.head };
        let rb = c.request(method, url);
        match &self.cfg.token {
            Some(t) if self.same_origin(url) => rb.bearer_auth(t),
            _ => rb,
        }
    }

    /// Sends, mapping transport failures and the Hub's error answers to typed errors.
    pub(crate) async fn send(
        &self,
        rb: reqwest::RequestBuilder,
        url: &str,
        subject: Subject<'_>,
    ) -> Result<reqwest::Response, HubError> {
        tracing::debug!(url, "hub request");
        let resp = rb.send().await.map_err(|e| HubError::Http {
            url: url.to_string(),
            status: None,
            message: transport_message(&e),
        })?;
        let status = resp.status();
        if status.is_success()
            || status.is_redirection()
            || status == StatusCode::RANGE_NOT_SATISFIABLE
        {
            return Ok(resp);
        }
        Err(error_of(status, resp.headers(), url, subject))
    }

    /// Reads a JSON body of at most [`MAX_JSON`] bytes.
    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        resp: reqwest::Response,
        url: &str,
        counter: Option<&AtomicU64>,
    ) -> Result<T, HubError> {
        let body = read_capped(resp, MAX_JSON, url, counter).await?;
        serde_json::from_slice(&body).map_err(|e| HubError::BadAnswer {
            url: url.to_string(),
            message: format!("not the JSON the Hub sends ({e})"),
        })
    }

    /// The commit `revision` names, and the files the Hub lists with it.
    pub async fn revision(&self, repo: &RepoId, revision: &str) -> Result<RepoRevision, HubError> {
        crate::hub::check_revision(revision)?;
        self.online(|| format!("{repo}@{revision}"))?;
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.cfg.endpoint,
            repo,
            quote(revision, false)
        );
        let subject = Subject {
            repo: repo.as_str(),
            revision: Some(revision),
            file: None,
        };
        let rb = self
            .request(Method::GET, &url, true)
            .timeout(self.cfg.etag_timeout);
        let resp = self.send(rb, &url, subject).await?;
        let info: RevisionJson = self.json(resp, &url, None).await?;
        let commit = info
            .sha
            .filter(|s| crate::repo::validate_revision(s).is_ok())
            .ok_or_else(|| HubError::BadAnswer {
                url: url.clone(),
                message: "the answer names no commit (`sha`)".into(),
            })?;
        Ok(RepoRevision {
            revision: revision.to_string(),
            commit,
            siblings: info.siblings.into_iter().map(|s| s.rfilename).collect(),
        })
    }

    /// Every file of `repo` at `revision`, following the listing's pages to the end. A name
    /// that is not a safe relative path fails the whole listing.
    pub async fn tree(&self, repo: &RepoId, revision: &str) -> Result<Vec<TreeFile>, HubError> {
        self.tree_counted(repo, revision, None).await
    }

    /// [`HubClient::tree`], counting the listing's bytes into `counter`.
    pub(crate) async fn tree_counted(
        &self,
        repo: &RepoId,
        revision: &str,
        counter: Option<&AtomicU64>,
    ) -> Result<Vec<TreeFile>, HubError> {
        crate::hub::check_revision(revision)?;
        self.online(|| format!("the file list of {repo}@{revision}"))?;
        let subject = Subject {
            repo: repo.as_str(),
            revision: Some(revision),
            file: None,
        };
        let mut url = format!(
            "{}/api/models/{}/tree/{}?recursive=true",
            self.cfg.endpoint,
            repo,
            quote(revision, false)
        );
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..MAX_PAGES {
            let rb = self
                .request(Method::GET, &url, true)
                .timeout(self.cfg.etag_timeout);
            let resp = self.send(rb, &url, subject).await?;
            let next = next_link(resp.headers());
            let page: Vec<TreeEntryJson> = self.json(resp, &url, counter).await?;
            for e in page {
                if e.kind != "file" {
                    continue;
                }
                if !is_safe_relative(&e.path) {
                    return Err(HubError::UnsafePath {
                        repo: repo.to_string(),
                        file: e.path,
                    });
                }
                if !seen.insert(e.path.clone()) {
                    continue;
                }
                out.push(TreeFile {
                    size: e.size.unwrap_or(0),
                    oid: e.oid.unwrap_or_default(),
                    lfs_sha256: e.lfs.map(|l| l.oid.to_ascii_lowercase()),
                    path: e.path,
                });
            }
            match next {
                Some(n) if n != url => url = n,
                _ => return Ok(out),
            }
        }
        Err(HubError::BadAnswer {
            url,
            message: format!("the listing has more than {MAX_PAGES} pages"),
        })
    }

    /// `HEAD` of one file: its ETag, size, commit and where its bytes are.
    pub async fn head(
        &self,
        repo: &RepoId,
        revision: &str,
        file: &str,
    ) -> Result<FileMeta, HubError> {
        crate::hub::check_revision(revision)?;
        self.online(|| format!("{repo}/{file}"))?;
        let subject = Subject {
            repo: repo.as_str(),
            revision: Some(revision),
            file: Some(file),
        };
        let mut url = self.file_url(repo, revision, file);
        for _ in 0..=MAX_RELATIVE_REDIRECTS {
            let rb = self
                .request(Method::HEAD, &url, false)
                .header(
                    reqwest::header::ACCEPT_ENCODING,
                    HeaderValue::from_static("identity"),
                )
                .timeout(self.cfg.etag_timeout);
            let resp = self.send(rb, &url, subject).await?;
            let h = resp.headers();
            let location = header(h, "location");
            if resp.status().is_redirection() {
                if let Some(loc) = location
                    .as_deref()
                    .filter(|l| l.starts_with('/') && !l.starts_with("//"))
                {
                    // A relative redirect (a renamed repository): follow it, as huggingface_hub does.
                    url = format!("{}{}", origin_of(&url), loc);
                    continue;
                }
            }
            let linked = header(h, "x-linked-etag");
            let etag = linked
                .clone()
                .or_else(|| header(h, "etag"))
                .map(|e| normalize_etag(&e))
                .filter(|e| etag_is_safe(e))
                .ok_or_else(|| HubError::BadAnswer {
                    url: url.clone(),
                    message: "no usable ETag (the Hub names every file by one)".into(),
                })?;
            let size = header(h, "x-linked-size")
                .or_else(|| {
                    (!resp.status().is_redirection())
                        .then(|| header(h, "content-length"))
                        .flatten()
                })
                .and_then(|s| s.parse().ok());
            let location = match location {
                Some(l) if resp.status().is_redirection() => {
                    match reqwest::Url::parse(&url).and_then(|b| b.join(&l)) {
                        Ok(u) => u.to_string(),
                        Err(_) => l,
                    }
                }
                _ => url.clone(),
            };
            return Ok(FileMeta {
                commit: header(h, "x-repo-commit"),
                etag,
                size,
                location,
                linked: linked.is_some(),
            });
        }
        Err(HubError::BadAnswer {
            url,
            message: format!("more than {MAX_RELATIVE_REDIRECTS} relative redirects"),
        })
    }

    /// `GET` of file bytes at `url` (following redirects), from `start` to `end` inclusive
    /// when given (`end` `None`: to the end of the file).
    pub(crate) async fn get_bytes(
        &self,
        url: &str,
        range: Option<(u64, Option<u64>)>,
        subject: Subject<'_>,
    ) -> Result<reqwest::Response, HubError> {
        self.online(|| match subject.file {
            Some(f) => format!("{}/{f}", subject.repo),
            None => subject.repo.to_string(),
        })?;
        let mut rb = self.request(Method::GET, url, true).header(
            reqwest::header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        if let Some((start, end)) = range {
            let v = match end {
                Some(e) => format!("bytes={start}-{e}"),
                None => format!("bytes={start}-"),
            };
            rb = rb.header(reqwest::header::RANGE, v);
        }
        // Only connection set-up is bounded here: a stall while the body streams is caught
        // chunk by chunk (`download_timeout`), so a large file is never cut for being large.
        self.send(rb, url, subject).await
    }
}

fn origin_of(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => {
            let mut s = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
            if let Some(p) = u.port() {
                s.push_str(&format!(":{p}"));
            }
            s
        }
        Err(_) => String::new(),
    }
}

/// A transport error in words: which step failed, without reqwest's nesting.
pub(crate) fn transport_message(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the connection broke off while the body was read"
    } else {
        "the request failed"
    };
    let mut cause = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        cause = format!("{cause}: {s}");
        src = s.source();
    }
    format!("{what} ({cause})")
}

/// The Hub's error answer as a typed error (`X-Error-Code` first, as `huggingface_hub`).
pub(crate) fn error_of(status: StatusCode, h: &HeaderMap, url: &str, s: Subject<'_>) -> HubError {
    let code = header(h, "x-error-code").unwrap_or_default();
    let message = header(h, "x-error-message").unwrap_or_default();
    let url = url.to_string();
    match code.as_str() {
        "RevisionNotFound" => {
            return HubError::RevisionNotFound {
                repo: s.repo.to_string(),
                revision: s.revision.unwrap_or("?").to_string(),
                url,
            }
        }
        "EntryNotFound" => {
            return HubError::EntryNotFound {
                repo: s.repo.to_string(),
                file: s.file.unwrap_or("?").to_string(),
                url,
            }
        }
        "GatedRepo" => {
            return HubError::GatedRepo {
                repo: s.repo.to_string(),
                url,
                message: if message.is_empty() {
                    format!("Access to model {} is restricted.", s.repo)
                } else {
                    message
                },
            }
        }
        "RepoNotFound" => {
            return HubError::RepoNotFound {
                repo: s.repo.to_string(),
                url,
            }
        }
        _ => {}
    }
    if status == StatusCode::UNAUTHORIZED
        && message != "Invalid credentials in Authorization header"
    {
        return HubError::RepoNotFound {
            repo: s.repo.to_string(),
            url,
        };
    }
    if status == StatusCode::NOT_FOUND && s.file.is_some() {
        return HubError::EntryNotFound {
            repo: s.repo.to_string(),
            file: s.file.unwrap_or("?").to_string(),
            url,
        };
    }
    let mut m = format!("HTTP {}", status.as_u16());
    if !message.is_empty() {
        m.push_str(&format!(": {message}"));
    }
    match status.as_u16() {
        401 => m.push_str(" (the token was refused; check HF_TOKEN or `hf auth login`)"),
        403 => m.push_str(" (make sure your token has the required permissions)"),
        429 => m.push_str(" (rate limited; wait and try again)"),
        _ => {}
    }
    HubError::Http {
        url,
        status: Some(status.as_u16()),
        message: m,
    }
}

/// The body, refusing more than `cap` bytes; `counter` counts what arrived.
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    cap: u64,
    url: &str,
    counter: Option<&AtomicU64>,
) -> Result<Vec<u8>, HubError> {
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| HubError::Http {
        url: url.to_string(),
        status: Some(status),
        message: transport_message(&e),
    })? {
        if let Some(c) = counter {
            c.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Err(HubError::BadAnswer {
                url: url.to_string(),
                message: format!("the answer is larger than {cap} bytes"),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
