//! The Hugging Face cache layout, read and written as `huggingface_hub` does, so that
//! `snapshot_download(local_files_only=True)`, `scan_cache_dir()`, transformers and mlx-lm
//! find what `mtp` downloaded, and `mtp` finds what they did:
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::hub::HubError;
use crate::repo::{validate_revision, RepoId};

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
