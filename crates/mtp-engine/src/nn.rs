//! Generic building blocks of the models: linear layers over every weight format the engine
//! keeps ([`Linear`]: f32, bf16, f16, mapped or in parts, packed quantized), a tensor store that
//! names missing tensors and wrong shapes ([`Store`]), and where a forward's tokens sit
//! ([`Positions`]). Qwen3.5's decoder layer is the model's own (`crate::qwen3_5`).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::kernels;
use crate::kernels::quant::QuantMatrix;
use crate::loader::{MappedTensor, Param, WeightDtype};

/// The cached attention kernel that [`Attention`](crate::qwen3_5::Attention) runs, on its own (for the `attention`
/// example, which times it), and the element types it reads keys and values in (f32, `f16`,
/// `bf16`). It checks every length it reads, panicking otherwise.
pub use crate::kernels::{attention, AttentionShape, Weight};

/// Where the new tokens of one sequence sit for the rotary embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions<'a> {
    /// Token `t` at position `start + t` on every axis (text).
    From(usize),
    /// Token `t` at the position ids `ids[t]` (temporal, height, width): the multimodal rope of
    /// a prompt with images.
    Each(&'a [[usize; 3]]),
}

/// Canonical-name → tensor map produced by a `sanitize` function, consumed by model builders.
pub struct Store {
    map: HashMap<String, Param>,
    model_type: String,
    dtype: WeightDtype,
    device: Device,
}

impl Store {
    /// Wraps sanitized tensors; matrices are kept in `dtype` (see [`WeightDtype`]) on `device`
    /// when taken.
    pub fn new(
        map: HashMap<String, Param>,
        model_type: &str,
        dtype: WeightDtype,
        device: &Device,
    ) -> Self {
        Store {
            map,
            model_type: model_type.to_string(),
            dtype,
            device: device.clone(),
        }
    }

