//! Reading checkpoints: memory-mapped safetensors (single file or sharded through
//! `model.safetensors.index.json`), floating-point dtypes and MLX affine dequantization.
//!
//! Half-precision tensors are left where they lie in the mapped files ([`Param::Mapped`]) and
//! multiplied there; everything else is copied tensor by tensor, each copied range's pages given
//! back as soon as it is copied, so loading never holds a file's pages and its copy at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, WithDType};
use memmap2::{Mmap, UncheckedAdvice};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::quant::QuantMatrix;

/// The precision weight matrices are kept in once loaded. On the CPU the arithmetic is f32
/// whichever is chosen: the matrix products widen bf16 and f16 weights exactly as they read them
/// (see `kernels::Weight`).
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

/// A tensor read in place from a memory-mapped checkpoint file: the engine multiplies by it
/// where it lies (half precision), so a bf16 checkpoint's matrices are never copied and its
/// pages are the page cache's, shared and evictable like llama.cpp's mmap.
#[derive(Clone)]
pub struct MappedTensor {
    map: Arc<Mmap>,
    /// Byte offset of the first element in `map`.
    start: usize,
    shape: Vec<usize>,
    dtype: DType,
}

impl std::fmt::Debug for MappedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedTensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .finish()
    }
}

/// A slice of `T` over `bytes`, when they are aligned for `T` and a whole number of `T`s.
fn cast_slice<T: WithDType>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
        || !bytes.len().is_multiple_of(size)
    {
        return None;
    }
    // SAFETY: the pointer is aligned for T and the length is a whole number of T, checked
    // above; T is f32, bf16 or f16 here (`WithDType` floats), for which every bit pattern is a
    // value; the bytes live as long as the map borrowed by the returned slice.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

impl MappedTensor {
    /// The shape.
    pub fn dims(&self) -> &[usize] {
        &self.shape
    }

    /// The element type as stored.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }

    fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.byte_len()]
    }

    /// The elements in place, when `T` is the stored element type and the data is aligned for
    /// it (safetensors writers align every tensor; a file that does not is copied instead).
    pub fn as_slice<T: WithDType>(&self) -> Option<&[T]> {
        (T::DTYPE == self.dtype)
            .then(|| cast_slice(self.bytes()))
            .flatten()
    }

    /// A copy as a candle tensor on the CPU. The copied range's pages are then given back
    /// (`MADV_DONTNEED`: the file's pages stay in the page cache but no longer count in this
    /// process's memory), so copying a whole checkpoint tensor by tensor never holds the file
    /// and the copy at once.
    pub fn to_tensor(&self) -> Result<Tensor> {
        let t = Tensor::from_raw_buffer(self.bytes(), self.dtype, &self.shape, &Device::Cpu)?;
        // SAFETY: a read-only file mapping: after MADV_DONTNEED the next read of these pages
        // faults them in again from the file, with the same contents, so nothing that reads the
        // map (this tensor or any other view of it) can observe a change.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, self.start, self.byte_len())
        };
        Ok(t)
    }
}

/// A checkpoint tensor as sanitized: copied into a candle tensor, or still in place in the
/// file (matrices the model multiplies by as stored).
#[derive(Debug, Clone)]
pub enum Param {
    /// In memory.
    Tensor(Tensor),
    /// In the memory-mapped file.
    Mapped(MappedTensor),
}

impl From<Tensor> for Param {
    fn from(t: Tensor) -> Self {
        Param::Tensor(t)
    }
}

impl Param {
    /// The shape.
    pub fn dims(&self) -> &[usize] {
        match self {
            Param::Tensor(t) => t.dims(),
            Param::Mapped(m) => m.dims(),
        }
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims().len()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Param::Tensor(t) => t.dtype(),
            Param::Mapped(m) => m.dtype(),
        }
    }

    /// As a candle tensor (a mapped one is copied, see [`MappedTensor::to_tensor`]).
    pub fn into_tensor(self) -> Result<Tensor> {
        match self {
            Param::Tensor(t) => Ok(t),
            Param::Mapped(m) => m.to_tensor(),
        }
    }

    /// A candle tensor view, for reading small tensors (a mapped one is copied).
    pub fn tensor(&self) -> Result<Tensor> {
        self.clone().into_tensor()
    }
}

/// Where one tensor lies.
#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    start: usize,
    shape: Vec<usize>,
    dtype: DType,
}

