//! Repository ids, the Hugging Face cache layout, and resolving "repo or path" to an artifact.
//!
//! ```
//! use mtp_detect::{resolve_model, CacheConfig, ResolvedArtifact};
//! let dir = tempfile::tempdir().unwrap();
//! let cache = CacheConfig::new(dir.path());
//! // Not a path on disk and not cached: the Hub is the only place left.
//! let r = resolve_model("mlx-community/Qwen3.8-27B-MTP-4bit", &cache).unwrap();
//! assert!(matches!(r, ResolvedArtifact::Remote { .. }));
//! // `..` never reaches the filesystem.
//! assert!(resolve_model("org/../../etc", &cache).is_err());
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

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

/// Where the Hugging Face cache lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// The hub cache directory (holding `models--org--name/`).
    pub hub_cache: PathBuf,
}

impl CacheConfig {
    /// A cache rooted at `hub_cache`.
    pub fn new(hub_cache: impl Into<PathBuf>) -> Self {
        CacheConfig {
            hub_cache: hub_cache.into(),
        }
    }

    /// The cache `huggingface_hub` uses: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else
    /// `$HF_HOME/hub`, where `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`, else
    /// `~/.cache/huggingface`.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The same rule over any variable lookup (testable without touching the environment).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let nonempty = |k: &str| get(k).filter(|v| !v.is_empty());
        if let Some(c) = nonempty("HF_HUB_CACHE").or_else(|| nonempty("HUGGINGFACE_HUB_CACHE")) {
            return CacheConfig::new(crate::hub::expand_home(&c, &get));
        }
        CacheConfig::new(crate::hub::hf_home(&get).join("hub"))
    }

    /// The snapshot directory of `repo` at `revision` (a branch name in `refs/`, or a commit),
    /// if it is in the cache.
    pub fn snapshot(&self, repo: &RepoId, revision: &str) -> Option<(PathBuf, String)> {
        crate::hub::cache::RepoFolder::new(&self.hub_cache, repo)
            .resolve(revision)
            .map(|(commit, dir)| (dir, commit))
    }

    /// Whether `repo` has a `main` snapshot in the cache.
    pub fn is_cached(&self, repo: &RepoId) -> bool {
        self.snapshot(repo, "main").is_some()
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self::from_env()
    }
}

/// Where a "repo or path" argument points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedArtifact {
    /// A file or directory on disk that the caller named.
    Local {
        /// The path.
        path: PathBuf,
        /// The repository, when the path lies inside the Hugging Face cache.
        repo: Option<RepoId>,
    },
    /// A snapshot in the Hugging Face cache.
    Cached {
        /// The repository.
        repo: RepoId,
        /// The commit of the snapshot.
        revision: String,
        /// The snapshot directory.
        snapshot: PathBuf,
    },
    /// Not on disk: only the Hub has it.
    Remote {
        /// The repository.
        repo: RepoId,
        /// The revision to read.
        revision: String,
    },
}

impl ResolvedArtifact {
    /// The repository id, when known.
    pub fn repo(&self) -> Option<&RepoId> {
        match self {
            ResolvedArtifact::Local { repo, .. } => repo.as_ref(),
            ResolvedArtifact::Cached { repo, .. } | ResolvedArtifact::Remote { repo, .. } => {
                Some(repo)
            }
        }
    }

    /// The local path, when there is one.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            ResolvedArtifact::Local { path, .. } => Some(path),
            ResolvedArtifact::Cached { snapshot, .. } => Some(snapshot),
            ResolvedArtifact::Remote { .. } => None,
        }
    }
}

/// Whether the argument is written as a path rather than a repository id.
fn looks_like_path(s: &str) -> bool {
    s.starts_with('/')
        || s.starts_with("./")
        || s.starts_with("../")
        || s.starts_with('~')
        || s == "."
        || s == ".."
        || s.contains('\\')
        || s.ends_with(".gguf")
        || s.ends_with(".safetensors")
}

/// The repository a path inside the cache belongs to (`…/models--org--name/snapshots/<rev>/…`).
pub fn repo_from_cache_path(path: &Path) -> Option<RepoId> {
    let comps: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let i = comps.iter().rposition(|c| c == "snapshots")?;
    let folder = comps.get(i.checked_sub(1)?)?.strip_prefix("models--")?;
    RepoId::parse(&folder.replace("--", "/")).ok()
}

/// Resolves `spec` (a path, `org/name` or `org/name@revision`) to an artifact: an existing
/// path wins; then a cache snapshot; then the Hub. Repository ids are validated first, so
/// nothing like `../` reaches the filesystem through the cache.
pub fn resolve_model(spec: &str, cache: &CacheConfig) -> Result<ResolvedArtifact, DetectError> {
    let p = Path::new(spec);
    if looks_like_path(spec) || p.exists() {
        let expanded = match spec.strip_prefix("~/") {
            Some(rest) => match std::env::var_os("HOME") {
                Some(h) => Path::new(&h).join(rest),
                None => p.to_path_buf(),
            },
            None => p.to_path_buf(),
        };
        if !expanded.exists() {
            return Err(DetectError::NotFound {
                path: spec.to_string(),
            });
        }
        let repo = repo_from_cache_path(&expanded);
        return Ok(ResolvedArtifact::Local {
            path: expanded,
            repo,
        });
    }
    let (id, revision) = match spec.split_once('@') {
        Some((id, rev)) => {
            validate_revision(rev)?;
            (id, rev.to_string())
        }
        None => (spec, "main".to_string()),
    };
    let repo = RepoId::parse(id)?;
    if let Some((snapshot, commit)) = cache.snapshot(&repo, &revision) {
        return Ok(ResolvedArtifact::Cached {
            repo,
            revision: commit,
            snapshot,
        });
    }
    Ok(ResolvedArtifact::Remote { repo, revision })
}
