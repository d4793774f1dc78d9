//! The engine: a loaded target model, its optional MTP head and tokenizer, and `generate`.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use mtp_contract::{DraftStats, FinishReason, PromptProgress, ResponseFormat, Sampling, Timings};

use crate::batch::Batch;
use crate::cache::{KvType, SeqCache};
use crate::config::GenerationConfig;
use crate::constraint::{compiler, Constraint, ConstraintCompiler};
use crate::depth::DepthModel;
use crate::error::{Error, Result};
use crate::loader::WeightDtype;
use crate::qwen3_5::{self, LogitsAt, Qwen35Model};
use crate::qwen3_5_mtp::MtpHead;
use crate::resume::{Keep, KeptStates, PrefillKept, PromptIn, PromptState};
use crate::sampling::Sampler;
use crate::tokenizer::TextTokenizer;
use crate::vision::preprocess::{self, ImageLimits, ImageProcessorConfig};
use crate::vision::{EncodedImage, MultimodalPrompt, VisionTower};

/// The most proposals one MTP round verifies: the verify forward computes `depth + 1` rows,
/// and up to `kernels::MAX_ROWS` (32) rows every product keeps the single-step arithmetic
/// (beyond, prefill's panel product takes over, whose bits differ), so greedy output stays the
/// target's own. A deeper request is refused with this limit named.
pub const MAX_VERIFY_DEPTH: usize = crate::kernels::MAX_ROWS - 1;

/// Options of one `generate` call (builder style; defaults: greedy, 256 tokens, no speculation).
///
/// ```
/// use mtp_engine::GenerateOptions;
/// let o = GenerateOptions::greedy(64).num_draft_tokens(3);
/// assert_eq!(o.max_tokens, 64);
/// assert_eq!(o.num_draft_tokens, Some(3));
/// ```
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling controls (the contract's type).
    pub sampling: Sampling,
    /// MTP proposals per round; `None` or `Some(0)` = target-only decoding. With
    /// `auto_depth`, the most a round may draft.
    pub num_draft_tokens: Option<usize>,
    /// Choose each round's depth, from 0 (a plain target step) to `num_draft_tokens`, from
    /// the measured acceptance and round costs (`num_draft_tokens: "auto"`); the tokens are
    /// the same as at any fixed depth.
    pub auto_depth: bool,
    /// Extra stop token ids (the checkpoint's EOS ids are always included unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at EOS (parity tests, benchmarks).
    pub ignore_eos: bool,
    /// A prefix-cache state to resume from: one taken after a prefix of the prompt (by an
    /// earlier call's [`GenerationOutput::states`], or read back with [`crate::persist`]).
    /// One that covers the whole prompt, holds other images or, when this call speculates,
    /// lacks the drafter's cache is not used (the prompt is computed in full);
    /// [`GenerationOutput::computed_prompt_tokens`] says what was computed. Output is the same
    /// with or without a resumed state.
    pub resume: Option<Arc<PromptState>>,
    /// Keep the prefix-cache states after the prompt and after the last token fed (and after
    /// `checkpoint_at`), returned in [`GenerationOutput::states`].
    pub checkpoint: bool,
    /// With `checkpoint`, also keep the state after this many prompt tokens (a chat's
    /// conversation before its generation prompt: the next turn renders the same tokens there
    /// and can resume from it). Ignored when it is not inside the part of the prompt this call
    /// computes.
    pub checkpoint_at: Option<usize>,
    /// The shape the reply must take (JSON Schema, regex, Lark grammar), enforced on every
    /// pick, drafts included; compiled before any model work.
    pub response_format: Option<ResponseFormat>,
    /// `response_format` compiled already ([`Engine::constraint`], on the thread that
    /// prepared the request, before it was queued): the reply starts from a copy of it, so
    /// compilation never runs on the scheduler's thread.
    pub constraint: Option<Constraint>,
    /// The images of the prompt, placed on its expanded `<|image_pad|>` runs (see
    /// [`Engine::multimodal_prompt`]).
    pub images: Option<Arc<MultimodalPrompt>>,
    /// Told how far the prompt's computation has got: when it starts (with the tokens
    /// resumed), after each part of a long prompt, and when the prompt is in (called on the
    /// thread that computes it, so it must return at once).
    pub on_prompt_progress: Option<ProgressSink>,
    /// The request's cancellation: once cancelled, the sequence ends at the next step (a
    /// prompt part or a decode step), finish `Cancelled`, as a caller's `false` ends it.
    pub cancel: Option<mtp_contract::Cancel>,
    /// Report each generated token's log probability under the target model, with this many
    /// of the most likely alternatives (0: the token's alone; at most
    /// [`crate::MAX_TOP_LOGPROBS`]), in [`GenerationOutput::logprobs`] and to `on_logprobs`.
    /// Taken from the target's logits before penalties, temperature and a constraint's mask,
    /// so they are the same with MTP on and off.
    pub logprobs: Option<usize>,
    /// Told each chunk's log probabilities (with `logprobs`), just before the chunk's tokens
    /// reach the caller's callback.
    pub on_logprobs: Option<crate::LogprobSink>,
}

