//! MLX affine-quantized matrices: `w = scales * q + biases` per group of `group` input columns,
//! with `bits`-wide unsigned values packed little-endian into `u32` words. This module holds the
//! one dequantization arithmetic (`s * q` rounded, then `+ b` rounded, in f32), used both to
//! dequantize a whole matrix at load ([`crate::loader::dequantize_affine`]), for prefill's
//! blocks of rows, and, for matrices kept packed in memory at widths other than 4 and 8 bits, a
//! few rows at a time inside the few-row products ([`crate::kernels::matmul_quant`]), which then
//! give the bits of the dequantized load. 4- and 8-bit few-row products dequantize in registers
//! with a fused multiply-add ([`crate::qdot`]), which rounds once where this rounds twice.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::has_avx512bw;

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
            // widths dividing 32 whose words do not straddle groups, a word at a time; the others
            // eight values (`bits` bytes) at a time where groups hold whole octets
            let (g, word_aligned) = (self.group, self.group.is_multiple_of(32 / self.bits));
            match self.bits {
                2 if word_aligned => dequantize_row_packed::<2>(w, s, b, g, row),
                4 if word_aligned => dequantize_row_packed::<4>(w, s, b, g, row),
                8 if word_aligned => dequantize_row_packed::<8>(w, s, b, g, row),
                3 if g.is_multiple_of(8) => dequantize_row_chunked::<3>(w, s, b, g, row),
                5 if g.is_multiple_of(8) => dequantize_row_chunked::<5>(w, s, b, g, row),
                6 if g.is_multiple_of(8) => dequantize_row_chunked::<6>(w, s, b, g, row),
                _ => dequantize_row_any(w, s, b, self.bits, g, row),
            }
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

/// One row at a width that does not divide 32 (3, 5, 6 bits), `group` a multiple of 8: the same
/// arithmetic as [`dequantize_row_any`], eight values at a time. Eight `B`-bit values are exactly
/// `B` bytes of the little-endian bit stream, read as one `u64` (AVX2: shifted in 64-bit lanes).
fn dequantize_row_chunked<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512bw() && group.is_multiple_of(16) {
        // SAFETY: AVX-512F and BW were detected; the slices' lengths are checked inside.
        return unsafe { dequantize_row_chunked_avx512::<B>(w, s, b, group, row) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::cpu::has_avx() {
        // SAFETY: AVX2 was detected; the slices' lengths are checked inside.
        return unsafe { dequantize_row_chunked_avx::<B>(w, s, b, group, row) };
    }
    dequantize_row_chunked_scalar::<B>(w, s, b, group, row)
}

/// [`dequantize_row_chunked`] without SIMD.
fn dequantize_row_chunked_scalar<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    let mask = (1u64 << B) - 1;
    for (c, dst) in row.chunks_exact_mut(8).enumerate() {
        let g = c * 8 / group;
        let (sg, bg) = (s[g], b[g]);
        let x = eight_values::<B>(w, c);
        for (j, o) in dst.iter_mut().enumerate() {
            *o = sg * (((x >> (j * B)) & mask) as f32) + bg;
        }
    }
}

/// The `B` bytes holding values `8 c..8 c + 8` of a `B`-bit packed row, as the low bytes of a
/// `u64`.
#[inline(always)]
fn eight_values<const B: usize>(w: &[u32], c: usize) -> u64 {
    let (byte, mut x) = (c * B, 0u64);
    for k in 0..B {
        let at = byte + k;
        x |= (((w[at / 4] >> (8 * (at % 4))) & 0xff) as u64) << (8 * k);
    }
    x
}

/// The 16 bytes of a packed row (`w`, as its little-endian bit stream) from byte `at` on, zero
/// past the row's end: read in place when they lie inside the row, else copied.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sixteen_bytes(w: &[u32], at: usize) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128};
    if at + 16 <= w.len() * 4 {
        // SAFETY: bytes `at..at + 16` lie inside `w` (SSE2 is part of x86_64)
        return unsafe { _mm_loadu_si128(w.as_ptr().cast::<u8>().add(at).cast::<__m128i>()) };
    }
    let mut tail = [0u8; 16];
    for (k, o) in tail.iter_mut().enumerate() {
        let i = at + k;
        if i < w.len() * 4 {
            *o = (w[i / 4] >> (8 * (i % 4))) as u8;
        }
    }
    // SAFETY: reading 16 bytes from a 16-byte array
    unsafe { _mm_loadu_si128(tail.as_ptr().cast::<__m128i>()) }
}

