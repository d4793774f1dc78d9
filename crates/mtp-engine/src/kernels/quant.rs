//! MLX affine-quantized matrices: `w = scales * q + biases` per group of `group` input columns,
//! with `bits`-wide unsigned values packed little-endian into `u32` words. [`QuantMatrix`] holds
//! the parts and hands rows of them to the kernels: the one dequantization arithmetic (`s * q`
//! rounded, then `+ b` rounded, in f32; `crate::kernels`' `dequant`), used both to dequantize a
//! whole matrix at load ([`crate::loader::dequantize_affine`]), for prefill's blocks of rows,
//! and, for matrices kept packed in memory at widths other than 4 and 8 bits, a few rows at a
//! time inside the few-row products ([`crate::kernels::matmul_quant`]), which then give the
//! bits of the dequantized load. 4- and 8-bit few-row products dequantize in registers with a
//! fused multiply-add (`crate::kernels`' `qdot`), which rounds once where this rounds twice.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// A quantized matrix `[out, inp]` (stacked matrices count as more rows).
#[derive(Clone)]
pub struct QuantMatrix {
    packed: Vec<u32>,
    scales: Params,
    biases: Params,
    bits: usize,
    group: usize,
    out: usize,
    inp: usize,
    /// The packed tensor's leading dimensions with the last replaced by `inp`.
    shape: Vec<usize>,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("shape", &self.shape)
            .field("bits", &self.bits)
            .field("group", &self.group)
            .finish()
    }
}

impl QuantMatrix {
    /// Checks and gathers the parts of quantized tensor `name`: `packed` `[..., out, inp * bits
    /// / 32]` (u32), `scales` and `biases` `[..., out, inp / group]` (any float dtype).
    pub fn from_parts(
        name: &str,
        packed: &Tensor,
        scales: &Tensor,
        biases: &Tensor,
        bits: usize,
    ) -> Result<Self> {
        let (inp, group) = Self::check_parts(name, packed, scales, biases, bits)?;
        let mut shape = packed.dims().to_vec();
        let lead = shape.len() - 1;
        let out = shape[..lead].iter().product();
        shape[lead] = inp;
        Ok(QuantMatrix {
            packed: packed.flatten_all()?.to_vec1::<u32>()?,
            scales: Params::from_tensor(scales)?,
            biases: Params::from_tensor(biases)?,
            bits,
            group,
            out,
            inp,
            shape,
        })
    }

