//! The prefix cache's disk tier (`prompt_cache_dir`, `mtp serve --cache-dir`): checkpoints
//! that outlive the process, within a byte budget.
//!
//! Each model keeps its states in a folder of its own under the cache directory, named by the
//! engine's state identity (weights, drafter, precision, state format), so a state is only
//! ever read by the model that computed it; the folder is locked while a process uses it.
//! Every checkpoint the memory cache keeps is also written here (write-through, on a thread of
//! its own so no request waits for the disk); a lookup that finds nothing as long in memory
//! reads the longest one here.
//!
//! A file is written as `NAME.tmp`, synced, then renamed to `NAME.state` (and the folder
//! synced), so a `.state` file is complete unless the disk itself lied. It ends with the
//! SHA-256 of everything before it, checked on every read: a torn or corrupt file (a process
//! killed mid-write, a full disk, a bad sector) is removed and never loaded. Leftover `.tmp`
//! files (a writer killed before its rename) are removed when the folder is opened.
//!
//! The layout: `MTPCACHE`, format version (u32), the identity (64 ASCII hex digits), the key
//! (u32 length + UTF-8), the tokens (u64 count + u32 each), the state (u64 length + bytes,
//! the backend's own encoding), the SHA-256 (32 bytes). Little-endian throughout.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::prefix_cache::CacheState;

/// The disk budget when a cache directory is given without one: 4 GiB.
pub const DEFAULT_DISK_BUDGET_BYTES: u64 = 4 << 30;

const MAGIC: &[u8; 8] = b"MTPCACHE";
const VERSION: u32 = 1;
const STATE_EXT: &str = "state";
const TEMP_EXT: &str = "tmp";
const LOCK_FILE: &str = "lock";

/// Creates `dir` (and its missing parents) readable by the user alone; with `always`, makes it
/// so when it exists too (the model's own folder; the root, the user's, is left as found).
fn private_dir(dir: &Path, always: bool) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let existed = dir.is_dir();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        if !existed || always {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = always;
        std::fs::create_dir_all(dir)
    }
}

/// Files created readable and writable by the user alone.
fn private(options: &mut std::fs::OpenOptions) -> &mut std::fs::OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
}
/// The longest key a file may name (the contract caps `prompt_cache_key` far below).
const MAX_KEY_BYTES: usize = 64 * 1024;
/// Checkpoints waiting for the writer; beyond that a checkpoint is not persisted (the request
/// never waits for the disk).
const WRITE_QUEUE: usize = 16;

/// Why the cache directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskCacheError {
    /// The folder cannot be created, listed or locked.
    #[error("prefix cache directory {path}: {source}")]
    Io {
        /// The path at fault.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Another process holds the folder.
    #[error(
        "prefix cache directory {path} is in use by another process (one process per cache \
         directory and model); give this one another --cache-dir"
    )]
    Locked {
        /// The model's folder.
        path: PathBuf,
    },
}

/// Why one file was not loaded.
#[derive(Debug, thiserror::Error)]
enum FileError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Bad(String),
}

fn bad(m: impl Into<String>) -> FileError {
    FileError::Bad(m.into())
}

/// A checkpoint on disk.
#[derive(Debug, Clone)]
struct Entry {
    key: String,
    tokens: Vec<u32>,
    path: PathBuf,
    bytes: u64,
    last_used: u64,
}

#[derive(Default)]
struct Index {
    entries: Vec<Entry>,
    used: u64,
    tick: u64,
}

/// What the request threads and the writer share.
struct Shared {
    dir: PathBuf,
    identity: String,
    budget: u64,
    per_key: usize,
    index: Mutex<Index>,
}

/// What the writer thread does, in order.
enum Job<S> {
    /// Write a checkpoint.
    Write {
        key: String,
        tokens: Vec<u32>,
        state: Arc<S>,
    },
    /// Mark a checkpoint as just used (after the writes queued before it).
    Touch(PathBuf),
    /// Remove every checkpoint (after the writes queued before it).
    Clear,
}

/// The disk tier of one model's prefix cache.
pub struct DiskCache<S: CacheState + 'static> {
    shared: Arc<Shared>,
    tx: Option<SyncSender<Job<S>>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Held (locked) while this cache is open.
    _lock: File,
}