/// Byte-shuffle indices and shifts that move value `j` of an octet starting at byte `first` of
/// a 16-byte lane into 32-bit lane `j`: its two bytes `first + j B / 8` and the next (the others
/// zeroed), to be shifted right by `j B % 8`.
#[cfg(target_arch = "x86_64")]
fn octet_lanes<const B: usize>(first: usize) -> ([i8; 32], [i32; 8]) {
    let (mut idx, mut shift) = ([-1i8; 32], [0i32; 8]);
    for j in 0..8 {
        let byte = first + j * B / 8;
        // lanes 0-3 sit in the low 16-byte half, 4-7 in the high one; both halves hold the
        // same bytes
        idx[4 * j] = byte as i8;
        idx[4 * j + 1] = (byte + 1) as i8;
        shift[j] = (j * B % 8) as i32;
    }
    (idx, shift)
}

/// [`dequantize_row_chunked`] with AVX2, sixteen values (two octets, `2 B` bytes) per step: the
/// 16 bytes holding them broadcast into both halves, each value's two bytes shuffled into its
/// 32-bit lane, shifted, masked, converted, then `* s` and `+ b`, each rounded (no fused
/// multiply-add, as in the scalar form).
///
/// # Safety
/// The CPU has AVX2; `group` is a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2")]
unsafe fn dequantize_row_chunked_avx<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    use std::arch::x86_64::*;
    let octets = row.len() / 8;
    assert!(w.len() * 32 >= octets * 8 * B && (octets * 8).div_ceil(group) <= s.len().min(b.len()));
    let (i0, sh) = octet_lanes::<B>(0);
    let (i1, _) = octet_lanes::<B>(B);
    // SAFETY: reading 32 bytes / 8 i32 from arrays of that size
    let (idx0, idx1, shift) = unsafe {
        (
            _mm256_loadu_si256(i0.as_ptr() as *const __m256i),
            _mm256_loadu_si256(i1.as_ptr() as *const __m256i),
            _mm256_loadu_si256(sh.as_ptr() as *const __m256i),
        )
    };
    let mask = _mm256_set1_epi32(((1u32 << B) - 1) as i32);
    let out = row.as_mut_ptr();
    for c in (0..octets).step_by(2) {
        let x = _mm256_broadcastsi128_si256(sixteen_bytes(w, c * B));
        for (half, idx) in [idx0, idx1].into_iter().enumerate() {
            let o = c + half;
            if o == octets {
                break;
            }
            let q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(x, idx), shift), mask);
            let g = o * 8 / group;
            let v = _mm256_add_ps(
                _mm256_mul_ps(_mm256_set1_ps(s[g]), _mm256_cvtepi32_ps(q)),
                _mm256_set1_ps(b[g]),
            );
            // SAFETY: `o < octets`, so `row[8 o..8 o + 8]` is inside the row.
            unsafe { _mm256_storeu_ps(out.add(8 * o), v) };
        }
    }
}

