//! Rows of MLX affine-quantized matrices dequantized to f32 ([`dequantize_row`]): value `j` of
//! group `g` is `s[g] * q[j] + b[g]`, the product rounded, then the sum (no fused multiply-add),
//! the one dequantization arithmetic of the engine (a whole matrix at load, prefill's panels,
//! and the few-row products at widths other than 4 and 8 bits; `crate::kernels::quant::QuantMatrix`
//! hands the rows here). Widths that divide 32 (2, 4, 8 bits) go a word at a time, the others
//! (3, 5, 6) eight values, `B` bytes, at a time; each has a portable loop and AVX2 / AVX-512
//! forms, chosen by [`cpu::isa`], and every one gives the bits of [`dequantize_row_any`]
//! (`tests` below).

use super::cpu::{self, Isa};

/// Dequantizes one packed row: `row[j] = s[g] * q[j] + b[g]` for value `j` of group
/// `g = j / group`, the values `bits` wide, little-endian in `w` (MLX's layout). Every path
/// gives the same bits.
///
/// # Panics
/// When `bits` is not 2, 3, 4, 5, 6 or 8, `group` is zero or does not divide the row, `s` or `b`
/// hold fewer than one value per group, or `w` fewer than `row.len() · bits` bits.
pub(crate) fn dequantize_row(
    w: &[u32],
    s: &[f32],
    b: &[f32],
    bits: usize,
    group: usize,
    row: &mut [f32],
) {
    assert!(
        matches!(bits, 2 | 3 | 4 | 5 | 6 | 8),
        "dequantize_row: {bits} bits"
    );
    assert!(
        group > 0 && row.len().is_multiple_of(group),
        "dequantize_row: a row of {} values in groups of {group}",
        row.len()
    );
    let groups = row.len() / group;
    assert!(
        s.len() >= groups && b.len() >= groups,
        "dequantize_row: {} scales and {} biases for {groups} groups",
        s.len(),
        b.len()
    );
    assert!(
        row.len()
            .checked_mul(bits)
            .is_some_and(|need| w.len().checked_mul(32).is_none_or(|have| have >= need)),
        "dequantize_row: {} words for {} values of {bits} bits",
        w.len(),
        row.len()
    );
    let isa = cpu::isa();
    // widths dividing 32 whose words do not straddle groups, a word at a time; the others eight
    // values (`bits` bytes) at a time where groups hold whole octets
    let (g, word_aligned) = (group, group.is_multiple_of(32 / bits));
    match bits {
        2 if word_aligned => dequantize_row_packed::<2>(isa, w, s, b, g, row),
        4 if word_aligned => dequantize_row_packed::<4>(isa, w, s, b, g, row),
        8 if word_aligned => dequantize_row_packed::<8>(isa, w, s, b, g, row),
        3 if g.is_multiple_of(8) => dequantize_row_chunked::<3>(isa, w, s, b, g, row),
        5 if g.is_multiple_of(8) => dequantize_row_chunked::<5>(isa, w, s, b, g, row),
        6 if g.is_multiple_of(8) => dequantize_row_chunked::<6>(isa, w, s, b, g, row),
        _ => dequantize_row_any(w, s, b, bits, g, row),
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

/// One row at a width that does not divide 32 (3, 5, 6 bits), `group` a multiple of 8, on `isa`:
/// the same arithmetic as [`dequantize_row_any`], eight values at a time. Eight `B`-bit values
/// are exactly `B` bytes of the little-endian bit stream, read as one `u64` (AVX2: shifted in
/// 64-bit lanes).
fn dequantize_row_chunked<const B: usize>(
    isa: Isa,
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 if cpu::has_avx512bw(isa) && group.is_multiple_of(16) => {
            // SAFETY: AVX-512F and BW were detected; the slices' lengths are checked inside.
            return unsafe { dequantize_row_chunked_avx512::<B>(w, s, b, group, row) };
        }
        Isa::Avx512 | Isa::Avx2 => {
            // SAFETY: AVX2 was detected; the slices' lengths are checked inside.
            return unsafe { dequantize_row_chunked_avx::<B>(w, s, b, group, row) };
        }
        Isa::Portable => {}
    }
    let _ = isa;
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
/// arithmetic as [`dequantize_row_any`], eight values at a time with AVX2 (sixteen with
/// AVX-512) where `isa` has it.
fn dequantize_row_packed<const B: usize>(
    isa: Isa,
    w: &[u32],
    s: &[f32],
    b: &[f32],
    group: usize,
    row: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 if group.is_multiple_of(16) => {
            // SAFETY: AVX-512F was detected; the slices' lengths are checked inside.
            return unsafe { dequantize_row_avx512::<B>(w, s, b, group, row) };
        }
        Isa::Avx2 if group.is_multiple_of(16) => {
            // SAFETY: AVX2 was detected; the slices' lengths are checked inside.
            return unsafe { dequantize_row_avx::<B>(w, s, b, group, row) };
        }
        _ => {}
    }
    let _ = isa;
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
    use crate::kernels::cpu::{isas, with_isa};
    use crate::testing::{bits as bits_of, expect_panic};

    /// Every path this CPU runs (the portable loops, AVX2, AVX-512) gives the bits of the
    /// general arithmetic at every width: 2, 4 and 8 bits a word at a time, 3, 5 and 6 bits
    /// eight values at a time (in groups of 64, and of 8: one octet each, which the AVX-512
    /// form leaves to the AVX2 one).
    #[test]
    fn every_path_equals_the_general_arithmetic() {
        let mut x = 3u64;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 32) as u32
        };
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
            for isa in isas() {
                let mut got = vec![f32::NAN; inp];
                with_isa(isa, || dequantize_row(&w, &s, &b, bits, group, &mut got));
                assert_eq!(
                    bits_of(&got),
                    bits_of(&want),
                    "{isa:?}: {bits} bits, {inp} inputs, groups of {group}"
                );
            }
        }
    }

    /// The entry point checks every length the paths rely on.
    #[test]
    fn dequantize_row_checks_every_length() {
        let (w, s, b) = (vec![0u32; 8], vec![1f32; 2], vec![0f32; 2]);
        let mut row = vec![0f32; 64];
        dequantize_row(&w, &s, &b, 4, 32, &mut row);
        expect_panic("dequantize_row: 7 bits", || {
            dequantize_row(&w, &s, &b, 7, 32, &mut row.clone())
        });
        expect_panic("dequantize_row: a row of 64 values in groups of 0", || {
            dequantize_row(&w, &s, &b, 4, 0, &mut row.clone())
        });
        expect_panic("dequantize_row: a row of 60 values in groups of 32", || {
            dequantize_row(&w, &s, &b, 4, 32, &mut row[..60])
        });
        expect_panic("dequantize_row: 1 scales and 2 biases for 2 groups", || {
            dequantize_row(&w, &s[..1], &b, 4, 32, &mut row.clone())
        });
        expect_panic("dequantize_row: 7 words for 64 values of 4 bits", || {
            dequantize_row(&w[..7], &s, &b, 4, 32, &mut row.clone())
        });
    }
}