impl<S: CacheState + 'static> std::fmt::Debug for DiskCache<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("dir", &self.shared.dir)
            .field("budget", &self.shared.budget)
            .finish_non_exhaustive()
    }
}

impl<S: CacheState + 'static> DiskCache<S> {
    /// Opens (creating it) the folder of the model with `identity` under `root`, removes what
    /// a killed writer left and any file that is not a complete checkpoint of this identity,
    /// and keeps at most `budget` bytes and `per_key` checkpoints per key from now on.
    pub fn open(
        root: &Path,
        identity: &str,
        budget: u64,
        per_key: usize,
    ) -> Result<Self, DiskCacheError> {
        if identity.len() != 64 || !identity.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(DiskCacheError::Io {
                path: root.to_path_buf(),
                source: std::io::Error::other("the model's state identity is not a SHA-256"),
            });
        }
        let dir = root.join(&identity[..32]);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DiskCacheError::Io { path, source }
        };
        // the checkpoints hold conversations' token ids: the folders made here are the
        // user's alone (0700), and so are the files (0600)
        private_dir(root, false).map_err(io(root))?;
        private_dir(&dir, true).map_err(io(&dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let mut options = File::options();
        options.create(true).truncate(false).write(true);
        let lock = private(&mut options)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        // A process that is exiting (or a child between its fork and its exec, which holds a
        // copy of the descriptor) may hold the lock a moment longer: wait up to a second.
        let waited = std::time::Instant::now();
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock)
                    if waited.elapsed() < std::time::Duration::from_secs(1) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(DiskCacheError::Locked { path: dir })
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(&lock_path)(e)),
            }
        }
        let mut found = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let path = e.map_err(io(&dir))?.path();
            match path.extension().and_then(|x| x.to_str()) {
                Some(TEMP_EXT) => {
                    tracing::info!(file = %path.display(), "removing a checkpoint whose write never finished");
                    let _ = std::fs::remove_file(&path);
                }
                Some(STATE_EXT) => match read_header(&path, identity).and_then(|h| {
                    // (a file under another name than its contents' is a copy, not ours)
                    let named = path.file_name().and_then(|n| n.to_str());
                    if named == Some(file_name(&h.0, &h.1).as_str()) {
                        Ok(h)
                    } else {
                        Err(bad("its name is not the one its key and tokens give"))
                    }
                }) {
                    Ok((key, tokens, bytes)) => {
                        let mtime = std::fs::metadata(&path)
                            .and_then(|m| m.modified())
                            .unwrap_or(std::time::UNIX_EPOCH);
                        found.push((mtime, key, tokens, path, bytes));
                    }
                    Err(why) => {
                        tracing::warn!(file = %path.display(), %why, "removing a prefix-cache file that is not a complete checkpoint");
                        let _ = std::fs::remove_file(&path);
                    }
                },
                _ => {}
            }
        }
        // the oldest files are the least recently used
        found.sort_by_key(|f| f.0);
        let mut index = Index::default();
        for (_, key, tokens, path, bytes) in found {
            index.tick += 1;
            index.used += bytes;
            index.entries.push(Entry {
                key,
                tokens,
                path,
                bytes,
                last_used: index.tick,
            });
        }
        let shared = Arc::new(Shared {
            dir,
            identity: identity.to_string(),
            budget,
            per_key: per_key.max(1),
            index: Mutex::new(index),
        });
        shared.evict(None);
        let (tx, rx) = sync_channel::<Job<S>>(WRITE_QUEUE);
        let w = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("mtp-cache-writer".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    match job {
                        Job::Write { key, tokens, state } => w.write(key, tokens, &*state),
                        Job::Touch(path) => w.touch(&path),
                        Job::Clear => w.clear(),
                    }
                }
            })
            .map_err(io(&shared.dir))?;
        Ok(DiskCache {
            shared,
            tx: Some(tx),
            writer: Some(writer),
            _lock: lock,
        })
    }

    /// The model's folder.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Bytes of the checkpoints on disk.
    pub fn used_bytes(&self) -> u64 {
        self.shared.lock().used
    }

    /// Checkpoints on disk.
    pub fn len(&self) -> usize {
        self.shared.lock().entries.len()
    }

    /// True when no checkpoint is on disk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `state` (the state after `tokens` under `key`) for writing; when the writer is
    /// behind, the checkpoint is not persisted (it stays in memory).
    pub fn store(&self, key: &str, tokens: Vec<u32>, state: Arc<S>) {
        let Some(tx) = &self.tx else { return };
        let job = Job::Write {
            key: key.to_string(),
            tokens,
            state,
        };
        if let Err(TrySendError::Full(_)) = tx.try_send(job) {
            tracing::debug!("the prefix-cache writer is behind; a checkpoint stays in memory only");
        }
    }

    /// The longest checkpoint under `key` that covers more than `longer_than` tokens and a
    /// strict prefix of `prompt`, read and checked: its token count and the backend's bytes.
    /// Files that fail the check are removed on the way.
    pub fn lookup(
        &self,
        key: &str,
        prompt: &[u32],
        longer_than: usize,
    ) -> Option<(usize, Vec<u8>)> {
        let mut candidates: Vec<Entry> = self
            .shared
            .lock()
            .entries
            .iter()
            .filter(|e| {
                e.key == key
                    && e.tokens.len() > longer_than
                    && e.tokens.len() < prompt.len()
                    && prompt.starts_with(&e.tokens)
            })
            .cloned()
            .collect();
        candidates.sort_by_key(|e| std::cmp::Reverse(e.tokens.len()));
        for e in candidates {
            match read_checked(&e.path, &self.shared.identity, key, &e.tokens) {
                Ok(payload) => {
                    let mut ix = self.shared.lock();
                    ix.tick += 1;
                    let tick = ix.tick;
                    if let Some(x) = ix.entries.iter_mut().find(|x| x.path == e.path) {
                        x.last_used = tick;
                    }
                    return Some((e.tokens.len(), payload));
                }
                Err(why) => {
                    tracing::warn!(file = %e.path.display(), %why, "removing a prefix-cache file that failed its check");
                    self.shared.remove(&e.path);
                }
            }
        }
        None
    }

    /// Marks the checkpoint of `key` after `tokens` as just used (it was resumed from memory),
    /// so the disk keeps what the memory keeps. It goes through the writer, after the
    /// checkpoints queued before it.
    pub fn touch(&self, key: &str, tokens: &[u32]) {
        let path = self.shared.dir.join(file_name(key, tokens));
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(Job::Touch(path));
        }
    }

    /// Removes the checkpoint of `key` after `tokens` (the backend could not use it).
    pub fn discard(&self, key: &str, tokens: &[u32]) {
        let path = self.shared.dir.join(file_name(key, tokens));
        self.shared.remove(&path);
    }

    /// Removes every checkpoint (of this model): those on disk now, and those still queued
    /// for the writer once it has written them.
    pub fn clear(&self) {
        self.shared.clear();
        if let Some(tx) = &self.tx {
            // (a blocking send: the writer is never held up for long, and a clear must happen)
            let _ = tx.send(Job::Clear);
        }
    }

    /// Waits until every queued checkpoint is written.
    pub fn flush(&mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl<S: CacheState + 'static> Drop for DiskCache<S> {
    fn drop(&mut self) {
        // the checkpoints already queued are written before the folder is unlocked
        self.flush();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn clear(&self) {
        let mut ix = self.lock();
        for e in ix.entries.drain(..) {
            let _ = std::fs::remove_file(&e.path);
        }
        ix.used = 0;
    }

    fn touch(&self, path: &Path) {
        let mut ix = self.lock();
        ix.tick += 1;
        let tick = ix.tick;
        if let Some(e) = ix.entries.iter_mut().find(|e| e.path == path) {
            e.last_used = tick;
        }
    }

    fn remove(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
        let mut ix = self.lock();
        if let Some(i) = ix.entries.iter().position(|e| e.path == path) {
            let e = ix.entries.remove(i);
            ix.used -= e.bytes;
        }
    }

    /// Writes one checkpoint (temp file, sync, rename, sync the folder), then keeps the index
    /// within its limits.
    fn write<S: CacheState>(&self, key: String, tokens: Vec<u32>, state: &S) {
        let Some(payload) = state.to_bytes() else {
            return;
        };
        let name = file_name(&key, &tokens);
        let path = self.dir.join(&name);
        let temp = path.with_extension(TEMP_EXT);
        let result = (|| -> std::io::Result<u64> {
            let mut options = File::options();
            options.write(true).create(true).truncate(true);
            let file = private(&mut options).open(&temp)?;
            let mut f = HashingWriter::new(BufWriter::new(file));
            f.write_all(MAGIC)?;
            f.write_all(&VERSION.to_le_bytes())?;
            f.write_all(self.identity.as_bytes())?;
            f.write_all(&(key.len() as u32).to_le_bytes())?;
            f.write_all(key.as_bytes())?;
            f.write_all(&(tokens.len() as u64).to_le_bytes())?;
            for t in &tokens {
                f.write_all(&t.to_le_bytes())?;
            }
            f.write_all(&(payload.len() as u64).to_le_bytes())?;
            f.write_all(&payload)?;
            let (mut inner, digest, written) = f.finish();
            inner.write_all(&digest)?;
            let file = inner.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            drop(file);
            std::fs::rename(&temp, &path)?;
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
            Ok(written + 32)
        })();
        let bytes = match result {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(file = %temp.display(), error = %e, "a prefix-cache checkpoint could not be written");
                let _ = std::fs::remove_file(&temp);
                return;
            }
        };
        {
            let mut ix = self.lock();
            if let Some(i) = ix.entries.iter().position(|e| e.path == path) {
                let old = ix.entries.remove(i);
                ix.used -= old.bytes;
            }
            ix.tick += 1;
            let tick = ix.tick;
            ix.used += bytes;
            ix.entries.push(Entry {
                key: key.clone(),
                tokens,
                path,
                bytes,
                last_used: tick,
            });
        }
        self.evict(Some(&key));
    }

    /// Removes the oldest checkpoints of `key` beyond the per-key count, then the least
    /// recently used ones while over budget.
    fn evict(&self, key: Option<&str>) {
        let mut victims = Vec::new();
        {
            let mut ix = self.lock();
            if let Some(k) = key {
                loop {
                    let of_key: Vec<usize> = (0..ix.entries.len())
                        .filter(|&i| ix.entries[i].key == k)
                        .collect();
                    if of_key.len() <= self.per_key {
                        break;
                    }
                    let oldest = of_key
                        .into_iter()
                        .min_by_key(|&i| ix.entries[i].last_used)
                        .expect("over the per-key count");
                    let e = ix.entries.remove(oldest);
                    ix.used -= e.bytes;
                    victims.push(e.path);
                }
            }
            while ix.used > self.budget && !ix.entries.is_empty() {
                let lru = (0..ix.entries.len())
                    .min_by_key(|&i| ix.entries[i].last_used)
                    .expect("not empty");
                let e = ix.entries.remove(lru);
                ix.used -= e.bytes;
                victims.push(e.path);
            }
        }
        for p in victims {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A file name for the checkpoint of `key` after `tokens`: 32 hex digits of their SHA-256.
fn file_name(key: &str, tokens: &[u32]) -> String {
    let mut h = Sha256::new();
    h.update((key.len() as u64).to_le_bytes());
    h.update(key.as_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let hex: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{hex}.{STATE_EXT}")
}

/// Counts and hashes what goes through it.
struct HashingWriter<W: Write> {
    inner: W,
    hash: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hash: Sha256::new(),
            written: 0,
        }
    }
    fn finish(self) -> (W, [u8; 32], u64) {
        (self.inner, self.hash.finalize().into(), self.written)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The header of a checkpoint file, checked against the file's length: its key, tokens and
/// length. Lengths are checked against the file before anything is allocated.
fn read_header(path: &Path, identity: &str) -> Result<(String, Vec<u32>, u64), FileError> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    check_header(&mut BufReader::new(f), len, identity)
}

/// [`read_header`] of a file of `len` bytes read from `r`.
fn check_header(
    r: &mut impl Read,
    len: u64,
    identity: &str,
) -> Result<(String, Vec<u32>, u64), FileError> {
    let (key, tokens, payload, header) = parse_header(r, len, identity)?;
    if header + payload + 32 != len {
        return Err(bad(format!(
            "{len} bytes where its header says {} (torn write?)",
            header + payload + 32
        )));
    }
    Ok((key, tokens, len))
}

/// Reads the header from `r` (a file of `len` bytes): key, tokens, the state's length and the
/// header's own length.
fn parse_header(
    r: &mut impl Read,
    len: u64,
    identity: &str,
) -> Result<(String, Vec<u32>, u64, u64), FileError> {
    let mut at = 0u64;
    let mut take = |n: usize, r: &mut dyn Read| -> Result<Vec<u8>, FileError> {
        if at + n as u64 > len {
            return Err(bad(format!("ends inside its header at byte {len}")));
        }
        let mut b = vec![0; n];
        r.read_exact(&mut b)?;
        at += n as u64;
        Ok(b)
    };
    if take(8, r)? != MAGIC {
        return Err(bad("not a checkpoint file (no MTPCACHE magic)"));
    }
    let v = u32::from_le_bytes(take(4, r)?.try_into().expect("4"));
    if v != VERSION {
        return Err(bad(format!(
            "format version {v}, this build reads {VERSION}"
        )));
    }
    if take(64, r)? != identity.as_bytes() {
        return Err(bad("written by another model (its identity differs)"));
    }
    let klen = u32::from_le_bytes(take(4, r)?.try_into().expect("4")) as usize;
    if klen > MAX_KEY_BYTES {
        return Err(bad(format!("a key of {klen} bytes")));
    }
    let key = String::from_utf8(take(klen, r)?).map_err(|_| bad("a key that is not UTF-8"))?;
    let n = u64::from_le_bytes(take(8, r)?.try_into().expect("8"));
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| (n as u64).saturating_mul(4) <= len)
        .ok_or_else(|| bad(format!("{n} tokens in a file of {len} bytes")))?;
    if n == 0 {
        return Err(bad("a checkpoint of no tokens"));
    }
    let tokens = take(n * 4, r)?
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let payload = u64::from_le_bytes(take(8, r)?.try_into().expect("8"));
    // (a hostile length must not overflow the sums the callers check it with)
    if payload > len - at {
        return Err(bad(format!(
            "a state of {payload} bytes after a header of {at} in a file of {len} bytes"
        )));
    }
    Ok((key, tokens, payload, at))
}

/// The state bytes of a checkpoint file, after checking its SHA-256, its identity and that it
/// is the checkpoint of `key` after `tokens`.
fn read_checked(
    path: &Path,
    identity: &str,
    key: &str,
    tokens: &[u32],
) -> Result<Vec<u8>, FileError> {
    check_file(std::fs::read(path)?, identity, key, tokens)
}

/// [`read_checked`] of a file's bytes, `all`.
fn check_file(
    mut all: Vec<u8>,
    identity: &str,
    key: &str,
    tokens: &[u32],
) -> Result<Vec<u8>, FileError> {
    if all.len() < 32 {
        return Err(bad(format!("{} bytes", all.len())));
    }
    let body = all.len() - 32;
    let digest: [u8; 32] = Sha256::digest(&all[..body]).into();
    if digest[..] != all[body..] {
        return Err(bad(
            "its SHA-256 does not match its contents (torn or corrupt)",
        ));
    }
    let (k, t, payload, header) = parse_header(&mut &all[..body], body as u64, identity)?;
    if k != key || t != tokens {
        return Err(bad("it holds another checkpoint than its index entry"));
    }
    if header + payload != body as u64 {
        return Err(bad("its state's length does not match the file"));
    }
    all.truncate(body);
    all.drain(..header as usize);
    Ok(all)
}

/// A checkpoint file's bytes read back as the cache reads a file of the model with `identity`:
/// the header check [`DiskCache::open`] makes of every file, then, when it passes, the checked
/// read of [`DiskCache::lookup`] with the key and tokens the header gave. `Ok`: the key, the
/// tokens and the state's bytes; `Err`: why the file would be removed. (For `mtp-fuzz`'s
/// `disk-cache` target; nothing else needs it.)
#[doc(hidden)]
pub fn read_checkpoint_bytes(
    bytes: &[u8],
    identity: &str,
) -> Result<(String, Vec<u32>, Vec<u8>), String> {
    let (key, tokens, _) =
        check_header(&mut &bytes[..], bytes.len() as u64, identity).map_err(|e| e.to_string())?;
    let state = check_file(bytes.to_vec(), identity, &key, &tokens).map_err(|e| e.to_string())?;
    Ok((key, tokens, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct St(Vec<u8>, usize);
    impl CacheState for St {
        fn bytes(&self) -> usize {
            self.0.len()
        }
        fn tokens(&self) -> usize {
            self.1
        }
        fn to_bytes(&self) -> Option<Vec<u8>> {
            Some(self.0.clone())
        }
    }

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn open(root: &Path, budget: u64) -> DiskCache<St> {
        DiskCache::open(root, ID, budget, 3).unwrap()
    }

    fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn stored_checkpoints_are_found_again_by_a_new_process() {
        let root = tempfile::tempdir().unwrap();
        let mut c = open(root.path(), 1 << 20);
        c.store("k", vec![1, 2], Arc::new(St(b"two".to_vec(), 2)));
        c.store("k", vec![1, 2, 3, 4], Arc::new(St(b"four".to_vec(), 4)));
        c.store("other", vec![1, 2, 3], Arc::new(St(b"x".to_vec(), 3)));
        c.flush();
        drop(c);
        let c = open(root.path(), 1 << 20);
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.lookup("k", &[1, 2, 3, 4, 5], 0),
            Some((4, b"four".to_vec()))
        );
        // a strict prefix only, and longer than what memory already has
        assert_eq!(c.lookup("k", &[1, 2, 3, 4], 0), Some((2, b"two".to_vec())));
        assert_eq!(c.lookup("k", &[1, 2, 3, 4, 5], 4), None);
        assert_eq!(c.lookup("k", &[9, 9, 9], 0), None);
        assert_eq!(c.lookup("nope", &[1, 2, 3, 4, 5], 0), None);
        c.clear();
        assert!(c.is_empty());
        assert!(files(c.dir(), STATE_EXT).is_empty());
        // a clear also removes what was still queued when it was asked for
        let mut c = c;
        for n in 1..=8u32 {
            c.store(
                "q",
                (1..=n).collect(),
                Arc::new(St(vec![1; 4096], n as usize)),
            );
        }
        c.clear();
        c.flush();
        assert!(c.is_empty());
        assert!(files(c.dir(), STATE_EXT).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn checkpoints_are_the_users_alone() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("cache");
        let mut c = open(&root, 1 << 20);
        c.store("k", vec![1, 2], Arc::new(St(vec![1; 100], 1)));
        c.flush();
        assert_eq!(mode(&root), 0o700, "a root made here");
        assert_eq!(mode(c.dir()), 0o700);
        let state = files(c.dir(), STATE_EXT);
        assert_eq!(state.len(), 1);
        assert_eq!(mode(&state[0]), 0o600);
        assert_eq!(mode(&c.dir().join(LOCK_FILE)), 0o600);
        // a model folder left open by an older version is closed when opened again
        let dir = c.dir().to_path_buf();
        drop(c);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _c = open(&root, 1 << 20);
        assert_eq!(mode(&dir), 0o700);
    }

    /// A state length near 2^64 (found by `mtp-fuzz`'s `disk-cache` target: the header check
    /// added it to the header's length and overflowed) is refused, in the header check on
    /// opening and in the checked read, however the file is sealed.
    #[test]
    fn a_state_length_past_the_file_is_refused_not_overflowed() {
        let mut file = MAGIC.to_vec();
        file.extend(VERSION.to_le_bytes());
        file.extend(ID.as_bytes());
        file.extend(1u32.to_le_bytes());
        file.extend(b"k");
        file.extend(1u64.to_le_bytes());
        file.extend(7u32.to_le_bytes());
        for payload in [u64::MAX, u64::MAX - 31, u64::MAX - 100, 1 << 40] {
            let mut f = file.clone();
            f.extend(payload.to_le_bytes());
            f.extend(b"state");
            let digest = Sha256::digest(&f);
            f.extend(digest);
            let err = read_checkpoint_bytes(&f, ID).expect_err("a state past the file");
            assert!(err.contains("a state of"), "{payload}: {err}");
            let body = (f.len() - 32) as u64;
            let err = check_file(f.clone(), ID, "k", &[7]).expect_err("checked read");
            assert!(err.to_string().contains("a state of"), "{body}: {err}");
        }
    }

    #[test]
    fn torn_corrupt_and_half_written_files_are_removed_never_loaded() {
        let root = tempfile::tempdir().unwrap();
        let mut c = open(root.path(), 1 << 20);
        for n in 1..=3u32 {
            c.store(
                &format!("k{n}"),
                (1..=n).collect(),
                Arc::new(St(vec![n as u8; 100], 1)),
            );
        }
        c.flush();
        let dir = c.dir().to_path_buf();
        drop(c);
        let mut state = files(&dir, STATE_EXT);
        assert_eq!(state.len(), 3);
        // 1: torn (cut short), 2: a flipped byte in the state, 3: intact
        let k1 = dir.join(file_name("k1", &[1]));
        let bytes = std::fs::read(&k1).unwrap();
        std::fs::write(&k1, &bytes[..bytes.len() - 40]).unwrap();
        let k2 = dir.join(file_name("k2", &[1, 2]));
        let mut bytes = std::fs::read(&k2).unwrap();
        let mid = bytes.len() - 60;
        bytes[mid] ^= 0x40;
        std::fs::write(&k2, &bytes).unwrap();
        // a writer killed before its rename, and a file of garbage
        std::fs::write(dir.join("abc.tmp"), b"half a checkpoint").unwrap();
        std::fs::write(dir.join("junk.state"), b"MTPCACHE\x01\0\0\0short").unwrap();
        let c = open(root.path(), 1 << 20);
        // the torn file and the garbage go at once (their lengths are wrong), the temp file too
        assert!(files(&dir, TEMP_EXT).is_empty());
        assert!(!k1.exists());
        assert!(!dir.join("junk.state").exists());
        assert_eq!(c.len(), 2);
        // the flipped byte is caught by the checksum when read, and the file removed
        assert_eq!(c.lookup("k2", &[1, 2, 3], 0), None);
        assert!(!k2.exists());
        assert_eq!(c.lookup("k3", &[1, 2, 3, 4], 0), Some((3, vec![3; 100])));
        state.retain(|p| p.exists());
        assert_eq!(state.len(), 1);
    }

    #[test]
    fn budget_and_per_key_limits_evict_least_recently_used() {
        let root = tempfile::tempdir().unwrap();
        let one = {
            let mut c = open(root.path(), 1 << 20);
            c.store("a", vec![1], Arc::new(St(vec![0; 1000], 1)));
            c.flush();
            c.used_bytes()
        };
        let mut c: DiskCache<St> = DiskCache::open(root.path(), ID, 3 * one + one / 2, 2).unwrap();
        c.store("a", vec![1, 2], Arc::new(St(vec![0; 1000], 2)));
        c.store("a", vec![1, 2, 3], Arc::new(St(vec![0; 1000], 3)));
        c.flush();
        // per key: the oldest of three goes
        assert_eq!(c.len(), 2);
        assert_eq!(c.lookup("a", &[1, 2, 3, 4], 0).map(|h| h.0), Some(3));
        assert_eq!(c.lookup("a", &[1, 9], 0), None);
        drop(c);
        let mut c: DiskCache<St> = DiskCache::open(root.path(), ID, 3 * one + one / 2, 2).unwrap();
        c.lookup("a", &[1, 2, 3, 4], 0); // touch [1,2,3]
        c.store("b", vec![7], Arc::new(St(vec![0; 1000], 1)));
        c.store("c", vec![8], Arc::new(St(vec![0; 1000], 1)));
        c.flush();
        // over budget: the least recently used ([1,2]) goes
        assert_eq!(c.len(), 3);
        assert!(c.used_bytes() <= 3 * one + one / 2);
        assert_eq!(c.lookup("a", &[1, 2, 3, 4], 0).map(|h| h.0), Some(3));
        assert_eq!(c.lookup("a", &[1, 2, 9], 0), None);
    }

    /// Set in the child process of `a_writer_killed_mid_write_leaves_nothing_loadable`.
    const CHILD_VAR: &str = "MTP_DISK_CACHE_TEST_CHILD";

    /// The child: writes a small checkpoint, waits until it is on disk, then starts a large one
    /// and waits to be killed.
    #[test]
    fn child_writer() {
        let Ok(root) = std::env::var(CHILD_VAR) else {
            return; // only meaningful as the child of the test below
        };
        let c = open(Path::new(&root), 1 << 40);
        c.store("small", vec![1, 2, 3], Arc::new(St(vec![7; 1000], 3)));
        while c.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        c.store("big", vec![1, 2, 3, 4], Arc::new(St(vec![9; 256 << 20], 4)));
        std::thread::sleep(std::time::Duration::from_secs(60));
    }

    #[test]
    fn a_writer_killed_mid_write_leaves_nothing_loadable() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(&ID[..32]);
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "disk_cache::tests::child_writer", "--nocapture"])
            .env(CHILD_VAR, root.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // killed and reaped on every path out
        struct Reaper(std::process::Child);
        impl Drop for Reaper {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Reaper(child);
        // kill it as soon as the large checkpoint's temporary file has data in it (the small
        // one is renamed by then)
        let started = std::time::Instant::now();
        let killed_at = loop {
            let written = dir.is_dir() && !files(&dir, STATE_EXT).is_empty();
            let partial = if written {
                files(&dir, TEMP_EXT)
            } else {
                Vec::new()
            };
            let size = partial
                .first()
                .and_then(|p| std::fs::metadata(p).ok())
                .map_or(0, |m| m.len());
            if size > 0 || started.elapsed() > std::time::Duration::from_secs(60) {
                drop(child);
                break size;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        };
        assert!(killed_at > 0, "the child never started its large write");
        assert!(killed_at < (256 << 20), "killed before the write ended");
        // what the kill left: the small checkpoint and a partial temporary file
        assert_eq!(files(&dir, STATE_EXT).len(), 1);
        assert_eq!(files(&dir, TEMP_EXT).len(), 1);
        let c = open(root.path(), 1 << 40);
        assert!(
            files(&dir, TEMP_EXT).is_empty(),
            "the partial file is removed"
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c.lookup("big", &[1, 2, 3, 4, 5], 0), None);
        assert_eq!(
            c.lookup("small", &[1, 2, 3, 4], 0),
            Some((3, vec![7; 1000]))
        );
    }

    #[test]
    fn one_process_per_folder_and_identities_kept_apart() {
        let root = tempfile::tempdir().unwrap();
        let mut a = open(root.path(), 1 << 20);
        let err = DiskCache::<St>::open(root.path(), ID, 1 << 20, 3).unwrap_err();
        assert!(matches!(err, DiskCacheError::Locked { .. }), "{err}");
        assert!(
            err.to_string().contains("in use by another process"),
            "{err}"
        );
        a.store("k", vec![1, 2], Arc::new(St(b"s".to_vec(), 2)));
        a.flush();
        // another model's folder does not see it
        let other = "f".repeat(64);
        let b = DiskCache::<St>::open(root.path(), &other, 1 << 20, 3).unwrap();
        assert!(b.is_empty());
        assert!(DiskCache::<St>::open(root.path(), "not-hex", 1 << 20, 3).is_err());
        // a file copied from another model's folder is refused by its identity
        drop(a);
        let src = files(&root.path().join(&ID[..32]), STATE_EXT).remove(0);
        std::fs::copy(&src, b.dir().join("copied.state")).unwrap();
        drop(b);
        let b = DiskCache::<St>::open(root.path(), &other, 1 << 20, 3).unwrap();
        assert!(b.is_empty());
    }
}
