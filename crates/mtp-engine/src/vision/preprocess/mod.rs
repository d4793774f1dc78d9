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

mod config;
mod decode;
mod resize;

pub use config::*;
pub use decode::*;
pub use resize::*;

pub use crate::error::ImageError;

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
mod tests;
