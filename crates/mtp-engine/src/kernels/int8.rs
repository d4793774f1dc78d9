//! Integer products of 4- and 8-bit MLX matrices with int8 activations: the `fast` arithmetic
//! ([`crate::arith::Arith::Fast`]), llama.cpp's way (Q4_0 / Q8_0 times Q8_0 activations).
//!
//! **Activations** ([`Q8Rows::quantize`]): each input row on its own, in blocks of the weights'
//! group size, to int8 with one f32 scale per block, as llama.cpp's `quantize_row_q8_0`:
//! `d = max|x| / 127`, `a = round(x / d)` (to nearest, ties to even, as its AVX2 path), and the
//! block's `sum(a)` kept beside it. A row's quantization never depends on the other rows.
//!
//! **Products.** MLX affine weights are `w = s * q + b` per group, so a group's dot product with
//! `x ≈ d * a` is `s * d * sum(q * a) + b * d * sum(a)`. `sum(q * a)` is computed in integers,
//! exactly, in 8 lanes of i32: per 32-value block, lane `l` holds the products of register bytes
//! `4l..4l + 3`, where at 4 bits register byte `k < 16` is the low nibble of packed byte `k`
//! (value `2k`) and byte `16 + k` its high nibble (value `2k + 1`): the activations are stored
//! in that order (each block's even-indexed values, then the odd-indexed), at 8 bits as they
//! are. The lanes of a group's blocks are added (integers: exact). Then, in f32, one fixed
//! arithmetic on every path: per group `g`, `acc[l] = fma(float(lane[l]), s_g * d_g, acc[l])`
//! and `bias = fma(b_g, d_g * sum_g(a), bias)`; the result is
//! `((acc0 + acc4) + (acc1 + acc5)) + ((acc2 + acc6) + (acc3 + acc7)) + bias`. The integer lanes
//! are the same numbers on every path, so every path gives the same bits (the portable one
//! where it fuses multiply-adds, as [`crate::kernels`] says), and a row's result depends on that
//! row alone: a verify forward yields the bits of single steps in `fast` mode too.
//!
//! **Paths** ([`IntPath`]): AVX2 `vpmaddubsw` (u8 weights times i8 activations into i16 pairs,
//! at 4 bits added over up to four blocks, then `vpmaddwd` into i32 lanes; at 8 bits the codes
//! are shifted to `q - 128` so that pairs cannot saturate, and `128 * sum(a)` per lane, kept
//! with the activations, is added back), `vpdpbusd` (four u8 × i8 products into each i32 lane
//! per instruction) with AVX-VNNI or AVX512-VNNI (on 256-bit registers), and the portable loops.
//! VNNI is used only where the CPU reports it (`MTP_NO_VNNI=1` turns it off, to measure the
//! AVX2 path on such a CPU).

// per-row arrays indexed by the row number `R` fixes, so loops unroll to registers
#![allow(clippy::needless_range_loop)]

use super::cpu::{isa, Isa};
use crate::error::{Error, Result};
use crate::kernels::quant::QuantMatrix;

/// Values per block: 16 packed bytes at 4 bits, 32 at 8.
const BLOCK: usize = 32;
/// Lanes of i32 per block (a 256-bit register).
const LANES: usize = 8;
/// Input rows computed together (each weight block read once for them).
pub(crate) const TILE: usize = 4;
/// Output features per task when a product is split across threads.
const TASK_ROWS: usize = 64;
/// Largest group: a lane's integer sum stays below 2^24, so it converts to f32 exactly
/// (`4096 / 32` blocks × 4 products × 255 × 127 < 2^24).
const MAX_GROUP: usize = 4096;

/// Whether the integer product takes a matrix of `bits` in groups of `group`: 4 or 8 bits,
/// whole 32-value blocks per group, at most [`MAX_GROUP`] values.
pub(crate) fn supports(bits: usize, group: usize) -> bool {
    matches!(bits, 4 | 8) && group > 0 && group.is_multiple_of(BLOCK) && group <= MAX_GROUP
}

fn shape_err(name: &str, expected: Vec<usize>, actual: Vec<usize>) -> Error {
    Error::ShapeMismatch {
        name: name.into(),
        expected,
        actual,
    }
}

