//! `create_llm("native" | "mlx", …)`: resolves the checkpoint, decides the MTP lane from
//! artifact evidence (mtp-detect), loads the engine once per checkpoint, and builds the
//! provider.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device};
use mtp_contract::{
    resolve, Extra, IntRange, KvType, Lane, OptionError, Provider, ProviderError, ProviderOptions,
    Reason, SpeculationMode,
};
use mtp_detect::{
    check_drafter, probe_local, resolve_model, CacheConfig, ResolvedArtifact, Runtime,
};
use mtp_engine::{Arith, Engine, WeightDtype};

use super::backend::{Backend, DrafterLane};
use super::disk_cache::{DiskCache, DEFAULT_DISK_BUDGET_BYTES};
use super::engine_backend::EngineBackend;
use super::prefix_cache::{DEFAULT_BUDGET_BYTES, DEFAULT_CHECKPOINTS_PER_KEY};
use super::provider::{Loaded, NativeProvider};
use super::shared::SharedModels;

/// The `extra` option keys the native provider reads.
pub const EXTRA_KEYS: [&str; 13] = [
    "device",
    "dtype",
    "cache_type",
    "arith",
    "max_batch",
    "prefill_chunk",
    "prompt_cache_bytes",
    "prompt_cache_checkpoints",
    "prompt_cache_dir",
    "prompt_cache_disk_bytes",
    "ctx_size",
    "threads",
    "parse_special",
];

/// Where the native engine runs. This version of the engine runs on the CPU only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NativeDevice {
    /// The CPU (the engine's own kernels).
    #[default]
    Cpu,
}

impl std::str::FromStr for NativeDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(NativeDevice::Cpu),
            other => Err(format!(
                "device `{other}` is not available: this version of the native engine runs on the CPU only (`cpu`)"
            )),
        }
    }
}

/// The precision the weights are held in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NativeDtype {
    /// As the checkpoint stores them (MLX-quantized weights stay packed).
    #[default]
    Auto,
    /// f32.
    F32,
    /// bf16.
    Bf16,
    /// f16.
    F16,
}

impl std::str::FromStr for NativeDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(NativeDtype::Auto),
            "f32" => Ok(NativeDtype::F32),
            "bf16" => Ok(NativeDtype::Bf16),
            "f16" => Ok(NativeDtype::F16),
            other => Err(format!(
                "dtype `{other}` is not known; use auto (weights as the checkpoint stores them), f32, bf16 or f16"
            )),
        }
    }
}

impl NativeDtype {
    fn weight_dtype(self) -> WeightDtype {
        match self {
            NativeDtype::Auto => WeightDtype::Stored,
            NativeDtype::F32 => WeightDtype::Convert(DType::F32),
            NativeDtype::Bf16 => WeightDtype::Convert(DType::BF16),
            NativeDtype::F16 => WeightDtype::Convert(DType::F16),
        }
    }
}

/// The native provider's own options, typed. The command line and `mtp serve` build them from
/// their flags and call [`create_with`]; a library caller that names the provider by string
/// (`create_llm("native", …)`) gives them as [`ProviderOptions::extra`] strings, which
/// [`NativeOptions::from_extra`] reads once, at that edge.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeOptions {
    /// Where the engine runs.
    pub device: NativeDevice,
    /// The weights' precision.
    pub dtype: NativeDtype,
    /// The KV cache's element type (f32 by default: the reference's output; f16 or bf16 halve
    /// the cache and the bytes a long context reads per step).
    pub cache_type: KvType,
    /// The arithmetic of products with 4- and 8-bit MLX matrices (`exact` by default: mlx's, bit
    /// for bit; `fast`: int8 activations, integer products).
    pub arith: Arith,
    /// The prefix cache's memory budget.
    pub prompt_cache_bytes: usize,
    /// Checkpoints kept per prompt in the prefix cache.
    pub prompt_cache_checkpoints: usize,
    /// The prefix cache's disk tier: its folder, when there is one.
    pub prompt_cache_dir: Option<PathBuf>,
    /// The disk tier's byte budget.
    pub prompt_cache_disk_bytes: u64,
    /// The context length (positive).
    pub ctx_size: Option<usize>,
    /// The engine's threads (positive; set once per process).
    pub threads: Option<usize>,
    /// Continuous batching of up to this many sequences (positive).
    pub max_batch: Option<usize>,
    /// Prompt tokens per prefill slice while other sequences decode (positive).
    pub prefill_chunk: Option<usize>,
    /// Special-token strings in client text become special tokens (default: plain text).
    pub parse_special: bool,
}

