//! MLX affine-quantized matrices: `w = scales * q + biases` per group of `group` input columns,
//! with `bits`-wide unsigned values packed little-endian into `u32` words. This module holds the
//! one dequantization arithmetic (`s * q` rounded, then `+ b` rounded, in f32), used both to
//! dequantize a whole matrix at load ([`crate::loader::dequantize_affine`]) and, for matrices
//! kept packed in memory, a few rows at a time inside the matrix products
//! ([`crate::simd::matmul_quant`]), so both give the same bits.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// A quantized matrix `[out, inp]` (stacked matrices count as more rows).
#[derive(Clone)]
pub struct QuantMatrix {
    packed: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
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
        let floats = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let mut shape = packed.dims().to_vec();
        let lead = shape.len() - 1;
        let out = shape[..lead].iter().product();
        shape[lead] = inp;
        Ok(QuantMatrix {
            packed: packed.flatten_all()?.to_vec1::<u32>()?,
            scales: floats(scales)?,
            biases: floats(biases)?,
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

    /// Whether [`crate::simd::matmul_quant`] reads this matrix packed (values never straddle a
    /// word and a word never straddles a group).
    pub fn kept_packed(&self) -> bool {
        matches!(self.bits, 2 | 4 | 8) && self.group.is_multiple_of(32 / self.bits)
    }

    /// Bytes held (packed words, scales and biases).
    pub fn bytes(&self) -> usize {
        4 * (self.packed.len() + self.scales.len() + self.biases.len())
    }

    /// The rows `r0..r0 + dst.len() / inp`, dequantized into `dst`.
    pub fn dequantize_rows(&self, r0: usize, dst: &mut [f32]) {
        let words = self.inp * self.bits / 32;
        let groups = self.inp / self.group;
        for (i, row) in dst.chunks_exact_mut(self.inp).enumerate() {
            let r = r0 + i;
            let w = &self.packed[r * words..(r + 1) * words];
            let s = &self.scales[r * groups..(r + 1) * groups];
            let b = &self.biases[r * groups..(r + 1) * groups];
            match self.bits {
                2 if self.kept_packed() => dequantize_row_packed::<2>(w, s, b, self.group, row),
                4 if self.kept_packed() => dequantize_row_packed::<4>(w, s, b, self.group, row),
                8 if self.kept_packed() => dequantize_row_packed::<8>(w, s, b, self.group, row),
                _ => dequantize_row_any(w, s, b, self.bits, self.group, row),
            }
        }
    }

    /// The whole matrix dequantized, in the packed tensor's shape (last dimension `inp`).
    pub fn to_tensor(&self) -> Result<Tensor> {
        let mut out = vec![0f32; self.out * self.inp];
        self.dequantize_rows(0, &mut out);
        Ok(Tensor::from_vec(out, self.shape.clone(), &Device::Cpu)?)
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
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
            biases: parts
                .iter()
                .flat_map(|p| p.biases.iter().copied())
                .collect(),
            bits: first.bits,
            group: first.group,
            out,
            inp: first.inp,
            shape: vec![out, first.inp],
        })
    }
}

/// One row, any bit width: value `j` starts at bit `j * bits` (and may run into the next
/// word).
fn dequantize_row_any(w: &[u32], s: &[f32], b: &[f32], bits: usize, group: usize, row: &mut [f32]) {
    let mask: u64 = (1u64 << bits) - 1;
    for (j, o) in row.iter_mut().enumerate() {
        let bit = j * bits;
        let (wi, off) = (bit / 32, bit % 32);
        let mut v = (w[wi] as u64) >> off;
        if off + bits > 32 && wi + 1 < w.len() {
            v |= (w[wi + 1] as u64) << (32 - off);
        }
        let g = j / group;
        *o = s[g] * ((v & mask) as f32) + b[g];
    }
}

/// One row at a width that divides 32 (and whose values per word divide the group): the same
/// arithmetic as [`dequantize_row_any`], eight values at a time with AVX2 where the CPU has it.
fn dequantize_row_packed<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() && group.is_multiple_of(16) {
        // SAFETY: AVX-512F was detected; the slices' lengths are checked inside.
        return unsafe { dequantize_row_avx512::<B>(w, s, b, group, row) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx() && group.is_multiple_of(16) {
        // SAFETY: AVX2 was detected; the slices' lengths are checked inside.
        return unsafe { dequantize_row_avx::<B>(w, s, b, group, row) };
    }
    dequantize_row_scalar::<B>(w, s, b, group, row)
}

/// [`dequantize_row_packed`] one word at a time.
fn dequantize_row_scalar<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    let per_word = 32 / B;
    let mask = (1u32 << B) - 1;
    for ((dg, wg), (sg, bg)) in row
        .chunks_exact_mut(group)
        .zip(w.chunks_exact(group / per_word))
        .zip(s.iter().zip(b))
    {
        for (d, word) in dg.chunks_exact_mut(per_word).zip(wg) {
            for (j, o) in d.iter_mut().enumerate() {
                *o = sg * (((word >> (j * B)) & mask) as f32) + bg;
            }
        }
    }
}

