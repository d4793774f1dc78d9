//! The engine: a loaded target model, its optional MTP head, tokenizer and vision tower, and
//! the checks every request passes. Generation steps it in a batch (`batch.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;

use crate::cache::KvType;
use crate::config::GenerationConfig;
use crate::constraint::{compiler, Constraint, ConstraintCompiler};
use crate::depth::DepthModel;
use crate::error::{Error, Result};
use crate::loader::WeightDtype;
use crate::logprobs;
use crate::qwen3_5::{self, LogitsAt, Qwen35Model};
use crate::qwen3_5_mtp::MtpHead;
use crate::request::GenerateOptions;
use crate::tokenizer::TextTokenizer;
use crate::vision::preprocess::{self, ImageLimits, ImageProcessorConfig};
use crate::vision::{EncodedImage, MultimodalPrompt, VisionTower};

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
        if let Some(n) = opts.logprobs.filter(|&n| n > logprobs::MAX_TOP_LOGPROBS) {
            return Err(Error::InvalidRequest(format!(
                "at most {} alternatives per token's log probability, {n} asked for",
                logprobs::MAX_TOP_LOGPROBS
            )));
        }
        Ok(())
    }
}

impl Engine {
    /// The log probability of each prompt token after the ones before it (the first has none:
    /// nothing comes before it), with the `top` most likely alternatives at each position (at
    /// most [`crate::MAX_TOP_LOGPROBS`]): what `echo` with `logprobs` returns. One forward over the
    /// prompt (with the images of `opts`), its logits reduced a block of rows at a time.
    pub fn prompt_logprobs(
        &self,
        prompt: &[u32],
        top: usize,
        opts: &GenerateOptions,
    ) -> Result<Vec<Option<logprobs::TokenLogprob>>> {
        let most = logprobs::MAX_TOP_LOGPROBS;
        if top > most {
            return Err(Error::InvalidRequest(format!(
                "at most {most} alternatives per token, {top} asked for"
            )));
        }
        self.check(prompt, opts)?;
        let model = self.model();
        let mut cache = [self.new_cache(opts)];
        let out = model.forward(&[prompt.to_vec()], &mut cache, LogitsAt::None)?;
        let dm = model.hidden_size();
        let vocab = model.vocab_size();
        let mut lps = Vec::with_capacity(prompt.len());
        lps.push(None);
        // row p's logits give token p + 1
        let rows = prompt.len() - 1;
        let mut p = 0;
        while p < rows {
            if opts.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
                return Err(Error::Cancelled);
            }
            let n = logprobs::PROMPT_ROWS.min(rows - p);
            let logits = model.logits(&out.hidden[p * dm..(p + n) * dm], n)?;
            lps.extend(
                logprobs::of_rows(&logits, vocab, &prompt[p + 1..p + 1 + n], top)
                    .into_iter()
                    .map(Some),
            );
            p += n;
        }
        Ok(lps)
    }
}