impl Default for NativeOptions {
    fn default() -> Self {
        NativeOptions {
            device: NativeDevice::Cpu,
            dtype: NativeDtype::Auto,
            cache_type: KvType::F32,
            arith: Arith::Exact,
            prompt_cache_bytes: DEFAULT_BUDGET_BYTES,
            prompt_cache_checkpoints: DEFAULT_CHECKPOINTS_PER_KEY,
            prompt_cache_dir: None,
            prompt_cache_disk_bytes: DEFAULT_DISK_BUDGET_BYTES,
            ctx_size: None,
            threads: None,
            max_batch: None,
            prefill_chunk: None,
            parse_special: false,
        }
    }
}

fn shared() -> &'static SharedModels<Loaded<EngineBackend>> {
    static SHARED: OnceLock<SharedModels<Loaded<EngineBackend>>> = OnceLock::new();
    SHARED.get_or_init(SharedModels::default)
}

/// Number of checkpoints whose weights are currently loaded by native providers.
pub fn loaded_checkpoints() -> usize {
    shared().loaded()
}

/// Number of loaded copies of the checkpoint at `path` (one per drafter variant).
pub fn loaded_copies(path: &Path) -> usize {
    shared().loaded_at(path)
}

fn load_err(model: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::ModelLoad {
        model: model.to_string(),
        message: message.into(),
    }
}

/// Option names of the seed project's native provider that differ from ours: accepted as
/// aliases (`mlx_batching`) or answered with why they do not apply (`mlx_ple_offload`).
pub const SEED_ALIASES: [&str; 2] = ["mlx_batching", "mlx_ple_offload"];

/// The batch `mlx_batching=true` asks for when `max_batch` is not given: the seed's
/// "scheduled" runtime (continuous batching, MTP cohorts) with room for a few callers.
pub const SEED_BATCHING_MAX_BATCH: usize = 4;

/// The names `dtype` takes.
const DTYPES: [(&str, NativeDtype); 4] = [
    ("auto", NativeDtype::Auto),
    ("f32", NativeDtype::F32),
    ("bf16", NativeDtype::Bf16),
    ("f16", NativeDtype::F16),
];

/// The names `cache_type` takes.
const KV_TYPES: [(&str, KvType); 3] = [
    ("f32", KvType::F32),
    ("f16", KvType::F16),
    ("bf16", KvType::Bf16),
];

/// The names `arith` takes.
const ARITHS: [(&str, Arith); 2] = [("exact", Arith::Exact), ("fast", Arith::Fast)];

/// `max_batch` from ours or the seed's `mlx_batching` (true: batching at
/// [`SEED_BATCHING_MAX_BATCH`] unless `max_batch` says; false: one call at a time, which a
/// `max_batch` beside it contradicts).
fn max_batch(x: &Extra, given: Option<usize>) -> Result<Option<usize>, OptionError> {
    match (x.flag("mlx_batching")?, given) {
        (None, given) => Ok(given),
        (Some(true), Some(n)) => Ok(Some(n)),
        (Some(true), None) => Ok(Some(SEED_BATCHING_MAX_BATCH)),
        (Some(false), None) => Ok(None),
        (Some(false), Some(n)) => Err(OptionError::conflict(
            "mlx_batching",
            format!(
                "false (one call at a time) contradicts `max_batch` {n}; `mlx_batching` is the \
                 seed's name for batching: give `max_batch` alone"
            ),
        )),
    }
}

