//! Reading checkpoints: memory-mapped safetensors (single file or sharded through
//! `model.safetensors.index.json`), floating-point dtypes and MLX affine dequantization.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::QuantMatrix;

/// The precision weight matrices are kept in once loaded. On the CPU the arithmetic is f32
/// whichever is chosen: the matrix products widen bf16 and f16 weights exactly as they read them
/// (see [`crate::simd::Weight`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightDtype {
    /// As the checkpoint stores them: f32, bf16 and f16 matrices stay as they are, so a bf16
    /// checkpoint takes half the memory of its f32 conversion and reads half the bytes per
    /// token, with the same output; MLX-quantized matrices stay packed (on the CPU).
    #[default]
    Stored,
    /// Every matrix converted to this dtype at load (bf16 or f16 halve the memory of an f32
    /// checkpoint by rounding its weights).
    Convert(DType),
}

impl From<DType> for WeightDtype {
    fn from(dtype: DType) -> Self {
        WeightDtype::Convert(dtype)
    }
}

impl WeightDtype {
    /// The dtype a matrix stored as `stored` is kept in.
    pub fn for_stored(self, stored: DType) -> DType {
        match self {
            WeightDtype::Convert(d) => d,
            WeightDtype::Stored => match stored {
                DType::F32 | DType::BF16 | DType::F16 => stored,
                _ => DType::F32,
            },
        }
    }
}

/// The tensors of one checkpoint directory, memory-mapped; nothing is copied until a tensor is
/// asked for.
pub struct Checkpoint {
    dir: PathBuf,
    st: MmapedSafetensors,
    shapes: BTreeMap<String, Vec<usize>>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("tensors", &self.shapes.len())
            .finish()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The safetensors files of a checkpoint directory: the shards named by the index when there is
/// one, else `model.safetensors`, else every `*.safetensors` file in name order.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(io_err(&index))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: index.clone(),
            message: e.to_string(),
        })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::Config {
                path: index.clone(),
                message: "no `weight_map` object".into(),
            })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::Io {
            path: dir.join("model.safetensors"),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no safetensors files"),
        });
    }
    Ok(files)
}

impl Checkpoint {
    /// Memory-maps every safetensors file of `dir` and reads their headers.
    pub fn open(dir: &Path) -> Result<Self> {
        let files = safetensors_files(dir)?;
        for f in &files {
            if !f.is_file() {
                return Err(Error::Io {
                    path: f.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "shard named by the index is missing",
                    ),
                });
            }
        }
        // SAFETY: the files are mapped read-only; like every mmap-based loader we rely on them not
        // being truncated while the engine runs.
        let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| Error::Safetensors {
            path: dir.to_path_buf(),
            message: e.to_string(),
        })?;
        let shapes = st
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().to_vec()))
            .collect();
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            st,
            shapes,
        })
    }

    /// The directory this checkpoint was read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor name with its shape, in name order.
    pub fn shapes(&self) -> &BTreeMap<String, Vec<usize>> {
        &self.shapes
    }

    /// Loads one tensor as stored (no dtype conversion), on the CPU.
    pub fn load_raw(&self, name: &str) -> Result<Tensor> {
        self.st
            .load(name, &Device::Cpu)
            .map_err(|e| Error::Safetensors {
                path: self.dir.clone(),
                message: format!("{name}: {e}"),
            })
    }

    /// Loads one floating-point tensor in the precision it is stored in (f32, bf16 or f16; f64
    /// becomes f32), on the CPU.
    pub fn load_float(&self, name: &str) -> Result<Tensor> {
        let t = self.load_raw(name)?;
        match t.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => Ok(t),
            DType::F64 => Ok(t.to_dtype(DType::F32)?),
            other => Err(Error::Safetensors {
                path: self.dir.clone(),
                message: format!("{name} has dtype {other:?}; expected f32, f16 or bf16"),
            }),
        }
    }
}

/// The tensors of quantized module `module` (weight tensor `name`, canonical module name
/// `canonical`, width from `cfg`'s `quantization`) as a sanitized map holds them, under their
/// canonical names: with `packed`, the u32 `.weight` with its `.scales`, `.biases` and `.bits`
/// (the width, a u32 scalar) beside it (the model builder keeps it packed or dequantizes it,
/// see `nn::Store`); otherwise the `.weight` dequantized to f32.
pub(crate) fn load_quantized(
    ckpt: &Checkpoint,
    cfg: &ModelConfig,
    name: &str,
    module: &str,
    canonical: &str,
    packed: bool,
) -> Result<Vec<(String, Tensor)>> {
    let bits = cfg
        .quant_bits(module, canonical)
        .ok_or_else(|| Error::Quantization {
            name: name.to_string(),
            message: "quantized tensor but config.json has no `quantization.bits`".into(),
        })?;
    let w = ckpt.load_raw(name)?;
    let scales = ckpt.load_raw(&format!("{module}.scales"))?;
    let biases = ckpt.load_raw(&format!("{module}.biases"))?;
    let named = |suffix: &str, t: Tensor| (format!("{canonical}{suffix}"), t);
    if packed {
        // checked now, so that a malformed module fails at load whichever way it is used
        QuantMatrix::check_parts(name, &w, &scales, &biases, bits)?;
        return Ok(vec![
            named(".weight", w),
            named(".scales", scales),
            named(".biases", biases),
            named(".bits", Tensor::new(bits as u32, &Device::Cpu)?),
        ]);
    }
    let dense = dequantize_affine(name, &w, &scales, &biases, bits)?;
    Ok(vec![named(".weight", dense)])
}

/// Dequantizes an MLX affine-quantized matrix: `w = scales * q + biases` per group of
/// `group_size` input columns, with `bits`-wide unsigned values packed little-endian into `u32`
/// words. `packed`: `[..., out, in * bits / 32]` (u32); `scales`, `biases`:
/// `[..., out, in / group_size]`. Returns f32 `[..., out, in]` (see [`QuantMatrix`]).
pub fn dequantize_affine(
    name: &str,
    packed: &Tensor,
    scales: &Tensor,
    biases: &Tensor,
    bits: usize,
) -> Result<Tensor> {
    QuantMatrix::from_parts(name, packed, scales, biases, bits)?.to_tensor()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantize_4bit_row() {
        // one row, 8 inputs at 4 bits = 1 word; values 0..8, group size 8
        let mut word = 0u32;
        for j in 0..8u32 {
            word |= j << (4 * j);
        }
        let packed = Tensor::from_vec(vec![word], (1, 1), &Device::Cpu).unwrap();
        let scales = Tensor::from_vec(vec![0.5f32], (1, 1), &Device::Cpu).unwrap();
        let biases = Tensor::from_vec(vec![-1.0f32], (1, 1), &Device::Cpu).unwrap();
        let w = dequantize_affine("t", &packed, &scales, &biases, 4).unwrap();
        let v = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let want: Vec<f32> = (0..8).map(|j| 0.5 * j as f32 - 1.0).collect();
        assert_eq!(v, want);
    }
}
