//! Whole-repository downloads from the Hub into the standard Hugging Face cache layout
//! (`models--org--name/snapshots/<commit>/…` plus `refs/<revision>`), and reading that cache
//! back for `mtp models list|verify`.
//!
//! Boundary: `mtp-detect` reads repos (listings, small JSON files, `Range` prefixes) but does
//! not download whole weights; this module does, over the same URL layout:
//! `{HF_ENDPOINT}/api/models/{repo}/revision/{rev}` (commit and file list) and
//! `{HF_ENDPOINT}/{repo}/resolve/{commit}/{file}`. There is no built-in endpoint: without
//! `HF_ENDPOINT` the error says to set it. The token (`HF_TOKEN`) is sent as a bearer header
//! and never printed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::ProgressBar;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

/// A Hub or cache failure; each message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// `HF_ENDPOINT` is not set.
    #[error("no Hub endpoint: HF_ENDPOINT is not set — set HF_ENDPOINT to the Hub's base URL (and HF_TOKEN for gated repos)")]
    NoEndpoint,
    /// A repo id that could reach outside the cache.
    #[error("invalid repo id `{id}`: {why} — use `org/name`")]
    InvalidRepo {
        /// The id as given.
        id: String,
        /// What is wrong.
        why: String,
    },
    /// The Hub answered with an error or could not be reached.
    #[error("Hub request {url} failed: {message}")]
    Http {
        /// The URL.
        url: String,
        /// The status and cause.
        message: String,
    },
    /// The Hub listed a file name that is not a safe relative path.
    #[error(
        "repo {repo} lists an unsafe file name `{}`; refusing to write it",
        mtp_detect::shown_name(file)
    )]
    UnsafePath {
        /// The repo.
        repo: String,
        /// The name.
        file: String,
    },
    /// A cache file could not be written or read.
    #[error("cache error at {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A model is not (completely) in the cache.
    #[error("{repo} is not installed in {}: {why} — run `mtp models download {repo}`", cache.display())]
    NotInstalled {
        /// The repo.
        repo: String,
        /// The cache directory.
        cache: PathBuf,
        /// What is missing.
        why: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Checks a repo id with `mtp-detect`'s rules (`org/name`, nothing like `../`).
pub fn validate_repo(id: &str) -> Result<(), HubError> {
    mtp_detect::RepoId::parse(id)
        .map(|_| ())
        .map_err(|e| HubError::InvalidRepo {
            id: id.chars().take(100).collect(),
            why: match e {
                mtp_detect::DetectError::InvalidRepoId { why, .. } => why,
                other => other.to_string(),
            },
        })
}

fn validate_revision(rev: &str) -> Result<(), HubError> {
    mtp_detect::repo::validate_revision(rev).map_err(|_| HubError::InvalidRepo {
        id: rev.chars().take(100).collect(),
        why: "a revision may hold only ASCII letters, digits, `-`, `_` and `.`".into(),
    })
}

/// The one path rule for files named by a listing (detection's): a plain relative path.
pub use mtp_detect::is_safe_relative;

/// The Hugging Face cache directory: `--cache-dir`, else `mtp-detect`'s rule
/// (`HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`).
pub fn cache_dir(flag: Option<&Path>) -> PathBuf {
    match flag {
        Some(p) => p.to_path_buf(),
        None => mtp_detect::CacheConfig::from_env().hub_cache,
    }
}

/// `models--org--name`.
pub fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// The file next to a model's cache folder entries that names its MTP companion.
pub const COMPANION_FILE: &str = "mtp-companion";

/// A repo's state in the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Installed {
    /// The repo id.
    pub repo: String,
    /// The snapshot of `refs/main`, when the ref and the snapshot exist.
    pub snapshot: Option<PathBuf>,
    /// The companion drafter recorded at download time.
    pub companion: Option<String>,
}

/// Reads a repo's state; `None` when the cache has no folder for it.
pub fn installed(cache: &Path, repo: &str) -> Option<Installed> {
    let root = cache.join(repo_folder(repo));
    if !root.is_dir() {
        return None;
    }
    let snapshot = std::fs::read_to_string(root.join("refs").join("main"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|c| validate_revision(c).is_ok())
        .map(|c| root.join("snapshots").join(c))
        .filter(|p| p.is_dir());
    let companion = std::fs::read_to_string(root.join(COMPANION_FILE))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| validate_repo(s).is_ok());
    Some(Installed {
        repo: repo.to_string(),
        snapshot,
        companion,
    })
}

/// Every `models--*` repo in the cache, sorted.
pub fn scan(cache: &Path) -> Result<Vec<Installed>, HubError> {
    let rd = match std::fs::read_dir(cache) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(cache)(e)),
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("models--") else {
            continue;
        };
        let repo = rest.replacen("--", "/", 1);
        if validate_repo(&repo).is_err() {
            continue;
        }
        if let Some(i) = installed(cache, &repo) {
            out.push(i);
        }
    }
    out.sort_by(|a, b| a.repo.cmp(&b.repo));
    Ok(out)
}

/// A Hub endpoint and credentials.
pub struct HubClient {
    endpoint: String,
    token: Option<String>,
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct RevisionInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
}