/// [`dequantize_row_chunked_avx`] with AVX-512, sixteen values per step in one register (the 16
/// bytes broadcast into all four 16-byte lanes, the first octet's values shuffled into lanes
/// 0-7, the second's into 8-15); the same arithmetic, so the same bits.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW; `group` is a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,avx512f,avx512bw")]
unsafe fn dequantize_row_chunked_avx512<const B: usize>(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    use std::arch::x86_64::*;
    let blocks = row.len() / 16;
    assert!(
        w.len() * 32 >= blocks * 16 * B && (blocks * 16).div_ceil(group) <= s.len().min(b.len())
    );
    let (i0, sh) = octet_lanes::<B>(0);
    let (i1, _) = octet_lanes::<B>(B);
    let mut idx = [0i8; 64];
    idx[..32].copy_from_slice(&i0);
    idx[32..].copy_from_slice(&i1);
    let mut shifts = [0i32; 16];
    shifts[..8].copy_from_slice(&sh);
    shifts[8..].copy_from_slice(&sh);
    // SAFETY: reading 64 bytes from arrays of that size
    let (idx, shift) = unsafe {
        (
            _mm512_loadu_si512(idx.as_ptr() as *const __m512i),
            _mm512_loadu_si512(shifts.as_ptr() as *const __m512i),
        )
    };
    let mask = _mm512_set1_epi32(((1u32 << B) - 1) as i32);
    let out = row.as_mut_ptr();
    for k in 0..blocks {
        let x = _mm512_broadcast_i32x4(sixteen_bytes(w, 2 * k * B));
        let q = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(x, idx), shift), mask);
        let g = k * 16 / group;
        let v = _mm512_add_ps(
            _mm512_mul_ps(_mm512_set1_ps(s[g]), _mm512_cvtepi32_ps(q)),
            _mm512_set1_ps(b[g]),
        );
        // SAFETY: `k < blocks`, so `row[16 k..16 k + 16]` is inside the row.
        unsafe { _mm512_storeu_ps(out.add(16 * k), v) };
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
    if crate::kernels::cpu::has_avx512() && group.is_multiple_of(16) {
        // SAFETY: AVX-512F was detected; the slices' lengths are checked inside.
        return unsafe { dequantize_row_avx512::<B>(w, s, b, group, row) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::cpu::has_avx() && group.is_multiple_of(16) {
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

    /// The packed row functions (scalar, AVX2, AVX-512 where the CPU has them) and the general
    /// one agree bit for bit at every width (3, 5 and 6 bits: eight values at a time).
    #[test]
    fn packed_rows_equal_the_general_arithmetic() {
        let mut x = 3u64;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 32) as u32
        };
        // groups of 8 (one octet each) at the widths that straddle words
        for (bits, inp, group) in [2usize, 3, 4, 5, 6, 8]
            .map(|b| (b, 256, 64))
            .into_iter()
            .chain([3, 5, 6].map(|b| (b, 224, 8)))
        {
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
                3 => vec![("scalar", dequantize_row_chunked_scalar::<3>)],
                4 => vec![("scalar", dequantize_row_scalar::<4>)],
                5 => vec![("scalar", dequantize_row_chunked_scalar::<5>)],
                6 => vec![("scalar", dequantize_row_chunked_scalar::<6>)],
                _ => vec![("scalar", dequantize_row_scalar::<8>)],
            };
            #[cfg(target_arch = "x86_64")]
            if !matches!(bits, 2 | 4 | 8) && crate::kernels::cpu::has_avx() {
                fn chunked<const B: usize>(
                    w: &[u32],
                    s: &[f32],
                    b: &[f32],
                    g: usize,
                    r: &mut [f32],
                ) {
                    // SAFETY: only pushed where the CPU has AVX2; `g` is a multiple of 8.
                    unsafe { dequantize_row_chunked_avx::<B>(w, s, b, g, r) }
                }
                paths.push(match bits {
                    3 => ("avx2", chunked::<3>),
                    5 => ("avx2", chunked::<5>),
                    _ => ("avx2", chunked::<6>),
                });
                fn chunked512<const B: usize>(
                    w: &[u32],
                    s: &[f32],
                    b: &[f32],
                    g: usize,
                    r: &mut [f32],
                ) {
                    // SAFETY: only pushed where the CPU has AVX-512F/BW; `g` is a multiple of 16.
                    unsafe { dequantize_row_chunked_avx512::<B>(w, s, b, g, r) }
                }
                if has_avx512bw() && group.is_multiple_of(16) {
                    paths.push(match bits {
                        3 => ("avx512", chunked512::<3>),
                        5 => ("avx512", chunked512::<5>),
                        _ => ("avx512", chunked512::<6>),
                    });
                }
            }
            #[cfg(target_arch = "x86_64")]
            if matches!(bits, 2 | 4 | 8) {
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
                if crate::kernels::cpu::has_avx() {
                    paths.push(match bits {
                        2 => ("avx2", avx::<2>),
                        4 => ("avx2", avx::<4>),
                        _ => ("avx2", avx::<8>),
                    });
                }
                if crate::kernels::cpu::has_avx512() {
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
                assert!(same, "{bits} bits, {inp} inputs, groups of {group}, {path}");
            }
        }
    }
}