    /// The shapes and dtypes [`QuantMatrix::from_parts`] needs, checked without reading the
    /// data: `(inp, group)`.
    pub fn check_parts(
        name: &str,
        packed: &Tensor,
        scales: &Tensor,
        biases: &Tensor,
        bits: usize,
    ) -> Result<(usize, usize)> {
        let qerr = |message: String| Error::Quantization {
            name: name.to_string(),
            message,
        };
        if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) {
            return Err(qerr(format!("unsupported bit width {bits}")));
        }
        if packed.dtype() != DType::U32 {
            return Err(qerr(format!(
                "packed weight has dtype {:?}, expected u32",
                packed.dtype()
            )));
        }
        let pdims = packed.dims().to_vec();
        let sdims = scales.dims().to_vec();
        if pdims.len() < 2 || sdims.len() != pdims.len() || biases.dims() != sdims.as_slice() {
            return Err(qerr(format!(
                "shapes do not match: weight {pdims:?}, scales {sdims:?}, biases {:?}",
                biases.dims()
            )));
        }
        let words = pdims[pdims.len() - 1];
        let inp = words * 32 / bits;
        let groups = sdims[sdims.len() - 1];
        if groups == 0
            || inp == 0
            || !(words * 32).is_multiple_of(bits)
            || !inp.is_multiple_of(groups)
            || pdims[..pdims.len() - 1] != sdims[..sdims.len() - 1]
        {
            return Err(qerr(format!(
                "weight {pdims:?} ({inp} inputs at {bits} bits) does not fit scales {sdims:?}"
            )));
        }
        Ok((inp, inp / groups))
    }

    /// Rows (output features; all of them for a stack).
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Columns (input features).
    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// Bits per value.
    pub fn bits(&self) -> usize {
        self.bits
    }

    /// Values per group of scale and bias.
    pub fn group(&self) -> usize {
        self.group
    }

    /// The packed words, `inp * bits / 32` per row.
    pub(crate) fn packed_words(&self) -> &[u32] {
        &self.packed
    }

    /// The scales and biases (`rows * groups` each) of rows `r0..r0 + rows` as f32: borrowed
    /// when stored as f32, else widened into `wide_s` and `wide_b`.
    ///
    /// # Panics
    /// When the rows are not all in the matrix.
    pub(crate) fn params_rows<'a>(
        &'a self,
        r0: usize,
        rows: usize,
        wide_s: &'a mut Vec<f32>,
        wide_b: &'a mut Vec<f32>,
    ) -> (&'a [f32], &'a [f32]) {
        let groups = self.inp / self.group;
        assert!(
            r0 + rows <= self.out,
            "params_rows: rows {r0}..{r0}+{rows} of {}",
            self.out
        );
        (
            self.scales.row(r0 * groups, rows * groups, wide_s),
            self.biases.row(r0 * groups, rows * groups, wide_b),
        )
    }

    /// Bytes held (packed words, scales and biases as stored).
    pub fn bytes(&self) -> usize {
        4 * self.packed.len() + self.scales.bytes() + self.biases.bytes()
    }

    /// The rows `r0..r0 + dst.len() / inp`, dequantized into `dst`.
    ///
    /// # Panics
    /// When `dst` is not whole rows or the rows are not all in the matrix.
    pub fn dequantize_rows(&self, r0: usize, dst: &mut [f32]) {
        assert!(
            dst.len().is_multiple_of(self.inp),
            "dequantize_rows: {} floats are not whole rows of {}",
            dst.len(),
            self.inp
        );
        assert!(
            r0.checked_add(dst.len() / self.inp)
                .is_some_and(|end| end <= self.out),
            "dequantize_rows: rows {r0}..{r0}+{} of a matrix of {}",
            dst.len() / self.inp,
            self.out
        );
        let words = self.inp * self.bits / 32;
        let groups = self.inp / self.group;
        let (mut s_wide, mut b_wide) = (Vec::new(), Vec::new());
        for (i, row) in dst.chunks_exact_mut(self.inp).enumerate() {
            let r = r0 + i;
            let w = &self.packed[r * words..(r + 1) * words];
            let s = self.scales.row(r * groups, groups, &mut s_wide);
            let b = self.biases.row(r * groups, groups, &mut b_wide);
            crate::kernels::dequantize_row(w, s, b, self.bits, self.group, row);
        }
    }

    /// The whole matrix dequantized, in the packed tensor's shape (last dimension `inp`).
    pub fn to_tensor(&self) -> Result<Tensor> {
        let mut out = vec![0f32; self.out * self.inp];
        self.dequantize_rows(0, &mut out);
        Ok(Tensor::from_vec(out, self.shape.clone(), &Device::Cpu)?)
    }

    /// Rows `r0..r0 + n` as a matrix of their own (one expert of a stack).
    pub fn slice_rows(&self, r0: usize, n: usize) -> QuantMatrix {
        let words = self.inp * self.bits / 32;
        let groups = self.inp / self.group;
        QuantMatrix {
            packed: self.packed[r0 * words..(r0 + n) * words].to_vec(),
            scales: self.scales.slice(r0 * groups, n * groups),
            biases: self.biases.slice(r0 * groups, n * groups),
            bits: self.bits,
            group: self.group,
            out: n,
            inp: self.inp,
            shape: vec![n, self.inp],
        }
    }

    /// The rows of `parts` one after another (a fused projection), when they share bits and
    /// group size.
    pub fn cat_rows(parts: &[QuantMatrix]) -> Option<QuantMatrix> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.bits != first.bits || p.group != first.group || p.inp != first.inp)
        {
            return None;
        }
        let out = parts.iter().map(|p| p.out).sum();
        Some(QuantMatrix {
            packed: parts
                .iter()
                .flat_map(|p| p.packed.iter().copied())
                .collect(),
            scales: Params::concat(&parts.iter().map(|p| &p.scales).collect::<Vec<_>>()),
            biases: Params::concat(&parts.iter().map(|p| &p.biases).collect::<Vec<_>>()),
            bits: first.bits,
            group: first.group,
            out,
            inp: first.inp,
            shape: vec![out, first.inp],
        })
    }
}

