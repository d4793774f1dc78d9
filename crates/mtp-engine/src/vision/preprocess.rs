//! Image preprocessing as the checkpoint's `preprocessor_config.json` says, exactly as mlx-vlm
//! 0.7.10 does it for Qwen3-VL / Qwen3.5 (`mlx_vlm/models/qwen3_vl/processing_qwen3_vl.py`).
//!
//! The pipeline, each step matching its Python counterpart bit for bit (JPEG decoding aside,
//! within a few levels: see [`decode_image`]):
//!
//! 1. [`decode_image`]: the file's bytes to 8-bit RGB as `mlx_vlm.utils.load_image` gets them
//!    from Pillow: `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`;
//! 2. [`ImageProcessorConfig::resized_size`]: mlx-vlm's `_smart_resize_image` (the image variant
//!    of Qwen's `smart_resize`), with Python's float arithmetic and round-half-to-even;
//! 3. [`resize_bicubic`]: Pillow's `Image.resize((w, h), Image.BICUBIC)` on the 8-bit image, in
//!    Pillow's own fixed-point arithmetic;
//! 4. [`prepare`]: rescale (`x * 1/255`) and normalize (`(x - mean) / std`) in f32, the frame
//!    repeated `temporal_patch_size` times, cut into patches in the order of mlx-vlm's
//!    `pixel_values`.
//!
//! The goldens in `tests/fixtures/vision-resize/` (written by Pillow 13.0.0 and mlx-vlm 0.7.10,
//! see its README) are what the tests compare against.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};
use serde_json::{Map, Value};

/// Errors of image decoding, configuration and preprocessing; each names the image or the file
/// at fault.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The bytes are not a PNG, JPEG or WebP file (or are one of a format this build does not
    /// decode).
    #[error(
        "{name}: unsupported image format{}; PNG, JPEG and WebP are supported",
        in_parens(detected)
    )]
    UnsupportedFormat {
        /// The image (a path, or e.g. "image 2").
        name: String,
        /// The format recognised from the file's signature, if any.
        detected: Option<String>,
    },
    /// The file is corrupt or truncated.
    #[error("{name}: cannot decode the image: {message}")]
    Decode {
        /// The image.
        name: String,
        /// What the decoder said.
        message: String,
    },
    /// The file, or the image its header describes, is over the [`ImageLimits`] (checked before
    /// any pixel is decoded), or the resized image would be unreasonably large.
    #[error("{name}: {detail}")]
    TooLarge {
        /// The image.
        name: String,
        /// What is over which limit.
        detail: String,
    },
    /// The image has no pixels.
    #[error("{name}: the image is empty ({width}x{height} pixels)")]
    Empty {
        /// The image.
        name: String,
        /// Its width in pixels.
        width: usize,
        /// Its height in pixels.
        height: usize,
    },
    /// One side is more than 200 times the other (mlx-vlm refuses those too).
    #[error("{name}: absolute aspect ratio must be smaller than 200, got {ratio} ({width}x{height} pixels)")]
    AspectRatio {
        /// The image.
        name: String,
        /// Its width in pixels.
        width: usize,
        /// Its height in pixels.
        height: usize,
        /// `max(width, height) / min(width, height)`.
        ratio: f64,
    },
    /// The smart resize gives a zero side (only possible with `min_pixels` 0), which Pillow
    /// refuses to resize to.
    #[error(
        "{name}: {width}x{height} pixels resize to {new_width}x{new_height} (min_pixels is 0?)"
    )]
    ResizeToZero {
        /// The image.
        name: String,
        /// Its width in pixels.
        width: usize,
        /// Its height in pixels.
        height: usize,
        /// The width smart resize computed.
        new_width: usize,
        /// The height smart resize computed.
        new_height: usize,
    },
    /// The [`RgbImage`]'s buffer does not hold `width * height * 3` bytes.
    #[error("{name}: {message}")]
    InvalidImage {
        /// The image.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A checkpoint's `preprocessor_config.json` / `processor_config.json` is unreadable,
    /// malformed, or has a value of the wrong type.
    #[error("{}: {message}", path.display())]
    Config {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// An [`ImageProcessorConfig`] value that cannot work (a zero patch size, `max_pixels` 0).
    #[error("invalid image processor config: {message}")]
    InvalidConfig {
        /// What is wrong.
        message: String,
    },
}

/// `" (x)"` for `Some(x)`, nothing for `None`.
fn in_parens(detected: &Option<String>) -> String {
    detected
        .as_ref()
        .map(|f| format!(" ({f})"))
        .unwrap_or_default()
}

// ------------------------------------------------------------------------------------------
// Configuration

/// The image processor settings of a Qwen3-VL / Qwen3.5 checkpoint: the fields of mlx-vlm's
/// `Qwen3VLImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessorConfig {
    /// Side of a square patch in pixels (16 for Qwen3.5).
    pub patch_size: usize,
    /// Frames per temporal patch; a still image is repeated this many times (2).
    pub temporal_patch_size: usize,
    /// Side of the square of patches merged into one language-model token (2).
    pub merge_size: usize,
    /// Smart resize enlarges images with fewer pixels than this (`size.shortest_edge`).
    pub min_pixels: usize,
    /// Smart resize shrinks images with more pixels than this (`size.longest_edge`).
    pub max_pixels: usize,
    /// Per-channel mean subtracted after rescaling.
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation divided by after subtracting the mean.
    pub image_std: [f32; 3],
    /// Factor the 8-bit values are multiplied by (1/255).
    pub rescale_factor: f32,
    /// Whether to multiply by `rescale_factor`.
    pub do_rescale: bool,
    /// Whether to normalize with `image_mean` / `image_std`.
    pub do_normalize: bool,
    /// Read from the config for completeness; mlx-vlm converts every image to RGB regardless
    /// (`_to_numpy_image`), and so does [`decode_image`].
    pub do_convert_rgb: bool,
}

impl Default for ImageProcessorConfig {
    /// The defaults of mlx-vlm's `Qwen3VLImageProcessor.__init__`.
    fn default() -> Self {
        Self {
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 14 * 14 * 4 * 1280,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            // numpy multiplies the f32 image by the Python float 1/255 in f32 (NEP 50).
            rescale_factor: (1.0f64 / 255.0) as f32,
            do_rescale: true,
            do_normalize: true,
            do_convert_rgb: true,
        }
    }
}

/// Reads a JSON config file as mlx-vlm's `_load_qwen_vl_json` does: `None` when it does not
/// exist; Python's `json.loads(...) or {}`, so a falsy document (`null`, `{}`, `[]`, `0`, `""`)
/// is empty; any other non-object is an error, as the `.get` / `.update` on it would be.
fn read_config_object(path: &Path) -> Result<Option<Map<String, Value>>, ImageError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ImageError::Config {
                path: path.to_path_buf(),
                message: format!("cannot read: {e}"),
            })
        }
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| ImageError::Config {
        path: path.to_path_buf(),
        message: format!("malformed JSON: {e}"),
    })?;
    match value {
        Value::Object(map) => Ok(Some(map)),
        v if is_falsy(&v) => Ok(Some(Map::new())),
        v => Err(ImageError::Config {
            path: path.to_path_buf(),
            message: format!(
                "expected a JSON object, found {}",
                mtp_contract::json_kind(&v)
            ),
        }),
    }
}

/// Python truthiness of a JSON value.
fn is_falsy(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// One config key's value and the file it came from (for the error message).
struct Setting<'a> {
    key: &'a str,
    value: &'a Value,
    path: &'a Path,
}

impl Setting<'_> {
    fn error(&self, expected: &str) -> ImageError {
        ImageError::Config {
            path: self.path.to_path_buf(),
            message: format!("`{}` must be {expected}, found {}", self.key, self.value),
        }
    }

    /// A positive integer (patch, temporal patch and merge sizes: Python needs an `int` there).
    fn positive_int(&self) -> Result<usize, ImageError> {
        match self.value.as_u64().and_then(|v| usize::try_from(v).ok()) {
            Some(v) if v > 0 => Ok(v),
            _ => Err(self.error("a positive integer")),
        }
    }

    /// A pixel count: a non-negative integer, or a float with an integral value (Python's
    /// arithmetic treats `3136.0` as 3136).
    fn pixels(&self) -> Result<usize, ImageError> {
        if let Some(v) = self.value.as_u64() {
            return usize::try_from(v).map_err(|_| self.error("a pixel count"));
        }
        match self.value.as_f64() {
            Some(f) if f >= 0.0 && f.fract() == 0.0 && f < usize::MAX as f64 => Ok(f as usize),
            _ => Err(self.error("a non-negative integer pixel count")),
        }
    }

    fn number(&self) -> Result<f32, ImageError> {
        self.value
            .as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| self.error("a number"))
    }

    /// Python truthiness as `if self.do_rescale and ...` sees it; only booleans and `null` are
    /// accepted.
    fn flag(&self) -> Result<bool, ImageError> {
        match self.value {
            Value::Bool(b) => Ok(*b),
            Value::Null => Ok(false),
            _ => Err(self.error("true or false")),
        }
    }

    /// `image_mean` / `image_std`: `value or [0.5, 0.5, 0.5]`; one number broadcasts over the
    /// three channels as numpy's `(1, 1, 1)` array does.
    fn channels(&self, default: [f32; 3]) -> Result<[f32; 3], ImageError> {
        if is_falsy(self.value) {
            return Ok(default);
        }
        let expected = "a list of 3 numbers (or 1)";
        let Value::Array(items) = self.value else {
            return Err(self.error(expected));
        };
        let nums: Vec<f32> = items
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| self.error(expected))?;
        match nums[..] {
            [v] => Ok([v; 3]),
            [a, b, c] => Ok([a, b, c]),
            _ => Err(self.error(expected)),
        }
    }
}