/// The tensors of one checkpoint directory, memory-mapped; nothing is copied until a tensor is
/// asked for, and half-precision matrices are not copied at all (see [`MappedTensor`]).
pub struct Checkpoint {
    dir: PathBuf,
    /// `MTP_NO_MMAP` is set: every tensor is copied into memory (as llama.cpp's `--no-mmap`,
    /// for file systems where reading through a mapping is slow).
    copy_all: bool,
    maps: Vec<Arc<Mmap>>,
    entries: BTreeMap<String, Entry>,
    shapes: BTreeMap<String, Vec<usize>>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("files", &self.maps.len())
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

/// The candle type of a safetensors element type, for the types checkpoints use.
fn candle_dtype(d: safetensors::Dtype) -> Option<DType> {
    use safetensors::Dtype as S;
    Some(match d {
        S::U8 => DType::U8,
        S::U32 => DType::U32,
        S::I16 => DType::I16,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        S::BF16 => DType::BF16,
        S::F16 => DType::F16,
        S::F32 => DType::F32,
        S::F64 => DType::F64,
        _ => return None,
    })
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
        let mut files: Vec<String> = Vec::new();
        for (tensor, f) in map {
            let Some(f) = f.as_str() else {
                return Err(Error::Config {
                    path: index.clone(),
                    message: format!("weight_map[{tensor:?}] is not a file name"),
                });
            };
            // the one path rule (mtp-detect's): a shard is a plain relative path in the folder
            if !mtp_detect::is_safe_relative(f) {
                return Err(Error::Config {
                    path: index.clone(),
                    message: format!(
                        "weight_map names the shard {:?}, which is not a plain relative path \
                         inside the checkpoint folder",
                        f.chars().take(200).collect::<String>()
                    ),
                });
            }
            files.push(f.to_string());
        }
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
    /// Memory-maps every safetensors file of `dir` and reads their headers (checked by the
    /// `safetensors` crate: sizes, offsets, and data that matches the file's length).
    pub fn open(dir: &Path) -> Result<Self> {
        let files = safetensors_files(dir)?;
        let mut maps = Vec::with_capacity(files.len());
        let mut entries = BTreeMap::new();
        for (i, f) in files.iter().enumerate() {
            if !f.is_file() {
                return Err(Error::Io {
                    path: f.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "shard named by the index is missing",
                    ),
                });
            }
            let file = std::fs::File::open(f).map_err(io_err(f))?;
            // SAFETY: the file is mapped read-only; like every mmap-based loader we rely on it
            // not being truncated or rewritten while the engine runs.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(f))?;
            let st_err = |message: String| Error::Safetensors {
                path: f.clone(),
                message,
            };
            let st =
                safetensors::SafeTensors::deserialize(&map).map_err(|e| st_err(e.to_string()))?;
            let base = map.as_ptr() as usize;
            for (name, view) in st.tensors() {
                let Some(dtype) = candle_dtype(view.dtype()) else {
                    return Err(st_err(format!(
                        "{name} has element type {:?}, which this engine does not read",
                        view.dtype()
                    )));
                };
                let entry = Entry {
                    file: i,
                    start: view.data().as_ptr() as usize - base,
                    shape: view.shape().to_vec(),
                    dtype,
                };
                if entries.insert(name.clone(), entry).is_some() {
                    return Err(st_err(format!("{name} is stored in more than one file")));
                }
            }
            // read ahead: the first forward then finds the pages in the page cache
            let _ = map.advise(memmap2::Advice::WillNeed);
            maps.push(Arc::new(map));
        }
        let shapes = entries
            .iter()
            .map(|(k, e)| (k.clone(), e.shape.clone()))
            .collect();
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            copy_all: std::env::var_os("MTP_NO_MMAP").is_some_and(|v| !v.is_empty() && v != "0"),
            maps,
            entries,
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

    /// One tensor where it lies in its file.
    pub fn mapped(&self, name: &str) -> Result<MappedTensor> {
        let e = self.entries.get(name).ok_or_else(|| Error::Safetensors {
            path: self.dir.clone(),
            message: format!("{name}: no such tensor"),
        })?;
        Ok(MappedTensor {
            map: Arc::clone(&self.maps[e.file]),
            start: e.start,
            shape: e.shape.clone(),
            dtype: e.dtype,
        })
    }

    /// Loads one tensor as stored (no dtype conversion), on the CPU: a copy.
    pub fn load_raw(&self, name: &str) -> Result<Tensor> {
        self.mapped(name)?.to_tensor()
    }

    /// One floating-point tensor in the precision it is stored in (f32, bf16 or f16; f64 becomes
    /// f32): half-precision tensors stay in the file ([`Param::Mapped`]) when aligned, the
    /// others are copied.
    pub fn load_float(&self, name: &str) -> Result<Param> {
        let m = self.mapped(name)?;
        let aligned = !self.copy_all
            && match m.dtype() {
                DType::BF16 => m.as_slice::<half::bf16>().is_some(),
                DType::F16 => m.as_slice::<half::f16>().is_some(),
                _ => false,
            };
        if aligned {
            return Ok(Param::Mapped(m));
        }
        let t = m.to_tensor()?;
        match t.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => Ok(Param::Tensor(t)),
            DType::F64 => Ok(Param::Tensor(t.to_dtype(DType::F32)?)),
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
/// `[..., out, in / group_size]`. Returns f32 `[..., out, in]` (see `QuantMatrix`).
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