/// Where a generation reports its prompt's progress ([`GenerateOptions::on_prompt_progress`]).
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Fn(PromptProgress) + Send + Sync>);

impl ProgressSink {
    /// A sink calling `f` with each report.
    pub fn new(f: impl Fn(PromptProgress) + Send + Sync + 'static) -> Self {
        ProgressSink(Arc::new(f))
    }

    pub(crate) fn report(&self, p: PromptProgress) {
        (self.0)(p)
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: Sampling::default(),
            num_draft_tokens: None,
            auto_depth: false,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            resume: None,
            checkpoint: false,
            checkpoint_at: None,
            response_format: None,
            constraint: None,
            images: None,
            on_prompt_progress: None,
            cancel: None,
            logprobs: None,
            on_logprobs: None,
        }
    }
}

impl GenerateOptions {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        GenerateOptions {
            max_tokens,
            ..Default::default()
        }
    }

    /// Sets the sampling controls.
    pub fn sampling(mut self, s: Sampling) -> Self {
        self.sampling = s;
        self
    }

    /// Sets the speculation depth (0 = off).
    pub fn num_draft_tokens(mut self, k: usize) -> Self {
        self.num_draft_tokens = Some(k);
        self
    }

    /// Chooses each round's depth up to `max` (`num_draft_tokens: "auto"`).
    ///
    /// ```
    /// let o = mtp_engine::GenerateOptions::greedy(8).auto_depth(8);
    /// assert!(o.auto_depth);
    /// assert_eq!(o.num_draft_tokens, Some(8));
    /// ```
    pub fn auto_depth(mut self, max: usize) -> Self {
        self.num_draft_tokens = Some(max);
        self.auto_depth = true;
        self
    }

    /// Constrains the reply to `format`.
    pub fn response_format(mut self, format: ResponseFormat) -> Self {
        self.response_format = Some(format);
        self
    }

    /// Reports each generated token's log probability with `top` alternatives
    /// ([`GenerateOptions::logprobs`]).
    pub fn logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }

    /// Keeps generating past EOS.
    pub fn ignore_eos(mut self, yes: bool) -> Self {
        self.ignore_eos = yes;
        self
    }

    /// Resumes from a prefix-cache state (see [`GenerateOptions::resume`]).
    pub fn resume_from(mut self, state: Arc<PromptState>) -> Self {
        self.resume = Some(state);
        self
    }

    /// Reports the prompt's progress to `f` (see [`GenerateOptions::on_prompt_progress`]).
    pub fn on_prompt_progress(
        mut self,
        f: impl Fn(PromptProgress) + Send + Sync + 'static,
    ) -> Self {
        self.on_prompt_progress = Some(ProgressSink::new(f));
        self
    }

    /// Keeps the prefix-cache states (see [`GenerateOptions::checkpoint`]).
    pub fn checkpoint(mut self, yes: bool) -> Self {
        self.checkpoint = yes;
        self
    }

    /// The prefix-cache states this call keeps.
    pub(crate) fn keep(&self) -> Keep {
        Keep {
            on: self.checkpoint,
            at: self.checkpoint_at.filter(|_| self.checkpoint),
        }
    }
}