/// [`dequantize_row_packed`] eight values per step: the words holding them broadcast into the
/// lanes, each lane shifted to its value, masked, converted, then `* s` and `+ b`, each rounded
/// (no fused multiply-add, as in the scalar form).
///
/// # Safety
/// The CPU has AVX2; `B` is 2, 4 or 8; `group` is a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2")]
unsafe fn dequantize_row_avx<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    use std::arch::x86_64::*;
    let groups = (row.len() / group).min(s.len()).min(b.len());
    assert!(w.len() * 32 >= groups * group * B);
    // lane j of the 8 values from element e on: word (e + j) * B / 32, shift (e + j) * B % 32;
    // with B | 32 and 8 | e, that is word e * B / 32 + j * B / 32 and shift (e * B % 32) + j * B % 32
    let lane_word = _mm256_setr_epi32(
        0,
        (B / 32) as i32,
        (2 * B / 32) as i32,
        (3 * B / 32) as i32,
        (4 * B / 32) as i32,
        (5 * B / 32) as i32,
        (6 * B / 32) as i32,
        (7 * B / 32) as i32,
    );
    let lane_shift = _mm256_setr_epi32(
        0,
        (B % 32) as i32,
        (2 * B % 32) as i32,
        (3 * B % 32) as i32,
        (4 * B % 32) as i32,
        (5 * B % 32) as i32,
        (6 * B % 32) as i32,
        (7 * B % 32) as i32,
    );
    let mask = _mm256_set1_epi32(((1u32 << B) - 1) as i32);
    // at 2 bits one word holds 16 values: its upper eight are shifted 16 further
    let upper = _mm256_add_epi32(lane_shift, _mm256_set1_epi32(16));
    let out = row.as_mut_ptr();
    for g in 0..groups {
        let (sv, bv) = (_mm256_set1_ps(s[g]), _mm256_set1_ps(b[g]));
        let value = |words: __m256i, shifts: __m256i| {
            let q = _mm256_and_si256(_mm256_srlv_epi32(words, shifts), mask);
            _mm256_add_ps(_mm256_mul_ps(sv, _mm256_cvtepi32_ps(q)), bv)
        };
        let mut e = g * group;
        while e < (g + 1) * group {
            let first = e * B / 32;
            // SAFETY: the words `first..` that hold values `e..e + 8` (one, or two at 8 bits)
            // are inside `w` (asserted above); `row[e..e + 16]` at 2 bits (a group holds a
            // multiple of 16 values there, since 16 values share a word and words do not cross
            // groups) and `row[e..e + 8]` otherwise are inside the row.
            unsafe {
                match B {
                    8 => {
                        let two = _mm_loadl_epi64(w.as_ptr().add(first) as *const __m128i);
                        let words =
                            _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(two), lane_word);
                        _mm256_storeu_ps(out.add(e), value(words, lane_shift));
                        e += 8;
                    }
                    4 => {
                        let words = _mm256_set1_epi32(*w.get_unchecked(first) as i32);
                        _mm256_storeu_ps(out.add(e), value(words, lane_shift));
                        e += 8;
                    }
                    _ => {
                        let words = _mm256_set1_epi32(*w.get_unchecked(first) as i32);
                        _mm256_storeu_ps(out.add(e), value(words, lane_shift));
                        _mm256_storeu_ps(out.add(e + 8), value(words, upper));
                        e += 16;
                    }
                }
            }
        }
    }
}

