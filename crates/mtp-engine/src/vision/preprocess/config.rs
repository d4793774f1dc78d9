//! The processor's settings: `preprocessor_config.json` read as mlx-vlm reads it, and the
//! resize rule (`smart_resize`).

use std::path::Path;

use serde_json::{Map, Value};

use super::*;

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

/// The bytes of a config file, `None` when it does not exist.
fn read_config_file(path: &Path) -> Result<Option<Vec<u8>>, ImageError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ImageError::Config {
            path: path.to_path_buf(),
            message: format!("cannot read: {e}"),
        }),
    }
}

/// Reads a JSON config file's bytes as mlx-vlm's `_load_qwen_vl_json` does: `None` when it
/// does not exist; Python's `json.loads(...) or {}`, so a falsy document (`null`, `{}`, `[]`,
/// `0`, `""`) is empty; any other non-object is an error, as the `.get` / `.update` on it would
/// be.
fn parse_config_object(
    bytes: Option<&[u8]>,
    path: &Path,
) -> Result<Option<Map<String, Value>>, ImageError> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ImageError::Config {
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
        let processor = parse_config_object(
            read_config_file(&processor_path)?.as_deref(),
            &processor_path,
        )?;
        let preprocessor = parse_config_object(
            read_config_file(&preprocessor_path)?.as_deref(),
            &preprocessor_path,
        )?;
        Self::from_objects(preprocessor, processor, dir)
    }

    /// What [`ImageProcessorConfig::load`] reads from `dir`, from the files' bytes (`None`: the
    /// file does not exist; `dir` is only used in errors and logs).
    ///
    /// ```
    /// use mtp_engine::vision::preprocess::ImageProcessorConfig;
    /// let cfg = ImageProcessorConfig::from_json(
    ///     Some(br#"{"patch_size": 14, "size": {"longest_edge": 4096}}"#),
    ///     Some(br#"{"image_processor": {"patch_size": 16}}"#),
    ///     "model".as_ref(),
    /// )?;
    /// assert_eq!((cfg.patch_size, cfg.max_pixels), (16, 4096));
    /// # Ok::<(), mtp_engine::vision::preprocess::ImageError>(())
    /// ```
    pub fn from_json(
        preprocessor: Option<&[u8]>,
        processor: Option<&[u8]>,
        dir: &Path,
    ) -> Result<Self, ImageError> {
        let processor_path = dir.join("processor_config.json");
        let preprocessor_path = dir.join("preprocessor_config.json");
        let processor = parse_config_object(processor, &processor_path)?;
        let preprocessor = parse_config_object(preprocessor, &preprocessor_path)?;
        Self::from_objects(preprocessor, processor, dir)
    }

    /// The settings of the two files' objects (see [`ImageProcessorConfig::load`]).
    fn from_objects(
        preprocessor: Option<Map<String, Value>>,
        processor: Option<Map<String, Value>>,
        dir: &Path,
    ) -> Result<Self, ImageError> {
        let processor_path = dir.join("processor_config.json");
        let preprocessor_path = dir.join("preprocessor_config.json");
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

    pub(super) fn resized_size_named(
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
