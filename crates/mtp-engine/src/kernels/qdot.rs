//! Few-row products with 4- and 8-bit MLX matrices kept packed, dequantized in registers: each
//! 32-value block is unpacked, widened and scaled (`w = fma(q, s, b)`) once for all the input
//! rows of a pass, and multiplied into their accumulators straight away. Nothing is written
//! back: [`super::matmul_quant`]'s general path, which dequantizes four rows into a buffer
//! and multiplies them as f32 rows, spent more on the buffer than on the products (a 4-bit matrix
//! streamed at a third of bf16's speed, `examples/matmul_rows`).
//!
//! Why not integers (llama.cpp's way, with activations quantized to 8 bits): 8-bit, and even
//! 16-bit, activations move the logits of the 4-bit fixtures by up to 5e-4 and changed the greedy
//! tokens of the 4-bit MoE fixture against mlx-vlm; activations split into two 16-bit parts kept
//! parity but cost four integer multiply-adds per pair of values and input row, where this path
//! costs one f32 multiply-add per value and input row (measured side by side: a verify of 4 rows
//! 1.9x one row here, 2.5x in integers; one row alike).
//!
//! One fixed arithmetic, whatever the instruction set, so that a row's result never depends on
//! the path or on the other rows computed with it (a verify forward yields the bits of single
//! steps). Per 32-value block of group `g`, 16 lanes `j` hold two values: at 4 bits the low and
//! high nibbles of packed byte `j` (values `2j` and `2j + 1`), at 8 bits bytes `j` and `16 + j`.
//! Each is dequantized as `w = fma(float(q), s[g], b[g])` (rounded once; at 4 bits the AVX-512
//! path looks it up among the group's 16 such values, the same numbers) and accumulated as
//! `acc_a[j] = fma(w_a, x_a, acc_a[j])`, `acc_b[j] = fma(w_b, x_b, acc_b[j])`. After the last
//! block, `v[j] = acc_a[j] + acc_b[j]`, `u[l] = v[l] + v[l + 8]`, and the result is
//! `((u0 + u4) + (u1 + u5)) + ((u2 + u6) + (u3 + u7))`. The multiply-adds are fused wherever the
//! lanes of [`crate::kernels`] are (always on AVX2 and AVX-512). At 4 bits the inputs are first
//! reordered per block (even-indexed values, then odd) so that each lane's pair of values sits
//! at the same offsets as its pair of nibbles.

// The kernels index several per-row arrays (accumulators, results) by the same row number,
// which `R` fixes at compile time, so the loops unroll to registers.
#![allow(clippy::needless_range_loop)]

use super::cpu::{self, Isa};
use super::Aligned;
use crate::kernels::quant::QuantMatrix;

/// Values per block: 16 packed bytes at 4 bits, 32 at 8.
const BLOCK: usize = 32;

/// Output features computed per task when a product is split across threads.
const TASK_ROWS: usize = 64;

/// Input rows computed together (they share each dequantized weight block).
const TILE: usize = 4;

/// Whether [`matmul`] takes a matrix of `bits` with groups of `group` values: 4 or 8 bits, whole
/// blocks per group (mlx's group sizes 32, 64 and 128).
pub(crate) fn supports(bits: usize, group: usize) -> bool {
    matches!(bits, 4 | 8) && group > 0 && group.is_multiple_of(BLOCK)
}

/// The inputs as the lanes read them, on a 64-byte boundary ([`Aligned`]): at 4 bits each
/// 32-value block reordered as its values are unpacked (the 16 even-indexed, then the 16
/// odd-indexed); at 8 bits as they are.
fn arrange(x: &[f32], bits: usize) -> Aligned {
    if bits != 4 {
        return Aligned::copy(x);
    }
    Aligned::filled(x.len(), |out| {
        for (o, v) in out.chunks_exact_mut(BLOCK).zip(x.chunks_exact(BLOCK)) {
            for j in 0..BLOCK / 2 {
                o[j] = v[2 * j];
                o[BLOCK / 2 + j] = v[2 * j + 1];
            }
        }
    })
}