/// Scales or biases, kept in the precision the checkpoint stores them in (mlx writes them in the
/// model's float type, usually bf16); widened exactly to f32 a row at a time.
#[derive(Clone)]
enum Params {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
    F16(Vec<half::f16>),
}

impl Params {
    fn from_tensor(t: &Tensor) -> Result<Self> {
        let flat = t.flatten_all()?;
        Ok(match t.dtype() {
            DType::BF16 => Params::Bf16(flat.to_vec1()?),
            DType::F16 => Params::F16(flat.to_vec1()?),
            _ => Params::F32(flat.to_dtype(DType::F32)?.to_vec1()?),
        })
    }

    fn bytes(&self) -> usize {
        match self {
            Params::F32(v) => 4 * v.len(),
            Params::Bf16(v) => 2 * v.len(),
            Params::F16(v) => 2 * v.len(),
        }
    }

    /// Values `at..at + n` as f32: borrowed when stored as f32, else widened into `wide`.
    #[inline]
    fn row<'a>(&'a self, at: usize, n: usize, wide: &'a mut Vec<f32>) -> &'a [f32] {
        match self {
            Params::F32(v) => &v[at..at + n],
            Params::Bf16(v) => {
                wide.clear();
                wide.extend(v[at..at + n].iter().map(|x| x.to_f32()));
                wide
            }
            Params::F16(v) => {
                wide.clear();
                wide.extend(v[at..at + n].iter().map(|x| x.to_f32()));
                wide
            }
        }
    }

    fn slice(&self, at: usize, n: usize) -> Params {
        match self {
            Params::F32(v) => Params::F32(v[at..at + n].to_vec()),
            Params::Bf16(v) => Params::Bf16(v[at..at + n].to_vec()),
            Params::F16(v) => Params::F16(v[at..at + n].to_vec()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Params::F32(v) => v.len(),
            Params::Bf16(v) => v.len(),
            Params::F16(v) => v.len(),
        }
    }

    /// The parts one after another; in f32 when they are stored differently.
    fn concat(parts: &[&Params]) -> Params {
        /// Every part's values when all are stored as `pick` takes them.
        fn gather<T: Copy>(parts: &[&Params], pick: fn(&Params) -> Option<&[T]>) -> Option<Vec<T>> {
            parts
                .iter()
                .map(|p| pick(p))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.concat())
        }
        fn bf16(p: &Params) -> Option<&[half::bf16]> {
            match p {
                Params::Bf16(v) => Some(v),
                _ => None,
            }
        }
        fn f16(p: &Params) -> Option<&[half::f16]> {
            match p {
                Params::F16(v) => Some(v),
                _ => None,
            }
        }
        if let Some(v) = gather(parts, bf16) {
            return Params::Bf16(v);
        }
        if let Some(v) = gather(parts, f16) {
            return Params::F16(v);
        }
        let mut out = Vec::new();
        let mut wide = Vec::new();
        for p in parts {
            out.extend_from_slice(p.row(0, p.len(), &mut wide));
        }
        Params::F32(out)
    }
}