/// `a * b + c`, fused where the lanes of [`crate::kernels`] are.
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(any(target_feature = "fma", target_arch = "aarch64")) {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `n` rows of activations quantized to int8 per block of `group` values (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Q8Rows {
    n: usize,
    inp: usize,
    group: usize,
    bits: usize,
    /// `n · inp` codes, each 32-value block in register order (see the module docs).
    a: Vec<i8>,
    /// `n · groups` scales.
    d: Vec<f32>,
    /// `n · groups`: `d * sum(a)` of the block.
    xs: Vec<f32>,
    /// At 8 bits, `n · groups · 8`: `128 ·` the sum of each lane's codes over the block (what
    /// the AVX2 path's shifted codes leave out); empty at 4 bits.
    corr: Vec<i32>,
}

impl Q8Rows {
    /// Quantizes `x`, `n` rows of `inp` values, in blocks of `group`, laid out for `bits`-bit
    /// weights. A wrong length or an unsupported layout is an error.
    pub(crate) fn quantize(
        x: &[f32],
        n: usize,
        inp: usize,
        group: usize,
        bits: usize,
    ) -> Result<Q8Rows> {
        if !supports(bits, group) || inp == 0 || !inp.is_multiple_of(group) {
            return Err(Error::Unsupported(format!(
                "int8 activations for {bits}-bit weights in groups of {group} over {inp} inputs"
            )));
        }
        if n.checked_mul(inp) != Some(x.len()) {
            return Err(shape_err(
                "the input of an int8 product",
                vec![n, inp],
                vec![x.len()],
            ));
        }
        let groups = inp / group;
        let mut q = Q8Rows {
            n,
            inp,
            group,
            bits,
            a: vec![0; n * inp],
            d: vec![0.0; n * groups],
            xs: vec![0.0; n * groups],
            corr: if bits == 8 {
                vec![0; n * groups * LANES]
            } else {
                Vec::new()
            },
        };
        for (k, xg) in x.chunks_exact(group).enumerate() {
            let nan = xg.iter().any(|v| v.is_nan());
            let amax = xg.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = if nan { f32::NAN } else { amax / 127.0 };
            let id = if d != 0.0 && d.is_finite() {
                1.0 / d
            } else {
                0.0
            };
            let ag = &mut q.a[k * group..(k + 1) * group];
            let mut sum = 0i32;
            for (ab, xb) in ag.chunks_exact_mut(BLOCK).zip(xg.chunks_exact(BLOCK)) {
                for (j, &v) in xb.iter().enumerate() {
                    let c = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
                    sum += i32::from(c);
                    // register order: at 4 bits value 2k at byte k, value 2k + 1 at 16 + k
                    let at = if bits == 4 {
                        j / 2 + (j % 2) * (BLOCK / 2)
                    } else {
                        j
                    };
                    ab[at] = c;
                }
                if bits == 8 {
                    for (l, c) in ab.chunks_exact(4).enumerate() {
                        let s: i32 = c.iter().map(|&v| i32::from(v)).sum();
                        q.corr[k * LANES + l] += 128 * s;
                    }
                }
            }
            q.d[k] = d;
            q.xs[k] = d * sum as f32;
        }
        Ok(q)
    }
}

/// The instruction set an integer product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntPath {
    /// Plain loops.
    Portable,
    /// AVX2 `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// AVX-VNNI `vpdpbusd` (256-bit, VEX).
    AvxVnni,
    /// AVX512-VNNI `vpdpbusd` on 256-bit registers (AVX512-VL).
    Avx512Vnni,
}

impl IntPath {
    /// The widest path this thread's kernels may take (see [`crate::kernels::cpu::isa`]): VNNI
    /// where the CPU has it and `MTP_NO_VNNI` does not turn it off, else AVX2, else portable.
    pub(crate) fn detect() -> IntPath {
        let isa = isa();
        if isa == Isa::Portable {
            return IntPath::Portable;
        }
        if vnni_allowed() {
            if isa >= Isa::Avx512 && IntPath::Avx512Vnni.cpu_has() {
                return IntPath::Avx512Vnni;
            }
            if IntPath::AvxVnni.cpu_has() {
                return IntPath::AvxVnni;
            }
        }
        IntPath::Avx2
    }

    /// Whether this CPU has the instructions of the path.
    pub(crate) fn cpu_has(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use super::cpu::{cpu_has_avx2_fma, cpu_has_avx512vnni, cpu_has_avxvnni};
            match self {
                IntPath::Portable => true,
                IntPath::Avx2 => cpu_has_avx2_fma(),
                IntPath::AvxVnni => cpu_has_avx2_fma() && cpu_has_avxvnni(),
                IntPath::Avx512Vnni => cpu_has_avx2_fma() && cpu_has_avx512vnni(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == IntPath::Portable
        }
    }
}

/// Whether `MTP_NO_VNNI` leaves VNNI on (unset, empty or `0`).
fn vnni_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MTP_NO_VNNI").is_none_or(|v| v.is_empty() || v == "0"))
}

/// One pass: weight rows `w` (`rows` of them) against input rows `r0..r0 + R` of `acts`.
struct Job<'a> {
    w: &'a [u32],
    s: &'a [f32],
    b: &'a [f32],
    rows: usize,
    acts: &'a Q8Rows,
    r0: usize,
}