impl ImageProcessorConfig {
    /// Reads `dir/preprocessor_config.json` and `dir/processor_config.json` as mlx-vlm's
    /// `_qwen_vl_image_kwargs` does: the keys of `processor_config.json`'s `image_processor`
    /// object replace those of `preprocessor_config.json` (a whole `size` object replaces the
    /// other); `size.shortest_edge` is `min_pixels` and `size.longest_edge` is `max_pixels`, and
    /// explicit `min_pixels` / `max_pixels` keys win over them; a `null` one is ignored. A missing
    /// file (or key) leaves the defaults ([`ImageProcessorConfig::default`]); a malformed file or a
    /// value of the wrong type is an [`ImageError::Config`] naming the file. (mlx-vlm would also
    /// try the Hugging Face Hub for a missing file; a local checkpoint has no such fallback.)
    pub fn load(dir: &Path) -> Result<Self, ImageError> {
        let processor_path = dir.join("processor_config.json");
        let preprocessor_path = dir.join("preprocessor_config.json");
        // mlx-vlm reads processor_config.json first, so its error is the one reported first.
        let processor = read_config_object(&processor_path)?;
        let preprocessor = read_config_object(&preprocessor_path)?;

        let mut raw: Vec<(String, Value, &Path)> = preprocessor
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v, preprocessor_path.as_path()))
            .collect();
        if let Some(processor) = processor {
            match processor.get("image_processor") {
                Some(Value::Object(overrides)) => {
                    for (k, v) in overrides {
                        raw.retain(|(key, _, _)| key != k);
                        raw.push((k.clone(), v.clone(), processor_path.as_path()));
                    }
                }
                Some(v) if !is_falsy(v) => {
                    return Err(ImageError::Config {
                        path: processor_path.clone(),
                        message: format!("`image_processor` must be an object, found {v}"),
                    })
                }
                _ => {}
            }
        }
        let get = |key: &'static str| {
            raw.iter()
                .find(|(k, _, _)| k == key)
                .map(|(_, value, path)| Setting { key, value, path })
        };

        let mut cfg = Self::default();
        if let Some(s) = get("patch_size") {
            cfg.patch_size = s.positive_int()?;
        }
        if let Some(s) = get("temporal_patch_size") {
            cfg.temporal_patch_size = s.positive_int()?;
        }
        if let Some(s) = get("merge_size") {
            cfg.merge_size = s.positive_int()?;
        }
        if let Some(s) = get("image_mean") {
            cfg.image_mean = s.channels([0.5; 3])?;
        }
        if let Some(s) = get("image_std") {
            cfg.image_std = s.channels([0.5; 3])?;
        }
        if let Some(s) = get("rescale_factor") {
            cfg.rescale_factor = s.number()?;
        }
        if let Some(s) = get("do_rescale") {
            cfg.do_rescale = s.flag()?;
        }
        if let Some(s) = get("do_normalize") {
            cfg.do_normalize = s.flag()?;
        }
        if let Some(s) = get("do_convert_rgb") {
            cfg.do_convert_rgb = s.flag()?;
        }
        if let Some(s) = get("size") {
            match s.value {
                Value::Object(size) => {
                    for (edge, field) in [
                        ("shortest_edge", &mut cfg.min_pixels),
                        ("longest_edge", &mut cfg.max_pixels),
                    ] {
                        if let Some(value) = size.get(edge).filter(|v| !v.is_null()) {
                            let key = if edge == "shortest_edge" {
                                "size.shortest_edge"
                            } else {
                                "size.longest_edge"
                            };
                            let setting = Setting {
                                key,
                                value,
                                path: s.path,
                            };
                            *field = setting.pixels()?;
                            if edge == "longest_edge" && *field == 0 {
                                return Err(setting.error("a positive pixel count"));
                            }
                        }
                    }
                }
                v if is_falsy(v) => {}
                _ => return Err(s.error("an object")),
            }
        }
        for (key, field) in [
            ("min_pixels", &mut cfg.min_pixels),
            ("max_pixels", &mut cfg.max_pixels),
        ] {
            if let Some(s) = get(key).filter(|s| !s.value.is_null()) {
                *field = s.pixels()?;
                // mlx-vlm divides by max_pixels: 0 is a ZeroDivisionError there.
                if key == "max_pixels" && *field == 0 {
                    return Err(s.error("a positive pixel count"));
                }
            }
        }
        cfg.validate().map_err(|e| match e {
            ImageError::InvalidConfig { message } => ImageError::Config {
                path: preprocessor_path.clone(),
                message,
            },
            e => e,
        })?;
        tracing::debug!(dir = %dir.display(), ?cfg, "image processor config");
        Ok(cfg)
    }

    /// Rejects settings that cannot work (mlx-vlm would fail on them later, with a division by
    /// zero or a reshape error).
    fn validate(&self) -> Result<(), ImageError> {
        let invalid = |message: String| Err(ImageError::InvalidConfig { message });
        if self.patch_size == 0 || self.temporal_patch_size == 0 || self.merge_size == 0 {
            return invalid(format!(
                "patch_size {}, temporal_patch_size {} and merge_size {} must be positive",
                self.patch_size, self.temporal_patch_size, self.merge_size
            ));
        }
        if self.patch_size.checked_mul(self.merge_size).is_none() {
            return invalid("patch_size * merge_size overflows".into());
        }
        if self.max_pixels == 0 {
            return invalid("max_pixels must be positive".into());
        }
        Ok(())
    }

    /// `(height, width)` after smart resize, as mlx-vlm's `_resolved_size`: multiples of
    /// `factor = patch_size * merge_size` near the original size, scaled into
    /// `min_pixels..=max_pixels`. Errors: a zero side, an aspect ratio over 200, a zero result.
    pub fn resized_size(&self, height: usize, width: usize) -> Result<(usize, usize), ImageError> {
        self.resized_size_named(height, width, &format!("{width}x{height} image"))
    }

    fn resized_size_named(
        &self,
        height: usize,
        width: usize,
        name: &str,
    ) -> Result<(usize, usize), ImageError> {
        self.validate()?;
        let (h, w) = smart_resize(
            height,
            width,
            self.patch_size * self.merge_size,
            self.min_pixels,
            self.max_pixels,
            name,
        )?;
        if h == 0 || w == 0 {
            return Err(ImageError::ResizeToZero {
                name: name.to_string(),
                width,
                height,
                new_width: w,
                new_height: h,
            });
        }
        Ok((h, w))
    }

    /// Number of language-model tokens an image of this size becomes, as mlx-vlm's
    /// `num_image_tokens`: `(grid_h * grid_w) / merge_size^2` of the resized image.
    pub fn num_image_tokens(&self, height: usize, width: usize) -> Result<usize, ImageError> {
        self.num_image_tokens_named(height, width, &format!("{width}x{height} image"))
    }

    /// [`ImageProcessorConfig::num_image_tokens`] with errors naming the image `name`.
    pub fn num_image_tokens_named(
        &self,
        height: usize,
        width: usize,
        name: &str,
    ) -> Result<usize, ImageError> {
        let (h, w) = self.resized_size_named(height, width, name)?;
        Ok((h / self.patch_size) * (w / self.patch_size) / (self.merge_size * self.merge_size))
    }
}

