//! The probe: read the few bytes that prove whether an artifact carries an MTP head, then say
//! which runtime can run it and how to start it.

use std::collections::BTreeMap;
use std::path::Path;

use mtp_contract::{DepthSource, Lane, Reason};
use serde::Serialize;

use crate::config::{parse_config, ConfigInfo, MAX_CONFIG_LEN};
use crate::drafter::{check_drafter_with, DrafterError};
use crate::error::DetectError;
use crate::gguf::{self, parse_gguf, GgufHeader, GgufParse};
use crate::hub::HubConfig;
use crate::registry::{registry, Entry, MatchKind, Registry, Status};
use crate::repo::{resolve_model, CacheConfig, RepoId, ResolvedArtifact};
use crate::runtimes::{
    launch_command_in, native_in, shell_quote, CommandStyle, Runtime, RuntimeSupport, Verdict,
};
use crate::source::{FileEntry, LocalReader, Reader};
use crate::st::{header_len, parse_header, parse_index, MAX_INDEX_LEN};
use crate::tensors::{MtpStyle, MtpTensorSummary};

/// The index file of a sharded safetensors checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// How many tensor names the report's `evidence` lists before summarising the rest.
pub const EVIDENCE_NAMES: usize = 12;
/// The most safetensors headers read for one probe.
const MAX_HEADERS: usize = 64;
/// Initial prefix for the second and later shards of a split GGUF (their metadata is short).
const SHARD_PREFIX: u64 = 256 * 1024;

/// The weights format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Hugging Face / MLX safetensors.
    Safetensors,
    /// GGUF.
    Gguf,
}

/// What the artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A model to generate with.
    Target,
    /// A companion MTP drafter (`model_type` of a drafter type).
    Drafter,
}

/// Options of a probe.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Where the Hugging Face cache is.
    pub cache: CacheConfig,
    /// The Hub, for repositories not in the cache; `None` (or `HF_HUB_OFFLINE`) makes such
    /// probes an error. Reading the Hub needs the `hub` feature.
    pub hub: Option<HubConfig>,
    /// The registry; `None` uses the embedded one.
    pub registry: Option<Registry>,
    /// Which weights file to probe when a repository holds several GGUFs.
    pub file: Option<String>,
    /// The first GGUF prefix fetched.
    pub gguf_prefix: u64,
    /// The largest GGUF prefix fetched.
    pub gguf_cap: u64,
    /// How the report writes the way to run the model (code, or the `mtp` command line).
    pub style: CommandStyle,
}

impl Default for ProbeOptions {
    /// Cache and Hub from the environment, the embedded registry, 3 MiB / 64 MiB prefixes.
    fn default() -> Self {
        ProbeOptions {
            cache: CacheConfig::from_env(),
            hub: Some(HubConfig::from_env()),
            registry: None,
            file: None,
            gguf_prefix: gguf::DEFAULT_PREFIX,
            gguf_cap: gguf::MAX_PREFIX,
            style: CommandStyle::Library,
        }
    }
}

impl ProbeOptions {
    /// Options that never touch the network, with the cache at `cache`.
    pub fn offline(cache: CacheConfig) -> Self {
        ProbeOptions {
            cache,
            hub: None,
            ..ProbeOptions::default()
        }
    }

    /// The defaults, with the registry overridden by the file named in
    /// `MTP_MODEL_CAPABILITIES` when set (an unreadable file is an error, not ignored).
    pub fn from_env() -> Result<Self, DetectError> {
        Ok(ProbeOptions {
            registry: Some(Registry::from_env()?),
            ..ProbeOptions::default()
        })
    }

    fn registry(&self) -> &Registry {
        self.registry.as_ref().unwrap_or_else(|| registry())
    }
}

/// The registry entry that matched, as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegistryView {
    /// Entry id.
    pub id: String,
    /// How the repository matched it.
    pub matched_by: MatchKind,
    /// Check status.
    pub status: Status,
    /// Companion drafter repository.
    pub drafter: Option<String>,
    /// Default depth.
    pub default_depth: u32,
    /// Output preservation, when known.
    pub output_preserving: Option<bool>,
    /// Measured speedup range.
    pub speedup: Option<[f64; 2]>,
    /// The evidence behind the entry.
    pub evidence: String,
}

impl RegistryView {
    /// The registry's entry for a repository id, file or model name (as [`Registry::lookup_match`]
    /// matches it), for runtimes that have no probe report: what a provider reports of the
    /// pairing (`default_depth`, `output_preserving`).
    pub fn lookup(key: &str) -> Option<Self> {
        registry()
            .lookup_match(key)
            .map(|(e, how)| RegistryView::new(e, how))
    }

