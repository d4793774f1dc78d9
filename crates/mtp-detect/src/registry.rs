//! The model registry: `model_capabilities.json`, embedded in the crate and overridable by a
//! user file. It maps a target repository to its speculation block (companion drafter,
//! default depth, status, output preservation, measured speedup, evidence) and holds the
//! runtime tables (which architectures each runtime can run MTP for).
//!
//! A registry entry says what to load; it is never evidence that a head is present. The
//! probe decides that from tensors and header keys.
//!
//! ```
//! use mtp_detect::registry;
//! let e = registry().lookup("mlx-community/Qwen3.8-27B-4bit").unwrap();
//! assert_eq!(e.id, "qwen3.8-27b");
//! assert_eq!(e.speculation.drafter.as_deref(), Some("mlx-community/Qwen3.8-27B-MTP-4bit"));
//! assert_eq!(e.speculation.default_depth, 3);
//! ```

use std::path::Path;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::DetectError;

/// The embedded registry text.
pub const EMBEDDED_REGISTRY: &str = include_str!("../model_capabilities.json");

/// The environment variable naming a user registry file that overrides the embedded one.
pub const REGISTRY_ENV: &str = "MTP_MODEL_CAPABILITIES";

/// How far an entry's speculation claim has been checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Run end to end and measured.
    Tested,
    /// The drafter's config was fetched and matches the target; not benchmarked.
    DrafterConfigVerified,
    /// Only the GGUF (embedded head) route is known.
    GgufOnly,
    /// Surveyed from a GGUF header; no run.
    Surveyed,
}

/// An entry's speculation block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeculationEntry {
    /// The companion drafter repository, when the head ships separately.
    pub drafter: Option<String>,
    /// The depth (proposals per round) to start from.
    pub default_depth: u32,
    /// How far the entry has been checked.
    pub status: Status,
    /// Whether greedy output has been seen to match with MTP off; `None` when untested.
    pub output_preserving: Option<bool>,
    /// Measured speedup range `[low, high]`, when measured.
    pub speedup: Option<[f64; 2]>,
    /// The artifact-level evidence behind the entry.
    pub evidence: String,
}

/// A GGUF artifact surveyed for the entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GgufEntry {
    /// The repository surveyed.
    pub artifact: Option<String>,
    /// Its `general.architecture`.
    pub arch: String,
    /// Its `<arch>.nextn_predict_layers` (0 when absent).
    pub nextn_predict_layers: u32,
}

/// One model of the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The model id, lower-case (`qwen3.8-27b`); also the name key matched against repo names.
    pub id: String,
    /// The family, for display.
    pub family: String,
    /// Repositories known to be this model.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Extra lower-case name keys.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The speculation block.
    pub speculation: SpeculationEntry,
    /// The surveyed GGUF, when there is one.
    #[serde(default)]
    pub gguf: Option<GgufEntry>,
}

/// Runtime tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeTables {
    /// The llama.cpp build the arch list was read from.
    pub llama_cpp_build: String,
    /// GGUF architectures whose MTP graph llama.cpp implements.
    pub llama_cpp_mtp_archs: Vec<String>,
    /// HF `model_type`s vLLM runs MTP for (`method: mtp`).
    pub vllm_mtp_model_types: Vec<String>,
    /// HF `model_type`s the native engine runs.
    pub native_model_types: Vec<String>,
    /// `model_type`s of companion MTP drafters.
    pub drafter_model_types: Vec<String>,
}

impl RuntimeTables {
    /// Whether the registry's llama.cpp build implements the MTP graph of this GGUF
    /// `general.architecture`. Names compare exactly, as llama.cpp compares them (a file that
    /// says `glm5next` is not the `glm5-next` architecture and does not load there).
    pub fn llama_cpp_supports(&self, arch: &str) -> bool {
        self.llama_cpp_mtp_archs.iter().any(|x| x == arch)
    }

    /// Whether vLLM runs MTP for this `model_type`.
    pub fn vllm_supports(&self, model_type: &str) -> bool {
        self.vllm_mtp_model_types.iter().any(|x| x == model_type)
    }

    /// Whether the native engine runs this `model_type`.
    pub fn native_supports(&self, model_type: &str) -> bool {
        self.native_model_types.iter().any(|x| x == model_type)
    }

    /// Whether `model_type` is a companion-drafter type.
    pub fn is_drafter_type(&self, model_type: &str) -> bool {
        self.drafter_model_types.iter().any(|x| x == model_type)
    }
}

/// How a repository matched an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchKind {
    /// Listed in `targets`.
    Target,
    /// It is the entry's drafter.
    Drafter,
    /// It is the entry's surveyed GGUF.
    Artifact,
    /// Its name starts with the entry's id or an alias.
    Name,
}

/// The registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registry {
    /// Format version.
    pub version: u32,
    /// Runtime tables.
    pub runtimes: RuntimeTables,
    /// Models.
    pub models: Vec<Entry>,
}

#[derive(Deserialize)]
struct UserFile {
    #[serde(default)]
    runtimes: Option<RuntimeTables>,
    #[serde(default)]
    models: Vec<Entry>,
}

/// The largest user registry file accepted.
const MAX_REGISTRY_FILE: u64 = 8 * 1024 * 1024;