/// mlx-vlm's `_smart_resize_image` (a port of Hugging Face's qwen2_vl `smart_resize`):
///
/// ```python
/// if max(height, width) / min(height, width) > 200: raise ValueError
/// h_bar = round(height / factor) * factor
/// w_bar = round(width / factor) * factor
/// if h_bar * w_bar > max_pixels:
///     beta = math.sqrt((height * width) / max_pixels)
///     h_bar = max(factor, math.floor(height / beta / factor) * factor)
///     w_bar = max(factor, math.floor(width / beta / factor) * factor)
/// elif h_bar * w_bar < min_pixels:
///     beta = math.sqrt(min_pixels / (height * width))
///     h_bar = math.ceil(height * beta / factor) * factor
///     w_bar = math.ceil(width * beta / factor) * factor
/// ```
///
/// Python's `/` on ints is the correctly rounded f64 quotient, which f64 division of the exact
/// operands also is while they stay below 2^53 (every image within [`ImageLimits`] does);
/// `round` rounds half to even; the products are exact Python ints (u128 here). Unlike the
/// video variant there is no "smaller than factor" check: a 1x1 image is enlarged.
fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
    name: &str,
) -> Result<(usize, usize), ImageError> {
    if height == 0 || width == 0 {
        // Python: ZeroDivisionError in the aspect-ratio check.
        return Err(ImageError::Empty {
            name: name.to_string(),
            width,
            height,
        });
    }
    let (hf, wf, f) = (height as f64, width as f64, factor as f64);
    let ratio = hf.max(wf) / hf.min(wf);
    if ratio > 200.0 {
        return Err(ImageError::AspectRatio {
            name: name.to_string(),
            width,
            height,
            ratio,
        });
    }
    let factor_u = factor as u128;
    // `as u128` of a non-negative finite float is its integer value (saturating, never UB).
    let mut h_bar = ((hf / f).round_ties_even() as u128).saturating_mul(factor_u);
    let mut w_bar = ((wf / f).round_ties_even() as u128).saturating_mul(factor_u);
    let area = height as u128 * width as u128;
    if h_bar.saturating_mul(w_bar) > max_pixels as u128 {
        let beta = (area as f64 / max_pixels as f64).sqrt();
        h_bar = factor_u.max(((hf / beta / f).floor() as u128).saturating_mul(factor_u));
        w_bar = factor_u.max(((wf / beta / f).floor() as u128).saturating_mul(factor_u));
    } else if h_bar.saturating_mul(w_bar) < min_pixels as u128 {
        let beta = (min_pixels as f64 / area as f64).sqrt();
        h_bar = ((hf * beta / f).ceil() as u128).saturating_mul(factor_u);
        w_bar = ((wf * beta / f).ceil() as u128).saturating_mul(factor_u);
    }
    let too_large = || ImageError::TooLarge {
        name: name.to_string(),
        detail: format!("{width}x{height} pixels resize to {w_bar}x{h_bar}, too large"),
    };
    Ok((
        usize::try_from(h_bar).map_err(|_| too_large())?,
        usize::try_from(w_bar).map_err(|_| too_large())?,
    ))
}

// ------------------------------------------------------------------------------------------
// Decoding

/// An 8-bit RGB image, rows top to bottom, pixels left to right, 3 bytes (R, G, B) each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `width * height * 3` bytes, HWC.
    pub data: Vec<u8>,
}

/// Bounds [`decode_image`] enforces before decoding anything (a decompression-bomb guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest accepted file, in bytes.
    pub max_bytes: usize,
    /// Largest accepted `width * height` as the file's header states it.
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    /// 64 MiB files, 8192 x 8192 pixels (Pillow itself refuses over 2 x 89,478,485 pixels).
    fn default() -> Self {
        Self {
            max_bytes: 64 << 20,
            max_pixels: 8192 * 8192,
        }
    }
}

/// Decodes a PNG, JPEG or WebP file (recognised by its signature, not by `name`) into 8-bit RGB
/// as mlx-vlm's `load_image` gets it from Pillow 13:
/// `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`. `name` (a path, or e.g. "image 2")
/// names the image in errors.
///
/// * The EXIF orientation (tag 0x0112 of the eXIf chunk, APP1 segment or EXIF chunk; or, when
///   there is no such tag, `tiff:Orientation` in the XMP packet, as Pillow's `getexif` falls
///   back to) is applied: orientations 2-8 flip / rotate the image as Pillow does.
/// * RGBA / LA: alpha is dropped, not composited; L: grey replicated; palette: expanded (a tRNS
///   transparency is ignored); 1/2/4-bit grey: scaled to 0..255.
/// * 16-bit PNG: RGB, RGBA and grey+alpha keep the high byte of each sample (Pillow's `;16B`
///   unpackers); 16-bit grey (with or without tRNS) is opened by Pillow as `I;16`, whose
///   `convert("RGB")` clips every value above 255 to 255 (so mostly white), and that is what
///   this returns too.
/// * JPEG: decoded by zune-jpeg, not libjpeg-turbo: the IDCT and chroma upsampling differ, so
///   values may differ from Pillow's by a few levels (measured on the fixtures: at most 3, mean
///   0.35 for 4:2:0 chroma, 0.04 for 4:4:4; CMYK at most 1). PNG and WebP (lossless, and the
///   lossy file measured) are byte-identical to Pillow.
///
/// Pillow's decoding differs from this in rare cases only: an eXIf chunk after the image data,
/// or an EXIF block in a PNG text chunk ("Raw profile type exif"), is not read here; ICC
/// profiles and gamma are ignored by both.
///
/// Errors: over `limits` ([`ImageError::TooLarge`], from the header, before decoding), an
/// unknown format, a corrupt or truncated file, zero pixels.
pub fn decode_image(
    bytes: &[u8],
    name: &str,
    limits: &ImageLimits,
) -> Result<RgbImage, ImageError> {
    let (hdr, decoder) = open_image(bytes, name, limits)?;
    let img = DynamicImage::from_decoder(decoder).map_err(|e| decode_error(name, e))?;
    let rgb = to_rgb_like_pillow(img, hdr.png_grey16);
    debug_assert_eq!(rgb.len(), hdr.width * hdr.height * 3);
    let img = RgbImage {
        width: hdr.width,
        height: hdr.height,
        data: rgb,
    };
    let img = apply_orientation(img, hdr.orientation);
    tracing::debug!(
        image = name,
        format = ?hdr.format,
        width = img.width,
        height = img.height,
        orientation = hdr.orientation,
        "decoded image"
    );
    Ok(img)
}

/// The media type of an image file, from its signature (as [`decode_image`] recognises it):
/// `image/png`, `image/jpeg`, `image/webp`, else `application/octet-stream`.
pub fn media_type(bytes: &[u8]) -> &'static str {
    match image::guess_format(bytes) {
        Ok(ImageFormat::Png) => "image/png",
        Ok(ImageFormat::Jpeg) => "image/jpeg",
        Ok(ImageFormat::WebP) => "image/webp",
        _ => "application/octet-stream",
    }
}

/// The `(width, height)` [`decode_image`] gives (EXIF orientation applied), read from the
/// file's header without decoding its pixels; the same checks and errors before the pixels.
pub fn image_size(
    bytes: &[u8],
    name: &str,
    limits: &ImageLimits,
) -> Result<(usize, usize), ImageError> {
    let (h, _) = open_image(bytes, name, limits)?;
    Ok(if (5..=8).contains(&h.orientation) {
        (h.height, h.width)
    } else {
        (h.width, h.height)
    })
}

/// What a file's header says, read before any pixel is decoded.
struct Header {
    format: ImageFormat,
    width: usize,
    height: usize,
    orientation: u16,
    /// A 16-bit grey PNG (color type 0), which reaches us as grey+alpha when it has tRNS.
    png_grey16: bool,
}

/// `image::ImageError` as ours, naming the image.
fn decode_error(name: &str, e: image::ImageError) -> ImageError {
    match e {
        image::ImageError::Unsupported(u) => ImageError::Decode {
            name: name.to_string(),
            message: format!("unsupported: {u}"),
        },
        image::ImageError::Limits(l) => ImageError::TooLarge {
            name: name.to_string(),
            detail: format!("over the decoder's memory limit: {l}"),
        },
        e => ImageError::Decode {
            name: name.to_string(),
            message: e.to_string(),
        },
    }
}