/// One task's work: weight rows `o0..o0 + rows` against input rows `r0..r0 + R`.
struct Job<'a> {
    /// The task's packed rows, `rows · inp · bits / 32` words.
    w: &'a [u32],
    /// Their scales and biases, `rows · groups` each, widened to f32.
    s: &'a [f32],
    b: &'a [f32],
    rows: usize,
    inp: usize,
    group: usize,
    /// Every input row, arranged (see [`arrange`]).
    x: &'a [f32],
    r0: usize,
}

/// `x [n, inp] · w^T → [n, out]` for a 4- or 8-bit matrix that [`supports`] takes, `n` rows
/// (any number; the callers pass up to [`crate::kernels::MAX_ROWS`]). Row `r` of the result
/// depends only on row `r` of `x`.
///
/// # Panics
/// When the matrix is not one [`supports`] takes or `x` is not `n` rows of its inputs.
pub(crate) fn matmul(x: &[f32], n: usize, q: &QuantMatrix) -> Vec<f32> {
    let (inp, out, bits, group) = (q.in_features(), q.out_features(), q.bits(), q.group());
    assert!(
        supports(bits, group),
        "qdot: {bits} bits, groups of {group}"
    );
    assert!(
        n.checked_mul(inp) == Some(x.len()),
        "qdot: the input holds {} floats, expected {n} rows of {inp}",
        x.len()
    );
    let xs = arrange(x, bits);
    // decided once, by the calling thread (the team's threads do not see a test's cap)
    let isa = cpu::isa();
    let mut y = vec![0f32; n * out];
    let words = inp * bits / 32;
    thread_local! {
        static PARAMS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    let ys = Out(y.as_mut_ptr());
    let work = |task: usize| {
        let o0 = task * TASK_ROWS;
        let rows = TASK_ROWS.min(out - o0);
        PARAMS.with_borrow_mut(|(wide_s, wide_b)| {
            let (s, b) = q.params_rows(o0, rows, wide_s, wide_b);
            let mut r0 = 0;
            while r0 < n {
                let tile = TILE.min(n - r0);
                let job = Job {
                    w: &q.packed_words()[o0 * words..(o0 + rows) * words],
                    s,
                    b,
                    rows,
                    inp,
                    group,
                    x: xs.values(),
                    r0,
                };
                let mut res = [[0f32; TILE]; TASK_ROWS];
                match tile {
                    4 => run::<4>(isa, &job, bits, &mut res),
                    3 => run::<3>(isa, &job, bits, &mut res),
                    2 => run::<2>(isa, &job, bits, &mut res),
                    _ => run::<1>(isa, &job, bits, &mut res),
                }
                for (i, row) in res.iter().take(rows).enumerate() {
                    for (t, &v) in row.iter().take(tile).enumerate() {
                        // SAFETY: `(r0 + t, o0 + i)` is inside the `[n, out]` result, and
                        // only this task writes its features `o0..o0 + rows`.
                        unsafe { ys.put((r0 + t) * out + o0 + i, v) };
                    }
                }
                r0 += tile;
            }
        });
    };
    let tasks = out.div_ceil(TASK_ROWS);
    if out * inp >= 1 << 12 {
        crate::team::run(tasks, &work);
    } else {
        (0..tasks).for_each(work);
    }
    y
}

/// The result, written by tasks at disjoint features.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: tasks write disjoint elements (see `matmul`).
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}
impl Out {
    /// # Safety
    /// `i` is inside the result and no other thread writes it.
    unsafe fn put(self, i: usize, v: f32) {
        // SAFETY: forwarded from the caller.
        unsafe { *self.0.add(i) = v };
    }
}

