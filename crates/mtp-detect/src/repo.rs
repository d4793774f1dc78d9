//! Hub repository ids and revisions, validated before they name anything on disk or in a URL.
//!
//! ```
//! use mtp_detect::RepoId;
//! assert_eq!(RepoId::parse("org/name").unwrap().cache_folder(), "models--org--name");
//! // `..` never reaches the filesystem.
//! assert!(RepoId::parse("org/../../etc").is_err());
//! ```

use std::fmt;

use serde::Serialize;

use crate::error::DetectError;

/// The longest repository id accepted.
pub const MAX_REPO_ID_LEN: usize = 96;

/// A validated Hub repository id: `name` or `org/name`, ASCII letters, digits, `-`, `_`, `.`,
/// never `..`, never starting or ending with `.` or `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct RepoId(String);

impl RepoId {
    /// Validates `id`.
    pub fn parse(id: &str) -> Result<RepoId, DetectError> {
        let err = |why: &str| DetectError::InvalidRepoId {
            id: id.chars().take(200).collect(),
            why: why.to_string(),
        };
        if id.is_empty() {
            return Err(err("it is empty"));
        }
        if id.len() > MAX_REPO_ID_LEN {
            return Err(err("it is longer than 96 characters"));
        }
        let parts: Vec<&str> = id.split('/').collect();
        if parts.len() > 2 {
            return Err(err("it has more than one `/`; use `org/name`"));
        }
        for p in &parts {
            if p.is_empty() {
                return Err(err("it has an empty part"));
            }
            if p.contains("..") {
                return Err(err("it contains `..`"));
            }
            if !p
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            {
                return Err(err(
                    "only ASCII letters, digits, `-`, `_` and `.` are allowed",
                ));
            }
            if p.starts_with(['.', '-']) || p.ends_with(['.', '-']) {
                return Err(err("a part may not start or end with `.` or `-`"));
            }
        }
        Ok(RepoId(id.to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cache folder name: `models--org--name`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.0.replace('/', "--"))
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Validates a revision (branch, tag or commit): ASCII letters, digits, `-`, `_`, `.`,
/// at most 128 characters, never `..`.
pub fn validate_revision(rev: &str) -> Result<(), DetectError> {
    let ok = !rev.is_empty()
        && rev.len() <= 128
        && !rev.contains("..")
        && rev
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(DetectError::InvalidRepoId {
            id: rev.chars().take(200).collect(),
            why: "a revision may hold only ASCII letters, digits, `-`, `_` and `.`".into(),
        })
    }
}