/// [`dequantize_row_avx`] sixteen values per step (the words holding them permuted into the
/// lanes); the same arithmetic, so the same bits.
///
/// # Safety
/// The CPU has AVX-512F; `B` is 2, 4 or 8; `group` is a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,avx512f")]
unsafe fn dequantize_row_avx512<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    use std::arch::x86_64::*;
    let groups = (row.len() / group).min(s.len()).min(b.len());
    assert!(w.len() * 32 >= groups * group * B);
    // lane j of the 16 values from element e on (16 | e): word e * B / 32 + j * B / 32, shift
    // j * B % 32
    let lane_word: [i32; 16] = std::array::from_fn(|j| (j * B / 32) as i32);
    let lane_shift: [i32; 16] = std::array::from_fn(|j| (j * B % 32) as i32);
    // SAFETY: 16 readable i32 each.
    let (lane_word, lane_shift) = unsafe {
        (
            _mm512_loadu_si512(lane_word.as_ptr() as *const _),
            _mm512_loadu_si512(lane_shift.as_ptr() as *const _),
        )
    };
    let mask = _mm512_set1_epi32(((1u32 << B) - 1) as i32);
    let out = row.as_mut_ptr();
    for g in 0..groups {
        let (sv, bv) = (_mm512_set1_ps(s[g]), _mm512_set1_ps(b[g]));
        let mut e = g * group;
        while e < (g + 1) * group {
            let p = w.as_ptr().wrapping_add(e * B / 32);
            // SAFETY: the `B / 2` words at `p` that hold values `e..e + 16` are inside `w`
            // (asserted above), and so many are read; `row[e..e + 16]` is inside the row.
            unsafe {
                let words = match B {
                    8 => _mm_loadu_si128(p as *const __m128i),
                    4 => _mm_loadl_epi64(p as *const __m128i),
                    _ => _mm_cvtsi32_si128(*p as i32),
                };
                let words = _mm512_permutexvar_epi32(lane_word, _mm512_castsi128_si512(words));
                let q = _mm512_and_si512(_mm512_srlv_epi32(words, lane_shift), mask);
                let v = _mm512_add_ps(_mm512_mul_ps(sv, _mm512_cvtepi32_ps(q)), bv);
                _mm512_storeu_ps(out.add(e), v);
            }
            e += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed row functions (scalar, AVX2, AVX-512 where the CPU has them) and the general
    /// one agree bit for bit at every width they share.
    #[test]
    fn packed_rows_equal_the_general_arithmetic() {
        let mut x = 3u64;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 32) as u32
        };
        for bits in [2usize, 4, 8] {
            let (inp, group) = (256, 64);
            let w: Vec<u32> = (0..inp * bits / 32).map(|_| next()).collect();
            let s: Vec<f32> = (0..inp / group)
                .map(|_| next() as f32 / u32::MAX as f32 - 0.5)
                .collect();
            let b: Vec<f32> = (0..inp / group)
                .map(|_| next() as f32 / u32::MAX as f32 - 0.5)
                .collect();
            let mut want = vec![0f32; inp];
            dequantize_row_any(&w, &s, &b, bits, group, &mut want);
            type Row = fn(&[u32], &[f32], &[f32], usize, &mut [f32]);
            let mut paths: Vec<(&str, Row)> = match bits {
                2 => vec![("scalar", dequantize_row_scalar::<2>)],
                4 => vec![("scalar", dequantize_row_scalar::<4>)],
                _ => vec![("scalar", dequantize_row_scalar::<8>)],
            };
            #[cfg(target_arch = "x86_64")]
            {
                fn avx<const B: usize>(w: &[u32], s: &[f32], b: &[f32], g: usize, r: &mut [f32]) {
                    // SAFETY: only pushed where the CPU has AVX2; `g` is a multiple of 16.
                    unsafe { dequantize_row_avx::<B>(w, s, b, g, r) }
                }
                fn avx512<const B: usize>(
                    w: &[u32],
                    s: &[f32],
                    b: &[f32],
                    g: usize,
                    r: &mut [f32],
                ) {
                    // SAFETY: only pushed where the CPU has AVX-512F; `g` is a multiple of 16.
                    unsafe { dequantize_row_avx512::<B>(w, s, b, g, r) }
                }
                if crate::simd::has_avx() {
                    paths.push(match bits {
                        2 => ("avx2", avx::<2>),
                        4 => ("avx2", avx::<4>),
                        _ => ("avx2", avx::<8>),
                    });
                }
                if crate::simd::has_avx512() {
                    paths.push(match bits {
                        2 => ("avx512", avx512::<2>),
                        4 => ("avx512", avx512::<4>),
                        _ => ("avx512", avx512::<8>),
                    });
                }
            }
            for (path, f) in paths {
                let mut got = vec![0f32; inp];
                f(&w, &s, &b, group, &mut got);
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, p)| a.to_bits() == p.to_bits());
                assert!(same, "{bits} bits, {path}");
            }
        }
    }
}