/// What speculation did in one call.
#[derive(Debug, Clone, Default)]
pub struct SpeculationOutcome {
    /// True when MTP rounds ran.
    pub used: bool,
    /// Proposals per round requested (with `auto_depth`, the most a round could draft).
    pub num_draft_tokens: usize,
    /// Each round's depth was chosen (`GenerateOptions::auto_depth`); the depths used are in
    /// `stats` ([`DraftStats::rounds_per_depth`]).
    pub auto_depth: bool,
    /// Drafted / accepted / rounds / per-position acceptance.
    pub stats: DraftStats,
    /// Why speculation was not used although requested (e.g. penalties, no head).
    pub not_used_reason: Option<String>,
}

/// The result of `generate`.
#[derive(Debug, Clone)]
pub struct GenerationOutput {
    /// Generated token ids (without the stop token).
    pub tokens: Vec<u32>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Prefill / decode / draft / verify / rollback timings.
    pub timings: Timings,
    /// Speculation statistics, when speculation was requested.
    pub speculation: Option<SpeculationOutcome>,
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Prompt tokens computed by this call (the rest came from the resumed state).
    pub computed_prompt_tokens: usize,
    /// The prefix-cache states kept, when [`GenerateOptions::checkpoint`] asked for them.
    pub states: KeptStates,
    /// Each generated token's log probability, when [`GenerateOptions::logprobs`] asked for
    /// them (one per token of `tokens`).
    pub logprobs: Vec<crate::TokenLogprob>,
}

/// A loaded model ready to generate.
#[derive(Debug)]
pub struct Engine {
    model: Qwen35Model,
    drafter: Option<MtpHead>,
    tokenizer: Option<TextTokenizer>,
    generation: GenerationConfig,
    eos: Vec<u32>,
    dir: PathBuf,
    /// Built on the first constrained request (the token trie takes a while on a large
    /// vocabulary); the error is kept and repeated.
    constraints: std::sync::OnceLock<std::result::Result<ConstraintCompiler, String>>,
    /// The vision tower and the image processor's settings, or why images are refused.
    vision: std::result::Result<Vision, String>,
    /// The last images encoded, by the SHA-256 of their files (a chat sends its pictures again
    /// with every turn): most recent last, at most [`ENCODED_KEPT`] of them and
    /// [`ENCODED_KEPT_BYTES`] of features.
    encoded: std::sync::Mutex<std::collections::VecDeque<EncodedImage>>,
    /// What `auto` depths are chosen from: this model's measured round costs and the
    /// acceptance of the sequences run so far.
    depths: std::sync::Mutex<DepthModel>,
    /// What its states depend on ([`Engine::state_identity`]): computed on first use (it
    /// reads samples of every weights file, which only a prefix cache on disk needs), from
    /// the drafter directory, whether a head is loaded and the precision.
    pub(crate) identity: std::sync::OnceLock<std::result::Result<String, String>>,
    pub(crate) identity_of: (Option<PathBuf>, bool, WeightDtype),
}

/// Encoded images kept for reuse.
const ENCODED_KEPT: usize = 16;
/// Bytes of features kept for reuse.
const ENCODED_KEPT_BYTES: usize = 256 << 20;

/// What the engine needs to turn images into prompt features.
#[derive(Debug)]
struct Vision {
    tower: VisionTower,
    processor: ImageProcessorConfig,
}

impl Engine {
    /// Loads `dir` (HF or MLX layout) on `device`, with matrices kept in `dtype`: a
    /// [`WeightDtype`], or a candle `DType` to convert every matrix to ([`WeightDtype::Stored`]
    /// keeps a bf16 checkpoint in half the memory of f32, with the same output on the CPU). An
    /// embedded MTP head (`mtp.*`) is loaded when present.
    pub fn load(dir: &Path, device: &Device, dtype: impl Into<WeightDtype>) -> Result<Self> {
        Self::load_with_drafter(dir, None, device, dtype)
    }

    /// Loads only the target model: any embedded MTP head is left unloaded (speculation off).
    pub fn load_target_only(
        dir: &Path,
        device: &Device,
        dtype: impl Into<WeightDtype>,
    ) -> Result<Self> {
        let dtype = dtype.into();
        let loaded = qwen3_5::load_dir(dir, device, dtype)?;
        Self::assemble(dir, loaded.model, None, loaded.vision, (None, false, dtype))
    }