/// `res[i * TILE + t]` = weight row `i` of `w` (`rows` rows of `acts`' inputs at its bits,
/// scales and biases `s`, `b` per group) times input row `r0 + t` of `acts`, for `t < nr`, on
/// `path`. Every length is checked: a mismatch is an error, and a path this CPU lacks is one
/// too.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_q8(
    path: IntPath,
    w: &[u32],
    s: &[f32],
    b: &[f32],
    rows: usize,
    acts: &Q8Rows,
    r0: usize,
    nr: usize,
    res: &mut [f32],
) -> Result<()> {
    let (inp, bits) = (acts.inp, acts.bits);
    let groups = inp / acts.group;
    let words = inp * bits / 32;
    if rows.checked_mul(words) != Some(w.len()) {
        return Err(shape_err(
            "the packed rows of an int8 product",
            vec![rows, words],
            vec![w.len()],
        ));
    }
    if s.len() != rows * groups || b.len() != rows * groups {
        return Err(shape_err(
            "the scales and biases of an int8 product",
            vec![rows, groups],
            vec![s.len(), b.len()],
        ));
    }
    if !(1..=TILE).contains(&nr) || r0.checked_add(nr).is_none_or(|e| e > acts.n) {
        return Err(shape_err(
            "the input rows of an int8 product",
            vec![acts.n],
            vec![r0, nr],
        ));
    }
    if res.len() < rows * TILE {
        return Err(shape_err(
            "the result of an int8 product",
            vec![rows, TILE],
            vec![res.len()],
        ));
    }
    if !path.cpu_has() {
        return Err(Error::Unsupported(format!(
            "the {path:?} integer product on this CPU"
        )));
    }
    let job = Job {
        w,
        s,
        b,
        rows,
        acts,
        r0,
    };
    macro_rules! go {
        ($f:ident) => {
            match (bits, nr) {
                (4, 1) => $f::<4, 1>(&job, res),
                (4, 2) => $f::<4, 2>(&job, res),
                (4, 3) => $f::<4, 3>(&job, res),
                (4, _) => $f::<4, 4>(&job, res),
                (_, 1) => $f::<8, 1>(&job, res),
                (_, 2) => $f::<8, 2>(&job, res),
                (_, 3) => $f::<8, 3>(&job, res),
                (_, _) => $f::<8, 4>(&job, res),
            }
        };
    }
    match path {
        IntPath::Portable => go!(portable),
        // SAFETY (all three): every length the paths read was checked above, and the CPU has
        // the path's instructions (`cpu_has`).
        #[cfg(target_arch = "x86_64")]
        IntPath::Avx2 => unsafe { go!(x86_avx2) },
        #[cfg(target_arch = "x86_64")]
        IntPath::AvxVnni => unsafe { go!(x86_avxvnni) },
        #[cfg(target_arch = "x86_64")]
        IntPath::Avx512Vnni => unsafe { go!(x86_avx512vnni) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the portable path runs off x86-64 (`cpu_has`)"),
    }
    Ok(())
}

/// Byte `k` of a row's little-endian packed words.
#[inline(always)]
fn byte(w: &[u32], k: usize) -> i32 {
    ((w[k / 4] >> (8 * (k % 4))) & 0xff) as i32
}

/// The 8 integer lanes of weight row `w` (packed words) from byte `at` on and codes `a` over
/// one group.
#[inline(always)]
fn group_lanes<const BITS: usize>(w: &[u32], at: usize, a: &[i8]) -> [i32; LANES] {
    let mut lanes = [0i32; LANES];
    for (blk, ab) in a.chunks_exact(BLOCK).enumerate() {
        let base = at + blk * BLOCK * BITS / 8;
        for k in 0..BLOCK {
            let q = if BITS == 4 {
                if k < 16 {
                    byte(w, base + k) & 15
                } else {
                    byte(w, base + k - 16) >> 4
                }
            } else {
                byte(w, base + k)
            };
            lanes[k / 4] += q * i32::from(ab[k]);
        }
    }
    lanes
}

/// The final fold of the float lanes and the bias term (see the module docs).
#[inline(always)]
fn fold(acc: [f32; LANES], bias: f32) -> f32 {
    (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + bias
}

/// The fixed arithmetic in plain Rust.
fn portable<const BITS: usize, const R: usize>(job: &Job<'_>, res: &mut [f32]) {
    let acts = job.acts;
    let (inp, group) = (acts.inp, acts.group);
    let groups = inp / group;
    let rbytes = inp * BITS / 8;
    let gbytes = group * BITS / 8;
    for i in 0..job.rows {
        let wr = &job.w[i * rbytes / 4..(i + 1) * rbytes / 4];
        for t in 0..R {
            let r = job.r0 + t;
            let (mut acc, mut bias) = ([0f32; LANES], 0f32);
            for g in 0..groups {
                let lanes =
                    group_lanes::<BITS>(wr, g * gbytes, &acts.a[r * inp + g * group..][..group]);
                let sd = job.s[i * groups + g] * acts.d[r * groups + g];
                for l in 0..LANES {
                    acc[l] = madd(lanes[l] as f32, sd, acc[l]);
                }
                bias = madd(job.b[i * groups + g], acts.xs[r * groups + g], bias);
            }
            res[i * TILE + t] = fold(acc, bias);
        }
    }
}

#[cfg(target_arch = "x86_64")]
use x86::{rows_avx2 as x86_avx2, rows_avx512vnni as x86_avx512vnni, rows_avxvnni as x86_avxvnni};

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The vector paths. Every offset they read was checked by [`super::rows_q8`]: the job's
    //! weight rows hold `rows · inp · bits / 8` bytes, its scales and biases `rows · groups`
    //! floats, and the activations `r0 + R` rows.

    use std::arch::x86_64::*;

    use super::{Job, BLOCK, LANES, TILE};

    /// How a path multiplies a block's 32 weight bytes by 32 activation codes into i32 lanes.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Dot {
        /// `vpmaddubsw` + `vpmaddwd`.
        Maddubs,
        /// AVX-VNNI `vpdpbusd`.
        AvxVnni,
        /// AVX512-VNNI `vpdpbusd` on 256 bits.
        Avx512Vnni,
    }

    /// The AVX2 path.
    ///
    /// # Safety
    /// AVX2 and FMA; the job fits its buffers (see [`super::rows_q8`]).
    #[target_feature(enable = "avx,avx2,fma")]
    pub(super) unsafe fn rows_avx2<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        res: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { rows::<BITS, R>(job, res, Dot::Maddubs) }
    }

    /// The AVX-VNNI path.
    ///
    /// # Safety
    /// AVX2, FMA and AVX-VNNI; the job fits its buffers.
    #[target_feature(enable = "avx,avx2,fma,avxvnni")]
    pub(super) unsafe fn rows_avxvnni<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        res: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { rows::<BITS, R>(job, res, Dot::AvxVnni) }
    }

    /// The AVX512-VNNI path (256-bit registers).
    ///
    /// # Safety
    /// AVX2, FMA, AVX-512F, AVX-512VL and AVX512-VNNI; the job fits its buffers.
    #[target_feature(enable = "avx,avx2,fma,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn rows_avx512vnni<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        res: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { rows::<BITS, R>(job, res, Dot::Avx512Vnni) }
    }

    /// `vpdpbusd` of the path: `acc + ` four u8 × i8 products per lane.
    ///
    /// # Safety
    /// The path's instructions.
    #[inline(always)]
    unsafe fn dpbusd(dot: Dot, acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: forwarded from the caller.
        unsafe {
            match dot {
                Dot::AvxVnni => _mm256_dpbusd_avx_epi32(acc, w, a),
                _ => _mm256_dpbusd_epi32(acc, w, a),
            }
        }
    }

    /// `((u0 + u4) + (u1 + u5)) + ((u2 + u6) + (u3 + u7))` of lanes `u`.
    ///
    /// # Safety
    /// AVX.
    #[inline(always)]
    unsafe fn fold(u: __m256) -> f32 {
        // SAFETY: the callers run with AVX.
        let h = unsafe {
            let v = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u));
            let mut h = [0f32; 4];
            _mm_storeu_ps(h.as_mut_ptr(), v);
            h
        };
        (h[0] + h[1]) + (h[2] + h[3])
    }

    /// The body of every path: weight rows one at a time, `R` input rows each.
    ///
    /// # Safety
    /// The path's instructions; the job fits its buffers.
    #[inline(always)]
    unsafe fn rows<const BITS: usize, const R: usize>(job: &Job<'_>, res: &mut [f32], dot: Dot) {
        let acts = job.acts;
        let (inp, group) = (acts.inp, acts.group);
        let groups = inp / group;
        let blocks = group / BLOCK;
        let rbytes = inp * BITS / 8;
        // SAFETY: every offset below stays inside the buffers `rows_q8` checked.
        unsafe {
            let m0f = _mm256_set1_epi8(15);
            let flip = _mm256_set1_epi8(-128);
            let ones = _mm256_set1_epi16(1);
            let ap = acts.a.as_ptr();
            let (dp, xp, cp) = (acts.d.as_ptr(), acts.xs.as_ptr(), acts.corr.as_ptr());
            for i in 0..job.rows {
                let w = job.w.as_ptr().cast::<u8>().add(i * rbytes);
                let (sp, bp) = (
                    job.s.as_ptr().add(i * groups),
                    job.b.as_ptr().add(i * groups),
                );
                let mut acc = [_mm256_setzero_ps(); R];
                let mut bias = [0f32; R];
                for g in 0..groups {
                    let mut lanes = [_mm256_setzero_si256(); R];
                    let mut pairs = [_mm256_setzero_si256(); R];
                    for blk in 0..blocks {
                        let v0 = g * group + blk * BLOCK;
                        let p = w.add(v0 * BITS / 8);
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(2048).cast());
                        let wq = if BITS == 4 {
                            let v = _mm_loadu_si128(p.cast());
                            let hi = _mm_srli_epi16::<4>(v);
                            _mm256_and_si256(_mm256_set_m128i(hi, v), m0f)
                        } else {
                            _mm256_loadu_si256(p.cast())
                        };
                        match dot {
                            Dot::Maddubs if BITS == 4 => {
                                for t in 0..R {
                                    let a =
                                        _mm256_loadu_si256(ap.add((job.r0 + t) * inp + v0).cast());
                                    // |pair| <= 2 · 15 · 127: four blocks fit in i16
                                    pairs[t] =
                                        _mm256_add_epi16(pairs[t], _mm256_maddubs_epi16(wq, a));
                                }
                                if blk % 4 == 3 || blk + 1 == blocks {
                                    for t in 0..R {
                                        lanes[t] = _mm256_add_epi32(
                                            lanes[t],
                                            _mm256_madd_epi16(pairs[t], ones),
                                        );
                                        pairs[t] = _mm256_setzero_si256();
                                    }
                                }
                            }
                            Dot::Maddubs => {
                                // q - 128 in -128..=127: |pair| <= 2 · 128 · 127 fits in i16
                                let ws = _mm256_xor_si256(wq, flip);
                                let wabs = _mm256_abs_epi8(ws);
                                for t in 0..R {
                                    let a =
                                        _mm256_loadu_si256(ap.add((job.r0 + t) * inp + v0).cast());
                                    let p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(a, ws));
                                    lanes[t] =
                                        _mm256_add_epi32(lanes[t], _mm256_madd_epi16(p16, ones));
                                }
                            }
                            _ => {
                                for t in 0..R {
                                    let a =
                                        _mm256_loadu_si256(ap.add((job.r0 + t) * inp + v0).cast());
                                    lanes[t] = dpbusd(dot, lanes[t], wq, a);
                                }
                            }
                        }
                    }
                    let (s, b) = (*sp.add(g), *bp.add(g));
                    for t in 0..R {
                        let r = job.r0 + t;
                        if BITS == 8 && dot == Dot::Maddubs {
                            // `128 · sum(a)` per lane, which the shifted codes left out
                            let c = _mm256_loadu_si256(cp.add((r * groups + g) * LANES).cast());
                            lanes[t] = _mm256_add_epi32(lanes[t], c);
                        }
                        let sd = _mm256_set1_ps(s * *dp.add(r * groups + g));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes[t]), sd, acc[t]);
                        bias[t] = b.mul_add(*xp.add(r * groups + g), bias[t]);
                    }
                }
                for t in 0..R {
                    *res.get_unchecked_mut(i * TILE + t) = fold(acc[t]) + bias[t];
                }
            }
        }
    }
}

