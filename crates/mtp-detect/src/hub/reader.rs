//! The probe's [`Reader`] over the Hub: the file listing (every page), small JSON files, and
//! `Range` prefixes of weights files. Never whole weights.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::DetectError;
use crate::hub::client::{transport_message, Subject};
use crate::hub::{HubClient, HubConfig, HubError};
use crate::names::is_safe_relative;
use crate::repo::RepoId;
use crate::source::{FileEntry, Reader};

/// A Hub repository read over HTTP, on its own single-threaded runtime so that synchronous
/// callers (the engine, the CLI) can use it.
pub struct HubReader {
    client: HubClient,
    repo: RepoId,
    revision: String,
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
            .field("client", &self.client)
            .field("repo", &self.repo)
            .field("revision", &self.revision)
            .finish()
    }
}

impl HubReader {
    /// A reader for `repo` at `revision`.
    pub fn new(cfg: HubConfig, repo: RepoId, revision: &str) -> Result<Self, DetectError> {
        crate::hub::check_revision(revision)?;
        let endpoint = cfg.endpoint.clone();
        let client = HubClient::new(cfg)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| HubError::Http {
                url: endpoint,
                status: None,
                message: format!("cannot start the I/O runtime: {e}"),
            })?;
        Ok(HubReader {
            client,
            repo,
            revision: revision.to_string(),
            rt: Some(rt),
            bytes: AtomicU64::new(0),
        })
    }

    /// Runs a future to completion, on a fresh thread when called from inside a runtime.
    fn block<T: Send>(
        &self,
        fut: impl std::future::Future<Output = Result<T, HubError>> + Send,
    ) -> Result<T, DetectError> {
        let Some(rt) = &self.rt else {
            return Err(HubError::Http {
                url: self.client.config().endpoint.clone(),
                status: None,
                message: "the I/O runtime is gone".into(),
            }
            .into());
        };
        let r = if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| rt.block_on(fut))
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        } else {
            rt.block_on(fut)
        };
        r.map_err(DetectError::from)
    }

    fn subject<'a>(&'a self, file: &'a str) -> Subject<'a> {
        Subject {
            repo: self.repo.as_str(),
            revision: Some(&self.revision),
            file: Some(file),
        }
    }

    /// GET with an optional range: status, headers and at most `cap` body bytes (the rest is
    /// not read: a probe never pulls whole weights).
    async fn get(
        &self,
        file: &str,
        range: Option<(u64, u64)>,
        cap: u64,
    ) -> Result<(u16, reqwest::header::HeaderMap, Vec<u8>), HubError> {
        let url = self.client.file_url(&self.repo, &self.revision, file);
        let mut resp = self
            .client
            .get_bytes(&url, range.map(|(a, b)| (a, Some(b))), self.subject(file))
            .await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| HubError::Http {
            url: url.clone(),
            status: Some(status),
            message: transport_message(&e),
        })? {
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
        let files = self.block(self.client.tree_counted(
            &self.repo,
            &self.revision,
            Some(&self.bytes),
        ))?;
        Ok(files
            .into_iter()
            .map(|f| FileEntry {
                path: f.path,
                size: Some(f.size),
            })
            .collect())
    }

    fn read_small(&self, file: &str, cap: u64) -> Result<Option<Vec<u8>>, DetectError> {
        if !is_safe_relative(file) {
            return Ok(None);
        }
        let (_, headers, body) = match self.block(self.get(file, None, cap + 1)) {
            Err(DetectError::Hub(HubError::EntryNotFound { .. })) => return Ok(None),
            r => r?,
        };
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
        let end = start.saturating_add(len - 1);
        let (status, headers, body) = self.block(self.get(file, Some((start, end)), len))?;
        let url = self.client.file_url(&self.repo, &self.revision, file);
        let http = |status, message: String| {
            DetectError::from(HubError::Http {
                url: url.clone(),
                status: Some(status),
                message,
            })
        };
        match status {
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