/// The checks before decoding (size limits, format, completeness, the header's dimensions) and
/// the decoder, positioned at the pixels.
fn open_image<'a>(
    bytes: &'a [u8],
    name: &str,
    limits: &ImageLimits,
) -> Result<(Header, impl ImageDecoder + 'a), ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooLarge {
            name: name.to_string(),
            detail: format!(
                "the file is {} bytes, over the limit of {} bytes",
                bytes.len(),
                limits.max_bytes
            ),
        });
    }
    let format = match image::guess_format(bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP)) => f,
        Ok(other) => {
            return Err(ImageError::UnsupportedFormat {
                name: name.to_string(),
                detected: Some(format!("{other:?}")),
            })
        }
        Err(_) => {
            return Err(ImageError::UnsupportedFormat {
                name: name.to_string(),
                detected: None,
            })
        }
    };
    let complete = match format {
        ImageFormat::Jpeg => check_jpeg_complete(bytes),
        ImageFormat::WebP => check_webp_complete(bytes),
        _ => Ok(()),
    };
    complete.map_err(|message| ImageError::Decode {
        name: name.to_string(),
        message,
    })?;

    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut decoder_limits = image::Limits::default();
    // Room for the largest decoded buffer the pixel limit allows (16-bit RGBA) and the
    // decoders' own buffers; the pixel count itself is checked below, from the header.
    decoder_limits.max_alloc = Some(
        limits
            .max_pixels
            .saturating_mul(8)
            .saturating_add(256 << 20),
    );
    reader.limits(decoder_limits);
    let mut decoder = reader.into_decoder().map_err(|e| decode_error(name, e))?;

    let (w, h) = decoder.dimensions();
    let (width, height) = (w as usize, h as usize);
    if width == 0 || height == 0 {
        return Err(ImageError::Empty {
            name: name.to_string(),
            width,
            height,
        });
    }
    let pixels = u64::from(w) * u64::from(h);
    if pixels > limits.max_pixels {
        return Err(ImageError::TooLarge {
            name: name.to_string(),
            detail: format!(
                "the header says {w}x{h} = {pixels} pixels, over the limit of {}",
                limits.max_pixels
            ),
        });
    }

    // Orientation metadata is read before the pixels (a metadata error is not fatal: Pillow
    // would ignore an unparsable block too).
    let exif = decoder.exif_metadata().ok().flatten();
    let xmp = decoder.xmp_metadata().ok().flatten();
    let orientation = exif
        .as_deref()
        .and_then(exif_orientation)
        .or_else(|| xmp.as_deref().and_then(xmp_orientation))
        .unwrap_or(1);
    // 16-bit grey PNGs (color type 0), with tRNS, reach us as grey+alpha: tell them apart.
    let png_grey16 =
        format == ImageFormat::Png && bytes.get(24) == Some(&16) && bytes.get(25) == Some(&0);
    let header = Header {
        format,
        width,
        height,
        orientation,
        png_grey16,
    };
    Ok((header, decoder))
}

/// Pillow refuses a JPEG whose data ends before the decoder is done ("image file is truncated");
/// zune-jpeg (lenient mode, as the `image` crate runs it) would fill the rest with grey. Walks
/// the marker segments and the entropy-coded data to the EOI marker; an end of file before it is
/// an error.
fn check_jpeg_complete(bytes: &[u8]) -> Result<(), String> {
    let truncated = || Err("the JPEG file is truncated (no end-of-image marker)".to_string());
    let mut i = 2; // after SOI
    loop {
        // A marker: 0xFF, any fill 0xFF bytes, then the code.
        if i >= bytes.len() {
            return truncated();
        }
        if bytes[i] != 0xFF {
            // Garbage between segments: libjpeg skips to the next marker; so do we.
            i += 1;
            continue;
        }
        while i < bytes.len() && bytes[i] == 0xFF {
            i += 1;
        }
        let Some(&code) = bytes.get(i) else {
            return truncated();
        };
        i += 1;
        match code {
            0xD9 => return Ok(()),                 // EOI
            0x01 | 0xD0..=0xD8 | 0x00 => continue, // TEM, RSTn, SOI, stuffed: no length
            _ => {
                let Some(len) = bytes
                    .get(i..i + 2)
                    .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
                else {
                    return truncated();
                };
                i += len;
                if i > bytes.len() {
                    return truncated();
                }
                if code == 0xDA {
                    // SOS: entropy-coded data up to the next marker that is not a stuffed
                    // 0xFF00 or a restart marker.
                    loop {
                        match bytes.get(i..i + 2) {
                            None => return truncated(),
                            Some([0xFF, 0x00]) | Some([0xFF, 0xD0..=0xD7]) => i += 2,
                            Some([0xFF, _]) => break,
                            Some(_) => i += 1,
                        }
                    }
                }
            }
        }
    }
}

/// libwebp (so Pillow) refuses a WebP file shorter than its RIFF header says; image-webp would
/// decode the image if only trailing metadata chunks were cut off.
fn check_webp_complete(bytes: &[u8]) -> Result<(), String> {
    let riff = bytes
        .get(4..8)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    match riff {
        Some(size) if size.saturating_add(8) <= bytes.len() => check_webp_chunks(bytes, size + 8),
        Some(size) => Err(format!(
            "the WebP file is truncated ({} bytes, its header says {})",
            bytes.len(),
            size.saturating_add(8)
        )),
        None => Err("the WebP file is truncated".to_string()),
    }
}

/// Every chunk of the RIFF payload `bytes[12..end]` must lie inside it: image-webp allocates
/// what a chunk's header claims (the fuzzer found a 2.7 KB file making it reserve 2.5 GB
/// through a metadata chunk), so a claim past the end is refused before it decodes anything.
fn check_webp_chunks(bytes: &[u8], end: usize) -> Result<(), String> {
    let mut at = 12;
    while at + 8 <= end {
        let fourcc = String::from_utf8_lossy(&bytes[at..at + 4]).into_owned();
        let size = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]])
            as usize;
        let next = (at + 8)
            .checked_add(size)
            .and_then(|n| n.checked_add(size % 2));
        match next {
            // a final chunk may omit its padding byte
            Some(n) if n <= end || (size % 2 == 1 && n == end + 1) => at = n,
            _ => {
                return Err(format!(
                    "the WebP file's `{}` chunk claims {size} bytes, past the end of the file",
                    fourcc.escape_debug()
                ))
            }
        }
    }
    Ok(())
}

/// The orientation tag (0x0112) of an EXIF block (with or without the "Exif\0\0" prefix of a
/// JPEG APP1 segment): `Some(value)` when the tag is present, whatever its value, since Pillow
/// then ignores XMP.
fn exif_orientation(exif: &[u8]) -> Option<u16> {
    let d = exif.strip_prefix(b"Exif\0\0").unwrap_or(exif);
    let le = match d.get(..4)? {
        b"II*\0" => true,
        b"MM\0*" => false,
        _ => return None,
    };
    let u16_at = |o: usize| {
        let b = d.get(o..o + 2)?;
        Some(if le {
            u16::from_le_bytes([b[0], b[1]])
        } else {
            u16::from_be_bytes([b[0], b[1]])
        })
    };
    let u32_at = |o: usize| {
        let b = d.get(o..o + 4)?;
        let b = [b[0], b[1], b[2], b[3]];
        Some(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let ifd = usize::try_from(u32_at(4)?).ok()?;
    let entries = usize::from(u16_at(ifd)?);
    (0..entries).find_map(|n| {
        let entry = ifd + 2 + 12 * n;
        if u16_at(entry)? != 0x0112 {
            return None;
        }
        match u16_at(entry + 2)? {
            3 => u16_at(entry + 8),                                            // SHORT
            4 => u32_at(entry + 8).map(|v| v.min(u32::from(u16::MAX)) as u16), // LONG
            _ => d.get(entry + 8).map(|&b| u16::from(b)),                      // BYTE and the like
        }
    })
}

/// Pillow's XMP fallback: the first match of `tiff:Orientation(="|>)([0-9])`.
fn xmp_orientation(xmp: &[u8]) -> Option<u16> {
    const KEY: &[u8] = b"tiff:Orientation";
    let mut from = 0;
    while let Some(pos) = xmp[from..].windows(KEY.len()).position(|w| w == KEY) {
        let rest = &xmp[from + pos + KEY.len()..];
        let digit = match rest {
            [b'=', b'"', d, ..] | [b'>', d, ..] if d.is_ascii_digit() => Some(*d),
            _ => None,
        };
        if let Some(d) = digit {
            return Some(u16::from(d - b'0'));
        }
        from += pos + 1;
    }
    None
}

/// Pillow's `convert("RGB")` of what it opened (see [`decode_image`] for the 16-bit rules).
fn to_rgb_like_pillow(img: DynamicImage, png_grey16: bool) -> Vec<u8> {
    fn grey(values: impl Iterator<Item = u8>, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len * 3);
        for v in values {
            out.extend_from_slice(&[v, v, v]);
        }
        out
    }
    // Pillow's I;16 -> RGB: `in[1] == 0 ? in[0] : 255`.
    let clip16 = |v: u16| u8::try_from(v).unwrap_or(255);
    let high = |v: u16| (v >> 8) as u8;
    let n = (img.width() as usize) * (img.height() as usize);
    match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageRgba8(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        DynamicImage::ImageLuma8(b) => grey(b.into_raw().into_iter(), n),
        DynamicImage::ImageLumaA8(b) => grey(b.into_raw().chunks_exact(2).map(|p| p[0]), n),
        DynamicImage::ImageLuma16(b) => grey(b.into_raw().into_iter().map(clip16), n),
        DynamicImage::ImageLumaA16(b) => {
            let to8 = if png_grey16 { clip16 } else { high };
            grey(b.into_raw().chunks_exact(2).map(|p| to8(p[0])), n)
        }
        DynamicImage::ImageRgb16(b) => b.into_raw().into_iter().map(high).collect(),
        DynamicImage::ImageRgba16(b) => b
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [high(p[0]), high(p[1]), high(p[2])])
            .collect(),
        // PNG, JPEG and WebP decode to none of the other layouts.
        other => other.to_rgb8().into_raw(),
    }
}

