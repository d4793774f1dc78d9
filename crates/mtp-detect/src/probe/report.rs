//! The probe's report and options: what a caller reads ([`ProbeReport`], its lanes) and
//! sets ([`ProbeOptions`]).

use super::*;

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

    pub(super) fn registry(&self) -> &Registry {
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

    pub(super) fn new(e: &Entry, how: MatchKind) -> Self {
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
}
