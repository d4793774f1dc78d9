//! The Hugging Face cache, in one place: where it is (the environment, as `huggingface_hub`
//! reads it: [`CacheConfig`]), its layout, read and written as `huggingface_hub` does
//! ([`RepoFolder`], [`scan`], [`cached_repo`]), and resolving a "repo or path" argument against
//! it ([`resolve_model`]). So `snapshot_download(local_files_only=True)`, `scan_cache_dir()`,
//! transformers and mlx-lm find what `mtp` downloaded, and `mtp` finds what they did:
//!
//! ```text
//! $HF_HUB_CACHE/
//!   CACHEDIR.TAG
//!   .locks/models--org--name/<etag>.lock        per-blob lock (flock, as `filelock` takes it)
//!   models--org--name/
//!     blobs/<etag>                               the bytes, named by ETag (sha256 for LFS files)
//!     blobs/<etag>.incomplete                    a download under way (resumed with `Range`)
//!     snapshots/<commit>/<path> -> ../../blobs/<etag>   relative symlinks
//!     refs/<revision>                            the commit a branch or tag pointed to
//! ```
//!
//! It sits below the Hub client (which downloads into it) and the probe (which reads from it).
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{DetectError, HubError};
use crate::repo::{validate_revision, RepoId};

/// `~` and `~/…` expanded with `HOME`, as `os.path.expanduser` does.
pub(crate) fn expand_home(p: &str, get: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let home = || get("HOME").filter(|h| !h.is_empty());
    if p == "~" {
        if let Some(h) = home() {
            return PathBuf::from(h);
        }
    }
    if let Some(rest) = p.strip_prefix("~/") {
        if let Some(h) = home() {
            return Path::new(&h).join(rest);
        }
    }
    PathBuf::from(p)
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home(get: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let nonempty = |k: &str| get(k).filter(|v| !v.is_empty());
    if let Some(h) = nonempty("HF_HOME") {
        return expand_home(&h, get);
    }
    let base = match nonempty("XDG_CACHE_HOME") {
        Some(x) => expand_home(&x, get),
        None => expand_home("~/.cache", get),
    };
    base.join("huggingface")
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
            return CacheConfig::new(expand_home(&c, &get));
        }
        CacheConfig::new(hf_home(&get).join("hub"))
    }

    /// The snapshot directory of `repo` at `revision` (a branch name in `refs/`, or a commit),
    /// if it is in the cache.
    pub fn snapshot(&self, repo: &RepoId, revision: &str) -> Option<(PathBuf, String)> {
        RepoFolder::new(&self.hub_cache, repo)
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

/// The content of `CACHEDIR.TAG` (the Cache Directory Tagging Standard's signature line, then
/// the same comment `huggingface_hub` writes).
pub const CACHEDIR_TAG: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by huggingface_hub.\n\
# For information about cache directory tags, see:\n\
#\thttps://bford.info/cachedir/\n";

/// One repository's folder in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFolder {
    /// The cache root (`HF_HUB_CACHE`).
    pub cache: PathBuf,
    /// The repository.
    pub repo: RepoId,
}

impl RepoFolder {
    /// `repo`'s folder under `cache`.
    pub fn new(cache: &Path, repo: &RepoId) -> Self {
        RepoFolder {
            cache: cache.to_path_buf(),
            repo: repo.clone(),
        }
    }

    /// `models--org--name`.
    pub fn root(&self) -> PathBuf {
        self.cache.join(self.repo.cache_folder())
    }

    /// `blobs/<etag>`.
    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root().join("blobs").join(etag)
    }

    /// `blobs/<etag>.incomplete`: where a download of that blob goes until it is verified.
    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.root().join("blobs").join(format!("{etag}.incomplete"))
    }

    /// `snapshots/<commit>`.
    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.root().join("snapshots").join(commit)
    }

    /// `snapshots/<commit>/<file>` (`file` must be a safe relative path).
    pub fn pointer(&self, commit: &str, file: &str) -> PathBuf {
        let mut p = self.snapshot(commit);
        for part in file.split('/') {
            p.push(part);
        }
        p
    }

    /// `.locks/models--org--name/<etag>.lock`, the lock `huggingface_hub` takes for that blob.
    pub fn lock(&self, etag: &str) -> PathBuf {
        self.cache
            .join(".locks")
            .join(self.repo.cache_folder())
            .join(format!("{etag}.lock"))
    }

    /// The commit `refs/<revision>` names, when the ref exists and holds a commit.
    pub fn read_ref(&self, revision: &str) -> Option<String> {
        validate_revision(revision).ok()?;
        let s = std::fs::read_to_string(self.root().join("refs").join(revision)).ok()?;
        let c = s.trim();
        (validate_revision(c).is_ok()).then(|| c.to_string())
    }

    /// Records that `revision` is `commit` (nothing when they are equal, as `huggingface_hub`
    /// does), atomically: a temporary file renamed over the ref.
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit || self.read_ref(revision).as_deref() == Some(commit) {
            return Ok(());
        }
        let refs = self.root().join("refs");
        std::fs::create_dir_all(&refs).map_err(HubError::io(&refs))?;
        let path = refs.join(revision);
        let tmp = refs.join(format!(".{revision}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, commit).map_err(HubError::io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(HubError::io(&path))
    }

    /// The snapshot `revision` names: through `refs/`, or the commit itself.
    pub fn resolve(&self, revision: &str) -> Option<(String, PathBuf)> {
        validate_revision(revision).ok()?;
        let commit = self
            .read_ref(revision)
            .unwrap_or_else(|| revision.to_string());
        let dir = self.snapshot(&commit);
        dir.is_dir().then_some((commit, dir))
    }

    /// Points `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative symlink
    /// (replacing what was there).
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf, HubError> {
        let pointer = self.pointer(commit, file);
        let parent = pointer.parent().unwrap_or(&pointer).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(HubError::io(&parent))?;
        // snapshots/<commit>/a/b/file -> ../../../blobs/<etag>: one `..` per folder below root.
        let depth = 2 + file.matches('/').count();
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        match std::fs::symlink_metadata(&pointer) {
            Ok(_) => std::fs::remove_file(&pointer).map_err(HubError::io(&pointer))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(HubError::io(&pointer)(e)),
        }
        symlink(&target, &pointer).map_err(HubError::io(&pointer))?;
        Ok(pointer)
    }

    /// Blobs with a download under way or broken off (`*.incomplete`).
    pub fn incomplete_blobs(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(self.root().join("blobs")) else {
            return Vec::new();
        };
        let mut v: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "incomplete"))
            .collect();
        v.sort();
        v
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    // Where symlinks are not allowed (Windows without developer mode), `huggingface_hub`
    // copies the blob into the snapshot; so does this.
    let blob = link.parent().unwrap_or(link).join(target);
    std::fs::copy(blob, link).map(|_| ())
}