/// Pillow's `exif_transpose`: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE,
/// 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90 (Pillow's rotations are counter-clockwise); any other
/// value leaves the image as it is.
fn apply_orientation(img: RgbImage, orientation: u16) -> RgbImage {
    let (w, h) = (img.width, img.height);
    // For each output pixel (x, y), the source pixel.
    let map: fn(usize, usize, usize, usize) -> (usize, usize) = match orientation {
        2 => |x, y, w, _| (w - 1 - x, y),
        3 => |x, y, w, h| (w - 1 - x, h - 1 - y),
        4 => |x, y, _, h| (x, h - 1 - y),
        5 => |x, y, _, _| (y, x),
        6 => |x, y, _, h| (y, h - 1 - x),
        7 => |x, y, w, h| (w - 1 - y, h - 1 - x),
        8 => |x, y, w, _| (w - 1 - y, x),
        _ => return img,
    };
    let (ow, oh) = if orientation >= 5 { (h, w) } else { (w, h) };
    let mut data = Vec::with_capacity(img.data.len());
    for y in 0..oh {
        for x in 0..ow {
            let (sx, sy) = map(x, y, w, h);
            let i = (sy * w + sx) * 3;
            data.extend_from_slice(&img.data[i..i + 3]);
        }
    }
    RgbImage {
        width: ow,
        height: oh,
        data,
    }
}

// ------------------------------------------------------------------------------------------
// Pillow's bicubic resize
//
// Hand-written because the tokens depend on it: the `image` crate's resize filters in f32 and
// rounds differently, while Pillow (libImaging/Resample.c, 13.0.0) computes the filter taps in
// f64, turns them into 22-bit fixed point and accumulates in i32. Every step below follows that
// file: `precompute_coeffs`, `normalize_coeffs_8bpc`, `ImagingResampleHorizontal_8bpc` /
// `Vertical_8bpc` and the pass order of `ImagingResampleInner`.

/// Fixed-point bits of Pillow's 8-bit resampling: 32, minus 8 for the pixel, minus 2 of headroom
/// for the kernel's negative lobes and overshoot.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's `bicubic_filter` (Keys' cubic convolution, a = -0.5), in f64 as written there.
fn bicubic_filter(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = if x < 0.0 { -x } else { x };
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// The filter taps of one axis: for output position `i`, `bounds[i] = (first input, count)` and
/// `coeffs[i * ksize..][..count]` the fixed-point weights.
struct Taps {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    coeffs: Vec<i32>,
}

impl Taps {
    /// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` for the whole axis (box 0..in).
    fn new(in_size: usize, out_size: usize) -> Self {
        // The box edges are C floats: `(double)(in1 - in0) / outSize`.
        let scale = f64::from(in_size as f32) / out_size as f64;
        let filterscale = if scale < 1.0 { 1.0 } else { scale };
        let support = 2.0 * filterscale; // BICUBIC's support is 2.0
        let ksize = support.ceil() as usize * 2 + 1;
        let inv_filterscale = 1.0 / filterscale;
        let mut bounds = Vec::with_capacity(out_size);
        let mut coeffs = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            // `(int)` truncates toward zero, as `as i64` does.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
            let n = (xmax - xmin).max(0) as usize;
            let xmin = xmin as usize;
            let mut ww = 0.0;
            for (x, kx) in k.iter_mut().enumerate().take(n) {
                let w = bicubic_filter(((x + xmin) as f64 - center + 0.5) * inv_filterscale);
                *kx = w;
                ww += w;
            }
            let row = &mut coeffs[xx * ksize..][..n];
            for (c, &kx) in row.iter_mut().zip(&k[..n]) {
                let kx = if ww != 0.0 { kx / ww } else { kx };
                let fixed = kx * f64::from(1u32 << PRECISION_BITS);
                *c = if kx < 0.0 {
                    (-0.5 + fixed) as i32
                } else {
                    (0.5 + fixed) as i32
                };
            }
            bounds.push((xmin, n));
        }
        Self {
            ksize,
            bounds,
            coeffs,
        }
    }

    fn taps(&self, i: usize) -> (usize, &[i32]) {
        let (first, n) = self.bounds[i];
        (first, &self.coeffs[i * self.ksize..][..n])
    }
}

/// Pillow's `clip8`: the accumulator shifted down and clamped to 0..=255 (its lookup table
/// covers every value an `i32 >> 22` can take).
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Starting value of every accumulator: one half, for rounding.
const ROUND_HALF: i32 = 1 << (PRECISION_BITS - 1);

/// The horizontal pass over `rows` of `src` (width `in_w`, `c` channels), each channel of each
/// pixel summed over its taps in i32 as Pillow does (wrapping, which 8-bit input never reaches,
/// keeps it exact).
fn resample_horizontal(
    src: &[u8],
    in_w: usize,
    c: usize,
    rows: std::ops::Range<usize>,
    taps: &Taps,
    out_w: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; rows.len() * out_w * c];
    for (line_out, y) in out.chunks_exact_mut(out_w * c).zip(rows) {
        let line = &src[y * in_w * c..][..in_w * c];
        for (xx, px) in line_out.chunks_exact_mut(c).enumerate() {
            let (xmin, k) = taps.taps(xx);
            let window = &line[xmin * c..][..k.len() * c];
            for (ch, out_v) in px.iter_mut().enumerate() {
                let mut ss = ROUND_HALF;
                for (p, &kv) in window.chunks_exact(c).zip(k) {
                    ss = ss.wrapping_add(i32::from(p[ch]).wrapping_mul(kv));
                }
                *out_v = clip8(ss);
            }
        }
    }
    out
}

/// The vertical pass: `src` holds rows `row0..` of the image (width `w`, `c` channels).
fn resample_vertical(
    src: &[u8],
    w: usize,
    c: usize,
    row0: usize,
    taps: &Taps,
    out_h: usize,
) -> Vec<u8> {
    let row_len = w * c;
    let mut out = vec![0u8; out_h * row_len];
    let mut acc = vec![0i32; row_len];
    for (yy, line_out) in out.chunks_exact_mut(row_len).enumerate() {
        let (ymin, k) = taps.taps(yy);
        acc.fill(ROUND_HALF);
        for (i, &kv) in k.iter().enumerate() {
            let line = &src[(ymin + i - row0) * row_len..][..row_len];
            // Integer sums in any order (wrapping addition is associative): Pillow's result.
            for (a, &p) in acc.iter_mut().zip(line) {
                *a = a.wrapping_add(i32::from(p).wrapping_mul(kv));
            }
        }
        for (o, &a) in line_out.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    out
}

/// Pillow-exact bicubic resize (`Image.resize((new_width, new_height), Image.BICUBIC)`) of an
/// 8-bit image of `channels` interleaved channels, each resampled on its own (as Pillow does for
/// L, RGB and CMYK; Pillow premultiplies RGBA / LA by alpha first, which this does not).
///
/// Two separable passes in Pillow's fixed point, each rounding to 8 bits: horizontal then
/// vertical, except that the vertical pass goes first when the height shrinks by more than
/// twice as many pixels as the width (Pillow's `horizontal_first` rule); a pass whose size does
/// not change is skipped, and an unchanged size is a copy. A zero output size gives an empty
/// buffer; a zero-size source gives zeros (Pillow has no input taps for it).
///
/// # Panics
///
/// If `src.len() != width * height * channels`, or an output size overflows `usize`.
pub fn resize_bicubic(
    src: &[u8],
    width: usize,
    height: usize,
    channels: usize,
    new_width: usize,
    new_height: usize,
) -> Vec<u8> {
    let in_len = width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(channels))
        .expect("resize_bicubic: width * height * channels overflows");
    assert_eq!(
        src.len(),
        in_len,
        "resize_bicubic: {width}x{height}x{channels} needs {in_len} bytes, got {}",
        src.len()
    );
    let out_len = new_width
        .checked_mul(new_height)
        .and_then(|n| n.checked_mul(channels))
        .expect("resize_bicubic: new_width * new_height * channels overflows");
    if out_len == 0 {
        return Vec::new();
    }
    if (width, height) == (new_width, new_height) {
        return src.to_vec();
    }
    if in_len == 0 {
        return vec![0; out_len];
    }
    let c = channels;
    let need_horizontal = new_width != width;
    let need_vertical = new_height != height;
    // Pillow: `!((in_h - out_h) > 0 && (in_h - out_h) > (in_w - out_w) * 2)` in C ints.
    let (dh, dw) = (
        height as i64 - new_height as i64,
        width as i64 - new_width as i64,
    );
    let horizontal_first = !(dh > 0 && dh > dw * 2);
    match (need_horizontal, need_vertical) {
        (true, false) => resample_horizontal(
            src,
            width,
            c,
            0..height,
            &Taps::new(width, new_width),
            new_width,
        ),
        (false, true) => {
            resample_vertical(src, width, c, 0, &Taps::new(height, new_height), new_height)
        }
        _ if horizontal_first => {
            let vertical = Taps::new(height, new_height);
            // Only the source rows the vertical pass reads go through the horizontal pass.
            let first = vertical.bounds[0].0;
            let (last_min, last_n) = vertical.bounds[new_height - 1];
            let tmp = resample_horizontal(
                src,
                width,
                c,
                first..last_min + last_n,
                &Taps::new(width, new_width),
                new_width,
            );
            resample_vertical(&tmp, new_width, c, first, &vertical, new_height)
        }
        _ => {
            let tmp =
                resample_vertical(src, width, c, 0, &Taps::new(height, new_height), new_height);
            resample_horizontal(
                &tmp,
                width,
                c,
                0..new_height,
                &Taps::new(width, new_width),
                new_width,
            )
        }
    }
}