/// One repo's commit and files, ready to download.
#[derive(Debug, Clone)]
pub struct RepoPlan {
    /// The repo id.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolves to.
    pub commit: String,
    /// Its files (safe relative paths).
    pub files: Vec<String>,
}

impl HubClient {
    /// The endpoint from `HF_ENDPOINT`; the token from the argument (flag or `HF_TOKEN`).
    pub fn from_env(token: Option<String>) -> Result<Self, HubError> {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.trim().is_empty())
            .ok_or(HubError::NoEndpoint)?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(15))
            .build()
            .map_err(|e| HubError::Http {
                url: endpoint.clone(),
                message: e.to_string(),
            })?;
        Ok(HubClient {
            endpoint: endpoint.trim().trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
            client,
        })
    }

    async fn get(&self, url: &str) -> Result<reqwest::Response, HubError> {
        let mut req = self.client.get(url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let http = |message: String| HubError::Http {
            url: url.to_string(),
            message,
        };
        let resp = req.send().await.map_err(|e| http(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            let hint = match status.as_u16() {
                401 | 403 => " (set HF_TOKEN for a gated or private repo)",
                404 => " (check the repo id and revision)",
                _ => "",
            };
            return Err(http(format!("HTTP {status}{hint}")));
        }
        Ok(resp)
    }

    /// Resolves `revision` to a commit and lists the repo's files.
    pub async fn plan(&self, repo: &str, revision: &str) -> Result<RepoPlan, HubError> {
        validate_repo(repo)?;
        validate_revision(revision)?;
        let url = format!("{}/api/models/{repo}/revision/{revision}", self.endpoint);
        let resp = self.get(&url).await?;
        let info: RevisionInfo = resp.json().await.map_err(|e| HubError::Http {
            url: url.clone(),
            message: format!("not the expected JSON: {e}"),
        })?;
        let commit = info
            .sha
            .filter(|s| validate_revision(s).is_ok())
            .ok_or_else(|| HubError::Http {
                url: url.clone(),
                message: "the answer names no commit (`sha`)".into(),
            })?;
        let mut files = Vec::new();
        for s in info.siblings {
            if !is_safe_relative(&s.rfilename) {
                return Err(HubError::UnsafePath {
                    repo: repo.to_string(),
                    file: s.rfilename,
                });
            }
            files.push(s.rfilename);
        }
        if files.is_empty() {
            return Err(HubError::Http {
                url,
                message: "the repo lists no files".into(),
            });
        }
        Ok(RepoPlan {
            repo: repo.to_string(),
            revision: revision.to_string(),
            commit,
            files,
        })
    }

    /// Downloads one file of a plan into the snapshot (skipped when already there), reporting
    /// progress on `bar`. Returns the bytes written.
    pub async fn download(
        &self,
        cache: &Path,
        plan: &RepoPlan,
        file: &str,
        bar: &ProgressBar,
    ) -> Result<u64, HubError> {
        let snap = cache
            .join(repo_folder(&plan.repo))
            .join("snapshots")
            .join(&plan.commit);
        let dest = snap.join(file);
        if dest.is_file() {
            bar.finish_and_clear();
            return Ok(0);
        }
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(io(parent))?;
        }
        let url = format!(
            "{}/{}/resolve/{}/{}",
            self.endpoint, plan.repo, plan.commit, file
        );
        let mut resp = self.get(&url).await?;
        // Read before the body: reqwest's figure shrinks as chunks are taken.
        let expected = resp.content_length();
        if let Some(len) = expected {
            bar.set_length(len);
        }
        let part = dest.with_file_name(format!(
            "{}.part",
            dest.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let mut f = tokio::fs::File::create(&part).await.map_err(io(&part))?;
        let mut written = 0u64;
        loop {
            let chunk = resp.chunk().await.map_err(|e| HubError::Http {
                url: url.clone(),
                message: format!("the download broke off: {e}"),
            })?;
            let Some(chunk) = chunk else { break };
            f.write_all(&chunk).await.map_err(io(&part))?;
            written += chunk.len() as u64;
            bar.set_position(written);
        }
        f.flush().await.map_err(io(&part))?;
        drop(f);
        if let Some(len) = expected {
            if len != written {
                return Err(HubError::Http {
                    url,
                    message: format!("got {written} of {len} bytes"),
                });
            }
        }
        tokio::fs::rename(&part, &dest).await.map_err(io(&dest))?;
        bar.finish_and_clear();
        Ok(written)
    }
}

/// Marks a downloaded repo as installed: `refs/<revision>` names its commit. Written last.
pub fn write_ref(cache: &Path, plan: &RepoPlan) -> Result<(), HubError> {
    let refs = cache.join(repo_folder(&plan.repo)).join("refs");
    std::fs::create_dir_all(&refs).map_err(io(&refs))?;
    let path = refs.join(&plan.revision);
    std::fs::write(&path, &plan.commit).map_err(io(&path))
}

/// Records the MTP companion of a model.
pub fn write_companion(cache: &Path, repo: &str, companion: &str) -> Result<(), HubError> {
    let dir = cache.join(repo_folder(repo));
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let path = dir.join(COMPANION_FILE);
    std::fs::write(&path, companion).map_err(io(&path))
}