/// Writes `CACHEDIR.TAG` into the cache root if it has none (as `huggingface_hub` does).
pub fn tag_cache(cache: &Path) {
    let tag = cache.join("CACHEDIR.TAG");
    if !tag.exists() {
        if let Err(e) = std::fs::write(&tag, CACHEDIR_TAG) {
            tracing::debug!(path = %tag.display(), error = %e, "could not write CACHEDIR.TAG");
        }
    }
}

/// A repository as the cache holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedRepo {
    /// The repository.
    pub repo: RepoId,
    /// Every ref and the commit it names.
    pub refs: BTreeMap<String, String>,
    /// The snapshot to use: `refs/main`'s, else the only snapshot there is.
    pub snapshot: Option<PathBuf>,
    /// The commit of [`CachedRepo::snapshot`].
    pub commit: Option<String>,
    /// Files of that snapshot whose blob is missing (a broken symlink).
    pub missing: Vec<String>,
    /// Downloads of this repo that broke off (`blobs/*.incomplete`).
    pub incomplete: usize,
}

impl CachedRepo {
    /// Whether the snapshot is there with every blob it links, and no download is pending.
    pub fn is_complete(&self) -> bool {
        self.snapshot.is_some() && self.missing.is_empty() && self.incomplete == 0
    }
}

/// Every file under a snapshot folder, as sorted `/`-separated relative paths, each with
/// whether it leads to its bytes (a snapshot's files are symlinks into `blobs/`; `false` is a
/// broken one). Folders are followed 16 deep at most.
pub(crate) fn snapshot_files(dir: &Path) -> Vec<(String, bool)> {
    fn walk(dir: &Path, rel: &str, depth: usize, out: &mut Vec<(String, bool)>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let relname = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let p = e.path();
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() && depth < 16 => walk(&p, &relname, depth + 1, out),
                Ok(_) => out.push((relname, true)),
                Err(_) => out.push((relname, false)),
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", 0, &mut out);
    out.sort();
    out
}

/// What the cache holds of `repo`; `None` when it has no folder for it.
pub fn cached_repo(cache: &Path, repo: &RepoId) -> Option<CachedRepo> {
    let folder = RepoFolder::new(cache, repo);
    let root = folder.root();
    if !root.is_dir() {
        return None;
    }
    let mut refs = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(root.join("refs")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(c) = folder.read_ref(&name) {
                refs.insert(name, c);
            }
        }
    }
    let snapshots: Vec<String> = std::fs::read_dir(root.join("snapshots"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|c| validate_revision(c).is_ok())
                .collect()
        })
        .unwrap_or_default();
    let commit = match refs.get("main") {
        Some(c) if snapshots.contains(c) => Some(c.clone()),
        Some(_) => None,
        None if snapshots.len() == 1 => Some(snapshots[0].clone()),
        None => None,
    };
    let snapshot = commit.as_ref().map(|c| folder.snapshot(c));
    let missing = snapshot
        .as_deref()
        .map(snapshot_files)
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(f, _)| f)
        .collect();
    Some(CachedRepo {
        repo: repo.clone(),
        refs,
        snapshot,
        commit,
        missing,
        incomplete: folder.incomplete_blobs().len(),
    })
}

/// Every model repository in the cache (`models--*`), sorted by id. Folders whose name is
/// not a valid id are skipped.
pub fn scan(cache: &Path) -> Result<Vec<CachedRepo>, HubError> {
    let rd = match std::fs::read_dir(cache) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HubError::io(cache)(e)),
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("models--") else {
            continue;
        };
        let Ok(repo) = RepoId::parse(&rest.replacen("--", "/", 1)) else {
            continue;
        };
        if let Some(r) = cached_repo(cache, &repo) {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.repo.cmp(&b.repo));
    Ok(out)
}