/// Writes `res[i][t]`, the product of weight row `i` of the job and input row `r0 + t`, on
/// `isa` (what [`cpu::isa`] detected, or narrower).
///
/// # Panics
/// When the job does not fit its buffers (the lengths every path relies on).
fn run<const R: usize>(isa: Isa, job: &Job<'_>, bits: usize, res: &mut [[f32; TILE]; TASK_ROWS]) {
    let groups = job.inp / job.group.max(1);
    assert!(
        R <= TILE
            && job.rows <= TASK_ROWS
            && supports(bits, job.group)
            && job.inp == groups * job.group
            && job.w.len() == job.rows * job.inp * bits / 32
            && job.s.len() >= job.rows * groups
            && job.b.len() >= job.rows * groups
            && job.r0 + R <= job.x.len() / job.inp,
        "qdot: a job that does not fit its buffers"
    );
    match isa {
        // SAFETY (all four): the lengths were checked above; the CPU has the instruction sets
        // (`cpu::isa`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if bits == 4 => unsafe { x86::rows_avx2::<4, R>(job, res) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::rows_avx2::<8, R>(job, res) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if bits == 4 => unsafe { x86::rows_avx512::<4, R>(job, res) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::rows_avx512::<8, R>(job, res) },
        _ => portable::<R>(job, bits, res),
    }
}