/// The embedded registry.
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        // The embedded file is checked by a unit test; an empty registry is the fallback.
        Registry::parse(EMBEDDED_REGISTRY, "<embedded>").unwrap_or_else(|e| {
            tracing::error!(%e, "embedded registry is invalid");
            Registry {
                version: 1,
                runtimes: RuntimeTables {
                    llama_cpp_build: String::new(),
                    llama_cpp_mtp_archs: Vec::new(),
                    vllm_mtp_model_types: Vec::new(),
                    native_model_types: Vec::new(),
                    drafter_model_types: Vec::new(),
                },
                models: Vec::new(),
            }
        })
    })
}

impl Registry {
    /// Parses a registry document.
    pub fn parse(text: &str, file: &str) -> Result<Registry, DetectError> {
        serde_json::from_str(text).map_err(|e| DetectError::Registry {
            file: file.to_string(),
            message: e.to_string(),
        })
    }

    /// The embedded registry with a user file laid over it: user entries replace embedded
    /// ones with the same `id` and add new ones; user `runtimes` tables replace the embedded.
    pub fn with_user_file(path: &Path) -> Result<Registry, DetectError> {
        let file = path.display().to_string();
        let len = std::fs::metadata(path)
            .map_err(|e| DetectError::io(&file, e))?
            .len();
        if len > MAX_REGISTRY_FILE {
            return Err(DetectError::TooLarge {
                file,
                size: len,
                limit: MAX_REGISTRY_FILE,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| DetectError::io(&file, e))?;
        let user: UserFile = serde_json::from_str(&text).map_err(|e| DetectError::Registry {
            file: file.clone(),
            message: e.to_string(),
        })?;
        let mut r = registry().clone();
        if let Some(rt) = user.runtimes {
            r.runtimes = rt;
        }
        for e in user.models {
            match r.models.iter_mut().find(|m| m.id == e.id) {
                Some(m) => *m = e,
                None => r.models.push(e),
            }
        }
        Ok(r)
    }

    /// The embedded registry, overridden by the file named in `MTP_MODEL_CAPABILITIES` when set.
    pub fn from_env() -> Result<Registry, DetectError> {
        match std::env::var_os(REGISTRY_ENV) {
            Some(p) if !p.is_empty() => Registry::with_user_file(Path::new(&p)),
            _ => Ok(registry().clone()),
        }
    }

    /// The entry for a repository id (or a bare model name), if any.
    pub fn lookup(&self, repo: &str) -> Option<&Entry> {
        self.lookup_match(repo).map(|(e, _)| e)
    }

    /// The entry for a repository id and how it matched: an exact `targets`, drafter or
    /// artifact match first (case-insensitive), else the longest id or alias that the repo's
    /// name starts with, followed by `-`, `_`, `.` or the end.
    pub fn lookup_match(&self, repo: &str) -> Option<(&Entry, MatchKind)> {
        let eq = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        for e in &self.models {
            if e.targets.iter().any(|t| eq(t, repo)) {
                return Some((e, MatchKind::Target));
            }
            if e.speculation
                .drafter
                .as_deref()
                .is_some_and(|d| eq(d, repo))
            {
                return Some((e, MatchKind::Drafter));
            }
            if e.gguf
                .as_ref()
                .and_then(|g| g.artifact.as_deref())
                .is_some_and(|a| eq(a, repo))
            {
                return Some((e, MatchKind::Artifact));
            }
        }
        let name = repo.rsplit('/').next().unwrap_or(repo).to_ascii_lowercase();
        let mut best: Option<(&Entry, usize)> = None;
        for e in &self.models {
            for key in std::iter::once(&e.id).chain(&e.aliases) {
                let k = key.to_ascii_lowercase();
                let fits = name
                    .strip_prefix(&k)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '_', '.']));
                if fits && best.is_none_or(|(_, l)| k.len() > l) {
                    best = Some((e, k.len()));
                }
            }
        }
        best.map(|(e, _)| (e, MatchKind::Name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_registry_parses_and_has_the_reference_entries() {
        let r = Registry::parse(EMBEDDED_REGISTRY, "<embedded>").unwrap();
        for id in [
            "qwen3.8-27b",
            "qwen3.6-27b",
            "qwen3.6-35b-a3b",
            "qwen3.5-9b",
            "qwen3.5-4b",
            "gemma-4-26b-a4b-it",
            "qwen3.6-27b-mtp-gguf",
            "qwen3.6-35b-a3b-mtp-gguf",
        ] {
            assert!(r.models.iter().any(|m| m.id == id), "{id} missing");
        }
        // The MTP graphs of llama.cpp b11434 (`src/models/*.cpp` handling
        // LLM_GRAPH_TYPE_DECODER_MTP), under the names its llama-arch.cpp gives them.
        for arch in [
            "qwen35",
            "qwen35moe",
            "glm-dsa",
            "glm5-next",
            "qwen4exp",
            "step35",
        ] {
            assert!(r.runtimes.llama_cpp_supports(arch), "{arch}");
        }
        for arch in ["glm_dsa", "glm5next", "llama", "qwen3"] {
            assert!(!r.runtimes.llama_cpp_supports(arch), "{arch}");
        }
    }
}