/// A count as the engine takes it (a `usize`; on a 32-bit host a larger one is refused).
fn size(key: &str, n: Option<u64>) -> Result<Option<usize>, OptionError> {
    n.map(|n| {
        usize::try_from(n).map_err(|_| {
            OptionError::invalid(key, n.to_string(), "an integer this machine can address")
        })
    })
    .transpose()
}

impl NativeOptions {
    /// Reads [`ProviderOptions::extra`] (keys [`EXTRA_KEYS`], and the seed's names in
    /// [`SEED_ALIASES`]) with the contract's [`Extra`], one rule per kind of value: the one
    /// place the native options' strings are parsed. An unknown key, a value that does not
    /// parse or is out of range, or a contradiction is an [`OptionError`] naming the key.
    pub fn from_extra(opts: &ProviderOptions) -> Result<NativeOptions, ProviderError> {
        let keys: Vec<&str> = EXTRA_KEYS.iter().chain(&SEED_ALIASES).copied().collect();
        let x = Extra::new("native", &keys, &opts.extra)?;
        if let Some(v) = x.flag("mlx_ple_offload")? {
            return Err(OptionError::unusable(
                "mlx_ple_offload",
                v.to_string(),
                "not applicable to this engine: it offloads the per-layer embedding (n-gram) \
                 tables of the models that have them, and the Qwen3.5-family models this engine \
                 runs have none; leave it out",
            )
            .into());
        }
        let device = match x.value("device") {
            None => NativeDevice::Cpu,
            Some(d) => match d.trim() {
                "cpu" => NativeDevice::Cpu,
                _ => {
                    return Err(OptionError::unusable(
                        "device",
                        d,
                        "this version of the native engine runs on the CPU only (`cpu`)",
                    )
                    .into())
                }
            },
        };
        // (a disk budget without the folder it is for is a mistake, not a default)
        if x.has("prompt_cache_disk_bytes") && !x.has("prompt_cache_dir") {
            return Err(OptionError::conflict(
                "prompt_cache_disk_bytes",
                "needs `prompt_cache_dir` (--cache-dir), the folder the checkpoints go to",
            )
            .into());
        }
        let d = NativeOptions::default();
        let native = NativeOptions {
            device,
            dtype: x.choice("dtype", &DTYPES)?.unwrap_or(d.dtype),
            cache_type: x.choice("cache_type", &KV_TYPES)?.unwrap_or(d.cache_type),
            arith: x.choice("arith", &ARITHS)?.unwrap_or(d.arith),
            // 0 bytes is a cache that keeps nothing
            prompt_cache_bytes: size(
                "prompt_cache_bytes",
                x.bytes("prompt_cache_bytes", IntRange::ANY)?,
            )?
            .unwrap_or(d.prompt_cache_bytes),
            prompt_cache_checkpoints: size(
                "prompt_cache_checkpoints",
                x.count("prompt_cache_checkpoints")?,
            )?
            .unwrap_or(d.prompt_cache_checkpoints),
            prompt_cache_dir: x.path("prompt_cache_dir")?,
            prompt_cache_disk_bytes: x
                .bytes("prompt_cache_disk_bytes", IntRange::ANY)?
                .unwrap_or(d.prompt_cache_disk_bytes),
            ctx_size: x.ctx_size("ctx_size")?.map(|n| n as usize),
            threads: x.threads("threads")?.map(|n| n as usize),
            max_batch: max_batch(&x, size("max_batch", x.count("max_batch")?)?)?,
            prefill_chunk: size("prefill_chunk", x.count("prefill_chunk")?)?,
            parse_special: x.flag("parse_special")?.unwrap_or(d.parse_special),
        };
        Ok(native)
    }