    fn new(e: &Entry, how: MatchKind) -> Self {
        RegistryView {
            id: e.id.clone(),
            matched_by: how,
            status: e.speculation.status,
            drafter: e.speculation.drafter.clone(),
            default_depth: e.speculation.default_depth,
            output_preserving: e.speculation.output_preserving,
            speedup: e.speculation.speedup,
            evidence: e.speculation.evidence.clone(),
        }
    }
}

/// The companion drafter of a target without an embedded head.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompanionStatus {
    /// The drafter repository.
    pub repo: String,
    /// Whether it is in the local cache.
    pub cached: bool,
    /// Its snapshot directory, when cached.
    pub path: Option<String>,
    /// Whether it was checked against the target and fits.
    pub matches: Option<bool>,
    /// The reason it cannot be used, if it cannot.
    pub reason: Option<Reason>,
    /// What to do next (the exact download command when it is missing).
    pub message: String,
    /// The proposals per round its config asks for (`block_size - 1`), when it was checked
    /// and says.
    pub config_depth: Option<u32>,
}

/// Everything a probe found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    /// What was probed: a path, or `repo@revision`.
    pub source: String,
    /// The repository, when known.
    pub repo: Option<String>,
    /// The weights format.
    pub format: Format,
    /// The weights file probed (GGUF), when one was chosen among several.
    pub file: Option<String>,
    /// Target or companion drafter.
    pub role: Role,
    /// GGUF `general.architecture`, or the config's `model_type`.
    pub arch: Option<String>,
    /// The config's `model_type`, when there is a config.
    pub model_type: Option<String>,
    /// Whether the weights carry an MTP head (from tensors and header keys only).
    pub mtp_head: bool,
    /// Whether the artifact carries a vision tower: `model.visual.*` / `vision_tower.*`
    /// tensors, or for GGUF a vision projector file (`mmproj*.gguf`) beside the weights.
    pub vision: bool,
    /// The tensor or file that shows the vision tower.
    pub vision_evidence: Option<String>,
    /// MTP layers in the weights.
    pub mtp_layers: u64,
    /// The naming convention of the head.
    pub mtp_style: Option<MtpStyle>,
    /// Number of MTP tensors.
    pub mtp_tensor_count: usize,
    /// Data types of the MTP tensors.
    pub mtp_dtypes: Vec<String>,
    /// Whether the head is MLX affine-quantized.
    pub mlx_affine_quantized: bool,
    /// Whether the checkpoint's weights are MLX affine-quantized (config `quantization`, or
    /// `.scales` / `.biases` tensors), head or not: what vLLM and llama.cpp's converter cannot
    /// read.
    pub mlx_quantized_weights: bool,
    /// The tensor names or header key that prove the verdict.
    pub evidence: Vec<String>,
    /// Whether `config.json` claims a head (a claim, not evidence).
    pub config_claims_mtp: bool,
    /// The claim, e.g. `text_config.mtp_num_hidden_layers = 1`.
    pub config_claim: Option<String>,
    /// `hidden_size`, when known.
    pub hidden_size: Option<u64>,
    /// `vocab_size`, when known.
    pub vocab_size: Option<u64>,
    /// Ordinary decoder layers (NextN layers are numbered after them).
    pub base_layers: Option<u64>,
    /// Things the user should know (claims contradicted by weights, caps reached, …).
    pub warnings: Vec<String>,
    /// Per runtime: can it run MTP here, and the exact command.
    pub runtimes: Vec<RuntimeSupport>,
    /// The registry entry, when one matched.
    pub registry: Option<RegistryView>,
    /// The companion drafter, for a target without an embedded head.
    pub companion: Option<CompanionStatus>,
    /// Bytes read from the artifact (and the Hub listing).
    pub bytes_read: u64,
    /// Files read, in order.
    pub files_read: Vec<String>,
}

impl ProbeReport {
    /// The report as one JSON object (what `probe --json` prints).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }

    /// One runtime's line.
    pub fn runtime(&self, rt: Runtime) -> Option<&RuntimeSupport> {
        self.runtimes.iter().find(|r| r.runtime == rt)
    }

