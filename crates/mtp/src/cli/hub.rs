//! What `mtp models` keeps around the one Hub client (`mtp_detect::hub`): where the cache is
//! and the record of which companion drafter was fetched with which model.
//!
//! That record is mtp's own, so it lives in mtp's folder, not in the Hugging Face cache (which
//! holds only what `huggingface_hub` itself would write): `companions.json` under `MTP_HOME`,
//! else `$XDG_CONFIG_HOME/mtp`, else `~/.config/mtp`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mtp_detect::hub::HubError;
use mtp_detect::RepoId;

/// The Hugging Face cache directory: `--cache-dir`, else `huggingface_hub`'s rule
/// (`HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
/// `~/.cache/huggingface/hub`).
pub fn cache_dir(flag: Option<&Path>) -> PathBuf {
    match flag {
        Some(p) => p.to_path_buf(),
        None => mtp_detect::CacheConfig::from_env().hub_cache,
    }
}

/// mtp's own folder: `MTP_HOME`, else `$XDG_CONFIG_HOME/mtp`, else `~/.config/mtp`.
pub fn mtp_home() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(h) = var("MTP_HOME") {
        return PathBuf::from(h);
    }
    if let Some(x) = var("XDG_CONFIG_HOME") {
        return Path::new(&x).join("mtp");
    }
    let home = var("HOME").unwrap_or_else(|| ".".into());
    Path::new(&home).join(".config").join("mtp")
}

/// Which companion drafter was fetched with which model (`companions.json`).
#[derive(Debug, Default)]
pub struct Companions {
    path: PathBuf,
    map: BTreeMap<String, String>,
}

impl Companions {
    /// The record in [`mtp_home`]; an absent file is an empty record, an unreadable one an error.
    pub fn load() -> Result<Self, HubError> {
        let path = mtp_home().join("companions.json");
        let map = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice::<BTreeMap<String, String>>(&b).map_err(|e| {
                HubError::Io {
                    path: path.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("not a JSON object of repo ids ({e}); fix or delete it"),
                    ),
                }
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(HubError::io(&path)(e)),
        };
        // Only ids that pass the repo-id rule are kept: the file is read back into paths.
        let map = map
            .into_iter()
            .filter(|(k, v)| RepoId::parse(k).is_ok() && RepoId::parse(v).is_ok())
            .collect();
        Ok(Companions { path, map })
    }

    /// The companion recorded for `repo`.
    pub fn get(&self, repo: &str) -> Option<&str> {
        self.map.get(repo).map(String::as_str)
    }

    /// Records `companion` for `repo` and writes the file (atomically).
    pub fn set(&mut self, repo: &str, companion: &str) -> Result<(), HubError> {
        self.map.insert(repo.to_string(), companion.to_string());
        let dir = self.path.parent().unwrap_or(Path::new(".")).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(HubError::io(&dir))?;
        let tmp = dir.join(format!(".companions.{}.tmp", std::process::id()));
        let body = serde_json::to_vec_pretty(&self.map).unwrap_or_default();
        std::fs::write(&tmp, body).map_err(HubError::io(&tmp))?;
        std::fs::rename(&tmp, &self.path).map_err(HubError::io(&self.path))
    }
}
