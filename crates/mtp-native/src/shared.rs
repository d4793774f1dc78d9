//! One copy of a checkpoint's weights in memory, shared by every provider that loads it.
//!
//! Providers hold an `Arc` to the loaded model; this table holds only `Weak` references, so
//! the weights are freed when the last provider using them unloads (or is dropped).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// A table of loaded models keyed by canonical checkpoint path (plus a variant string, such
/// as the device and dtype).
pub struct SharedModels<M> {
    table: Mutex<HashMap<(PathBuf, String), Weak<M>>>,
}

impl<M> Default for SharedModels<M> {
    fn default() -> Self {
        SharedModels {
            table: Mutex::new(HashMap::new()),
        }
    }
}

impl<M> SharedModels<M> {
    /// Returns the loaded model for `path`/`variant`, loading it with `load` if no provider
    /// holds it. Concurrent callers for the same checkpoint load it once.
    pub fn get_or_load<E>(
        &self,
        path: &Path,
        variant: &str,
        load: impl FnOnce() -> Result<M, E>,
    ) -> Result<Arc<M>, E> {
        let key = (
            path.canonicalize().unwrap_or_else(|_| path.to_path_buf()),
            variant.to_string(),
        );
        // The lock is held while loading so that two providers never load the same weights.
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.retain(|_, w| w.strong_count() > 0);
        if let Some(m) = t.get(&key).and_then(Weak::upgrade) {
            return Ok(m);
        }
        let m = Arc::new(load()?);
        t.insert(key, Arc::downgrade(&m));
        Ok(m)
    }

    /// Number of loaded copies of the checkpoint at `path` (any variant).
    pub fn loaded_at(&self, path: &Path) -> usize {
        let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.iter()
            .filter(|((p, _), w)| *p == canon && w.strong_count() > 0)
            .count()
    }

    /// Number of checkpoints currently loaded.
    pub fn loaded(&self) -> usize {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.values().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_load_shares_and_last_drop_frees() {
        let shared: SharedModels<Vec<u8>> = SharedModels::default();
        let dir = std::env::temp_dir();
        let mut loads = 0;
        let a = shared
            .get_or_load::<()>(&dir, "cpu", || {
                loads += 1;
                Ok(vec![0; 16])
            })
            .unwrap();
        let b = shared
            .get_or_load::<()>(&dir, "cpu", || {
                loads += 1;
                Ok(vec![1; 16])
            })
            .unwrap();
        assert_eq!(loads, 1);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(shared.loaded(), 1);
        drop(a);
        assert_eq!(shared.loaded(), 1);
        drop(b);
        assert_eq!(shared.loaded(), 0);
    }
}