    /// Refuses values no engine could use, by the same ranges [`NativeOptions::from_extra`]
    /// reads strings with ([`IntRange`]): the typed path's checks.
    fn check(&self) -> Result<(), OptionError> {
        let ranged = [
            ("ctx_size", self.ctx_size, IntRange::CTX_SIZE),
            ("threads", self.threads, IntRange::THREADS),
            ("max_batch", self.max_batch, IntRange::POSITIVE),
            ("prefill_chunk", self.prefill_chunk, IntRange::POSITIVE),
            (
                "prompt_cache_checkpoints",
                Some(self.prompt_cache_checkpoints),
                IntRange::POSITIVE,
            ),
        ];
        for (key, v, range) in ranged {
            if let Some(n) = v {
                range.check(key, n as u64)?;
            }
        }
        if self
            .prompt_cache_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(OptionError::invalid(
                "prompt_cache_dir",
                "",
                "a path (it is empty)",
            ));
        }
        Ok(())
    }
}

fn local_dir(spec: &str, cache: &CacheConfig) -> Result<PathBuf, ProviderError> {
    let resolved = match resolve_model(spec, cache) {
        Err(mtp_detect::DetectError::NotFound { .. }) => {
            return Err(load_err(
                spec,
                format!("read as a path, `{spec}` does not exist (no such file or folder)"),
            ))
        }
        other => other.map_err(|e| load_err(spec, e.to_string()))?,
    };
    match resolved {
        ResolvedArtifact::Remote { repo, revision } => {
            let download = if revision == "main" {
                format!("mtp models download {repo}")
            } else {
                format!("mtp models download {repo} --revision {revision}")
            };
            Err(load_err(
                spec,
                format!(
                    "there is no folder `{spec}` here, so it was read as a Hub repo id, and \
                     {repo} ({revision}) is not in the local cache ({}); download it with \
                     `{download}`",
                    cache.hub_cache.display()
                ),
            ))
        }
        other => {
            let p = other
                .local_path()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            if p.is_file() {
                return Err(load_err(
                    spec,
                    "a single weights file is not a checkpoint directory; GGUF files run on the `gguf` provider",
                ));
            }
            Ok(p)
        }
    }
}

/// Builds the native provider (registered as `native` and `mlx`) from string options: the
/// [`ProviderOptions::extra`] keys are read once by [`NativeOptions::from_extra`].
pub fn create(
    name: &str,
    model: &str,
    opts: &ProviderOptions,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let native = NativeOptions::from_extra(opts)?;
    build(name, model, opts, native)
}

/// Builds the native provider from typed options. `opts` carries what every provider shares
/// (the speculation block); an `extra` key there would be ignored beside typed options, so it
/// is refused.
pub fn create_with(
    name: &str,
    model: &str,
    opts: &ProviderOptions,
    native: NativeOptions,
) -> Result<Arc<dyn Provider>, ProviderError> {
    opts.refuse_extra("NativeOptions")?;
    native.check()?;
    build(name, model, opts, native)
}