/// A random quantized matrix `[out, group * groups]` at `bits` (the group count raised until the
/// rows fill whole words), its scales and biases stored in `params` (f32, bf16 or f16), and the
/// same matrix dequantized by the definition, one bit at a time (`s * q + b`, rounded twice):
/// the reference the kernels are tested against.
#[cfg(test)]
pub(crate) fn random_matrix(
    bits: usize,
    group: usize,
    groups: usize,
    out: usize,
    params: DType,
    seed: u64,
) -> (QuantMatrix, Vec<f32>) {
    let mut groups = groups.max(1);
    while !(group * groups * bits).is_multiple_of(32) {
        groups += 1;
    }
    let (inp, cpu) = (group * groups, &Device::Cpu);
    let words = inp * bits / 32;
    let mut state = seed;
    let mut word = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 32) as u32
    };
    let packed: Vec<u32> = (0..out * words).map(|_| word()).collect();
    let mut r = crate::testing::rng(seed ^ 0x5eed);
    let mut param = |scale: f32| {
        let v: Vec<f32> = (0..out * groups).map(|_| r() * scale).collect();
        let t = Tensor::from_vec(v, (out, groups), cpu).unwrap();
        let t = t.to_dtype(params).unwrap();
        let wide = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
        (t, wide.to_vec1::<f32>().unwrap())
    };
    let ((st, s), (bt, b)) = (param(0.1), param(1.0));
    let pt = Tensor::from_vec(packed.clone(), (out, words), cpu).unwrap();
    let q = QuantMatrix::from_parts("test", &pt, &st, &bt, bits).unwrap();
    let mut want = vec![0f32; out * inp];
    for row in 0..out {
        for j in 0..inp {
            let mut v = 0u32;
            for k in 0..bits {
                let i = j * bits + k;
                v |= ((packed[row * words + i / 32] >> (i % 32)) & 1) << k;
            }
            let g = row * groups + j / group;
            want[row * inp + j] = s[g] * v as f32 + b[g];
        }
    }
    (q, want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::{isas, with_isa};
    use crate::testing::{bits as bits_of, expect_panic, CASES};
    use proptest::prelude::*;

    /// The float types scales and biases are stored in.
    const PARAMS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

    /// Bad parts are typed errors: a row of no values, scales that do not fit the weight.
    #[test]
    fn from_parts_rejects_parts_that_do_not_fit() {
        let cpu = &Device::Cpu;
        let words = |r: usize, c: usize| Tensor::zeros((r, c), DType::U32, cpu).unwrap();
        let params = |r: usize, c: usize| Tensor::zeros((r, c), DType::F32, cpu).unwrap();
        for (packed, scales, biases, bits) in [
            // no values per row
            (words(2, 0), params(2, 1), params(2, 1), 4),
            // scales for other rows
            (words(2, 4), params(3, 1), params(3, 1), 4),
            // biases unlike scales
            (words(2, 4), params(2, 1), params(2, 2), 4),
            // 32 values in 3 groups
            (words(2, 4), params(2, 3), params(2, 3), 4),
            // 10.67 values per word
            (words(2, 1), params(2, 1), params(2, 1), 3),
            (words(2, 4), params(2, 1), params(2, 1), 7),
        ] {
            let got = QuantMatrix::from_parts("w", &packed, &scales, &biases, bits);
            assert!(
                matches!(got, Err(Error::Quantization { .. })),
                "{bits} bits"
            );
        }
    }

    /// `dequantize_rows` checks its destination: whole rows, all inside the matrix.
    #[test]
    fn dequantize_rows_checks_its_rows() {
        let (q, _) = random_matrix(4, 32, 2, 3, DType::F32, 1);
        let mut dst = vec![0f32; 2 * 64];
        q.dequantize_rows(1, &mut dst);
        expect_panic(
            "dequantize_rows: 127 floats are not whole rows of 64",
            || q.dequantize_rows(0, &mut dst[..127]),
        );
        expect_panic("dequantize_rows: rows 2..2+2 of a matrix of 3", || {
            q.dequantize_rows(2, &mut dst)
        });
        expect_panic("dequantize_rows: rows", || {
            q.dequantize_rows(usize::MAX, &mut dst)
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Dequantized rows have the bits of the definition at every supported width, group
        /// size (on and off the vector paths' multiples) and parameter type, on every path this
        /// CPU runs, from any first row.
        #[test]
        fn dequantized_rows_follow_the_definition(
            bits in prop::sample::select(vec![2usize, 3, 4, 5, 6, 8]),
            group in prop::sample::select(vec![4usize, 8, 12, 16, 24, 32, 64, 128]),
            groups in 1usize..=3,
            out in 1usize..=6,
            params in 0usize..3,
            seed in any::<u64>(),
        ) {
            let (q, want) = random_matrix(bits, group, groups, out, PARAMS[params], seed);
            let inp = q.in_features();
            for isa in isas() {
                for r0 in [0, out / 2] {
                    let mut got = vec![f32::NAN; (out - r0) * inp];
                    with_isa(isa, || q.dequantize_rows(r0, &mut got));
                    prop_assert_eq!(
                        bits_of(&got),
                        bits_of(&want[r0 * inp..]),
                        "{:?}, {} bits, groups of {}, from row {}", isa, bits, group, r0
                    );
                }
            }
        }
    }
}