    /// The lane a provider on `rt` should plan with: ready (embedded head or a matching
    /// cached companion, at [`default_depth`]) or unavailable with the reason.
    pub fn lane(&self, rt: Runtime) -> Lane {
        let companion = self.companion.as_ref().filter(|_| !self.mtp_head);
        let (depth, depth_source) = default_depth(
            companion.and_then(|c| c.config_depth),
            self.registry.as_ref(),
        );
        match self.runtime(rt) {
            Some(r) if r.can_run_mtp => Lane::Ready {
                drafter: match companion {
                    Some(c) => c.repo.clone(),
                    None => "embedded".to_string(),
                },
                default_depth: depth,
                depth_source,
                output_preserving: self.registry.as_ref().and_then(|r| r.output_preserving),
            },
            Some(r) => Lane::Unavailable {
                reason: r.reason.unwrap_or(Reason::RuntimeUnsupported),
                message: acceleration_off(&r.note),
            },
            None => Lane::Unavailable {
                reason: Reason::RuntimeUnsupported,
                message: acceleration_off(&format!("no verdict for runtime {rt}")),
            },
        }
    }

    /// A short human summary (what `probe` prints without `--json`).
    pub fn render_human(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let fmt = match self.format {
            Format::Safetensors => "safetensors",
            Format::Gguf => "gguf",
        };
        let _ = writeln!(
            s,
            "{}  ({fmt}{}{})",
            self.source,
            self.arch
                .as_ref()
                .map(|a| format!(", arch {a}"))
                .unwrap_or_default(),
            match (self.role, self.mlx_quantized_weights) {
                (Role::Drafter, true) => ", MLX-quantized companion drafter",
                (Role::Drafter, false) => ", companion drafter",
                (Role::Target, true) => ", MLX-quantized",
                (Role::Target, false) => "",
            }
        );
        if let Some(f) = &self.file {
            let _ = writeln!(s, "file: {f}");
        }
        if self.mtp_head {
            let _ = writeln!(
                s,
                "MTP head: yes, {} layer(s), {} tensor(s){}{}{}",
                self.mtp_layers,
                self.mtp_tensor_count,
                self.mtp_style
                    .map(|st| format!(", {}", style_name(st)))
                    .unwrap_or_default(),
                if self.mtp_dtypes.is_empty() {
                    String::new()
                } else {
                    format!(", {}", self.mtp_dtypes.join("/"))
                },
                if self.mlx_affine_quantized {
                    ", MLX affine-quantized"
                } else {
                    ""
                }
            );
        } else {
            let _ = writeln!(s, "MTP head: no");
        }
        if !self.evidence.is_empty() {
            let _ = writeln!(s, "evidence: {}", self.evidence.join(", "));
        }
        match &self.vision_evidence {
            Some(e) if self.vision => {
                let _ = writeln!(s, "vision tower: yes ({e})");
            }
            _ => {
                let _ = writeln!(s, "vision tower: no");
            }
        }
        if let Some(c) = &self.config_claim {
            let _ = writeln!(s, "config claims: {c} (a claim, not evidence)");
        }
        if let Some(r) = &self.registry {
            let _ = writeln!(
                s,
                "registry: {} ({:?}, depth {}){}",
                r.id,
                r.status,
                r.default_depth,
                r.drafter
                    .as_ref()
                    .map(|d| format!(", drafter {d}"))
                    .unwrap_or_default()
            );
        }
        if let Some(c) = &self.companion {
            let _ = writeln!(s, "companion: {}", c.message);
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        let _ = writeln!(s, "runtimes:");
        for r in &self.runtimes {
            let _ = writeln!(
                s,
                "  {:<13}{}  {}\n  {:<13}     {}",
                r.runtime.as_str(),
                if r.can_run_mtp { "MTP" } else { " - " },
                r.command,
                "",
                r.note
            );
        }
        let _ = writeln!(s, "bytes read: {}", self.bytes_read);
        s
    }
}

fn style_name(s: MtpStyle) -> &'static str {
    match s {
        MtpStyle::MtpPrefix => "mtp.* tensors",
        MtpStyle::NextN => "NextN layers",
        MtpStyle::GgufNextN => "GGUF nextn blocks",
        MtpStyle::Drafter => "drafter layout",
    }
}

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
            let offline = || crate::hub::HubError::Offline {
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
    Err(crate::hub::HubError::Http {
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
    let repo = crate::repo::repo_from_cache_path(path);
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

/// Tensor names with their dtype when a header gave one.
pub(crate) type WeightNames = Vec<(String, Option<String>)>;

/// Reads every tensor name of a safetensors artifact listed in `files`: from the index when
/// there is one (names only; the weight map is returned too), else from each file's header.
pub(crate) fn read_weight_names(
    reader: &dyn Reader,
    files: &[FileEntry],
    only: Option<&str>,
    files_read: &mut Vec<String>,
) -> Result<(WeightNames, Option<BTreeMap<String, String>>), DetectError> {
    if only.is_none() && files.iter().any(|f| f.path == INDEX_FILE) {
        if let Some(b) = reader.read_small(INDEX_FILE, MAX_INDEX_LEN)? {
            files_read.push(INDEX_FILE.to_string());
            let wm = parse_index(&b, &reader.describe(INDEX_FILE))?;
            let names = wm.keys().map(|k| (k.clone(), None)).collect();
            return Ok((names, Some(wm)));
        }
    }
    let mut out = Vec::new();
    let st: Vec<&FileEntry> = files
        .iter()
        .filter(|f| match only {
            Some(o) => f.path == o,
            None => f.path.to_ascii_lowercase().ends_with(".safetensors"),
        })
        .take(MAX_HEADERS)
        .collect();
    for f in st {
        let h = read_st_header(reader, &f.path, files_read)?;
        out.extend(h.tensors.into_iter().map(|t| (t.name, Some(t.dtype))));
    }
    Ok((out, None))
}

/// Reads exactly the 8-byte length and the JSON header of one safetensors file.
fn read_st_header(
    reader: &dyn Reader,
    file: &str,
    files_read: &mut Vec<String>,
) -> Result<crate::st::StHeader, DetectError> {
    let desc = reader.describe(file);
    let (first, total) = reader.read_range(file, 0, 8)?;
    let n = header_len(&first, total, &desc)?;
    let (json, _) = reader.read_range(file, 8, n)?;
    if (json.len() as u64) < n {
        return Err(DetectError::Safetensors {
            file: desc,
            message: format!("header of {n} bytes was cut at {} bytes", json.len()),
        });
    }
    files_read.push(file.to_string());
    parse_header(&json, total, &desc)
}

fn read_config(
    reader: &dyn Reader,
    files_read: &mut Vec<String>,
) -> Result<Option<ConfigInfo>, DetectError> {
    match reader.read_small("config.json", MAX_CONFIG_LEN)? {
        Some(b) => {
            files_read.push("config.json".into());
            Ok(Some(parse_config(&b, &reader.describe("config.json"))?))
        }
        None => Ok(None),
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

fn probe_safetensors(
    reader: &dyn Reader,
    files: &[FileEntry],
    chosen: Option<&FileEntry>,
    opts: &ProbeOptions,
    files_read: &mut Vec<String>,
) -> Result<ProbeReport, DetectError> {
    let mut r = empty_report(Format::Safetensors);
    let cfg = read_config(reader, files_read)?;
    let reg = opts.registry();
    if let Some(c) = &cfg {
        r.model_type = c.model_type.clone();
        r.arch = c.model_type.clone();
        r.hidden_size = c.hidden_size;
        r.vocab_size = c.vocab_size;
        r.base_layers = c.num_hidden_layers;
        if let Some((k, n)) = &c.mtp_claim {
            r.config_claim = Some(format!("{k} = {n}"));
        }
        r.config_claims_mtp = c.claims_mtp();
        let mt = c.model_type.as_deref().unwrap_or_default();
        if reg.runtimes.is_drafter_type(mt) {
            r.role = Role::Drafter;
        }
    }
    let base = r.base_layers;
    let only = chosen.map(|f| f.path.as_str());
    let (mut names, index) = read_weight_names(reader, files, only, files_read)?;
    let pairs = |names: &[(String, Option<String>)]| -> MtpTensorSummary {
        let it = names.iter().map(|(n, d)| (n.as_str(), d.as_deref()));
        match r.role {
            Role::Drafter => MtpTensorSummary::from_drafter_names(it),
            Role::Target => MtpTensorSummary::from_names(it, base),
        }
    };
    let mut summary = pairs(&names);
    if let Some(wm) = index.filter(|_| !summary.is_empty()) {
        // The index gives names only: read the headers of the shards that hold the head,
        // for its dtypes.
        let mut shards: Vec<&String> = summary.tensors.iter().filter_map(|t| wm.get(t)).collect();
        shards.sort();
        shards.dedup();
        let mut dtypes: BTreeMap<String, String> = BTreeMap::new();
        for shard in shards.into_iter().take(MAX_HEADERS) {
            let h = read_st_header(reader, shard, files_read)?;
            dtypes.extend(h.tensors.into_iter().map(|t| (t.name, t.dtype)));
        }
        for (n, d) in names.iter_mut() {
            if let Some(dt) = dtypes.get(n) {
                *d = Some(dt.clone());
            }
        }
        summary = pairs(&names);
    }
    apply_summary(&mut r, &summary);
    if let Some((n, _)) = names
        .iter()
        .find(|(n, _)| crate::tensors::vision_tensor_key(n).is_some())
    {
        r.vision = true;
        r.vision_evidence = Some(n.clone());
    }
    r.mlx_quantized_weights = cfg.as_ref().is_some_and(|c| c.quant_bits.is_some())
        || names
            .iter()
            .any(|(n, _)| crate::tensors::is_mlx_quant_tensor(n));
    if r.role == Role::Drafter {
        // A drafter without its core tensors is no head at all.
        let keys: Vec<&str> = summary
            .tensors
            .iter()
            .filter_map(|n| crate::tensors::drafter_tensor_key(n))
            .collect();
        let has_core = keys
            .iter()
            .any(|k| k.starts_with("fc.") || k.starts_with("eh_proj."))
            && !summary.layers.is_empty();
        if !has_core {
            r.mtp_head = false;
            r.warnings.push(format!(
                "config.json declares drafter type `{}` but the weights lack its core tensors (fc/eh_proj and layers.N.*)",
                r.model_type.as_deref().unwrap_or_default()
            ));
        }
    }
    if let Some(c) = &cfg {
        let claim = c.mtp_claim.clone();
        match (&claim, r.mtp_head) {
            (Some((k, n)), false) if *n > 0 && r.role == Role::Target => r.warnings.push(format!(
                "config.json claims {n} MTP layer(s) (`{k}`) but the weights carry no MTP tensors; the claim is ignored (MLX quantizations that drop the head keep this key)"
            )),
            (Some((k, n)), true) if *n != r.mtp_layers && r.role == Role::Target => {
                r.warnings.push(format!(
                    "config.json claims {n} MTP layer(s) (`{k}`) but the weights carry {}",
                    r.mtp_layers
                ))
            }
            (None, true) if r.role == Role::Target => r.warnings.push(
                "the weights carry MTP tensors that config.json does not declare; loaders that read only the config will ignore the head".into(),
            ),
            _ => {}
        }
        if c.quant_bits.is_some() {
            r.mlx_affine_quantized |= r.mtp_head && summary.mlx_affine_quantized;
        }
        if r.role == Role::Target
            && r.mtp_head
            && summary.styles.contains(&MtpStyle::MtpPrefix)
            && (c.quant_bits.is_some() || summary.mlx_affine_quantized)
        {
            r.warnings.push(
                "an MLX checkpoint that keeps mtp.* tensors: released mlx-lm (0.31.3 and earlier) mis-loads it without an error; load it through mlx-vlm".into(),
            );
        }
    } else {
        r.warnings
            .push("no config.json: architecture and base depth unknown; NextN layers are recognised by their eh_proj/enorm/hnorm tensors only".into());
    }
    if r.mtp_head && !r.mtp_dtypes.is_empty() {
        r.evidence.truncate(EVIDENCE_NAMES + 1);
    }
    Ok(r)
}

/// Reads a GGUF header through `reader`, growing the prefix from `first` up to `cap` when
/// the metadata is longer. Returns the header and whether it is complete.
pub fn read_gguf_header(
    reader: &dyn Reader,
    file: &str,
    first: u64,
    cap: u64,
) -> Result<(GgufHeader, bool), DetectError> {
    let desc = reader.describe(file);
    let (mut buf, total) = reader.read_range(file, 0, first.min(cap).max(8))?;
    loop {
        match parse_gguf(&buf, total) {
            Ok(GgufParse::Complete(h)) => return Ok((h, true)),
            Ok(GgufParse::NeedMore { needed, partial }) => {
                let limit = cap.min(total);
                let have = buf.len() as u64;
                if have >= limit {
                    return Ok((partial, false));
                }
                let want = needed.max(have.saturating_mul(2)).min(limit);
                let (more, _) = reader.read_range(file, have, want - have)?;
                if more.is_empty() {
                    return Err(DetectError::Gguf {
                        file: desc,
                        kind: gguf::GgufErrorKind::Truncated {
                            what: "header".into(),
                            at: have,
                            needed: want - have,
                            file_len: have,
                        },
                    });
                }
                buf.extend_from_slice(&more);
            }
            Err(kind) => return Err(DetectError::Gguf { file: desc, kind }),
        }
    }
}

/// `(stem, index, count)` of a split GGUF name `…-00001-of-00003.gguf`.
pub(crate) fn split_parts(name: &str) -> Option<(&str, u32, u32)> {
    let base = name.strip_suffix(".gguf")?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, idx) = rest.rsplit_once('-')?;
    if idx.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((stem, idx.parse().ok()?, count.parse().ok()?))
}

/// Whether `name` (a file name or repo-relative path) is a GGUF one loads as a model: a
/// `.gguf` that is not a vision projector (`mmproj*`) and, of a split model, the first shard
/// (llama.cpp finds the others from it).
pub fn is_gguf_model_file(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l.ends_with(".gguf")
        && !l.rsplit('/').next().unwrap_or(&l).starts_with("mmproj")
        && split_parts(name).is_none_or(|(_, i, _)| i == 1)
}

fn choose_gguf<'a>(
    files: &'a [FileEntry],
    style: CommandStyle,
    warnings: &mut Vec<String>,
) -> Option<&'a FileEntry> {
    let candidates: Vec<&FileEntry> = files
        .iter()
        .filter(|f| is_gguf_model_file(&f.path))
        .collect();
    let pick = candidates
        .iter()
        .find(|f| f.path.to_ascii_uppercase().contains("Q4_K_M"))
        .or_else(|| candidates.first())
        .copied();
    if let Some(p) = pick {
        if candidates.len() > 1 {
            let how = match style {
                CommandStyle::Cli => "pass --file NAME to choose another",
                CommandStyle::Library => "set ProbeOptions::file to choose another",
            };
            warnings.push(format!(
                "{} GGUF files; probed {} ({how})",
                candidates.len(),
                p.path
            ));
        }
    }
    pick
}

fn probe_gguf(
    reader: &dyn Reader,
    files: &[FileEntry],
    chosen: Option<&FileEntry>,
    opts: &ProbeOptions,
    files_read: &mut Vec<String>,
) -> Result<ProbeReport, DetectError> {
    let mut r = empty_report(Format::Gguf);
    let file = match chosen {
        Some(f) => f,
        None => choose_gguf(files, opts.style, &mut r.warnings).ok_or_else(|| {
            DetectError::NoWeights {
                place: reader.place(),
            }
        })?,
    };
    r.file = Some(file.path.clone());
    // llama.cpp's vision lane is a separate projector file (mtmd's `--mmproj`)
    if let Some(m) = files.iter().find(|f| {
        let l = f.path.to_ascii_lowercase();
        let base = l.rsplit('/').next().unwrap_or(&l);
        base.starts_with("mmproj") && base.ends_with(".gguf")
    }) {
        r.vision = true;
        r.vision_evidence = Some(m.path.clone());
    }
    let (h, complete) = read_gguf_header(reader, &file.path, opts.gguf_prefix, opts.gguf_cap)?;
    files_read.push(file.path.clone());
    let arch = h.architecture().map(String::from);
    let key_layers = h.nextn_predict_layers();
    let block_count = h.block_count();
    r.arch = arch.clone();
    r.base_layers = match (block_count, key_layers) {
        (Some(b), Some(n)) => b.checked_sub(n),
        (Some(b), None) => Some(b),
        _ => None,
    };
    let mut tensors: Vec<(String, String)> = h
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.type_name()))
        .collect();
    let mut all_complete = complete;
    // Split GGUF: the NextN blocks are usually in the last shard.
    if let Some((stem, 1, count)) = split_parts(&file.path) {
        for i in 2..=count.min(256) {
            let name = format!("{stem}-{i:05}-of-{count:05}.gguf");
            if !files.iter().any(|f| f.path == name) {
                r.warnings
                    .push(format!("split GGUF shard {name} is missing"));
                continue;
            }
            let (sh, c) = read_gguf_header(reader, &name, SHARD_PREFIX, opts.gguf_cap)?;
            files_read.push(name);
            all_complete &= c;
            tensors.extend(sh.tensors.iter().map(|t| (t.name.clone(), t.type_name())));
        }
    }
    let summary = MtpTensorSummary::from_names(
        tensors.iter().map(|(n, d)| (n.as_str(), Some(d.as_str()))),
        r.base_layers,
    );
    apply_summary(&mut r, &summary);
    let key = arch.as_deref().map(|a| format!("{a}.nextn_predict_layers"));
    match (key_layers, r.mtp_head, all_complete) {
        (Some(n), true, _) => {
            if let Some(k) = &key {
                r.evidence.insert(0, format!("{k} = {n}"));
            }
        }
        (Some(n), false, false) if n > 0 => {
            r.mtp_head = true;
            r.mtp_layers = n;
            r.mtp_style = Some(MtpStyle::GgufNextN);
            if let Some(k) = &key {
                r.evidence.push(format!("{k} = {n}"));
            }
            r.warnings.push(format!(
                "the tensor table lies beyond the {}-byte read cap; the head is inferred from the header key alone",
                opts.gguf_cap
            ));
        }
        (Some(n), false, true) if n > 0 => r.warnings.push(format!(
            "the header declares {n} NextN layer(s) ({}) but no blk.N.nextn.* tensor exists; no head",
            key.clone().unwrap_or_default()
        )),
        (None, true, _) => r.warnings.push(format!(
            "blk.N.nextn.* tensors without a `{}` key; llama.cpp will not load them as a head",
            key.clone().unwrap_or_default()
        )),
        _ => {}
    }
    Ok(r)
}

