//! Where artifact bytes come from: a local directory (or single file) or the Hub. The probe
//! reads through [`Reader`], which counts every byte it hands out.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::DetectError;
use crate::names::is_safe_relative;

/// One file of an artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Path relative to the artifact root, `/`-separated.
    pub path: String,
    /// Size in bytes, when known.
    pub size: Option<u64>,
}

/// Reads an artifact's files. Implemented for local directories and for the Hub.
pub trait Reader {
    /// A name for the whole artifact (path or `repo@rev`), used in messages.
    fn place(&self) -> String;
    /// A name for one file (full path, or `repo:file`), used in messages.
    fn describe(&self, file: &str) -> String;
    /// The files of the artifact.
    fn list(&self) -> Result<Vec<FileEntry>, DetectError>;
    /// A whole small file, or `None` when it does not exist; larger than `cap` is an error.
    fn read_small(&self, file: &str, cap: u64) -> Result<Option<Vec<u8>>, DetectError>;
    /// Up to `len` bytes at `start`, and the file's total length.
    fn read_range(&self, file: &str, start: u64, len: u64) -> Result<(Vec<u8>, u64), DetectError>;
    /// Bytes handed out so far.
    fn bytes_read(&self) -> u64;
    /// Whether the bytes come over the network.
    fn is_remote(&self) -> bool {
        false
    }
}

/// A directory on disk, or one file in it.
#[derive(Debug)]
pub struct LocalReader {
    root: PathBuf,
    only: Option<String>,
    bytes: AtomicU64,
}

/// How deep a local listing descends (GGUF repos keep quantizations in sub-folders).
const LIST_DEPTH: usize = 2;
/// The most files a local listing returns.
const LIST_MAX: usize = 10_000;

impl LocalReader {
    /// Reads `path`: a directory, or a single weights file.
    pub fn new(path: &Path) -> Result<Self, DetectError> {
        let meta = std::fs::metadata(path).map_err(|_| DetectError::NotFound {
            path: path.display().to_string(),
        })?;
        if meta.is_dir() {
            Ok(LocalReader {
                root: path.to_path_buf(),
                only: None,
                bytes: AtomicU64::new(0),
            })
        } else {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| DetectError::NotFound {
                    path: path.display().to_string(),
                })?;
            let root = path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."));
            Ok(LocalReader {
                root,
                only: Some(name),
                bytes: AtomicU64::new(0),
            })
        }
    }

    fn path_of(&self, file: &str) -> Result<PathBuf, DetectError> {
        if !is_safe_relative(file) {
            return Err(DetectError::NotFound {
                path: file.to_string(),
            });
        }
        Ok(self.root.join(file))
    }

    fn walk(&self, dir: &Path, rel: &str, depth: usize, out: &mut Vec<FileEntry>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if out.len() >= LIST_MAX {
                return;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let relname = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            // metadata() follows symlinks: cache snapshots link into blobs/.
            let Ok(meta) = std::fs::metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                if depth < LIST_DEPTH {
                    self.walk(&e.path(), &relname, depth + 1, out);
                }
            } else {
                out.push(FileEntry {
                    path: relname,
                    size: Some(meta.len()),
                });
            }
        }
    }
}

impl Reader for LocalReader {
    fn place(&self) -> String {
        match &self.only {
            Some(f) => self.root.join(f).display().to_string(),
            None => self.root.display().to_string(),
        }
    }

    fn describe(&self, file: &str) -> String {
        self.root.join(file).display().to_string()
    }

    fn list(&self) -> Result<Vec<FileEntry>, DetectError> {
        if let Some(f) = &self.only {
            let meta = std::fs::metadata(self.root.join(f))
                .map_err(|e| DetectError::io(self.describe(f), e))?;
            let mut out = vec![FileEntry {
                path: f.clone(),
                size: Some(meta.len()),
            }];
            // The first shard of a split GGUF brings its siblings along.
            if let Some((stem, 1, count)) = crate::gguf::split_parts(f) {
                for i in 2..=count.min(256) {
                    let name = format!("{stem}-{i:05}-of-{count:05}.gguf");
                    if let Ok(m) = std::fs::metadata(self.root.join(&name)) {
                        out.push(FileEntry {
                            path: name,
                            size: Some(m.len()),
                        });
                    }
                }
            }
            return Ok(out);
        }
        let mut out = Vec::new();
        self.walk(&self.root, "", 0, &mut out);
        Ok(out)
    }

    fn read_small(&self, file: &str, cap: u64) -> Result<Option<Vec<u8>>, DetectError> {
        if self.only.as_deref().is_some_and(|o| o != file) {
            return Ok(None);
        }
        let path = self.path_of(file)?;
        let f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(DetectError::io(self.describe(file), e)),
        };
        let len = f
            .metadata()
            .map_err(|e| DetectError::io(self.describe(file), e))?
            .len();
        if len > cap {
            return Err(DetectError::TooLarge {
                file: self.describe(file),
                size: len,
                limit: cap,
            });
        }
        let mut buf = Vec::with_capacity(len as usize);
        f.take(cap)
            .read_to_end(&mut buf)
            .map_err(|e| DetectError::io(self.describe(file), e))?;
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(Some(buf))
    }

    fn read_range(&self, file: &str, start: u64, len: u64) -> Result<(Vec<u8>, u64), DetectError> {
        let path = self.path_of(file)?;
        let mut f =
            std::fs::File::open(&path).map_err(|e| DetectError::io(self.describe(file), e))?;
        let total = f
            .metadata()
            .map_err(|e| DetectError::io(self.describe(file), e))?
            .len();
        let avail = total.saturating_sub(start).min(len);
        f.seek(SeekFrom::Start(start))
            .map_err(|e| DetectError::io(self.describe(file), e))?;
        let mut buf = Vec::with_capacity(avail as usize);
        f.take(avail)
            .read_to_end(&mut buf)
            .map_err(|e| DetectError::io(self.describe(file), e))?;
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok((buf, total))
    }

    fn bytes_read(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}