fn build(
    name: &str,
    model: &str,
    opts: &ProviderOptions,
    native: NativeOptions,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let NativeOptions {
        device,
        dtype,
        cache_type,
        arith,
        prompt_cache_bytes: cache_bytes,
        prompt_cache_checkpoints: checkpoints,
        prompt_cache_dir,
        prompt_cache_disk_bytes,
        ctx_size,
        threads,
        max_batch,
        prefill_chunk,
        parse_special,
    } = native;
    let (device, runtime) = match device {
        NativeDevice::Cpu => (Device::Cpu, "mtp-engine-cpu".to_string()),
    };
    let dtype = dtype.weight_dtype();
    let cache_dir = prompt_cache_dir.map(|d| (d, prompt_cache_disk_bytes));
    if let Some(n) = threads {
        let running = mtp_engine::team::set_threads(n);
        if running != n {
            return Err(OptionError::unusable(
                "threads",
                n.to_string(),
                format!(
                    "the engine's threads are set once per process, and this one already runs \
                     with {running}; leave `threads` out or give {running}"
                ),
            )
            .into());
        }
    }
    let cache = CacheConfig::from_env();
    let dir = local_dir(model, &cache)?;
    let report = probe_local(&dir).map_err(|e| load_err(model, e.to_string()))?;
    if report.format == mtp_detect::Format::Gguf {
        let file = report.file.as_deref().unwrap_or("the .gguf file");
        return Err(load_err(
            model,
            format!(
                "{} holds GGUF weights ({file}), which the native engine does not read (it loads \
                 safetensors checkpoints): run the file with the `gguf` provider or llama-server",
                dir.display()
            ),
        ));
    }
    let default_resolved = resolve(opts.speculation.as_ref(), None);
    let default_mode = default_resolved.mode;
    let explicit = opts.speculation.as_ref().and_then(|s| s.drafter.clone());

    // Decide the lane from evidence, and which drafter directory (if any) the engine loads.
    let (lane, drafter_dir): (Lane, Option<PathBuf>) = if default_mode == SpeculationMode::Off {
        (
            Lane::Unavailable {
                // what a request that asks for speculation is told: the lane was not loaded at
                // start-up (a request that does not ask is told the block's own reason)
                reason: Reason::LaneNotLoaded,
                message: Reason::LaneNotLoaded.default_message().into(),
            },
            None,
        )
    } else if let Some(d) = explicit {
        // a drafter named as a path that is not there is the caller's mistake: say so, instead
        // of running target-only with a download hint that would reject the path
        if let Err(mtp_detect::DetectError::NotFound { path }) = resolve_model(&d, &cache) {
            return Err(load_err(
                model,
                format!("the drafter {path} does not exist (it was read as a path)"),
            ));
        }
        match local_dir(&d, &cache) {
            Err(_) => (
                Lane::Unavailable {
                    reason: Reason::MtpHeadNotCached,
                    message: format!("MTP acceleration off: drafter {d} is not downloaded; download it with `mtp models download {d}`."),
                },
                None,
            ),
            Ok(ddir) => match check_drafter(&dir, &ddir) {
                Ok(info) => {
                    let (default_depth, depth_source) =
                        mtp_detect::default_depth(info.config_depth, report.registry.as_ref());
                    (
                    Lane::Ready {
                        drafter: d.clone(),
                        default_depth,
                        depth_source,
                        output_preserving: report.registry.as_ref().and_then(|r| r.output_preserving),
                    },
                    Some(ddir),
                    )
                }
                Err(e) => (
                    Lane::Unavailable {
                        reason: e.reason(),
                        message: format!("MTP acceleration off: drafter {d} cannot be used: {e}"),
                    },
                    None,
                ),
            },
        }
    } else {
        let lane = report.lane(Runtime::Native);
        let ddir = match (&lane, report.mtp_head, &report.companion) {
            (Lane::Ready { .. }, false, Some(c)) => c.path.as_ref().map(PathBuf::from),
            _ => None,
        };
        (lane, ddir)
    };
    // The native engine verifies every proposal against the target exactly, so greedy and
    // seeded output is unchanged whatever the drafter (tested at depths 1-8): where the
    // registry knows nothing about the pairing it is output-preserving here; what the registry
    // says (`false` where a divergence was seen) is reported as it is.
    let lane = match lane {
        Lane::Ready {
            drafter,
            default_depth,
            depth_source,
            output_preserving,
        } => Lane::Ready {
            drafter,
            default_depth,
            depth_source,
            output_preserving: output_preserving.or(Some(true)),
        },
        other => other,
    };
    let want_head = matches!(lane, Lane::Ready { .. });
    // (a provider with a prefix cache on disk gets a load of its own: the folder is locked to
    // the process that uses it, and providers without one must not write to it; so does one
    // that parses special tokens in client text, a setting of the loaded backend)
    let variant = format!(
        "{runtime}:{dtype:?}:{cache_type}:{arith}:{}{}{}",
        match (&drafter_dir, want_head) {
            (Some(d), _) => d.display().to_string(),
            (None, true) => "embedded".into(),
            (None, false) => "target-only".into(),
        },
        cache_dir
            .as_ref()
            .map(|(d, b)| format!(":disk cache {} ({b} bytes)", d.display()))
            .unwrap_or_default(),
        if parse_special { ":parse_special" } else { "" }
    );
    let drafter_lane = match &lane {
        Lane::Ready {
            drafter,
            default_depth,
            output_preserving,
            ..
        } => Some(DrafterLane {
            name: drafter.clone(),
            default_depth: *default_depth,
            output_preserving: *output_preserving,
        }),
        Lane::Unavailable { .. } => None,
    };
    let loaded = shared().get_or_load(&dir, &variant, || {
        let mut engine = if want_head {
            Engine::load_with_drafter(&dir, drafter_dir.as_deref(), &device, dtype)
        } else {
            Engine::load_target_only(&dir, &device, dtype)
        }
        .map_err(|e| load_err(model, e.to_string()))?;
        if want_head && engine.drafter().is_none() {
            // Evidence said there is a head; the engine must load it or say why. No fallback.
            return Err(load_err(
                model,
                "the artifact carries MTP tensors but the engine loaded no drafter from them",
            ));
        }
        engine.set_kv_type(cache_type);
        engine.set_arith(arith);
        let mut backend = EngineBackend::new(engine, drafter_lane.clone(), runtime.clone())
            .with_parse_special(parse_special);
        if let Some(c) = prefill_chunk {
            backend = backend.with_prefill_chunk(c);
        }
        // (the identity reads samples of the weights: only a disk cache needs it)
        let disk = match &cache_dir {
            Some((root, budget)) => {
                match backend.state_identity().map_err(|e| load_err(model, e))? {
                    Some(id) => Some(
                        DiskCache::open(root, &id, *budget, checkpoints)
                            .map_err(|e| load_err(model, e.to_string()))?,
                    ),
                    None => None,
                }
            }
            None => None,
        };
        let loaded = Loaded::new(backend, cache_bytes, checkpoints);
        Ok::<_, ProviderError>(match disk {
            Some(d) => loaded.with_disk(d),
            None => loaded,
        })
    })?;
    Ok(Arc::new(
        NativeProvider::new(name, model, loaded, opts.speculation.clone(), lane)
            .with_ctx_size(ctx_size)
            .with_max_batch(max_batch),
    ))
}