struct ModelRef<'a> {
    model: &'a str,
    file: Option<&'a str>,
}

fn runtime_support(
    r: &ProbeReport,
    reg: &Registry,
    target: &ModelRef<'_>,
    depth: u32,
    companion_ok: bool,
    style: CommandStyle,
) -> Vec<RuntimeSupport> {
    let model = target.model;
    let launch_command =
        |rt, model: &str, file, mtp, depth| launch_command_in(style, rt, model, file, mtp, depth);
    let native_code =
        |model: &str, drafter, mtp, depth| native_in(style, model, drafter, mtp, depth);
    // the drafter option as the reader will write it
    let drafter_opt = match style {
        CommandStyle::Library => "`drafter`",
        CommandStyle::Cli => "--drafter",
    };
    let mlx_quant = r.mlx_affine_quantized || r.mlx_quantized_weights;
    let t = &reg.runtimes;
    let line =
        |runtime, can: bool, verdict, reason: Option<Reason>, command: String, note: String| {
            RuntimeSupport {
                runtime,
                can_run_mtp: can,
                verdict,
                reason: if can { None } else { reason },
                command,
                note,
            }
        };
    let arch = r.arch.clone().unwrap_or_default();
    let mt = r.model_type.clone().unwrap_or_default();
    let mut out = Vec::new();
    if r.role == Role::Drafter {
        let target = r
            .registry
            .as_ref()
            .and_then(|e| reg.models.iter().find(|m| m.id == e.id))
            .and_then(|m| m.targets.first().cloned())
            .unwrap_or_else(|| "<target>".into());
        let ok = r.mtp_head && mt == "qwen3_5_mtp";
        for rt in Runtime::ALL {
            out.push(match rt {
                Runtime::Native => line(
                    rt,
                    ok,
                    if ok { Verdict::CompanionReady } else { Verdict::FormatUnsupported },
                    Some(if r.mtp_head { Reason::RuntimeUnsupported } else { Reason::DrafterMismatch }),
                    native_code(&target, Some(model), true, depth),
                    if ok {
                        format!("a companion drafter: load the target and pass this as {drafter_opt}")
                    } else {
                        format!("the native engine runs qwen3_5_mtp drafters with their core tensors; this is `{mt}`")
                    },
                ),
                _ => line(
                    rt,
                    false,
                    Verdict::FormatUnsupported,
                    Some(Reason::RuntimeUnsupported),
                    launch_command(rt, model, None, false, depth),
                    "a companion drafter is loaded next to its target, not served on its own".into(),
                ),
            });
        }
        return out;
    }
    for rt in Runtime::ALL {
        let cmd = |mtp: bool| launch_command(rt, model, target.file, mtp, depth);
        out.push(match (rt, r.format) {
            (Runtime::Ollama, _) => line(
                rt,
                false,
                Verdict::NotExposed,
                Some(Reason::RuntimeUnsupported),
                cmd(false),
                "Ollama does not expose MTP; serve the GGUF from llama-server or LM Studio".into(),
            ),
            (Runtime::LlamaServer | Runtime::LmStudio | Runtime::Gguf, Format::Safetensors) => line(
                rt,
                false,
                Verdict::FormatUnsupported,
                Some(Reason::RuntimeUnsupported),
                format!(
                    "python convert_hf_to_gguf.py {} --outfile model.gguf {} {}",
                    if mlx_quant { "<original checkpoint>".to_string() } else { shell_quote(model) },
                    if rt == Runtime::Gguf { "; then" } else { "&&" },
                    launch_command(rt, "./model.gguf", None, r.mtp_head, depth)
                ),
                if mlx_quant {
                    "llama.cpp serves GGUF, and its convert_hf_to_gguf.py does not read MLX-quantized weights: convert the original checkpoint (it keeps the nextn head) or use a GGUF repo".into()
                } else {
                    "llama.cpp serves GGUF: convert with llama.cpp's convert_hf_to_gguf.py (it keeps the nextn head) or use a GGUF repo".into()
                },
            ),
            (Runtime::LlamaServer | Runtime::LmStudio | Runtime::Gguf, Format::Gguf) => {
                let graph = t.llama_cpp_supports(&arch);
                match (r.mtp_head, graph) {
                    (true, true) => line(
                        rt,
                        true,
                        Verdict::HeadPresentRuntimeReady,
                        None,
                        cmd(true),
                        format!("head present; llama.cpp {} has the {arch} MTP graph", t.llama_cpp_build),
                    ),
                    (false, true) => line(
                        rt,
                        false,
                        Verdict::RuntimeReadyNoHead,
                        Some(Reason::NoMtpHead),
                        cmd(false),
                        format!("llama.cpp implements MTP for {arch}, but this file carries no nextn tensors; use a quantization that keeps the head"),
                    ),
                    (true, false) => line(
                        rt,
                        false,
                        Verdict::HeadPresentNeedsNewerRuntime,
                        Some(Reason::RuntimeUnsupported),
                        cmd(false),
                        format!("head present, but llama.cpp {} has no MTP graph for `{arch}`; needs a newer build", t.llama_cpp_build),
                    ),
                    (false, false) => line(
                        rt,
                        false,
                        Verdict::NoHeadRuntimeUnsupported,
                        Some(Reason::NoMtpHead),
                        cmd(false),
                        format!("no head, and no llama.cpp MTP graph for `{arch}`"),
                    ),
                }
            }
            (Runtime::Vllm, Format::Gguf) => line(
                rt,
                false,
                Verdict::FormatUnsupported,
                Some(Reason::RuntimeUnsupported),
                cmd(false),
                "vLLM runs MTP from Hugging Face safetensors checkpoints, not GGUF".into(),
            ),
            (Runtime::Vllm, Format::Safetensors) => {
                let supported = t.vllm_supports(&mt);
                if mlx_quant {
                    line(rt, false, Verdict::FormatUnsupported, Some(Reason::RuntimeUnsupported), cmd(false),
                        "MLX affine-quantized weights do not load in vLLM; use the original checkpoint".into())
                } else {
                    match (r.mtp_head, supported) {
                        (true, true) => line(rt, true, Verdict::HeadPresentRuntimeReady, None, cmd(true),
                            format!("head present; vLLM runs MTP for {mt}")),
                        (false, true) => line(rt, false, Verdict::RuntimeReadyNoHead, Some(Reason::NoMtpHead), cmd(false),
                            format!("vLLM runs MTP for {mt}, but these weights carry no head (vLLM cannot use a separate MLX drafter)")),
                        (true, false) => line(rt, false, Verdict::HeadPresentNeedsNewerRuntime, Some(Reason::RuntimeUnsupported), cmd(false),
                            format!("head present, but `{mt}` is not in the vLLM MTP table")),
                        (false, false) => line(rt, false, Verdict::NoHeadRuntimeUnsupported, Some(Reason::NoMtpHead), cmd(false),
                            format!("no head, and `{mt}` is not in the vLLM MTP table")),
                    }
                }
            }
            (Runtime::Native, Format::Gguf) => line(
                rt,
                false,
                Verdict::FormatUnsupported,
                Some(Reason::RuntimeUnsupported),
                native_code(model, None, false, depth),
                "the native engine reads safetensors; serve this GGUF from llama-server or LM Studio".into(),
            ),
            (Runtime::Native, Format::Safetensors) => {
                let supported = t.native_supports(&mt);
                let companion = r.companion.as_ref();
                if !supported {
                    line(rt, false,
                        if r.mtp_head { Verdict::HeadPresentNeedsNewerRuntime } else { Verdict::NoHeadRuntimeUnsupported },
                        Some(Reason::RuntimeUnsupported), native_code(model, None, false, depth),
                        format!("the native engine runs {}; this is `{mt}`", t.native_model_types.join(", ")))
                } else if r.mtp_head {
                    line(rt, true, Verdict::HeadPresentRuntimeReady, None, native_code(model, None, true, depth),
                        "head embedded in the weights".into())
                } else if let Some(c) = companion {
                    let code = native_code(model, Some(&c.repo), companion_ok, depth);
                    match (c.cached, companion_ok) {
                        (true, true) => line(rt, true, Verdict::CompanionReady, None, code, c.message.clone()),
                        (true, false) => line(rt, false, Verdict::CompanionMismatch, c.reason, code, c.message.clone()),
                        _ => line(rt, false, Verdict::CompanionNotCached, Some(Reason::MtpHeadNotCached), code, c.message.clone()),
                    }
                } else {
                    line(rt, false, Verdict::RuntimeReadyNoHead, Some(Reason::NoMtpHead), native_code(model, None, false, depth),
                        format!("the weights carry no MTP head and no companion drafter is registered; name one with {drafter_opt}"))
                }
            }
        });
    }
    out
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
