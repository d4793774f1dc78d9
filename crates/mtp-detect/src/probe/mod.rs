//! The probe: read the few bytes that prove whether an artifact carries an MTP head, then say
//! which runtime can run it and how to start it.
//!
//! In files: `report` (the report and the options, the types callers read), `render` (the
//! report for a person), `formats` (reading safetensors and GGUF artifacts into a report),
//! `support` (which runtime can run it, and with which command); here, the orchestration:
//! resolving a spec, reading an artifact, the companion drafter.

mod formats;
mod render;
mod report;
mod support;

use std::collections::BTreeMap;
use std::path::Path;

use mtp_contract::{DepthSource, Lane, Reason};
use serde::Serialize;

use crate::cache::{repo_from_cache_path, resolve_model, CacheConfig, ResolvedArtifact};
use crate::config::{parse_config, ConfigInfo, MAX_CONFIG_LEN};
use crate::drafter::{check_drafter_with, DrafterError};
use crate::error::{DetectError, HubError};
use crate::gguf::{self, is_gguf_model_file, split_parts};
use crate::hub::HubConfig;
use crate::registry::{registry, Entry, MatchKind, Registry, Status};
use crate::repo::RepoId;
use crate::runtimes::{
    convert_command, launch_command_in, native_in, shell_quote, CommandStyle, Runtime,
    RuntimeSupport, Verdict,
};
use crate::source::{FileEntry, LocalReader, Reader};
use crate::tensors::{MtpStyle, MtpTensorSummary};
use crate::weights::{read_gguf_header, read_st_header, read_weight_names, MAX_HEADERS};

/// The index file of a sharded safetensors checkpoint (kept here for callers of
/// `probe::INDEX_FILE`; the readers own it).
pub use crate::weights::INDEX_FILE;
/// How many tensor names the report's `evidence` lists before summarising the rest.
pub const EVIDENCE_NAMES: usize = 12;
/// Initial prefix for the second and later shards of a split GGUF (their metadata is short).
const SHARD_PREFIX: u64 = 256 * 1024;

use formats::{probe_gguf, probe_safetensors};
pub use report::{CompanionStatus, Format, ProbeOptions, ProbeReport, RegistryView, Role};
use support::{runtime_support, ModelRef};

/// Probes `spec` (a path, `org/name` or `org/name@rev`): a path or cache snapshot is read
/// locally; otherwise the Hub is read over HTTP when `opts.hub` is set.
pub fn probe(spec: &str, opts: &ProbeOptions) -> Result<ProbeReport, DetectError> {
    let resolved = resolve_model(spec, &opts.cache)?;
    match &resolved {
        ResolvedArtifact::Local { path, repo } => {
            let r = LocalReader::new(path)?;
            probe_reader(&r, repo.as_ref(), local_name(path).as_deref(), opts)
        }
        ResolvedArtifact::Cached { repo, snapshot, .. } => {
            let r = LocalReader::new(snapshot)?;
            probe_reader(&r, Some(repo), None, opts)
        }
        ResolvedArtifact::Remote { repo, revision } => {
            let offline = || HubError::Offline {
                what: format!("{repo}@{revision}"),
                cache: Some(opts.cache.hub_cache.clone()),
            };
            let hub = match &opts.hub {
                Some(h) if !h.offline => h,
                _ => return Err(offline().into()),
            };
            remote(hub, repo, revision, opts)
        }
    }
}

#[cfg(feature = "hub")]
fn remote(
    hub: &HubConfig,
    repo: &RepoId,
    revision: &str,
    opts: &ProbeOptions,
) -> Result<ProbeReport, DetectError> {
    let r = crate::hub::HubReader::new(hub.clone(), repo.clone(), revision)?;
    probe_reader(&r, Some(repo), None, opts)
}

#[cfg(not(feature = "hub"))]
fn remote(
    hub: &HubConfig,
    repo: &RepoId,
    revision: &str,
    _opts: &ProbeOptions,
) -> Result<ProbeReport, DetectError> {
    Err(HubError::Http {
        url: hub.endpoint.clone(),
        status: None,
        message: format!(
            "{repo}@{revision} is not in the local cache, and this build of mtp-detect has no Hub client (the `hub` feature)"
        ),
    }
    .into())
}

/// [`probe`] for async callers: runs on the blocking pool.
#[cfg(feature = "hub")]
pub async fn probe_async(spec: String, opts: ProbeOptions) -> Result<ProbeReport, DetectError> {
    let task = tokio::task::spawn_blocking(move || probe(&spec, &opts));
    task.await.map_err(|e| DetectError::Io {
        file: "probe task".into(),
        source: std::io::Error::other(e.to_string()),
    })?
}