#[cfg(test)]
mod options_tests {
    use super::*;

    #[test]
    fn arith_is_exact_by_default_and_fast_on_request() {
        let read = |o: ProviderOptions| NativeOptions::from_extra(&o);
        assert_eq!(
            read(ProviderOptions::default()).unwrap().arith,
            Arith::Exact
        );
        let fast = ProviderOptions::default().extra("arith", "fast");
        assert_eq!(read(fast).unwrap().arith, Arith::Fast);
        let Err(e) = read(ProviderOptions::default().extra("arith", "int4")) else {
            panic!("an unknown arithmetic was accepted")
        };
        assert_eq!(
            e.to_string(),
            "invalid option: `arith` must be one of exact, fast, got `int4`"
        );
    }

    #[test]
    fn the_strings_are_read_once_into_typed_options() {
        let opts = ProviderOptions::default()
            .extra("dtype", "bf16")
            .extra("ctx_size", "4096")
            .extra("prompt_cache_dir", "/tmp/x")
            .extra("parse_special", "true")
            .extra("mlx_batching", "true");
        let n = NativeOptions::from_extra(&opts).unwrap();
        assert_eq!(n.dtype, NativeDtype::Bf16);
        assert_eq!(n.ctx_size, Some(4096));
        assert_eq!(n.prompt_cache_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(n.prompt_cache_disk_bytes, DEFAULT_DISK_BUDGET_BYTES);
        assert!(n.parse_special);
        assert_eq!(n.max_batch, Some(SEED_BATCHING_MAX_BATCH));
        assert_eq!(
            NativeOptions::from_extra(&ProviderOptions::default()).unwrap(),
            NativeOptions::default()
        );
        let bad = ProviderOptions::default().extra("dtype", "f8");
        let e = NativeOptions::from_extra(&bad).unwrap_err();
        assert!(
            e.to_string()
                .contains("`dtype` must be one of auto, f32, bf16, f16, got `f8`"),
            "{e}"
        );
        // a device this build cannot honour: refused naming the key and the value
        let e = NativeOptions::from_extra(&ProviderOptions::default().extra("device", "cuda"))
            .unwrap_err();
        match e {
            ProviderError::InvalidOption(OptionError::Unusable { key, value, why }) => {
                assert_eq!((key.as_str(), value.as_str()), ("device", "cuda"));
                assert!(why.contains("CPU only"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn typed_options_refuse_what_they_would_ignore_or_cannot_use() {
        let with_extra = ProviderOptions::default().extra("ctx_size", "8");
        let Err(e) = create_with("native", "m", &with_extra, NativeOptions::default()) else {
            panic!("an extra key beside typed options was accepted")
        };
        assert!(
            e.to_string()
                .contains("`ctx_size` is given as a string option"),
            "{e}"
        );
        let zero = NativeOptions {
            prefill_chunk: Some(0),
            ..NativeOptions::default()
        };
        let Err(e) = create_with("native", "m", &ProviderOptions::default(), zero) else {
            panic!("a zero prefill chunk was accepted")
        };
        assert!(
            e.to_string()
                .contains("`prefill_chunk` must be a positive integer"),
            "{e}"
        );
        // the typed path is held to the ranges the strings are read with
        for (typed, key) in [
            (
                NativeOptions {
                    ctx_size: Some(8),
                    ..NativeOptions::default()
                },
                "ctx_size",
            ),
            (
                NativeOptions {
                    threads: Some(0),
                    ..NativeOptions::default()
                },
                "threads",
            ),
            (
                NativeOptions {
                    prompt_cache_checkpoints: 0,
                    ..NativeOptions::default()
                },
                "prompt_cache_checkpoints",
            ),
        ] {
            match create_with("native", "m", &ProviderOptions::default(), typed) {
                Err(ProviderError::InvalidOption(e)) => assert_eq!(e.key(), key, "{e}"),
                Err(e) => panic!("{key}: {e:?}"),
                Ok(_) => panic!("{key}: accepted"),
            }
        }
    }

    /// The same strings mean what they mean in every lane: the contract's rules (the gguf and
    /// HTTP lanes' tests hold them to the same table).
    #[test]
    fn shared_rules_hold_in_the_native_lane() {
        let read =
            |k: &str, v: &str| NativeOptions::from_extra(&ProviderOptions::default().extra(k, v));
        for v in ["true", "True", "1", "yes", "on", "ON"] {
            assert!(read("parse_special", v).unwrap().parse_special, "{v}");
        }
        for v in ["false", "0", "no", "off", "Off"] {
            assert!(!read("parse_special", v).unwrap().parse_special, "{v}");
        }
        for v in ["maybe", "", "2", "y"] {
            let e = read("parse_special", v).unwrap_err();
            assert!(
                matches!(&e, ProviderError::InvalidOption(o) if o.key() == "parse_special"),
                "{e:?}"
            );
        }
        // threads: positive; 0 or negative is refused (leave it out for the default)
        assert_eq!(read("threads", "2").unwrap().threads, Some(2));
        for v in ["0", "-1", "two"] {
            let e = read("threads", v).unwrap_err().to_string();
            assert!(
                e.contains("`threads` must be a positive integer") && e.contains(v),
                "{e}"
            );
        }
        // ctx_size: 16 and up; a smaller one is refused, never replaced
        assert_eq!(read("ctx_size", "16").unwrap().ctx_size, Some(16));
        for v in ["8", "0", "15"] {
            let e = read("ctx_size", v).unwrap_err().to_string();
            assert!(
                e.contains("`ctx_size` must be an integer of at least 16"),
                "{e}"
            );
        }
        let e = read("flash_attn", "on").unwrap_err().to_string();
        assert!(
            e.contains("unknown option `flash_attn` for the native provider"),
            "{e}"
        );
        // prompt_cache_bytes 0 is a cache that keeps nothing; checkpoints must be positive
        assert_eq!(
            read("prompt_cache_bytes", "0").unwrap().prompt_cache_bytes,
            0
        );
        assert!(read("prompt_cache_checkpoints", "0").is_err());
    }
}