// ------------------------------------------------------------------------------------------
// Patches

/// An image ready for the vision tower: mlx-vlm's `pixel_values` rows and `image_grid_thw`.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedImage {
    /// `[t, h, w]` in patches: `[1, resized_height / patch_size, resized_width / patch_size]`.
    pub grid_thw: [usize; 3],
    /// `t * h * w` rows of `3 * temporal_patch_size * patch_size^2` floats each, in mlx-vlm's
    /// order: rows go over merge blocks (row-major), then the `merge_size x merge_size` patches
    /// inside a block (row-major); a row is channel, then frame, then the patch's pixels
    /// (row-major).
    pub pixel_values: Vec<f32>,
}

impl PreparedImage {
    /// Language-model tokens this image becomes: `t * h * w / merge_size^2`.
    pub fn num_tokens(&self, merge_size: usize) -> usize {
        let [t, h, w] = self.grid_thw;
        (t * h * w) / (merge_size * merge_size).max(1)
    }

    /// Floats per row of [`Self::pixel_values`] (`3 * temporal_patch_size * patch_size^2`).
    pub fn row_len(&self) -> usize {
        let [t, h, w] = self.grid_thw;
        self.pixel_values.len() / (t * h * w).max(1)
    }
}

/// Most pixels a resized image may have (a guard against configs that would allocate without
/// bound; mlx-vlm's budgets are far below it).
const MAX_RESIZED_PIXELS: usize = 8192 * 8192;