/// Probes a local file or directory, without the network, with the embedded registry and
/// the cache from the environment (for companion lookups).
pub fn probe_local(path: &Path) -> Result<ProbeReport, DetectError> {
    let opts = ProbeOptions::offline(CacheConfig::from_env());
    let r = LocalReader::new(path)?;
    let repo = repo_from_cache_path(path);
    probe_reader(&r, repo.as_ref(), local_name(path).as_deref(), &opts)
}

/// The name a local path is looked up under in the registry (its last component, without
/// a weights extension).
fn local_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    let name = name
        .strip_suffix(".gguf")
        .or_else(|| name.strip_suffix(".safetensors"))
        .unwrap_or(&name)
        .to_string();
    Some(name)
}

/// Probes whatever `reader` reads. `repo` is the repository (for the registry and commands);
/// `name` a fallback registry key for paths outside the cache.
pub fn probe_reader(
    reader: &dyn Reader,
    repo: Option<&RepoId>,
    name: Option<&str>,
    opts: &ProbeOptions,
) -> Result<ProbeReport, DetectError> {
    let files = reader.list()?;
    let mut files_read = Vec::new();
    let has = |n: &str| files.iter().any(|f| f.path == n);
    let is_gguf = |f: &FileEntry| f.path.to_ascii_lowercase().ends_with(".gguf");
    let is_st = |f: &FileEntry| f.path.to_ascii_lowercase().ends_with(".safetensors");

    let chosen_file = match &opts.file {
        Some(f) => {
            Some(
                files
                    .iter()
                    .find(|e| &e.path == f)
                    .ok_or_else(|| DetectError::NotFound {
                        path: reader.describe(f),
                    })?,
            )
        }
        None => None,
    };
    let use_gguf = match chosen_file {
        Some(f) => is_gguf(f),
        None => !(has(INDEX_FILE) || files.iter().any(is_st)) && files.iter().any(is_gguf),
    };
    let mut report = if use_gguf {
        probe_gguf(reader, &files, chosen_file, opts, &mut files_read)?
    } else if chosen_file.is_some_and(|f| !is_st(f)) {
        return Err(DetectError::NoWeights {
            place: reader.describe(opts.file.as_deref().unwrap_or_default()),
        });
    } else if has(INDEX_FILE) || files.iter().any(is_st) {
        probe_safetensors(reader, &files, chosen_file, opts, &mut files_read)?
    } else {
        return Err(DetectError::NoWeights {
            place: reader.place(),
        });
    };
    report.source = reader.place();
    report.repo = repo.map(|r| r.to_string());

    // Registry and companion.
    let reg = opts.registry();
    let key = repo
        .map(|r| r.as_str().to_string())
        .or(name.map(String::from));
    let entry = key.as_deref().and_then(|k| reg.lookup_match(k));
    if let Some((e, how)) = entry {
        report.registry = Some(RegistryView::new(e, how));
    }
    let mut companion_ok = false;
    if report.role == Role::Target && !report.mtp_head {
        if let Some((e, how)) = entry {
            if let (Some(d), true) = (&e.speculation.drafter, how != MatchKind::Drafter) {
                let (c, ok) = companion_status(d, &report, reader, opts);
                companion_ok = ok;
                report.companion = Some(c);
            }
        }
    }
    let (model_ref, hf_file) = match (report.format, &report.file, repo) {
        (Format::Gguf, Some(f), Some(r)) if reader.is_remote() => (r.to_string(), Some(f.clone())),
        (Format::Gguf, Some(f), _) => (reader.describe(f), None),
        (_, _, Some(r)) => (r.to_string(), None),
        _ => (reader.place(), None),
    };
    let target = ModelRef {
        model: &model_ref,
        file: hf_file.as_deref(),
    };
    let companion_depth = report
        .companion
        .as_ref()
        .filter(|_| !report.mtp_head)
        .and_then(|c| c.config_depth);
    let (depth, _) = default_depth(companion_depth, report.registry.as_ref());
    report.runtimes = runtime_support(&report, reg, &target, depth, companion_ok, opts.style);
    report.bytes_read = reader.bytes_read();
    report.files_read = files_read;
    Ok(report)
}