    /// Like [`Engine::load`], with a companion drafter directory (`model_type: qwen3_5_mtp`)
    /// that replaces any embedded head.
    pub fn load_with_drafter(
        dir: &Path,
        drafter: Option<&Path>,
        device: &Device,
        dtype: impl Into<WeightDtype>,
    ) -> Result<Self> {
        let dtype = dtype.into();
        let qwen3_5::Loaded { model, mtp, vision } = qwen3_5::load_dir(dir, device, dtype)?;
        let drafter_dir = drafter;
        let drafter = match drafter {
            Some(d) => Some(MtpHead::load_dir(d, model.config(), dtype, device)?),
            None if !mtp.is_empty() => Some(MtpHead::load(mtp, model.config(), dtype, device)?),
            None => None,
        };
        let head = drafter.is_some();
        let identity_of = (drafter_dir.map(Path::to_path_buf), head, dtype);
        Self::assemble(dir, model, drafter, vision, identity_of)
    }

    fn assemble(
        dir: &Path,
        model: Qwen35Model,
        drafter: Option<MtpHead>,
        tower: Option<std::result::Result<VisionTower, String>>,
        identity_of: (Option<PathBuf>, bool, WeightDtype),
    ) -> Result<Self> {
        let vision = match tower {
            None => Err("the checkpoint has no vision tower: a text-only model".to_string()),
            Some(Err(m)) => Err(m),
            Some(Ok(tower)) => {
                let processor = ImageProcessorConfig::load(dir).map_err(|e| Error::Config {
                    path: dir.join("preprocessor_config.json"),
                    message: e.to_string(),
                })?;
                Ok(Vision { tower, processor })
            }
        };
        let tokenizer = if dir.join("tokenizer.json").is_file() {
            Some(TextTokenizer::from_dir(dir)?)
        } else {
            None
        };
        let generation = GenerationConfig::load(dir)?;
        let mut eos = model.config().eos_token_ids.clone();
        for id in &generation.eos_token_ids {
            if !eos.contains(id) {
                eos.push(*id);
            }
        }
        if let Some(t) = &tokenizer {
            if let Some(id) = t.eos_token().and_then(|s| t.token_id(s)) {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        Ok(Engine {
            model,
            drafter,
            tokenizer,
            generation,
            eos,
            dir: dir.to_path_buf(),
            constraints: std::sync::OnceLock::new(),
            vision,
            encoded: Default::default(),
            depths: Default::default(),
            identity: std::sync::OnceLock::new(),
            identity_of,
        })
    }

    /// How verify forwards treat linear-attention states from now on (see
    /// [`crate::cache::VerifyMode`]; the default, `Auto`, picks per layer by state size). The
    /// output is the same in every mode; this is for measuring and testing them.
    pub fn set_verify_mode(&mut self, mode: crate::cache::VerifyMode) {
        self.model.set_verify_mode(mode);
    }

    /// The element type of the KV caches of the sequences started from now on, the target's and
    /// the drafter's (see [`KvType`]; the default, f32, keeps the reference's output; f16 and
    /// bf16 halve the cache's memory and the bytes a long context reads per step). States
    /// computed with one type are named apart from the others' ([`Engine::state_identity`]).
    pub fn set_kv_type(&mut self, kv: KvType) {
        self.model.set_kv_type(kv);
        if let Some(d) = &mut self.drafter {
            d.set_kv_type(kv);
        }
        self.identity = std::sync::OnceLock::new();
    }

    /// The element type of its KV caches.
    pub fn kv_type(&self) -> KvType {
        self.model.kv_type()
    }

    /// The arithmetic of the products with quantized (4- and 8-bit MLX) matrices from now on,
    /// the target's and the drafter's (see [`crate::Arith`]; the default, `Exact`, keeps mlx's
    /// output bit for bit; `Fast` multiplies in integers with int8 activations). A verify
    /// forward's rows keep the bits of single steps in either. States computed in one are named
    /// apart from the other's ([`Engine::state_identity`]).
    pub fn set_arith(&mut self, arith: crate::Arith) {
        self.model.set_arith(arith);
        if let Some(d) = &mut self.drafter {
            d.set_arith(arith);
        }
        self.identity = std::sync::OnceLock::new();
    }

    /// The arithmetic of its quantized products.
    pub fn arith(&self) -> crate::Arith {
        self.model.arith()
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The target model.
    pub fn model(&self) -> &Qwen35Model {
        &self.model
    }

    /// Bytes of the matrices held by the target and the drafter together, per kind (`f32`,
    /// `bf16`, `f16`; `q4` etc. for MLX-quantized matrices kept packed).
    pub fn weights_held(&self) -> std::collections::BTreeMap<String, usize> {
        let mut held = self.model.weights_held();
        for (kind, bytes) in self.drafter.iter().flat_map(|d| d.weights_held()) {
            *held.entry(kind).or_default() += bytes;
        }
        held
    }

    /// The state `auto` depths are chosen from.
    pub(crate) fn depths(&self) -> &std::sync::Mutex<DepthModel> {
        &self.depths
    }

    /// The MTP head, when loaded.
    pub fn drafter(&self) -> Option<&MtpHead> {
        self.drafter.as_ref()
    }

    /// The checkpoint's `generation_config.json` (empty when it has none).
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// The tokenizer, when the checkpoint has one.
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenizer.as_ref()
    }

    /// End-of-sequence ids.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Whether the engine takes `n_images` images: always for none; for some, when the
    /// checkpoint's vision tower is loaded (else `Unsupported` saying why).
    pub fn check_images(&self, n_images: usize) -> Result<()> {
        match self.images_refused() {
            Some(m) if n_images > 0 => Err(Error::Unsupported(format!("image input ({m})"))),
            _ => Ok(()),
        }
    }

    /// The vision tower and processor, or `Unsupported` saying why there are none.
    fn vision(&self) -> Result<&Vision> {
        self.vision
            .as_ref()
            .map_err(|m| Error::Unsupported(format!("image input ({m})")))
    }

    /// Why images are refused (`None` when the vision tower is loaded).
    pub fn images_refused(&self) -> Option<&str> {
        self.vision.as_ref().err().map(String::as_str)
    }

    /// The vision tower, when the checkpoint has one that loaded.
    pub fn vision_tower(&self) -> Option<&VisionTower> {
        self.vision.as_ref().ok().map(|v| &v.tower)
    }

    /// The image processor's settings (`preprocessor_config.json`), with a vision tower.
    pub fn image_processor(&self) -> Option<&ImageProcessorConfig> {
        self.vision.as_ref().ok().map(|v| &v.processor)
    }

    /// Decodes an image file's bytes (PNG, JPEG, WebP), resizes and normalises it as the
    /// checkpoint's processor does and runs the vision tower: the features that replace the
    /// image's tokens. `name` (a path, or "image 2") names the image in errors.
    ///
    /// The last images encoded are kept (by the SHA-256 of their bytes), so a picture sent again
    /// (every turn of a chat sends its pictures) is not encoded again.
    pub fn encode_image(&self, bytes: &[u8], name: &str) -> Result<EncodedImage> {
        let v = self.vision()?;
        let digest = crate::vision::prompt::image_digest(bytes);
        let mut kept = self.encoded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = kept.iter().position(|e| e.digest == digest) {
            let hit = kept.remove(i).expect("position is in range");
            kept.push_back(hit.clone());
            return Ok(hit);
        }
        drop(kept);
        let encoded = self.encode_new(v, bytes, name, digest)?;
        let mut kept = self.encoded.lock().unwrap_or_else(|p| p.into_inner());
        kept.push_back(encoded.clone());
        let bytes_of = |e: &EncodedImage| e.features.len() * std::mem::size_of::<f32>();
        while kept.len() > ENCODED_KEPT
            || kept.iter().map(bytes_of).sum::<usize>() > ENCODED_KEPT_BYTES
        {
            kept.pop_front();
        }
        Ok(encoded)
    }

    fn encode_new(
        &self,
        v: &Vision,
        bytes: &[u8],
        name: &str,
        digest: [u8; 32],
    ) -> Result<EncodedImage> {
        let img = preprocess::decode_image(bytes, name, &ImageLimits::default())?;
        let prepared = preprocess::prepare(&img, &v.processor, name)?;
        let [t, h, w] = prepared.grid_thw;
        let m = v.processor.merge_size;
        if m != v.tower.config().spatial_merge_size
            || v.processor.patch_size != v.tower.config().patch_size
            || v.processor.temporal_patch_size != v.tower.config().temporal_patch_size
        {
            return Err(Error::Config {
                path: self.dir.join("preprocessor_config.json"),
                message: format!(
                    "patch {} / temporal {} / merge {} differ from the vision tower's {} / {} / {}",
                    v.processor.patch_size,
                    v.processor.temporal_patch_size,
                    m,
                    v.tower.config().patch_size,
                    v.tower.config().temporal_patch_size,
                    v.tower.config().spatial_merge_size
                ),
            });
        }
        let features = v.tower.forward(&prepared.pixel_values, prepared.grid_thw)?;
        Ok(EncodedImage {
            grid: [t, h / m, w / m],
            features: features.into(),
            digest,
        })
    }

    /// A prompt with images: `tokens` holds one `<|image_pad|>` per image (as the chat
    /// template renders it), each expanded to the image's token count; returns the expanded
    /// tokens and the images placed on them (give them to [`GenerateOptions::images`]).
    pub fn multimodal_prompt(
        &self,
        tokens: &[u32],
        images: &[EncodedImage],
    ) -> Result<(Vec<u32>, Arc<MultimodalPrompt>)> {
        let v = self.vision()?;
        let pad = v.tower.config().image_token_id;
        let counts: Vec<usize> = images.iter().map(EncodedImage::num_tokens).collect();
        let expanded = crate::vision::expand_image_tokens(tokens, pad, &counts)?;
        let mm = MultimodalPrompt::new(&expanded, pad, images, self.model.hidden_size())?;
        Ok((expanded, Arc::new(mm)))
    }

    /// The tokens `image` takes in a prompt, from its header (no pixel is decoded and the
    /// vision tower does not run; a file the header passes may still fail to decode later).
    /// Lets a caller expand the prompt before encoding the image.
    pub fn image_token_count(&self, image: &crate::vision::ImageInput) -> Result<usize> {
        let v = self.vision()?;
        let (w, h) = preprocess::image_size(&image.bytes, &image.name, &ImageLimits::default())?;
        Ok(v.processor.num_image_tokens_named(h, w, &image.name)?)
    }

    /// Places encoded images on an already expanded prompt (one `<|image_pad|>` per image
    /// token, e.g. from [`crate::vision::expand_image_tokens`] with
    /// [`Engine::image_token_count`]).
    pub fn place_images(
        &self,
        expanded: &[u32],
        images: &[EncodedImage],
    ) -> Result<Arc<MultimodalPrompt>> {
        let v = self.vision()?;
        let pad = v.tower.config().image_token_id;
        Ok(Arc::new(MultimodalPrompt::new(
            expanded,
            pad,
            images,
            self.model.hidden_size(),
        )?))
    }

    /// The `<|image_pad|>` id, with a vision tower.
    pub fn image_token_id(&self) -> Option<u32> {
        self.vision_tower().map(|t| t.config().image_token_id)
    }

    /// A fresh target cache for a request (with its prompt's images).
    pub(crate) fn new_cache(&self, opts: &GenerateOptions) -> crate::cache::SeqCache {
        let mut c = self.model.new_cache();
        c.set_images(opts.images.clone());
        c
    }

    /// Last-position logits of one forward over `prompt` (parity checks).
    pub fn prompt_logits(&self, prompt: &[u32]) -> Result<Vec<f32>> {
        self.prompt_logits_with(prompt, &GenerateOptions::default())
    }

    /// [`Engine::prompt_logits`] for a prompt with the images of `opts`.
    pub fn prompt_logits_with(&self, prompt: &[u32], opts: &GenerateOptions) -> Result<Vec<f32>> {
        self.check(prompt, opts)?;
        let mut cache = [self.new_cache(opts)];
        Ok(self
            .model
            .forward(&[prompt.to_vec()], &mut cache, LogitsAt::Last)?
            .logits)
    }

    /// The grammar state for a request's `response_format` (none for free text), compiled
    /// before any model work: a format that does not compile is an error here.
    pub fn constraint(&self, opts: &GenerateOptions) -> Result<Option<Constraint>> {
        let Some(format) = opts.response_format.as_ref().filter(|f| f.is_constrained()) else {
            return Ok(None);
        };
        if let Some(c) = &opts.constraint {
            return Ok(Some(c.clone()));
        }
        let compiler = self.constraints.get_or_init(|| {
            let tok = self.tokenizer.as_ref().ok_or_else(|| {
                "constrained decoding needs the checkpoint's tokenizer.json".to_string()
            })?;
            compiler(tok.hf(), &self.eos).map_err(|e| e.to_string())
        });
        match compiler {
            Ok(c) => Ok(c.compile(format)?),
            Err(m) => Err(Error::Unsupported(m.clone())),
        }
    }

    /// A request's sampler: its sampling controls and its constraint.
    pub(crate) fn sampler(&self, opts: &GenerateOptions) -> Result<Sampler> {
        Ok(Sampler::new(&opts.sampling).with_constraint(self.constraint(opts)?))
    }

    /// Checks a request before any model work (also for each sequence of a batch).
    pub(crate) fn check(&self, prompt: &[u32], opts: &GenerateOptions) -> Result<()> {
        if prompt.is_empty() {
            return Err(Error::InvalidRequest("the prompt has no tokens".into()));
        }
        opts.sampling
            .validate()
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let vocab = self.model.vocab_size() as u32;
        if let Some(t) = prompt.iter().find(|t| **t >= vocab) {
            return Err(Error::InvalidRequest(format!(
                "token id {t} is outside the vocabulary ({vocab})"
            )));
        }
        if let Some(t) = opts.sampling.logit_bias.keys().find(|t| **t >= vocab) {
            return Err(Error::InvalidRequest(format!(
                "logit_bias names token id {t}, outside the vocabulary ({vocab})"
            )));
        }
        if let Some(m) = &opts.images {
            self.check_images(m.spans().len())?;
            m.check_fits(prompt, self.model.hidden_size())?;
        }
        if let Some(n) = opts.logprobs.filter(|&n| n > crate::MAX_TOP_LOGPROBS) {
            return Err(Error::InvalidRequest(format!(
                "at most {} alternatives per token's log probability, {n} asked for",
                crate::MAX_TOP_LOGPROBS
            )));
        }
        if let Some(d) = opts.num_draft_tokens.filter(|&d| d > MAX_VERIFY_DEPTH) {
            return Err(Error::InvalidRequest(format!(
                "num_draft_tokens {d} is more than this engine verifies in one round: at most \
                 {MAX_VERIFY_DEPTH} proposals (a verify forward of up to {} rows keeps every row's \
                 arithmetic that of a single step, which keeps the output exactly the target's)",
                crate::kernels::MAX_ROWS
            )));
        }
        Ok(())
    }

    /// The token ids that end a generation: the request's, and EOS unless ignored.
    pub(crate) fn stop_ids(&self, opts: &GenerateOptions) -> Vec<u32> {
        let mut stops = opts.stop_token_ids.clone();
        if !opts.ignore_eos {
            stops.extend_from_slice(&self.eos);
        }
        stops
    }

    /// Whether a call speculates: the outcome to fill (when speculation was asked for, with
    /// the reason when it cannot run) and true when MTP rounds will run.
    pub(crate) fn speculation_plan(
        &self,
        opts: &GenerateOptions,
    ) -> (Option<SpeculationOutcome>, bool) {
        let depth = opts.num_draft_tokens.unwrap_or(0);
        let mut outcome = (depth > 0).then(|| SpeculationOutcome {
            num_draft_tokens: depth,
            auto_depth: opts.auto_depth,
            ..Default::default()
        });
        let spec_ok = match (&self.drafter, outcome.as_mut()) {
            (_, None) => false,
            (None, Some(o)) => {
                o.not_used_reason = Some(
                    "mtp_head_missing: the checkpoint has no MTP head and no drafter was given"
                        .into(),
                );
                false
            }
            (Some(_), Some(o)) => {
                let ctl = opts.sampling.target_only_controls();
                if ctl.is_empty() {
                    true
                } else {
                    o.not_used_reason =
                        Some(format!("{} require target-only decoding", ctl.join(", ")));
                    false
                }
            }
        };
        (outcome, spec_ok)
    }

    /// Generates from `prompt` token ids. `on_tokens` receives each accepted chunk (one token in
    /// target-only decoding, up to `k + 1` per MTP round) and returns `false` to cancel.
    ///
    /// A solo call is a batch of one ([`Batch`]): the same sequence, stepped alone, its prompt
    /// computed in parts of `FORWARD_PART` (1,024) tokens (as one forward of it would be,
    /// so that [`GenerateOptions::on_prompt_progress`] hears of each). With [`GenerateOptions::resume`] and
    /// [`GenerateOptions::checkpoint`] it resumes from and keeps prefix-cache states.
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_tokens: impl FnMut(&[u32]) -> bool,
    ) -> Result<GenerationOutput> {
        let mut batch = Batch::new(self).with_prefill_chunk(qwen3_5::FORWARD_PART);
        let mut on = |_: u64, t: &[u32]| on_tokens(t);
        batch.join(0, prompt, opts, &mut on);
        while batch.active() > 0 {
            batch.step(&mut on);
        }
        batch.take_finished().pop().map_or_else(
            || Err(Error::Batch("the sequence did not end".into())),
            |(_, r)| r,
        )
    }
}

/// What [`prefill_target`] computed.
pub(crate) struct TargetPrefill {
    /// The cache after the whole prompt.
    pub(crate) cache: SeqCache,
    /// The logits for the first generated token.
    pub(crate) logits: Vec<f32>,
    /// The last prompt position's hidden row.
    pub(crate) hidden: Vec<f32>,
    /// The states asked for, and the prompt tokens computed.
    pub(crate) kept: PrefillKept,
}

/// The target-only prompt forward of a sequence: from `resume` when it covers a proper prefix
/// of `prompt` with the same images (else from the start), keeping the prefix-cache states
/// `keep` asks for (the state after the prompt; also the state after `keep.at` tokens,
/// computed as a part of its own).
pub(crate) fn prefill_target(
    model: &crate::Qwen35Model,
    p: PromptIn<'_>,
    resume: Option<Cow<'_, PromptState>>,
    keep: Keep,
) -> Result<TargetPrefill> {
    let prompt = p.ids;
    let resume = resume
        .filter(|st| st.tokens < prompt.len() && st.same_images(p.images))
        .map(|st| PromptState::resumed(st, p.room));
    let mut start = resume.as_ref().map_or(0, |st| st.tokens);
    let mut cache = [resume.map_or_else(
        || {
            let mut c = model.new_cache();
            c.reserve(p.room);
            c
        },
        |st| st.cache,
    )];
    // the images of this prompt (those of the resumed prefix are the same)
    cache[0].set_images(p.images.cloned());
    let computed = prompt.len() - start;
    let dm = model.hidden_size();
    let last_row = |hidden: &[f32]| hidden[hidden.len().saturating_sub(dm)..].to_vec();
    let mut history_state = None;
    // The state after the conversation before the generation prompt: prefill in two parts,
    // keeping the cache between them.
    if let Some(n) = keep
        .at
        .filter(|&n| keep.on && n > start && n < prompt.len())
    {
        let out = model.forward(&[prompt[start..n].to_vec()], &mut cache, LogitsAt::None)?;
        history_state = Some(PromptState {
            cache: cache[0].clone(),
            mcache: None,
            last_hidden: last_row(&out.hidden),
            tokens: n,
        });
        start = n;
    }
    let out = model.forward(&[prompt[start..].to_vec()], &mut cache, LogitsAt::Last)?;
    let hidden = last_row(&out.hidden);
    let [cache] = cache;
    let prompt_state = keep.on.then(|| PromptState {
        cache: cache.clone(),
        mcache: None,
        last_hidden: hidden.clone(),
        tokens: prompt.len(),
    });
    Ok(TargetPrefill {
        cache,
        logits: out.logits,
        hidden,
        kept: PrefillKept {
            prompt: prompt_state,
            history: history_state,
            computed,
        },
    })
}