/// `x [n, inp] · w^T → [n, out]` for a matrix [`supports`] takes, in integers (see the module
/// docs) on `path`. Row `r` of the result depends only on row `r` of `x`.
pub(crate) fn matmul_q8(x: &[f32], n: usize, q: &QuantMatrix, path: IntPath) -> Result<Vec<f32>> {
    let (inp, out, bits, group) = (q.in_features(), q.out_features(), q.bits(), q.group());
    let acts = Q8Rows::quantize(x, n, inp, group, bits)?;
    let words = inp * bits / 32;
    thread_local! {
        static PARAMS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    let tasks = out.div_ceil(TASK_ROWS);
    // per task, its features' results for every input row: `[tasks][TASK_ROWS][n]`
    let mut parts = vec![0f32; tasks * TASK_ROWS * n];
    let failed = std::sync::Mutex::new(None);
    let work = |task: usize, part: &mut [f32]| {
        let o0 = task * TASK_ROWS;
        let rows = TASK_ROWS.min(out - o0);
        let r = PARAMS.with_borrow_mut(|(wide_s, wide_b)| -> Result<()> {
            let (s, b) = q.params_rows(o0, rows, wide_s, wide_b);
            let mut res = [0f32; TASK_ROWS * TILE];
            let mut r0 = 0;
            while r0 < n {
                let nr = TILE.min(n - r0);
                rows_q8(
                    path,
                    &q.packed_words()[o0 * words..(o0 + rows) * words],
                    s,
                    b,
                    rows,
                    &acts,
                    r0,
                    nr,
                    &mut res,
                )?;
                for i in 0..rows {
                    part[i * n + r0..i * n + r0 + nr].copy_from_slice(&res[i * TILE..][..nr]);
                }
                r0 += nr;
            }
            Ok(())
        });
        if let Err(e) = r {
            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    };
    if out * inp >= 1 << 12 {
        crate::team::chunks_mut(&mut parts, TASK_ROWS * n, work);
    } else {
        for (task, part) in parts.chunks_mut(TASK_ROWS * n).enumerate() {
            work(task, part);
        }
    }
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut y = vec![0f32; n * out];
    for o in 0..out {
        for t in 0..n {
            y[t * out + o] = parts[o * n + t];
        }
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{bits as bits_of, CASES};
    use candle_core::{DType, Device, Tensor};
    use proptest::prelude::*;

    /// The paths this CPU runs.
    fn paths() -> Vec<IntPath> {
        [
            IntPath::Portable,
            IntPath::Avx2,
            IntPath::AvxVnni,
            IntPath::Avx512Vnni,
        ]
        .into_iter()
        .filter(|p| p.cpu_has())
        .collect()
    }

    fn fused(path: IntPath) -> bool {
        path != IntPath::Portable || cfg!(any(target_feature = "fma", target_arch = "aarch64"))
    }

    /// The codes of `q`, row-major in natural order, and its scales and biases as f32.
    fn parts(q: &QuantMatrix) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
        let (inp, bits) = (q.in_features(), q.bits());
        let w = q.packed_words();
        let codes = (0..q.out_features() * inp)
            .map(|j| i64::from((w[j * bits / 32] >> ((j * bits) % 32)) & ((1 << bits) - 1)))
            .collect();
        let (mut ws, mut wb) = (Vec::new(), Vec::new());
        let (s, b) = q.params_rows(0, q.out_features(), &mut ws, &mut wb);
        (codes, s.to_vec(), b.to_vec())
    }

    /// A matrix of given codes (natural order), scales and biases (f32).
    fn matrix(codes: &[u32], s: Vec<f32>, b: Vec<f32>, out: usize, bits: usize) -> QuantMatrix {
        let inp = codes.len() / out;
        let mut w = vec![0u32; codes.len() * bits / 32];
        for (j, &c) in codes.iter().enumerate() {
            w[j * bits / 32] |= c << ((j * bits) % 32);
        }
        let groups = s.len() / out;
        let cpu = &Device::Cpu;
        QuantMatrix::from_parts(
            "test",
            &Tensor::from_vec(w, (out, inp * bits / 32), cpu).unwrap(),
            &Tensor::from_vec(s, (out, groups), cpu).unwrap(),
            &Tensor::from_vec(b, (out, groups), cpu).unwrap(),
            bits,
        )
        .unwrap()
    }

    /// The reference quantization of one block (natural order): codes and scale.
    fn quantize_block(x: &[f32]) -> (Vec<i64>, f32) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let a = x
            .iter()
            .map(|v| (v * id).round_ties_even().clamp(-127.0, 127.0) as i64)
            .collect();
        (a, d)
    }

    /// With integer activations holding ±127 in every group (scale exactly 1), power-of-two
    /// scales and integer biases, every float step is exact: each path's result equals the
    /// integer sum `s · Σ q a + b · Σ a` exactly.
    #[test]
    fn integer_sums_are_exact_on_every_path() {
        for (bits, group, groups, out) in [
            (4, 32, 3, 5),
            (4, 64, 2, 70),
            (4, 128, 2, 9),
            (8, 32, 2, 3),
            (8, 64, 1, 66),
            (8, 128, 1, 7),
        ] {
            let inp = group * groups;
            let mut next = crate::testing::rng(bits as u64 * 1000 + group as u64);
            let max = (1u32 << bits) - 1;
            let codes: Vec<u32> = (0..out * inp)
                .map(|_| ((next() + 0.5) * (max + 1) as f32) as u32 % (max + 1))
                .map(|c| if c == 0 { max } else { c })
                .collect();
            let s: Vec<f32> = (0..out * groups).map(|i| [1.0, 2.0, 0.5][i % 3]).collect();
            let b: Vec<f32> = (0..out * groups).map(|i| [-8.0, 3.0, 0.0][i % 3]).collect();
            let q = matrix(&codes, s.clone(), b.clone(), out, bits);
            for n in 1..=6 {
                let x: Vec<f32> = (0..n * inp)
                    .map(|i| {
                        if i % group == 5 {
                            if i % 2 == 0 {
                                127.0
                            } else {
                                -127.0
                            }
                        } else {
                            (next() * 254.0).round()
                        }
                    })
                    .collect();
                for path in paths() {
                    let y = matmul_q8(&x, n, &q, path).unwrap();
                    for r in 0..n {
                        for o in 0..out {
                            let mut want = 0f64;
                            for g in 0..groups {
                                let (mut qa, mut sa) = (0i64, 0i64);
                                for j in g * group..(g + 1) * group {
                                    let a = x[r * inp + j] as i64;
                                    qa += i64::from(codes[o * inp + j]) * a;
                                    sa += a;
                                }
                                want += s[o * groups + g] as f64 * qa as f64
                                    + b[o * groups + g] as f64 * sa as f64;
                            }
                            assert_eq!(
                                y[r * out + o] as f64,
                                want,
                                "{path:?} {bits} bits, group {group}, row {r} of {n}, out {o}"
                            );
                        }
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// The activations are quantized as llama.cpp's `quantize_row_q8_0` (per row and
        /// block); each path's result is within f32 rounding of the exact product with those
        /// activations, and within the activations' rounding of the f32 product; a row's bits
        /// do not depend on the rows computed with it; every path gives the same bits.
        #[test]
        fn products_follow_the_int8_definition_per_row_on_every_path(
            n in 1usize..=9,
            bits in prop::sample::select(vec![4usize, 8]),
            group in prop::sample::select(vec![32usize, 64, 128, 96]),
            groups in 1usize..=4,
            out in 1usize..=70,
            params_dtype in prop::sample::select(vec![DType::F32, DType::BF16]),
            spread in prop::sample::select(vec![1e-3f32, 1.0, 300.0]),
            seed in any::<u64>(),
        ) {
            let (q, deq) = crate::kernels::quant::random_matrix(bits, group, groups, out, params_dtype, seed);
            let inp = q.in_features();
            let groups = inp / group;
            let (codes, s, b) = parts(&q);
            let mut next = crate::testing::rng(!seed);
            let x: Vec<f32> = (0..n * inp)
                .map(|i| next() * if (i / group) % 3 == 1 { spread } else { 1.0 })
                .collect();
            // the reference activations, and their layout in `Q8Rows`
            let acts = Q8Rows::quantize(&x, n, inp, group, bits).unwrap();
            let mut want_a = Vec::new();
            let mut want_d = Vec::new();
            for xb in x.chunks(group) {
                let (a, d) = quantize_block(xb);
                want_a.extend(a);
                want_d.push(d);
            }
            prop_assert_eq!(bits_of(&acts.d), bits_of(&want_d));
            for (k, &a) in want_a.iter().enumerate() {
                let (blk, j) = (k / BLOCK, k % BLOCK);
                let at = if bits == 4 { j / 2 + (j % 2) * 16 } else { j };
                prop_assert_eq!(i64::from(acts.a[blk * BLOCK + at]), a);
            }
            let mut first: Option<(IntPath, Vec<f32>)> = None;
            for path in paths() {
                let y = matmul_q8(&x, n, &q, path).unwrap();
                for r in 0..n {
                    let alone = matmul_q8(&x[r * inp..(r + 1) * inp], 1, &q, path).unwrap();
                    prop_assert_eq!(bits_of(&y[r * out..(r + 1) * out]), bits_of(&alone), "{:?} row {}", path, r);
                    for o in 0..out {
                        let (mut want, mut mag) = (0f64, 0f64);
                        let (mut exact, mut err) = (0f64, 0f64);
                        for g in 0..groups {
                            let (mut qa, mut sa, mut qa_abs, mut sa_abs) = (0f64, 0f64, 0f64, 0f64);
                            let d = want_d[r * groups + g] as f64;
                            for j in g * group..(g + 1) * group {
                                let a = want_a[r * inp + j] as f64;
                                qa += codes[o * inp + j] as f64 * a;
                                sa += a;
                                qa_abs += (codes[o * inp + j] as f64 * a).abs();
                                sa_abs += a.abs();
                                let w = deq[o * inp + j] as f64;
                                exact += w * x[r * inp + j] as f64;
                                err += w.abs() * d / 2.0;
                            }
                            let (sg, bg) = (s[o * groups + g] as f64, b[o * groups + g] as f64);
                            want += sg * d * qa + bg * d * sa;
                            // the lanes' partial sums may exceed the total: bound by `Σ |q a|`
                            mag += (sg * d).abs() * qa_abs + (bg * d).abs() * sa_abs;
                        }
                        let got = y[r * out + o] as f64;
                        let tol = (groups as f64 + 4.0) * 1.2e-7 * mag + 1e-30;
                        prop_assert!((got - want).abs() <= tol, "{:?} #{}: {} vs {} (bound {})", path, o, got, want, tol);
                        // the f32 product over the dequantized weights: within the rounding of
                        // the activations (half a step of each block's scale per value)
                        prop_assert!((got - exact).abs() <= err * 1.001 + tol + 1e-6 * mag, "{:?} #{}: {} vs exact {}", path, o, got, exact);
                    }
                }
                if fused(path) {
                    match &first {
                        Some((was, y0)) => prop_assert_eq!(bits_of(y0), bits_of(&y), "{:?} vs {:?}", was, path),
                        None => first = Some((path, y)),
                    }
                }
            }
        }
    }

    /// A value that is not finite makes its row's outputs not finite; zero rows give zero.
    #[test]
    fn edge_inputs() {
        let (q, _) = crate::kernels::quant::random_matrix(4, 64, 3, 5, DType::BF16, 7);
        let inp = q.in_features();
        for path in paths() {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut x = vec![0.25f32; 2 * inp];
                x[inp + 70] = bad;
                let y = matmul_q8(&x, 2, &q, path).unwrap();
                assert!(y[..5].iter().all(|v| v.is_finite()), "{path:?}: row 0");
                assert!(
                    y[5..].iter().all(|v| !v.is_finite()),
                    "{path:?} {bad}: {y:?}"
                );
            }
            let zero = matmul_q8(&vec![0.0; inp], 1, &q, path).unwrap();
            assert!(zero.iter().all(|&v| v == 0.0), "{zero:?}");
        }
    }

    /// Every length is checked: a mismatch is a typed error, never a read out of bounds.
    #[test]
    fn lengths_are_checked() {
        let (q, _) = crate::kernels::quant::random_matrix(4, 64, 2, 3, DType::F32, 1);
        let inp = q.in_features();
        assert!(matches!(
            Q8Rows::quantize(&[0.0; 127], 1, inp, 64, 4),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            Q8Rows::quantize(&[0.0; 128], 1, 128, 48, 4),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            Q8Rows::quantize(&[0.0; 128], 1, 128, 64, 3),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            Q8Rows::quantize(&[0.0; 96], 1, 96, 64, 4),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            matmul_q8(&[0.0; 130], 1, &q, IntPath::Portable),
            Err(Error::ShapeMismatch { .. })
        ));
        let acts = Q8Rows::quantize(&[0.5; 2 * 128], 2, 128, 64, 4).unwrap();
        let w = q.packed_words();
        let (mut ws, mut wb) = (Vec::new(), Vec::new());
        let (s, b) = q.params_rows(0, 3, &mut ws, &mut wb);
        let mut res = [0f32; 3 * TILE];
        for path in paths() {
            assert!(rows_q8(path, w, s, b, 3, &acts, 0, 2, &mut res).is_ok());
            let bad = [
                rows_q8(path, &w[1..], s, b, 3, &acts, 0, 2, &mut res),
                rows_q8(path, w, &s[1..], b, 3, &acts, 0, 2, &mut res),
                rows_q8(path, w, s, &b[..5], 3, &acts, 0, 2, &mut res),
                rows_q8(path, w, s, b, 3, &acts, 1, 2, &mut res),
                rows_q8(path, w, s, b, 3, &acts, 0, 0, &mut res),
                rows_q8(path, w, s, b, 3, &acts, 0, 5, &mut res),
                rows_q8(path, w, s, b, 3, &acts, usize::MAX, 1, &mut res),
                rows_q8(path, w, s, b, 3, &acts, 0, 1, &mut res[..11]),
            ];
            for (k, r) in bad.into_iter().enumerate() {
                assert!(
                    matches!(r, Err(Error::ShapeMismatch { .. })),
                    "{path:?} case {k}: {r:?}"
                );
            }
        }
        for path in [IntPath::AvxVnni, IntPath::Avx512Vnni] {
            if !path.cpu_has() {
                let r = rows_q8(path, w, s, b, 3, &acts, 0, 2, &mut res);
                assert!(matches!(r, Err(Error::Unsupported(_))), "{path:?}: {r:?}");
            }
        }
    }

    /// The VNNI paths give the portable path's bits (and so the definition's). Ignored where the
    /// build does not target VNNI: run it with `--ignored` on a CPU with AVX-VNNI or
    /// AVX512-VNNI; on a CPU without either it fails rather than passing without running.
    #[test]
    #[cfg_attr(
        not(any(target_feature = "avxvnni", target_feature = "avx512vnni")),
        ignore = "needs AVX-VNNI or AVX512-VNNI (this build does not target them): run with --ignored on such a CPU"
    )]
    fn vnni_paths_match_the_portable_path() {
        let vnni: Vec<IntPath> = [IntPath::AvxVnni, IntPath::Avx512Vnni]
            .into_iter()
            .filter(|p| p.cpu_has())
            .collect();
        assert!(
            !vnni.is_empty(),
            "this CPU has neither AVX-VNNI nor AVX512-VNNI"
        );
        for (bits, group) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128)] {
            for n in 1..=5 {
                let (q, _) =
                    crate::kernels::quant::random_matrix(bits, group, 3, 67, DType::BF16, n as u64);
                let inp = q.in_features();
                let mut next = crate::testing::rng(n as u64 + 9);
                let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
                let want = matmul_q8(&x, n, &q, IntPath::Portable).unwrap();
                for &path in &vnni {
                    let y = matmul_q8(&x, n, &q, path).unwrap();
                    if fused(IntPath::Portable) {
                        assert_eq!(
                            bits_of(&y),
                            bits_of(&want),
                            "{path:?} {bits} bits, group {group}"
                        );
                    } else {
                        let avx2 = matmul_q8(&x, n, &q, IntPath::Avx2).unwrap();
                        assert_eq!(
                            bits_of(&y),
                            bits_of(&avx2),
                            "{path:?} {bits} bits, group {group}"
                        );
                    }
                }
            }
        }
    }
}