fn companion_status(
    drafter: &str,
    report: &ProbeReport,
    reader: &dyn Reader,
    opts: &ProbeOptions,
) -> (CompanionStatus, bool) {
    let target = report.repo.clone().unwrap_or_else(|| reader.place());
    let download = format!("mtp models download {}", shell_quote(drafter));
    let Ok(drepo) = RepoId::parse(drafter) else {
        return (
            CompanionStatus {
                repo: drafter.to_string(),
                cached: false,
                path: None,
                matches: None,
                reason: Some(Reason::DrafterMismatch),
                message: format!("the registry names an invalid drafter id `{drafter}`"),
                config_depth: None,
            },
            false,
        );
    };
    match opts.cache.snapshot(&drepo, "main") {
        None => (
            CompanionStatus {
                repo: drafter.to_string(),
                cached: false,
                path: None,
                matches: None,
                reason: Some(Reason::MtpHeadNotCached),
                message: acceleration_off(&format!(
                    "companion {drafter} (the MTP head for {target}) is not downloaded; download it with `{download}`"
                )),
                config_depth: None,
            },
            false,
        ),
        Some((dir, _)) => {
            let tcfg = ConfigInfo {
                model_type: report.model_type.clone(),
                hidden_size: report.hidden_size,
                vocab_size: report.vocab_size,
                ..ConfigInfo::default()
            };
            let checked = LocalReader::new(&dir)
                .map_err(DrafterError::from)
                .and_then(|d| check_drafter_with(&tcfg, &d, opts.registry()));
            match checked {
                Ok(info) => (
                    CompanionStatus {
                        repo: drafter.to_string(),
                        cached: true,
                        path: Some(dir.display().to_string()),
                        matches: Some(true),
                        reason: None,
                        message: format!(
                            "companion {drafter} is cached and fits ({}, hidden size {}, {} MTP layer(s))",
                            info.model_type, info.hidden_size, info.mtp_layers
                        ),
                        config_depth: info.config_depth,
                    },
                    true,
                ),
                Err(e) => (
                    CompanionStatus {
                        repo: drafter.to_string(),
                        cached: true,
                        path: Some(dir.display().to_string()),
                        matches: Some(false),
                        reason: Some(e.reason()),
                        message: acceleration_off(&e.to_string()),
                        config_depth: None,
                    },
                    false,
                ),
            }
        }
    }
}

/// The depth a drafter runs at when no block names one, and which level decided it: the
/// drafter's own config, then the registry's `default_depth`, then the built-in
/// [`mtp_contract::BUILTIN_DEPTH`] (the order `docs/speculation.md` states).
pub fn default_depth(
    drafter_config: Option<u32>,
    registry: Option<&RegistryView>,
) -> (u32, DepthSource) {
    match (drafter_config.filter(|&d| d > 0), registry) {
        (Some(d), _) => (d, DepthSource::DrafterConfig),
        (None, Some(r)) => (r.default_depth, DepthSource::Registry),
        (None, None) => (mtp_contract::BUILTIN_DEPTH, DepthSource::BuiltIn),
    }
}

fn empty_report(format: Format) -> ProbeReport {
    ProbeReport {
        source: String::new(),
        repo: None,
        format,
        file: None,
        role: Role::Target,
        arch: None,
        model_type: None,
        mtp_head: false,
        vision: false,
        vision_evidence: None,
        mtp_layers: 0,
        mtp_style: None,
        mtp_tensor_count: 0,
        mtp_dtypes: Vec::new(),
        mlx_affine_quantized: false,
        mlx_quantized_weights: false,
        evidence: Vec::new(),
        config_claims_mtp: false,
        config_claim: None,
        hidden_size: None,
        vocab_size: None,
        base_layers: None,
        warnings: Vec::new(),
        runtimes: Vec::new(),
        registry: None,
        companion: None,
        bytes_read: 0,
        files_read: Vec::new(),
    }
}

fn evidence_names(names: &[String]) -> Vec<String> {
    let mut ev: Vec<String> = names.iter().take(EVIDENCE_NAMES).cloned().collect();
    if names.len() > EVIDENCE_NAMES {
        ev.push(format!("(+{} more)", names.len() - EVIDENCE_NAMES));
    }
    ev
}

fn apply_summary(r: &mut ProbeReport, s: &MtpTensorSummary) {
    r.mtp_head = !s.is_empty();
    r.mtp_layers = s.layer_count();
    r.mtp_style = s.styles.iter().next().copied();
    r.mtp_tensor_count = s.tensors.len();
    r.mtp_dtypes = s.dtypes.iter().cloned().collect();
    r.mlx_affine_quantized = s.mlx_affine_quantized;
    r.evidence = evidence_names(&s.tensors);
}

/// A lane's message: "MTP acceleration off: " once before what says why (a runtime's note may
/// carry a companion's message that says it already).
fn acceleration_off(why: &str) -> String {
    const OFF: &str = "MTP acceleration off: ";
    if why.starts_with(OFF) {
        why.to_string()
    } else {
        format!("{OFF}{why}")
    }
}