    /// True when the tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Names left in the store.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.map.keys()
    }

    fn take_param(&mut self, name: &str, shape: &[usize]) -> Result<Param> {
        let t = self.map.remove(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            model_type: self.model_type.clone(),
        })?;
        if t.dims() != shape {
            return Err(Error::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: t.dims().to_vec(),
            });
        }
        Ok(t)
    }

    fn take_raw(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.take_param(name, shape)?.into_tensor()
    }

    /// The quantized matrix `name` (a `….weight` whose module left packed `scales`, `biases`
    /// and `bits` beside it, see [`crate::loader::load_quantized`]) of logical shape `shape`
    /// (`[..., out, in]`), taken out of the store; `None` when `name` is not packed.
    fn take_packed(&mut self, name: &str, shape: &[usize]) -> Result<Option<QuantMatrix>> {
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let (sk, bk) = (format!("{base}.scales"), format!("{base}.biases"));
        let packed = match self.map.get(name) {
            Some(Param::Tensor(t)) if t.dtype() == DType::U32 && self.map.contains_key(&sk) => t,
            _ => return Ok(None),
        };
        let mismatch = || Error::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            actual: packed.dims().to_vec(),
        };
        let missing = |k: &str| Error::MissingTensor {
            name: k.to_string(),
            model_type: self.model_type.clone(),
        };
        let bits_key = format!("{base}.bits");
        let scales = self.map.get(&sk).ok_or_else(|| missing(&sk))?.tensor()?;
        let biases = self.map.get(&bk).ok_or_else(|| missing(&bk))?.tensor()?;
        let bits = self.map.get(&bits_key).ok_or_else(|| missing(&bits_key))?;
        let bits = bits.tensor()?.to_scalar::<u32>()? as usize;
        let q = QuantMatrix::from_parts(name, packed, &scales, &biases, bits)?;
        let inp = shape.last().copied().unwrap_or(0);
        let Some((_, lead)) = shape.split_last() else {
            return Err(mismatch());
        };
        let rows: usize = lead.iter().product();
        if q.in_features() != inp || q.out_features() != rows {
            return Err(mismatch());
        }
        for k in [name, sk.as_str(), bk.as_str(), bits_key.as_str()] {
            self.map.remove(k);
        }
        Ok(Some(q))
    }

    /// A matrix (or stack of matrices) in the weight dtype, on the compute device (a packed
    /// quantized one dequantized).
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = match self.take_packed(name, shape)? {
            Some(q) => q.to_tensor()?,
            None => self.take_raw(name, shape)?,
        };
        let dtype = self.dtype.for_stored(t.dtype());
        Ok(t.to_dtype(dtype)?.to_device(&self.device)?)
    }

    /// Whether packed quantized matrices are multiplied as they are: kept as stored, on the CPU.
    fn keeps_packed(&self) -> bool {
        self.dtype == WeightDtype::Stored && self.device.is_cpu()
    }

    /// A linear layer `[out, in]`: multiplied in place in the mapped file when it is a
    /// half-precision matrix kept as stored on the CPU (no copy), else from memory.
    pub fn linear(&mut self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        let name = format!("{name}.weight");
        match self.take_packed(&name, &[out, inp])? {
            Some(q) if self.keeps_packed() => Ok(Linear::packed(q)),
            Some(q) => self.dense(q.to_tensor()?),
            None => match self.take_param(&name, &[out, inp])? {
                Param::Mapped(m)
                    if self.device.is_cpu() && self.dtype.for_stored(m.dtype()) == m.dtype() =>
                {
                    Ok(Linear::mapped(m))
                }
                p => self.dense(p.into_tensor()?),
            },
        }
    }

    /// A dequantized matrix as a dense linear layer in the weight dtype.
    fn dense(&self, t: Tensor) -> Result<Linear> {
        let dtype = self.dtype.for_stored(t.dtype());
        Ok(Linear::dense(t.to_dtype(dtype)?.to_device(&self.device)?))
    }

    /// Several linear layers with the same input, fused into one `[sum(out), in]` matrix
    /// (packed when every part is).
    pub fn fused_linear(&mut self, names: &[(&str, usize)], inp: usize) -> Result<Linear> {
        let mut fused = self.fused(names, None, inp)?;
        Ok(fused.remove(0))
    }

    /// Stacks of `experts` matrices (`[experts, out, in]` each, e.g. an MoE's `gate_proj` and
    /// `up_proj`) as one linear layer per expert whose rows are that expert's rows of each
    /// stack in turn (packed when every stack is).
    pub fn expert_linears(
        &mut self,
        names: &[(&str, usize)],
        experts: usize,
        inp: usize,
    ) -> Result<Vec<Linear>> {
        self.fused(names, Some(experts), inp)
    }

    /// [`Store::fused_linear`] over plain matrices (`experts: None`, one layer out) or
    /// [`Store::expert_linears`] over stacks.
    fn fused(
        &mut self,
        names: &[(&str, usize)],
        experts: Option<usize>,
        inp: usize,
    ) -> Result<Vec<Linear>> {
        let shape = |out: usize| match experts {
            Some(e) => vec![e, out, inp],
            None => vec![out, inp],
        };
        let count = experts.unwrap_or(1);
        if experts.is_none() {
            if let Some(parts) = self.take_mapped_parts(names, inp)? {
                return Ok(vec![Linear::parts(parts)]);
            }
        }
        let mut packed = Vec::new();
        for (n, out) in names {
            match self.take_packed(&format!("{n}.weight"), &shape(*out))? {
                Some(q) => packed.push(q),
                None => break,
            }
        }
        if packed.len() == names.len() && self.keeps_packed() {
            let mut layers = Vec::with_capacity(count);
            for e in 0..count {
                let sliced: Vec<QuantMatrix>;
                let parts = match experts {
                    Some(_) => {
                        sliced = packed
                            .iter()
                            .zip(names)
                            .map(|(q, (_, out))| q.slice_rows(e * out, *out))
                            .collect();
                        &sliced
                    }
                    None => &packed,
                };
                // parts quantized differently (mixed-precision recipes) are dequantized below
                let Some(q) = QuantMatrix::cat_rows(parts) else {
                    break;
                };
                layers.push(Linear::packed(q));
            }
            if layers.len() == count {
                return Ok(layers);
            }
        }
        let mut parts = packed
            .iter()
            .map(QuantMatrix::to_tensor)
            .collect::<Result<Vec<_>>>()?;
        for (n, out) in &names[parts.len()..] {
            let name = format!("{n}.weight");
            parts.push(match self.take_packed(&name, &shape(*out))? {
                Some(q) => q.to_tensor()?,
                None => self.take_raw(&name, &shape(*out))?,
            });
        }
        // parts kept in different dtypes (a dequantized matrix next to a bf16 one) meet in f32
        let mut dtypes = parts.iter().map(|p| self.dtype.for_stored(p.dtype()));
        let first = dtypes.next().unwrap_or(DType::F32);
        let dtype = if dtypes.all(|d| d == first) {
            first
        } else {
            DType::F32
        };
        let parts = parts
            .iter()
            .map(|p| p.to_dtype(dtype))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut layers = Vec::with_capacity(count);
        for e in 0..count {
            let rows = match experts {
                Some(_) => parts
                    .iter()
                    .map(|p| p.get(e))
                    .collect::<candle_core::Result<Vec<_>>>()?,
                None => parts.clone(),
            };
            let w = Tensor::cat(&rows, 0)?.to_device(&self.device)?;
            layers.push(Linear::dense(w));
        }
        Ok(layers)
    }

    /// The parts of a fused matrix, taken out of the store, when every part is a half-precision
    /// matrix of one type, in place in the mapped checkpoint and kept as stored on the CPU:
    /// then the fused layer multiplies them where they lie. `None` (nothing taken) otherwise.
    fn take_mapped_parts(
        &mut self,
        names: &[(&str, usize)],
        inp: usize,
    ) -> Result<Option<Vec<MappedTensor>>> {
        if !self.device.is_cpu() {
            return Ok(None);
        }
        let keys: Vec<String> = names.iter().map(|(n, _)| format!("{n}.weight")).collect();
        let mut dtype = None;
        for (k, (_, out)) in keys.iter().zip(names) {
            let Some(Param::Mapped(m)) = self.map.get(k) else {
                return Ok(None);
            };
            let kept = self.dtype.for_stored(m.dtype()) == m.dtype();
            if !kept || dtype.is_some_and(|d| d != m.dtype()) {
                return Ok(None);
            }
            dtype = Some(m.dtype());
            if m.dims() != [*out, inp] {
                return Err(Error::ShapeMismatch {
                    name: k.clone(),
                    expected: vec![*out, inp],
                    actual: m.dims().to_vec(),
                });
            }
        }
        let mut parts = Vec::with_capacity(keys.len());
        for k in &keys {
            if let Some(Param::Mapped(m)) = self.map.remove(k) {
                parts.push(m);
            }
        }
        Ok(Some(parts))
    }

    /// A tensor of the shape it has, in f32 on the CPU (a packed quantized matrix is
    /// dequantized; only for a tensor whose layout the caller works out from its shape).
    pub fn tensor_any(&mut self, name: &str) -> Result<Tensor> {
        let dims = match self.map.get(name) {
            Some(t) => t.dims().to_vec(),
            None => {
                return Err(Error::MissingTensor {
                    name: name.to_string(),
                    model_type: self.model_type.clone(),
                })
            }
        };
        let t = match self.take_packed(name, &dims)? {
            Some(q) => q.to_tensor()?,
            None => self.take_raw(name, &dims)?,
        };
        Ok(t.to_dtype(DType::F32)?)
    }

    /// A small f32 vector (norm weights, gates).
    pub fn vec(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.take_raw(name, &[len])?;
        Ok(t.to_dtype(DType::F32)?.to_vec1::<f32>()?)
    }

    /// A small f32 matrix, flattened.
    pub fn mat_f32(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.take_raw(name, shape)?;
        Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// `y = x W^T` with `W: [out, in]`.
#[derive(Debug, Clone)]
pub struct Linear {
    w: Weights,
}

/// What a [`Linear`] multiplies by.
#[derive(Debug, Clone)]
enum Weights {
    /// A tensor (f32, bf16 or f16 on the CPU).
    Dense(Tensor),
    /// A bf16 or f16 matrix where it lies in the memory-mapped checkpoint (never copied).
    Mapped(MappedTensor),
    /// A fused matrix (q/k/v, gate/up, …) whose parts lie in the mapped checkpoint: the rows
    /// of each part in turn, all of one half-precision type and width.
    Parts(std::sync::Arc<[MappedTensor]>),
    /// An MLX-quantized matrix kept packed.
    Packed(std::sync::Arc<QuantMatrix>),
}

impl Linear {
    /// A layer over a `[out, in]` tensor.
    pub fn dense(w: Tensor) -> Self {
        Linear {
            w: Weights::Dense(w),
        }
    }

    /// A layer over a half-precision matrix read in place from the checkpoint file.
    pub fn mapped(m: MappedTensor) -> Self {
        Linear {
            w: Weights::Mapped(m),
        }
    }

    /// A layer over a fused matrix whose parts are read in place from the checkpoint file
    /// (half precision, one type and width; see [`Store::fused_linear`]).
    fn parts(parts: Vec<MappedTensor>) -> Self {
        Linear {
            w: Weights::Parts(parts.into()),
        }
    }

    /// A layer over a quantized matrix kept packed (see [`Store::linear`] for one built from a
    /// checkpoint's packed weights, scales and biases).
    pub(crate) fn packed(q: QuantMatrix) -> Self {
        Linear {
            w: Weights::Packed(std::sync::Arc::new(q)),
        }
    }

    /// How the weights are held (`f32`, `bf16`, `f16`, or `q4` for a packed 4-bit matrix) and
    /// their bytes.
    pub fn held(&self) -> (String, usize) {
        match &self.w {
            Weights::Dense(w) => (w.dtype().as_str().to_string(), tensor_bytes(w)),
            Weights::Mapped(m) => (
                m.dtype().as_str().to_string(),
                m.dims().iter().product::<usize>() * m.dtype().size_in_bytes(),
            ),
            Weights::Parts(p) => (
                p[0].dtype().as_str().to_string(),
                p.iter()
                    .map(|m| m.dims().iter().product::<usize>() * m.dtype().size_in_bytes())
                    .sum(),
            ),
            Weights::Packed(q) => (format!("q{}", q.bits()), q.bytes()),
        }
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        match &self.w {
            Weights::Dense(w) => w.dims()[0],
            Weights::Mapped(m) => m.dims()[0],
            Weights::Parts(p) => p.iter().map(|m| m.dims()[0]).sum(),
            Weights::Packed(q) => q.out_features(),
        }
    }

    /// Input features (`None` for a dense tensor that is not a matrix).
    fn in_features(&self) -> Option<usize> {
        match &self.w {
            Weights::Dense(w) => match w.dims() {
                [_, inp] => Some(*inp),
                _ => None,
            },
            Weights::Mapped(m) => m.dims().get(1).copied(),
            Weights::Parts(p) => p.first().and_then(|m| m.dims().get(1).copied()),
            Weights::Packed(q) => Some(q.in_features()),
        }
    }

    /// Rows `ids` of the weight matrix in f32, `[ids.len(), in]`: an embedding lookup. A packed
    /// matrix dequantizes only those rows, with the arithmetic of a dequantized load, so a
    /// packed embedding gives the bits of a dequantized one.
    pub fn rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let out = self.out_features();
        if let Some(id) = ids.iter().find(|&&id| id as usize >= out) {
            return Err(Error::InvalidRequest(format!(
                "token id {id} is outside the embedding's {out} rows"
            )));
        }
        match &self.w {
            Weights::Dense(w) => {
                let idx = Tensor::from_slice(ids, ids.len(), w.device())?;
                let e = w.index_select(&idx, 0)?.to_dtype(DType::F32)?;
                Ok(e.flatten_all()?.to_vec1::<f32>()?)
            }
            Weights::Parts(_) => Err(Error::Unsupported(
                "row lookup in a fused matrix (embeddings are never fused)".into(),
            )),
            Weights::Mapped(m) => {
                let inp = m.dims()[1];
                let mut rows = vec![0f32; ids.len() * inp];
                fn gather<E: kernels::Weight>(w: &[E], inp: usize, ids: &[u32], rows: &mut [f32]) {
                    for (dst, &id) in rows.chunks_exact_mut(inp).zip(ids) {
                        let src = &w[id as usize * inp..(id as usize + 1) * inp];
                        for (d, v) in dst.iter_mut().zip(src) {
                            *d = v.to_f32(); // exact widening, as the products read them
                        }
                    }
                }
                if let Some(w) = m.as_slice::<half::bf16>() {
                    gather(w, inp, ids, &mut rows);
                } else if let Some(w) = m.as_slice::<half::f16>() {
                    gather(w, inp, ids, &mut rows);
                }
                Ok(rows)
            }
            Weights::Packed(q) => {
                let inp = q.in_features();
                let mut rows = vec![0f32; ids.len() * inp];
                for (dst, &id) in rows.chunks_exact_mut(inp).zip(ids) {
                    q.dequantize_rows(id as usize, dst);
                }
                Ok(rows)
            }
        }
    }

    /// `x: [n, in]` (f32, row-major) → `[n, out]`.
    ///
    /// On the CPU, weights in f32, bf16 or f16 go through `kernels::matmul_rows`: f32
    /// arithmetic whose result for a row does not depend on how many rows are computed together
    /// (so a verify forward of k + 1 tokens produces bit-identical logits to k + 1 single-token
    /// forwards), with half-precision weights widened exactly as they are read. Inputs of more
    /// than `kernels::MAX_ROWS` (32) rows (prefill) use the engine's f32 GEMM (`fgemm`), over panels
    /// of rows widened or dequantized as they are packed (never a half-precision product). Other
    /// devices use candle in the weights' dtype.
    ///
    /// An `x` that is not `n` rows of the layer's input features is a
    /// [`Error::ShapeMismatch`], never read past its end.
    pub fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let Some(inp) = self.in_features() else {
            return Err(Error::Unsupported(
                "a linear layer over a tensor that is not a matrix".into(),
            ));
        };
        if kernels::elements(&[n, inp]) != Some(x.len()) {
            return Err(Error::ShapeMismatch {
                name: "the input of a linear layer".into(),
                expected: vec![n, inp],
                actual: vec![x.len()],
            });
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let w = match &self.w {
            Weights::Dense(w) => w,
            Weights::Packed(q) => return quant_product(x, n, q),
            Weights::Mapped(m) => {
                let inp = m.dims()[1];
                if let Some(w) = m.as_slice::<half::bf16>() {
                    return half_product(x, n, w, inp);
                }
                if let Some(w) = m.as_slice::<half::f16>() {
                    return half_product(x, n, w, inp);
                }
                return Err(Error::Unsupported(format!(
                    "a mapped {:?} matrix (only bf16 and f16 are multiplied in place)",
                    m.dtype()
                )));
            }
            Weights::Parts(p) => {
                let inp = p[0].dims()[1];
                let bf16: Option<Vec<&[half::bf16]>> =
                    p.iter().map(|m| m.as_slice::<half::bf16>()).collect();
                if let Some(parts) = bf16 {
                    return parts_product(x, n, &parts, inp);
                }
                let f16: Option<Vec<&[half::f16]>> =
                    p.iter().map(|m| m.as_slice::<half::f16>()).collect();
                if let Some(parts) = f16 {
                    return parts_product(x, n, &parts, inp);
                }
                return Err(Error::Unsupported(format!(
                    "mapped {:?} parts (only bf16 and f16 are multiplied in place)",
                    p[0].dtype()
                )));
            }
        };
        let inp = w.dims()[1];
        if w.device().is_cpu() {
            let (storage, layout) = w.storage_and_layout();
            if let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
                (&*storage, layout.contiguous_offsets())
            {
                match w.dtype() {
                    DType::F32 => {
                        let w = &cpu.as_slice::<f32>()?[start..end];
                        if n <= kernels::MAX_ROWS {
                            return Ok(kernels::matmul_rows(x, n, w, inp));
                        }
                        return Ok(kernels::fgemm::matmul(
                            x,
                            n,
                            w.len() / inp.max(1),
                            inp,
                            WIDEN_BLOCK,
                            |o0, rows| rows.copy_from_slice(&w[o0 * inp..o0 * inp + rows.len()]),
                        ));
                    }
                    DType::BF16 => {
                        return half_product(x, n, &cpu.as_slice::<half::bf16>()?[start..end], inp)
                    }
                    DType::F16 => {
                        return half_product(x, n, &cpu.as_slice::<half::f16>()?[start..end], inp)
                    }
                    _ => {}
                }
            }
        }
        let xt = Tensor::from_slice(x, (n, inp), w.device())?;
        let xt = if w.dtype() != DType::F32 {
            xt.to_dtype(w.dtype())?
        } else {
            xt
        };
        let y = xt.matmul(&w.t()?)?;
        let y = if y.dtype() != DType::F32 {
            y.to_dtype(DType::F32)?
        } else {
            y
        };
        Ok(y.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// Bytes of a tensor's elements.
pub(crate) fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

/// Adds `(kind, bytes)` to a per-kind tally.
pub(crate) fn tally(
    into: &mut std::collections::BTreeMap<String, usize>,
    (kind, bytes): (String, usize),
) {
    *into.entry(kind).or_default() += bytes;
}

/// `x [n, inp] · w^T` for half-precision weights `w [out, inp]`, in f32: up to
/// [`kernels::MAX_ROWS`] rows through [`kernels::matmul_rows`]; more (prefill) through
/// [`kernels::fgemm`], over panels of at most [`WIDEN_BLOCK`] weights widened to f32 as they are
/// packed.
fn half_product<E: kernels::Weight>(x: &[f32], n: usize, w: &[E], inp: usize) -> Result<Vec<f32>> {
    half_product_in(x, n, w, inp, WIDEN_BLOCK)
}

/// [`half_product`] widening at most `block` weights at a time.
fn half_product_in<E: kernels::Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    block: usize,
) -> Result<Vec<f32>> {
    if n <= kernels::MAX_ROWS {
        return Ok(kernels::matmul_rows(x, n, w, inp));
    }
    Ok(kernels::fgemm::matmul(
        x,
        n,
        w.len() / inp.max(1),
        inp,
        block,
        |o0, rows| kernels::widen_to(&w[o0 * inp..o0 * inp + rows.len()], rows),
    ))
}

/// [`half_product`] over a matrix held in parts (rows of each part in turn): the same blocks,
/// so the same bits, as the fused matrix — [`kernels::matmul_rows_parts`] for few rows, and for
/// prefill the blocks of widened rows filled from whichever parts they span.
fn parts_product<E: kernels::Weight>(
    x: &[f32],
    n: usize,
    parts: &[&[E]],
    inp: usize,
) -> Result<Vec<f32>> {
    if n <= kernels::MAX_ROWS {
        return Ok(kernels::matmul_rows_parts(x, n, parts, inp));
    }
    let out: usize = parts.iter().map(|p| p.len() / inp.max(1)).sum();
    Ok(kernels::fgemm::matmul(
        x,
        n,
        out,
        inp,
        WIDEN_BLOCK,
        |o0, rows| {
            // the elements `o0 * inp ..` of the fused matrix, widened from the parts they lie in
            let mut skip = o0 * inp;
            let mut done = 0;
            for p in parts {
                if done == rows.len() {
                    break;
                }
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                let take = (p.len() - skip).min(rows.len() - done);
                kernels::widen_to(&p[skip..skip + take], &mut rows[done..done + take]);
                done += take;
                skip = 0;
            }
        },
    ))
}

/// [`half_product`] for a quantized matrix kept packed: [`kernels::matmul_quant`] up to
/// [`kernels::MAX_ROWS`] rows; beyond, [`kernels::fgemm`] over panels dequantized as they are
/// packed.
fn quant_product(x: &[f32], n: usize, q: &QuantMatrix) -> Result<Vec<f32>> {
    quant_product_in(x, n, q, WIDEN_BLOCK)
}

/// [`quant_product`] dequantizing at most `block` weights at a time.
fn quant_product_in(x: &[f32], n: usize, q: &QuantMatrix, block: usize) -> Result<Vec<f32>> {
    if crate::arith::current() == crate::arith::Arith::Fast
        && kernels::int8::supports(q.bits(), q.group())
    {
        // every row quantized and multiplied on its own, whatever `n` (see `kernels::int8`)
        let path = kernels::int8::IntPath::detect();
        return kernels::int8::matmul_q8(x, n, q, path);
    }
    if n <= kernels::MAX_ROWS {
        return Ok(kernels::matmul_quant(x, n, q));
    }
    let inp = q.in_features();
    Ok(kernels::fgemm::matmul(
        x,
        n,
        q.out_features(),
        inp,
        block,
        |o0, rows| q.dequantize_rows(o0, rows),
    ))
}

/// Most weights a many-row product ([`kernels::fgemm`]) packs as f32 at once (16 MiB).
const WIDEN_BLOCK: usize = 1 << 22;

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefill-sized products over half-precision weights, split into blocks of widened rows
    /// (the last one short), agree with the f32 product over the widened weights.
    #[test]
    fn half_products_in_blocks_match_f32() {
        let (n, inp, out) = (40, 37, 300);
        let mut s = 5u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
        let w: Vec<half::bf16> = (0..out * inp)
            .map(|_| half::bf16::from_f32(next()))
            .collect();
        let wide = Linear::dense(
            Tensor::from_vec(
                w.iter().map(|v| v.to_f32()).collect::<Vec<f32>>(),
                (out, inp),
                &Device::Cpu,
            )
            .unwrap(),
        );
        let want = wide.forward(&x, n).unwrap();
        for block in [inp, 1000, 4000, out * inp, 1 << 22] {
            let got = half_product_in(&x, n, &w, inp, block).unwrap();
            let worst = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "block {block}: off by {worst}");
        }
        // and through `Linear` on a bf16 tensor, few rows and many
        let half = Linear::dense(Tensor::from_vec(w.clone(), (out, inp), &Device::Cpu).unwrap());
        for rows in [1, 3, 32, 33, n] {
            let got = half.forward(&x[..rows * inp], rows).unwrap();
            let want = wide.forward(&x[..rows * inp], rows).unwrap();
            let worst = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "{rows} rows: off by {worst}");
            if rows <= kernels::MAX_ROWS {
                assert_eq!(got, want, "{rows} rows: the few-row kernel widens exactly");
            }
        }
    }

    /// Matrices multiplied where they lie in a mapped checkpoint, whole or as the parts of a
    /// fused matrix, give the bits of the same bf16 matrix in memory, for few rows (decode,
    /// verify) and many (prefill, whose blocks of widened rows span the parts).
    #[test]
    fn mapped_matrices_and_parts_compute_what_memory_computes() {
        let (inp, sizes) = (64usize, [37usize, 53, 9]);
        let mut seed = 3u64;
        let mut rnd = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = HashMap::new();
        for (i, out) in sizes.iter().enumerate() {
            let w: Vec<half::bf16> = (0..out * inp)
                .map(|_| half::bf16::from_f32(rnd()))
                .collect();
            let t = Tensor::from_vec(w, (*out, inp), &Device::Cpu).unwrap();
            tensors.insert(format!("p{i}.weight"), t);
        }
        candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
        let ckpt = crate::loader::Checkpoint::open(dir.path()).unwrap();
        let mapped: Vec<MappedTensor> = (0..sizes.len())
            .map(|i| ckpt.mapped(&format!("p{i}.weight")).unwrap())
            .collect();
        let whole: Vec<Tensor> = (0..sizes.len())
            .map(|i| tensors[&format!("p{i}.weight")].clone())
            .collect();
        let fused_mem = Linear::dense(Tensor::cat(&whole, 0).unwrap());
        let fused_map = Linear::parts(mapped.clone());
        let one_mem = Linear::dense(whole[1].clone());
        let one_map = Linear::mapped(mapped[1].clone());
        assert_eq!(fused_map.held(), fused_mem.held());
        for n in [1, 2, 5, 32, 33, 45, 130] {
            let x: Vec<f32> = (0..n * inp).map(|_| rnd()).collect();
            let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(fused_map.forward(&x, n).unwrap()),
                bits(fused_mem.forward(&x, n).unwrap()),
                "fused, {n} rows"
            );
            assert_eq!(
                bits(one_map.forward(&x, n).unwrap()),
                bits(one_mem.forward(&x, n).unwrap()),
                "single, {n} rows"
            );
        }
        assert_eq!(
            one_map.rows(&[0, 36, 5]).unwrap(),
            one_mem.rows(&[0, 36, 5]).unwrap()
        );
        assert!(
            one_map.rows(&[53]).is_err(),
            "a row past the matrix is an error"
        );
    }
}