/// `a * b + c`, fused as the vector paths are where the target has FMA (see [`crate::kernels`]).
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(any(target_feature = "fma", target_arch = "aarch64")) {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The final fold of the 16 lanes (see the module docs).
#[inline(always)]
fn fold(v: [f32; 16]) -> f32 {
    let u: [f32; 8] = std::array::from_fn(|l| v[l] + v[l + 8]);
    ((u[0] + u[4]) + (u[1] + u[5])) + ((u[2] + u[6]) + (u[3] + u[7]))
}

/// Byte `k` of a row's little-endian packed stream.
#[inline(always)]
fn byte(w: &[u32], k: usize) -> u32 {
    (w[k / 4] >> (8 * (k % 4))) & 0xff
}

/// The fixed arithmetic in plain Rust.
fn portable<const R: usize>(job: &Job<'_>, bits: usize, res: &mut [[f32; TILE]; TASK_ROWS]) {
    let (inp, groups) = (job.inp, job.inp / job.group);
    let words = inp * bits / 32;
    for i in 0..job.rows {
        let w = &job.w[i * words..(i + 1) * words];
        for t in 0..R {
            let x = &job.x[(job.r0 + t) * inp..][..inp];
            let (mut acc_a, mut acc_b) = ([0f32; 16], [0f32; 16]);
            for v0 in (0..inp).step_by(BLOCK) {
                let g = i * groups + v0 / job.group;
                let (s, b) = (job.s[g], job.b[g]);
                let base = v0 * bits / 8;
                for j in 0..16 {
                    let (qa, qb) = if bits == 4 {
                        let v = byte(w, base + j);
                        (v & 15, v >> 4)
                    } else {
                        (byte(w, base + j), byte(w, base + 16 + j))
                    };
                    let (wa, wb) = (madd(qa as f32, s, b), madd(qb as f32, s, b));
                    acc_a[j] = madd(wa, x[v0 + j], acc_a[j]);
                    acc_b[j] = madd(wb, x[v0 + 16 + j], acc_b[j]);
                }
            }
            res[i][t] = fold(std::array::from_fn(|j| acc_a[j] + acc_b[j]));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The 256- and 512-bit paths. Every offset they read was checked by [`super::run`]:
    //! the job's weight rows hold `rows · inp · bits / 8` bytes, its scales and biases
    //! `rows · groups` floats, the inputs `r0 + R` rows of `inp`.

    use std::arch::x86_64::*;

    use super::{Job, BLOCK, TASK_ROWS, TILE};

    /// `$f::<.., G>(..)` with the group size `$group` as the constant `G` for mlx's sizes (32,
    /// 64 and 128: each group's loop then unrolls), else `G = 0` (the loops take the job's).
    macro_rules! by_group {
        ($group:expr, $f:ident::<$($p:ident),*>($($a:expr),*)) => {
            match $group {
                32 => $f::<$($p,)* 32>($($a),*),
                64 => $f::<$($p,)* 64>($($a),*),
                128 => $f::<$($p,)* 128>($($a),*),
                _ => $f::<$($p,)* 0>($($a),*),
            }
        };
    }

    /// `((u0 + u4) + (u1 + u5)) + ((u2 + u6) + (u3 + u7))` of the lanes `u = lo + hi`.
    ///
    /// # Safety
    /// AVX.
    #[inline(always)]
    unsafe fn fold(lo: __m256, hi: __m256) -> f32 {
        // SAFETY: the callers run with AVX.
        unsafe {
            let u = _mm256_add_ps(lo, hi);
            let h = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u));
            // [h0 + h1, _, h2 + h3, _]
            let p = _mm_add_ps(h, _mm_movehdup_ps(h));
            _mm_cvtss_f32(_mm_add_ss(p, _mm_movehl_ps(p, p)))
        }
    }

    /// The 256-bit path: each set of 16 lanes as two 8-lane halves, registers `k = 0..4` per
    /// input row: lanes 0-7 and 8-15 of `acc_a`, then of `acc_b`. One input row takes two
    /// weight rows at a time (eight chains instead of four to hide the multiply-add's
    /// latency); two keep all four registers; three and four (sixteen accumulators would not
    /// fit the sixteen registers with the weights: they spilled, and cost 2x and 3x one row)
    /// take each block's lanes 0-7 (`k = 0, 2`), then, re-reading the row from L1, lanes 8-15
    /// (`k = 1, 3`). Each lane's chain is the same every way.
    ///
    /// # Safety
    /// AVX2 and FMA; the job fits its buffers (see [`super::run`]).
    #[target_feature(enable = "avx,avx2,fma")]
    pub(super) unsafe fn rows_avx2<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { by_group!(job.group, rows_avx2_in::<BITS, R>(job, res)) }
    }

    /// [`rows_avx2`] for groups of `G` values (`0`: the job's), inlined into it.
    ///
    /// # Safety
    /// As [`rows_avx2`]; `G` is `0` or the job's group.
    #[inline(always)]
    unsafe fn rows_avx2_in<const BITS: usize, const R: usize, const G: usize>(
        job: &Job<'_>,
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        let mut i = 0;
        while i < job.rows {
            // SAFETY (all): forwarded from the caller; `i + P <= job.rows`.
            let (acc, p): ([[[__m256; 4]; R]; 2], usize) = unsafe {
                if R == 1 && i + 2 <= job.rows {
                    (lanes_avx2::<BITS, R, 4, 2, G>(job, i, [0, 1, 2, 3]), 2)
                } else if R <= 2 {
                    let [one] = lanes_avx2::<BITS, R, 4, 1, G>(job, i, [0, 1, 2, 3]);
                    ([one, one], 1)
                } else {
                    let [lo] = lanes_avx2::<BITS, R, 2, 1, G>(job, i, [0, 2]);
                    let [hi] = lanes_avx2::<BITS, R, 2, 1, G>(job, i, [1, 3]);
                    let one = std::array::from_fn(|t| [lo[t][0], hi[t][0], lo[t][1], hi[t][1]]);
                    ([one, one], 1)
                }
            };
            for (e, acc) in acc.iter().take(p).enumerate() {
                for t in 0..R {
                    let [a0, a1, b0, b1] = acc[t];
                    // SAFETY: AVX (the caller's).
                    res[i + e][t] = unsafe { fold(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1)) };
                }
            }
            i += p;
        }
    }

    /// Registers `ks` (of the four of [`rows_avx2`]) of weight rows `i..i + P` against the
    /// job's `R` input rows.
    ///
    /// # Safety
    /// As [`rows_avx2_in`]; `i + P <= job.rows`, every `k < 4`.
    #[inline(always)]
    unsafe fn lanes_avx2<
        const BITS: usize,
        const R: usize,
        const NK: usize,
        const P: usize,
        const G: usize,
    >(
        job: &Job<'_>,
        i: usize,
        ks: [usize; NK],
    ) -> [[[__m256; NK]; R]; P] {
        let (inp, group) = (job.inp, if G == 0 { job.group } else { G });
        let groups = inp / group;
        let words = inp * BITS / 32;
        // SAFETY: every offset below stays inside the buffers `run` checked.
        unsafe {
            let m15 = _mm256_set1_epi32(15);
            let (xp, sp, bp) = (job.x.as_ptr(), job.s.as_ptr(), job.b.as_ptr());
            let mut acc = [[[_mm256_setzero_ps(); NK]; R]; P];
            for g in 0..groups {
                for e in 0..P {
                    let w = job.w.as_ptr().add((i + e) * words).cast::<u8>();
                    let s = _mm256_set1_ps(*sp.add((i + e) * groups + g));
                    let b = _mm256_set1_ps(*bp.add((i + e) * groups + g));
                    for blk in (0..group).step_by(BLOCK) {
                        let v0 = g * group + blk;
                        let p = w.add(v0 * BITS / 8);
                        if ks[0] == 0 {
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4096).cast());
                        }
                        let mut wv = [_mm256_setzero_ps(); NK];
                        for (n, &k) in ks.iter().enumerate() {
                            let q = if BITS == 4 {
                                // k = 0, 2: bytes 0-7 (low, high nibbles); k = 1, 3: bytes 8-15
                                let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                    p.add(8 * (k % 2)).cast(),
                                ));
                                if k < 2 {
                                    _mm256_and_si256(v, m15)
                                } else {
                                    _mm256_srli_epi32::<4>(v)
                                }
                            } else {
                                _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8 * k).cast()))
                            };
                            wv[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, b);
                        }
                        for t in 0..R {
                            let x = xp.add((job.r0 + t) * inp + v0);
                            for (n, &k) in ks.iter().enumerate() {
                                let xk = _mm256_loadu_ps(x.add(8 * k));
                                acc[e][t][n] = _mm256_fmadd_ps(wv[n], xk, acc[e][t][n]);
                            }
                        }
                    }
                }
            }
            acc
        }
    }

    /// The 512-bit path: one register per set of 16 lanes. Every input row count takes two
    /// weight rows at a time (twice the chains, to hide the multiply-add's latency, and each
    /// input block read once for both; four rows by two weight rows are 16 accumulators of the
    /// 32 registers).
    ///
    /// # Safety
    /// AVX2, FMA and AVX-512F; the job fits its buffers (see [`super::run`]).
    #[target_feature(enable = "avx,avx2,fma,avx512f")]
    pub(super) unsafe fn rows_avx512<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { by_group!(job.group, rows_avx512_in::<BITS, R>(job, res)) }
    }

    /// [`rows_avx512`] for groups of `G` values (`0`: the job's), inlined into it.
    ///
    /// # Safety
    /// As [`rows_avx512`]; `G` is `0` or the job's group.
    #[inline(always)]
    unsafe fn rows_avx512_in<const BITS: usize, const R: usize, const G: usize>(
        job: &Job<'_>,
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        let mut i = 0;
        while i < job.rows {
            // SAFETY (both): forwarded from the caller; `i + P <= job.rows`.
            let (acc, p): ([[[__m512; 2]; R]; 2], usize) = unsafe {
                if i + 2 <= job.rows {
                    (lanes_avx512::<BITS, R, 2, G>(job, i), 2)
                } else {
                    let [one] = lanes_avx512::<BITS, R, 1, G>(job, i);
                    ([one, one], 1)
                }
            };
            for (e, acc) in acc.iter().take(p).enumerate() {
                for t in 0..R {
                    // SAFETY: AVX-512F and AVX (the caller's).
                    res[i + e][t] = unsafe {
                        let v = _mm512_add_ps(acc[t][0], acc[t][1]);
                        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                        fold(_mm512_castps512_ps256(v), hi)
                    };
                }
            }
            i += p;
        }
    }

    /// `acc_a` and `acc_b` of weight rows `i..i + P` against the job's `R` input rows.
    ///
    /// # Safety
    /// As [`rows_avx512_in`]; `i + P <= job.rows`.
    #[inline(always)]
    unsafe fn lanes_avx512<const BITS: usize, const R: usize, const P: usize, const G: usize>(
        job: &Job<'_>,
        i: usize,
    ) -> [[[__m512; 2]; R]; P] {
        let (inp, group) = (job.inp, if G == 0 { job.group } else { G });
        let groups = inp / group;
        let words = inp * BITS / 32;
        // SAFETY: every offset below stays inside the buffers `run` checked.
        unsafe {
            let iota = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            );
            let (xp, sp, bp) = (job.x.as_ptr(), job.s.as_ptr(), job.b.as_ptr());
            let mut acc = [[[_mm512_setzero_ps(); 2]; R]; P];
            for g in 0..groups {
                for e in 0..P {
                    let w = job.w.as_ptr().add((i + e) * words).cast::<u8>();
                    let s = _mm512_set1_ps(*sp.add((i + e) * groups + g));
                    let b = _mm512_set1_ps(*bp.add((i + e) * groups + g));
                    // at 4 bits, the group's 16 possible weights `fma(q, s, b)`, computed once:
                    // each lane's weight is then one lookup by its nibble (`vpermps` reads the
                    // low 4 bits of each index lane), where the int-to-float conversion and the
                    // scaling cost two instructions per 16 values and bound the loop on the
                    // conversion port (`examples/matmul_rows`)
                    let table = _mm512_fmadd_ps(iota, s, b);
                    for blk in (0..group).step_by(BLOCK) {
                        let v0 = g * group + blk;
                        let p = w.add(v0 * BITS / 8);
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4096).cast());
                        let (wa, wb) = if BITS == 4 {
                            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
                            (
                                _mm512_permutexvar_ps(v, table),
                                _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table),
                            )
                        } else {
                            let qa = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
                            let qb = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(16).cast()));
                            (
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(qa), s, b),
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(qb), s, b),
                            )
                        };
                        for t in 0..R {
                            let x = xp.add((job.r0 + t) * inp + v0);
                            let [ca, cb] = &mut acc[e][t];
                            *ca = _mm512_fmadd_ps(wa, _mm512_loadu_ps(x), *ca);
                            *cb = _mm512_fmadd_ps(wb, _mm512_loadu_ps(x.add(16)), *cb);
                        }
                    }
                }
            }
            acc
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::{isas, with_isa, Isa};
    use crate::testing::{bits as bits_of, expect_panic, CASES};
    use candle_core::DType;
    use proptest::prelude::*;

    /// `x [n, inp]` times the dequantized matrix in f64, and the sum of `|x · w|` per output
    /// (the scale of the f32 rounding).
    fn reference(x: &[f32], n: usize, deq: &[f32], inp: usize) -> (Vec<f64>, Vec<f64>) {
        let out = deq.len() / inp;
        let (mut y, mut mag) = (vec![0f64; n * out], vec![0f64; n * out]);
        for r in 0..n {
            for o in 0..out {
                let (v, m) = crate::testing::dot64(&x[r * inp..][..inp], &deq[o * inp..][..inp]);
                y[r * out + o] = v;
                mag[r * out + o] = m;
            }
        }
        (y, mag)
    }

    fn fused(isa: Isa) -> bool {
        isa != Isa::Portable || cfg!(any(target_feature = "fma", target_arch = "aarch64"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Every result is within f32 rounding of the exact product with the dequantized
        /// matrix; every row has the bits of its product alone; and every path this CPU runs
        /// gives the same bits (the portable one where it fuses multiply-adds too).
        #[test]
        fn products_are_close_exact_per_row_and_the_same_on_every_path(
            n in 1usize..=9,
            bits in prop::sample::select(vec![4usize, 8]),
            // mlx's group sizes, which the vector paths unroll, and two they take as they come
            group in prop::sample::select(vec![32usize, 64, 128, 96, 256]),
            groups in 1usize..=5,
            out in 1usize..=70,
            params_dtype in prop::sample::select(vec![DType::F32, DType::BF16, DType::F16]),
            spread in prop::sample::select(vec![1e-3f32, 1.0, 300.0]),
            seed in any::<u64>(),
        ) {
            let (q, deq) = crate::kernels::quant::random_matrix(bits, group, groups, out, params_dtype, seed);
            let inp = q.in_features();
            let mut next = crate::testing::rng(!seed);
            // one group in three much larger than the rest (activation outliers)
            let x: Vec<f32> = (0..n * inp)
                .map(|i| next() * if (i / group) % 3 == 1 { spread } else { 1.0 })
                .collect();
            let (want, mag) = reference(&x, n, &deq, inp);
            let mut first: Option<(Isa, Vec<f32>)> = None;
            for isa in isas() {
                let y = with_isa(isa, || matmul(&x, n, &q));
                for r in 0..n {
                    let alone = with_isa(isa, || matmul(&x[r * inp..(r + 1) * inp], 1, &q));
                    prop_assert_eq!(bits_of(&y[r * out..(r + 1) * out]), bits_of(&alone), "{:?} row {}", isa, r);
                }
                for (k, (&got, &exact)) in y.iter().zip(&want).enumerate() {
                    // recursive summation's bound, plus a rounding of each dequantized value
                    let tol = (inp as f64 + 2.0) * 6e-8 * mag[k] + 1e-30;
                    prop_assert!((got as f64 - exact).abs() <= tol, "{:?} #{k}: {got} vs {exact} (bound {tol})", isa);
                }
                if fused(isa) {
                    match &first {
                        Some((was, y0)) => prop_assert_eq!(bits_of(y0), bits_of(&y), "{:?} vs {:?}", was, isa),
                        None => first = Some((isa, y)),
                    }
                }
            }
        }
    }

    /// Which matrices this path takes.
    #[test]
    fn supports_4_and_8_bits_in_whole_blocks() {
        for (bits, group, ok) in [
            (4, 32, true),
            (4, 64, true),
            (4, 128, true),
            (8, 64, true),
            (8, 1024, true),
            (4, 16, false),
            (8, 48, false),
            (2, 64, false),
            (3, 64, false),
            (6, 64, false),
        ] {
            assert_eq!(supports(bits, group), ok, "{bits} bits, group {group}");
        }
    }

    /// A value that is not finite makes its row's outputs not finite (as the f32 product
    /// does); zero inputs give exactly zero; huge and tiny inputs stay close.
    #[test]
    fn edge_inputs() {
        let (q, deq) = crate::kernels::quant::random_matrix(4, 64, 3, 5, DType::BF16, 7);
        let inp = q.in_features();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![0.25f32; 2 * inp];
            x[inp + 70] = bad;
            for isa in isas() {
                let y = with_isa(isa, || matmul(&x, 2, &q));
                assert!(
                    y[..5].iter().all(|v| v.is_finite()),
                    "{isa:?}: row 0 stays finite"
                );
                assert!(
                    y[5..].iter().all(|v| !v.is_finite()),
                    "{isa:?} {bad}: {:?}",
                    &y[5..]
                );
            }
        }
        let zero = matmul(&vec![0.0; inp], 1, &q);
        assert!(zero.iter().all(|&v| v == 0.0), "{zero:?}");
        for scale in [1e30f32, 1e-30] {
            let x: Vec<f32> = (0..inp).map(|i| (i as f32 - 90.0) * scale).collect();
            let (want, _) = reference(&x, 1, &deq, inp);
            for isa in isas() {
                let y = with_isa(isa, || matmul(&x, 1, &q));
                for (got, want) in y.iter().zip(&want) {
                    let rel = (*got as f64 - want).abs() / want.abs().max(1e-300);
                    assert!(rel < 1e-4, "{isa:?} {scale}: {got} vs {want}");
                }
            }
        }
    }

    /// The entry point checks the input against the matrix.
    #[test]
    fn checks_the_input() {
        let (q, _) = crate::kernels::quant::random_matrix(8, 64, 2, 3, DType::F32, 1);
        expect_panic(
            "qdot: the input holds 127 floats, expected 1 rows of 128",
            || {
                matmul(&[0.0; 127], 1, &q);
            },
        );
        let (q3, _) = crate::kernels::quant::random_matrix(3, 64, 2, 3, DType::F32, 1);
        expect_panic("qdot: 3 bits", || {
            matmul(&[0.0; 128], 1, &q3);
        });
    }
}