/// mlx-vlm's `Qwen3VLImageProcessor._process_one`: smart resize
/// ([`ImageProcessorConfig::resized_size`]), Pillow's bicubic resize ([`resize_bicubic`]),
/// then in f32, per channel `c`: `x = v as f32`, `x = x * rescale_factor` (if `do_rescale`),
/// `x = (x - mean[c]) / std[c]` (if `do_normalize`) -- each operation rounded to f32 as numpy
/// does, so the values are bit-identical -- and the patch layout of [`PreparedImage`]. `name`
/// names the image in errors.
pub fn prepare(
    img: &RgbImage,
    cfg: &ImageProcessorConfig,
    name: &str,
) -> Result<PreparedImage, ImageError> {
    let (w, h) = (img.width, img.height);
    if w.checked_mul(h).and_then(|n| n.checked_mul(3)) != Some(img.data.len()) {
        return Err(ImageError::InvalidImage {
            name: name.to_string(),
            message: format!(
                "a {w}x{h} RGB image needs {w} * {h} * 3 bytes, the buffer has {}",
                img.data.len()
            ),
        });
    }
    let (rh, rw) = cfg.resized_size_named(h, w, name)?;
    if rh.saturating_mul(rw) > MAX_RESIZED_PIXELS {
        return Err(ImageError::TooLarge {
            name: name.to_string(),
            detail: format!(
                "{w}x{h} pixels resize to {rw}x{rh}, over {MAX_RESIZED_PIXELS} pixels \
                 (min_pixels {}, max_pixels {})",
                cfg.min_pixels, cfg.max_pixels
            ),
        });
    }
    let resized = resize_bicubic(&img.data, w, h, 3, rw, rh);

    // The 256 possible values of each channel, computed as numpy does element by element.
    let lut: [[f32; 256]; 3] = std::array::from_fn(|c| {
        std::array::from_fn(|v| {
            let mut x = v as f32;
            if cfg.do_rescale {
                x *= cfg.rescale_factor;
            }
            if cfg.do_normalize {
                x = (x - cfg.image_mean[c]) / cfg.image_std[c];
            }
            x
        })
    });

    let (ps, tps, ms) = (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size);
    let (gh, gw) = (rh / ps, rw / ps);
    // numpy: (1, 1, tps, C, gh/ms, ms, ps, gw/ms, ms, ps).transpose(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    let row_len = 3 * tps * ps * ps;
    let mut pixel_values = Vec::with_capacity(gh * gw * row_len);
    for bh in 0..gh / ms {
        for bw in 0..gw / ms {
            for mh in 0..ms {
                for mw in 0..ms {
                    let y0 = (bh * ms + mh) * ps;
                    let x0 = (bw * ms + mw) * ps;
                    for (c, lut) in lut.iter().enumerate() {
                        for _ in 0..tps {
                            for y in y0..y0 + ps {
                                let line = &resized[(y * rw + x0) * 3..][..ps * 3];
                                pixel_values
                                    .extend(line.chunks_exact(3).map(|p| lut[p[c] as usize]));
                            }
                        }
                    }
                }
            }
        }
    }
    debug_assert_eq!(pixel_values.len(), gh * gw * row_len);
    Ok(PreparedImage {
        grid_thw: [1, gh, gw],
        pixel_values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vision-resize")
    }

    fn read(rel: &str) -> Vec<u8> {
        let path = fixtures().join(rel);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn manifest() -> Value {
        serde_json::from_slice(&read("manifest.json")).expect("manifest.json")
    }

    fn usize_of(v: &Value) -> usize {
        v.as_u64().expect("an integer") as usize
    }

    fn decode_file(rel: &str) -> Result<RgbImage, ImageError> {
        decode_image(&read(rel), rel, &ImageLimits::default())
    }

    /// (max |diff|, mean |diff|) of two equally long byte buffers.
    fn diff(a: &[u8], b: &[u8]) -> (u8, f64) {
        let mut max = 0;
        let mut sum = 0u64;
        for (&x, &y) in a.iter().zip(b) {
            let d = x.abs_diff(y);
            max = max.max(d);
            sum += u64::from(d);
        }
        (max, sum as f64 / a.len().max(1) as f64)
    }

    /// Bounds on the zune-jpeg vs libjpeg-turbo difference (and image-webp vs libwebp for lossy
    /// WebP), with some room over what the fixtures measure (README there): JPEG at most 3
    /// levels, mean 0.35 with 4:2:0 chroma (upsampling differs), 0.04 with 4:4:4 (the IDCT);
    /// lossy WebP identical.
    const LOSSY_MAX_DIFF: u8 = 4;
    const LOSSY_MEAN_DIFF: f64 = 0.5;

    #[test]
    fn decode_matches_pillow() {
        let m = manifest();
        let mut lossy = Vec::new();
        for case in m["decode"].as_array().unwrap() {
            let file = case["file"].as_str().unwrap();
            let img = decode_file(file).unwrap_or_else(|e| panic!("{e}"));
            let want = read(case["rgb"].as_str().unwrap());
            assert_eq!(
                (img.width, img.height),
                (usize_of(&case["width"]), usize_of(&case["height"])),
                "{file}: size"
            );
            if case["exact"].as_bool().unwrap() {
                assert!(
                    img.data == want,
                    "{file}: not Pillow's bytes ({:?})",
                    diff(&img.data, &want)
                );
            } else {
                let (max, mean) = diff(&img.data, &want);
                lossy.push(format!("{file}: max {max}, mean {mean:.3}"));
                assert!(
                    max <= LOSSY_MAX_DIFF && mean <= LOSSY_MEAN_DIFF,
                    "{file}: max |diff| {max}, mean {mean:.3} vs Pillow"
                );
            }
        }
        assert!(!lossy.is_empty());
        eprintln!("lossy decoders vs Pillow:\n  {}", lossy.join("\n  "));
    }

    /// `image_size` reads from the header what `decode_image` gives, orientation included.
    #[test]
    fn sizes_from_headers_match_the_decoded_images() {
        let mut n = 0;
        for e in std::fs::read_dir(fixtures().join("images")).unwrap() {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let name = path.display().to_string();
            let limits = ImageLimits::default();
            match (
                decode_image(&bytes, &name, &limits),
                image_size(&bytes, &name, &limits),
            ) {
                (Ok(img), Ok(size)) => {
                    assert_eq!((img.width, img.height), size, "{name}");
                    n += 1;
                }
                (Err(_), _) => {}
                (Ok(_), Err(e)) => panic!("{name}: decodes but its size does not read: {e}"),
            }
        }
        assert!(n > 20, "{n} images compared");
    }

    #[test]
    fn decode_errors() {
        // found by `cargo xtask fuzz --target image`: a 2.7 KB WebP whose metadata chunk
        // claims more bytes than the file holds made image-webp reserve 2.5 GB
        let hostile = "hostile/webp_chunk_claims_2gb.webp";
        let bytes = std::fs::read(fixtures().join(hostile)).unwrap();
        let err = decode_image(&bytes, hostile, &ImageLimits::default()).unwrap_err();
        assert!(
            matches!(&err, ImageError::Decode { message, .. } if message.contains("past the end")),
            "{err}"
        );
        let m = manifest();
        for case in m["decode_errors"].as_array().unwrap() {
            let file = case["file"].as_str().unwrap();
            let err = decode_file(file).expect_err(file);
            assert!(err.to_string().contains(file), "{file}: {err}");
            match case.get("error").and_then(Value::as_str) {
                Some("TooLarge") => {
                    assert!(matches!(err, ImageError::TooLarge { .. }), "{file}: {err}")
                }
                _ => assert!(
                    matches!(err, ImageError::Decode { .. } | ImageError::Empty { .. }),
                    "{file}: {err}"
                ),
            }
        }
        let limits = ImageLimits::default();
        let garbage = decode_image(b"definitely not an image", "image 2", &limits).unwrap_err();
        assert!(
            matches!(
                garbage,
                ImageError::UnsupportedFormat { detected: None, .. }
            ),
            "{garbage}"
        );
        assert!(garbage.to_string().starts_with("image 2: "), "{garbage}");
        let gif =
            decode_image(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "a.gif", &limits).unwrap_err();
        assert!(
            matches!(
                gif,
                ImageError::UnsupportedFormat {
                    detected: Some(_),
                    ..
                }
            ),
            "{gif}"
        );
        assert!(decode_image(b"", "empty", &limits).is_err());
        // A PNG signature followed by garbage, and every prefix of a small PNG and a JPEG: a
        // typed error each, never a panic.
        let bad =
            decode_image(b"\x89PNG\r\n\x1a\nnonsense-nonsense", "bad.png", &limits).unwrap_err();
        assert!(matches!(bad, ImageError::Decode { .. }), "{bad}");
        // Pillow still decodes a PNG that lacks its IEND chunk and the IDAT's CRC (the last 20
        // bytes here); JPEG and WebP fail it at any cut.
        for (file, keep) in [
            ("images/orient1_5x3.png", 24),
            ("images/jpeg_q90_420_96x64.jpg", 1),
            ("images/webp_lossless_exif3_37x23.webp", 1),
        ] {
            let bytes = read(file);
            for cut in (0..=bytes.len() - keep).step_by(3) {
                assert!(
                    decode_image(&bytes[..cut], file, &limits).is_err(),
                    "{file} cut at {cut}"
                );
            }
        }
        // The file-size limit.
        let small = ImageLimits {
            max_bytes: 100,
            ..limits
        };
        let err = decode_image(&read("images/rgb_37x23.png"), "big", &small).unwrap_err();
        assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
        // The pixel limit, just under and at the image's size.
        let bytes = read("images/rgb_37x23.png");
        let tight = ImageLimits {
            max_pixels: 37 * 23 - 1,
            ..limits
        };
        assert!(matches!(
            decode_image(&bytes, "x", &tight),
            Err(ImageError::TooLarge { .. })
        ));
        let exact = ImageLimits {
            max_pixels: 37 * 23,
            ..limits
        };
        assert!(decode_image(&bytes, "x", &exact).is_ok());
    }

    #[test]
    fn resize_matches_pillow() {
        let m = manifest();
        let cases = m["resize"].as_array().unwrap();
        assert!(cases.len() >= 30);
        for case in cases {
            let src = read(case["src"].as_str().unwrap());
            let (w, h, c) = (
                usize_of(&case["width"]),
                usize_of(&case["height"]),
                usize_of(&case["channels"]),
            );
            let (nw, nh) = (usize_of(&case["new_width"]), usize_of(&case["new_height"]));
            let want = read(case["out"].as_str().unwrap());
            let got = resize_bicubic(&src, w, h, c, nw, nh);
            assert!(
                got == want,
                "{} {w}x{h} -> {nw}x{nh}: not Pillow's bytes ({:?})",
                case["mode"],
                diff(&got, &want)
            );
        }
    }

    fn size_config(m: &Value, name: &str) -> ImageProcessorConfig {
        let c = &m["size_configs"][name];
        ImageProcessorConfig {
            patch_size: usize_of(&c["patch_size"]),
            temporal_patch_size: usize_of(&c["temporal_patch_size"]),
            merge_size: usize_of(&c["merge_size"]),
            min_pixels: usize_of(&c["min_pixels"]),
            max_pixels: usize_of(&c["max_pixels"]),
            ..Default::default()
        }
    }

    #[test]
    fn smart_resize_matches_mlx_vlm() {
        let m = manifest();
        let cases = m["smart_resize"].as_array().unwrap();
        assert!(cases.len() > 500);
        let mut halves = 0;
        for case in cases {
            let cfg = size_config(&m, case["config"].as_str().unwrap());
            let (h, w) = (usize_of(&case["height"]), usize_of(&case["width"]));
            let got = cfg.resized_size(h, w);
            let tokens = cfg.num_image_tokens(h, w);
            if let Some(err) = case.get("error").and_then(Value::as_str) {
                let got = got.expect_err(err);
                if err.starts_with("ValueError: absolute aspect ratio") {
                    assert!(
                        matches!(got, ImageError::AspectRatio { .. }),
                        "{h}x{w}: {got}"
                    );
                } else {
                    assert!(matches!(got, ImageError::Empty { .. }), "{h}x{w}: {got}");
                }
                assert!(tokens.is_err());
                continue;
            }
            let want = case["resized"].as_array().unwrap();
            let got = got.unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(got, (usize_of(&want[0]), usize_of(&want[1])), "{case}");
            assert_eq!(
                tokens.unwrap(),
                usize_of(&case["num_image_tokens"]),
                "{case}"
            );
            let factor = usize_of(&case["factor"]);
            if (2 * h) % factor == 0 && (2 * h / factor) % 2 == 1 {
                halves += 1;
            }
        }
        assert!(halves >= 40, "only {halves} round-half cases");
        // Round half to even, by hand: 80 / 32 = 2.5 -> 2, 112 / 32 = 3.5 -> 4.
        let cfg = ImageProcessorConfig::default();
        assert_eq!(cfg.resized_size(80, 112).unwrap(), (64, 128));
        let err = cfg.resized_size(1, 300).unwrap_err();
        assert!(matches!(err, ImageError::AspectRatio { .. }), "{err}");
        assert!(err.to_string().contains("300x1"), "{err}");
        let zero_min = ImageProcessorConfig {
            min_pixels: 0,
            ..cfg.clone()
        };
        assert!(matches!(
            zero_min.resized_size(10, 10),
            Err(ImageError::ResizeToZero { .. })
        ));
    }

    fn processor_config(c: &Value) -> ImageProcessorConfig {
        let mut cfg = ImageProcessorConfig::default();
        let obj = c.as_object().unwrap();
        for (k, v) in obj {
            match k.as_str() {
                "patch_size" => cfg.patch_size = usize_of(v),
                "temporal_patch_size" => cfg.temporal_patch_size = usize_of(v),
                "merge_size" => cfg.merge_size = usize_of(v),
                "min_pixels" => cfg.min_pixels = usize_of(v),
                "max_pixels" => cfg.max_pixels = usize_of(v),
                "do_rescale" => cfg.do_rescale = v.as_bool().unwrap(),
                "do_normalize" => cfg.do_normalize = v.as_bool().unwrap(),
                "image_mean" | "image_std" => {
                    let a: Vec<f32> = v
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect();
                    let a = [a[0], a[1], a[2]];
                    if k == "image_mean" {
                        cfg.image_mean = a;
                    } else {
                        cfg.image_std = a;
                    }
                }
                other => panic!("processor case key {other}"),
            }
        }
        cfg
    }

    #[test]
    fn prepare_matches_mlx_vlm() {
        let m = manifest();
        for case in m["processor"].as_array().unwrap() {
            let label = case["label"].as_str().unwrap();
            let cfg = processor_config(&case["config"]);
            let file = case["image"].as_str().unwrap();
            let img = decode_file(file).unwrap();
            let got = prepare(&img, &cfg, file).unwrap();
            let thw: Vec<usize> = case["grid_thw"]
                .as_array()
                .unwrap()
                .iter()
                .map(usize_of)
                .collect();
            assert_eq!(got.grid_thw.to_vec(), thw, "{label}");
            assert_eq!(got.row_len(), usize_of(&case["row_len"]), "{label}");
            assert_eq!(
                got.num_tokens(cfg.merge_size),
                usize_of(&case["num_image_tokens"]),
                "{label}"
            );
            assert_eq!(
                cfg.num_image_tokens(img.height, img.width).unwrap(),
                usize_of(&case["num_image_tokens"]),
                "{label}"
            );
            let want: Vec<u32> = read(case["pixel_values"].as_str().unwrap())
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            assert_eq!(got.pixel_values.len(), want.len(), "{label}");
            let mismatches = got
                .pixel_values
                .iter()
                .zip(&want)
                .filter(|(g, w)| g.to_bits() != **w)
                .count();
            assert_eq!(
                mismatches, 0,
                "{label}: {mismatches} floats differ from mlx-vlm's"
            );
        }
    }

    #[test]
    fn prepare_errors() {
        let cfg = ImageProcessorConfig::default();
        let wide = RgbImage {
            width: 300,
            height: 1,
            data: vec![7; 900],
        };
        let err = prepare(&wide, &cfg, "wide.png").unwrap_err();
        assert!(matches!(err, ImageError::AspectRatio { .. }), "{err}");
        assert!(err.to_string().starts_with("wide.png: "), "{err}");
        let empty = RgbImage {
            width: 0,
            height: 5,
            data: vec![],
        };
        assert!(matches!(
            prepare(&empty, &cfg, "e"),
            Err(ImageError::Empty { .. })
        ));
        let short = RgbImage {
            width: 4,
            height: 4,
            data: vec![0; 47],
        };
        assert!(matches!(
            prepare(&short, &cfg, "s"),
            Err(ImageError::InvalidImage { .. })
        ));
        let bad = ImageProcessorConfig {
            patch_size: 0,
            ..cfg.clone()
        };
        let ok = RgbImage {
            width: 4,
            height: 4,
            data: vec![0; 48],
        };
        assert!(matches!(
            prepare(&ok, &bad, "ok"),
            Err(ImageError::InvalidConfig { .. })
        ));
        let huge = ImageProcessorConfig {
            min_pixels: usize::MAX / 4,
            ..cfg
        };
        assert!(matches!(
            prepare(&ok, &huge, "ok"),
            Err(ImageError::TooLarge { .. })
        ));
    }

    #[test]
    fn config_loading_matches_mlx_vlm() {
        let m = manifest();
        for case in m["configs"].as_array().unwrap() {
            let dir = fixtures().join(case["dir"].as_str().unwrap());
            let got = ImageProcessorConfig::load(&dir);
            if let Some(bad) = case.get("bad_file").and_then(Value::as_str) {
                let err = got.expect_err(bad);
                match &err {
                    ImageError::Config { path, .. } => assert!(path.ends_with(bad), "{err}"),
                    other => panic!("{}: {other}", dir.display()),
                }
                assert!(err.to_string().contains(bad), "{err}");
                continue;
            }
            let got = got.unwrap_or_else(|e| panic!("{e}"));
            let e = &case["expected"];
            let channels = |v: &Value| -> [f32; 3] {
                let a: Vec<f32> = v
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                if a.len() == 1 {
                    [a[0]; 3]
                } else {
                    [a[0], a[1], a[2]]
                }
            };
            // Python keeps `None` for a null flag; `if None` is false.
            let flag = |v: &Value| v.as_bool().unwrap_or(false);
            let want = ImageProcessorConfig {
                patch_size: usize_of(&e["patch_size"]),
                temporal_patch_size: usize_of(&e["temporal_patch_size"]),
                merge_size: usize_of(&e["merge_size"]),
                min_pixels: usize_of(&e["min_pixels"]),
                max_pixels: usize_of(&e["max_pixels"]),
                image_mean: channels(&e["image_mean"]),
                image_std: channels(&e["image_std"]),
                rescale_factor: e["rescale_factor"].as_f64().unwrap() as f32,
                do_rescale: flag(&e["do_rescale"]),
                do_normalize: flag(&e["do_normalize"]),
                do_convert_rgb: flag(&e["do_convert_rgb"]),
            };
            assert_eq!(got, want, "{}", dir.display());
        }
        // A missing folder is all defaults; a wrongly typed value names its file.
        let missing = ImageProcessorConfig::load(Path::new("/nonexistent/checkpoint")).unwrap();
        assert_eq!(missing, ImageProcessorConfig::default());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("preprocessor_config.json"),
            r#"{"patch_size": "16"}"#,
        )
        .unwrap();
        let err = ImageProcessorConfig::load(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("preprocessor_config.json"),
            "{err}"
        );
        assert!(err.to_string().contains("patch_size"), "{err}");
        std::fs::write(
            dir.path().join("processor_config.json"),
            r#"{"image_processor": {"size": {"longest_edge": -5}}}"#,
        )
        .unwrap();
        let err = ImageProcessorConfig::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("processor_config.json"), "{err}");
    }

    #[test]
    fn orientation_metadata() {
        // Big- and little-endian EXIF, with and without the JPEG "Exif\0\0" prefix.
        let be = b"MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0\0\0\0\0";
        assert_eq!(exif_orientation(be), Some(6));
        let mut prefixed = b"Exif\0\0".to_vec();
        prefixed
            .extend_from_slice(b"II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x08\0\0\0\0\0\0\0");
        assert_eq!(exif_orientation(&prefixed), Some(8));
        assert_eq!(exif_orientation(b"MM\0*\0\0\0\x08\0\0"), None);
        assert_eq!(exif_orientation(b"MM\0*\xff\xff\xff\xff"), None);
        assert_eq!(xmp_orientation(br#"<x tiff:Orientation="3"/>"#), Some(3));
        assert_eq!(
            xmp_orientation(b"<tiff:Orientation>5</tiff:Orientation>"),
            Some(5)
        );
        assert_eq!(
            xmp_orientation(b"tiff:Orientation=x tiff:Orientation>7"),
            Some(7)
        );
        assert_eq!(xmp_orientation(b"tiff:Orientation"), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn resize_never_panics(
            w in 0usize..40, h in 0usize..40, c in 1usize..5,
            nw in 0usize..70, nh in 0usize..70, seed in any::<u64>(),
        ) {
            let mut state = seed;
            let src: Vec<u8> = (0..w * h * c).map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 56) as u8
            }).collect();
            let out = resize_bicubic(&src, w, h, c, nw, nh);
            prop_assert_eq!(out.len(), nw * nh * c);
            // A constant image stays constant (the taps of each output sum to 1).
            if w > 0 && h > 0 {
                let flat = vec![src.first().copied().unwrap_or(0); w * h * c];
                let out = resize_bicubic(&flat, w, h, c, nw, nh);
                prop_assert!(out.iter().all(|&v| v == flat[0]));
            }
        }

        #[test]
        fn smart_resize_is_a_multiple_of_factor(h in 1usize..20000, w in 1usize..20000) {
            let cfg = ImageProcessorConfig::default();
            match cfg.resized_size(h, w) {
                Ok((rh, rw)) => {
                    prop_assert!(rh > 0 && rw > 0 && rh % 32 == 0 && rw % 32 == 0);
                    prop_assert!(rh * rw <= cfg.max_pixels.max(32 * 32));
                }
                Err(ImageError::AspectRatio { .. }) => prop_assert!(h.max(w) > 200 * h.min(w)),
                Err(e) => prop_assert!(false, "{}", e),
            }
        }
    }
}
