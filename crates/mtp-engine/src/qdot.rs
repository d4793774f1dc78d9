//! Few-row products with 4- and 8-bit MLX matrices kept packed, in integers: each input row is
//! quantized to 16 bits per group of the matrix (`x ≈ d · xq`, `|xq| <= 32767`, `d` the group's
//! largest magnitude over 32767), and a group's contribution to an output is
//! `s · d · Σ q·xq + b · Σ x` (`w = s·q + b`), with `Σ q·xq` exact in 32-bit integers.
//!
//! Why not mlx's arithmetic (dequantize, then multiply in f32): unpacking a value and scaling
//! it to f32 costs more instructions than its product, so a packed 4-bit matrix streamed at a
//! quarter of bf16's speed (`examples/matmul_rows`). Here one 512-bit instruction multiplies and
//! adds 32 pairs of 16-bit integers (`vpdpwssd`; `vpmaddwd` + `vpaddd` without AVX-512 VNNI), and
//! the unpacking is a widening load, a mask and a shift per 64 values. llama.cpp goes further,
//! quantizing activations to 8 bits; 16 bits keep the activation error at `2^-16` of a group's
//! largest magnitude (llama.cpp's is `2^-8`), far inside the engine's parity bound with mlx-vlm
//! (first-step logits within 1e-3, identical greedy tokens, `tests/parity.rs`).
//!
//! One fixed arithmetic, whatever the instruction set (so that a row's result never depends on
//! the path or on the other rows computed with it; a verify forward yields the bits of single
//! steps): per group, 16 integer lanes `A[l]` (the products a 512-bit register holds: lane `l`
//! of each 64-value block takes the values of bytes `2l` and `2l + 1` of its first and second
//! 32 packed bytes), then per lane `acc[l] = fma(float(A[l]), s * d, acc[l])`; after
//! the last group the two halves are added (`v[l] = acc[l] + acc[l + 8]`), the biases come in
//! eight groups at a time (`v[l] = fma(b[g], Σx[g], v[l])`, `g ≡ l mod 8`) and `v` is reduced as
//! `((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7))`. The integer sums are exact, so their
//! order is free; the float operations are the same on every path (fused where the lanes of
//! [`crate::simd`] are, i.e. always on AVX2 and AVX-512).

// The kernels index several per-row arrays (accumulators, lanes, results) by the same row and
// part numbers, which `R` and `BITS` fix at compile time, so the loops unroll to registers.
#![allow(clippy::needless_range_loop)]

use crate::quant::QuantMatrix;

/// Largest magnitude of a quantized activation's part.
const QMAX: f32 = 32767.0;

/// The low part's step relative to the high part's at 8 bits: `2^15`.
const LOW: f32 = 32768.0;

/// How far 4-bit values are shifted up to meet the high part of an activation.
const SHIFT4: u32 = 11;

/// The largest `|X|` of a 4-bit group's activations (`X = 2^11 · high + low`): as large as keeps
/// every 32-bit lane's sum of `w · X` (`4 · group / 64` products, `w <= 15`) from overflowing,
/// with `high` within 16 bits; 2^25 - 2^11 or so for groups of 64.
fn xmax4(group: usize) -> i32 {
    let products = (4 * group / BLOCK) as i64;
    let per = products * 15;
    let high = ((i32::MAX as i64 - per * ((1 << SHIFT4) - 1)) / (per << SHIFT4)).min(QMAX as i64);
    (high << SHIFT4) as i32
}

/// Values of one block: 32 packed bytes at 4 bits, 64 at 8.
const BLOCK: usize = 64;

/// Largest group this path takes: 16 blocks, whose integer lanes stay below 2^31 at 8 bits
/// (`4 · 255 · 32767` per block and lane).
const MAX_GROUP: usize = 1024;

/// Output features computed per task when a product is split across threads.
const TASK_ROWS: usize = 64;

/// Input rows computed together (they share each unpacked weight block).
const TILE: usize = 4;

/// Whether [`matmul`] takes a matrix of `bits` with groups of `group` values: 4 or 8 bits, whole
/// blocks per group (mlx's group sizes 64 and 128; 32 is left to the dequantizing product).
pub(crate) fn supports(bits: usize, group: usize) -> bool {
    matches!(bits, 4 | 8) && group.is_multiple_of(BLOCK) && group <= MAX_GROUP
}

/// Input rows quantized for [`matmul`].
struct Acts {
    /// `n` rows of `2 · inp` quantized values, per 64-value block its 64 high parts then its 64
    /// low parts; at 4 bits each part is ordered as the unpacking yields the values: the 32
    /// even-indexed, then the 32 odd-indexed.
    q: Vec<i16>,
    /// `n` rows of `groups` steps (`d`; NaN for a group holding a value that is not finite).
    d: Vec<f32>,
    /// `n` rows of `padded` group sums of the unquantized inputs, zero past `groups`.
    sums: Vec<f32>,
    inp: usize,
    groups: usize,
    /// `groups` rounded up to a multiple of 8.
    padded: usize,
}

impl Acts {
    fn new(x: &[f32], n: usize, inp: usize, group: usize, bits: usize) -> Acts {
        let groups = inp / group;
        let padded = groups.next_multiple_of(8);
        let mut acts = Acts {
            q: vec![0; 2 * n * inp],
            d: vec![0.0; n * groups],
            sums: vec![0.0; n * padded],
            inp,
            groups,
            padded,
        };
        let (mut high, mut low) = (vec![0i16; group], vec![0i16; group]);
        for r in 0..n {
            for g in 0..groups {
                let xs = &x[r * inp + g * group..][..group];
                let at = 2 * (r * inp + g * group);
                acts.sums[r * padded + g] = xs.iter().sum();
                if !xs.iter().all(|v| v.is_finite()) {
                    // the output is not finite either: NaN through the step, no values
                    acts.d[r * groups + g] = f32::NAN;
                    continue;
                }
                let m = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                if m / QMAX == 0.0 {
                    // zero, or too small for a step: the group contributes its sum only
                    continue;
                }
                if bits == 4 {
                    // one integer `X = round(x / d)` of up to 25 bits, split as
                    // `X = 2^11 · high + low`, `low` in 0..2^11: the products take the high part
                    // against the 4-bit values shifted up by 11 bits (still 16-bit integers)
                    let xmax = xmax4(group);
                    let d = m / xmax as f32;
                    acts.d[r * groups + g] = d;
                    let inv = xmax as f64 / m as f64;
                    for ((h, l), &v) in high.iter_mut().zip(low.iter_mut()).zip(xs) {
                        let x = (round64(v as f64 * inv) as i32).clamp(-xmax, xmax);
                        *h = x.div_euclid(1 << SHIFT4) as i16;
                        *l = x.rem_euclid(1 << SHIFT4) as i16;
                    }
                } else {
                    let d = m / QMAX;
                    acts.d[r * groups + g] = d;
                    let inv = QMAX / m;
                    for ((h, l), &v) in high.iter_mut().zip(low.iter_mut()).zip(xs) {
                        // (a group below f32's normal range has no finite inverse)
                        let scaled = if inv.is_finite() { v * inv } else { v / d };
                        let hi = round32(scaled).clamp(-QMAX, QMAX);
                        // what the high part leaves (exactly: the two are within half of each
                        // other), in steps of `d / 32768`: at most 16384 of them
                        let rest = (scaled - hi) * LOW;
                        *h = hi as i16;
                        *l = round32(rest).clamp(-QMAX, QMAX) as i16;
                    }
                }
                let dst = &mut acts.q[at..at + 2 * group];
                for ((db, hb), lb) in dst
                    .chunks_exact_mut(2 * BLOCK)
                    .zip(high.chunks_exact(BLOCK))
                    .zip(low.chunks_exact(BLOCK))
                {
                    let (dh, dl) = db.split_at_mut(BLOCK);
                    for (part, src) in [(dh, hb), (dl, lb)] {
                        if bits == 4 {
                            for b in 0..BLOCK / 2 {
                                part[b] = src[2 * b];
                                part[BLOCK / 2 + b] = src[2 * b + 1];
                            }
                        } else {
                            part.copy_from_slice(src);
                        }
                    }
                }
            }
        }
        acts
    }
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^51` (anything else comes
/// back as is or clamped by the caller): adding and taking away 1.5 · 2^52 leaves no fraction
/// bits. Written out because `round_ties_even` is a library call on x86-64 without SSE4.1.
#[inline(always)]
fn round64(v: f64) -> f64 {
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    if v.abs() < 2_251_799_813_685_248.0 {
        (v + MAGIC) - MAGIC
    } else {
        v
    }
}

/// [`round64`] for f32, `|v| < 2^22` (1.5 · 2^23).
#[inline(always)]
fn round32(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    if v.abs() < 4_194_304.0 {
        (v + MAGIC) - MAGIC
    } else {
        v
    }
}

/// One task's work: weight rows `o0..o0 + rows` against input rows `r0..r0 + R`.
struct Job<'a> {
    /// The task's packed rows, `rows · inp · bits / 32` words.
    w: &'a [u32],
    /// Their scales, `rows · groups`, widened to f32.
    s: &'a [f32],
    /// Their biases, `rows · groups`, widened to f32.
    b: &'a [f32],
    rows: usize,
    group: usize,
    acts: &'a Acts,
    r0: usize,
}

/// `x [n, inp] · w^T → [n, out]` for a 4- or 8-bit matrix that [`supports`] takes, `n` rows
/// (any number; the callers pass up to [`crate::simd::MAX_ROWS`]). Row `r` of the result
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
    let acts = Acts::new(x, n, inp, group, bits);
    let path = Path::detect();
    let mut y = vec![0f32; n * out];
    let words = inp * bits / 32;
    thread_local! {
        static PARAMS: std::cell::RefCell<(Vec<f32>, Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
    }
    let ys = Out(y.as_mut_ptr());
    let work = |task: usize| {
        let o0 = task * TASK_ROWS;
        let rows = TASK_ROWS.min(out - o0);
        PARAMS.with_borrow_mut(|(wide_s, wide_b, sd)| {
            let (s, b) = q.params_rows(o0, rows, wide_s, wide_b);
            sd.resize(2 * TILE * acts.groups, 0.0);
            let mut r0 = 0;
            while r0 < n {
                let tile = TILE.min(n - r0);
                let job = Job {
                    w: &q.packed_words()[o0 * words..(o0 + rows) * words],
                    s,
                    b,
                    rows,
                    group,
                    acts: &acts,
                    r0,
                };
                let mut res = [[0f32; TILE]; TASK_ROWS];
                match tile {
                    4 => path.run::<4>(&job, bits, sd, &mut res),
                    3 => path.run::<3>(&job, bits, sd, &mut res),
                    2 => path.run::<2>(&job, bits, sd, &mut res),
                    _ => path.run::<1>(&job, bits, sd, &mut res),
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

/// The instruction set a product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512F and BW; with VNNI's `vpdpwssd` when `true`.
    #[cfg(target_arch = "x86_64")]
    Avx512(bool),
}

impl Path {
    fn detect() -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::has_avx512() && std::arch::is_x86_feature_detected!("avx512bw") {
                return Path::Avx512(std::arch::is_x86_feature_detected!("avx512vnni"));
            }
            if crate::simd::has_avx() {
                return Path::Avx2;
            }
        }
        Path::Portable
    }

    /// Writes `res[i][t]`, the product of weight row `i` of the job and input row `r0 + t`.
    fn run<const R: usize>(
        self,
        job: &Job<'_>,
        bits: usize,
        sd: &mut [f32],
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        let words = job.acts.inp * bits / 32;
        assert!(
            R <= TILE
                && job.rows <= TASK_ROWS
                && job.w.len() == job.rows * words
                && job.s.len() >= job.rows * job.acts.groups
                && job.b.len() >= job.rows * job.acts.groups
                && job.r0 + R <= job.acts.q.len() / (2 * job.acts.inp).max(1)
                && job.acts.inp == job.acts.groups * job.group
                && supports(bits, job.group)
                && sd.len() >= 2 * R * job.acts.groups,
            "qdot: a job that does not fit its buffers"
        );
        match self {
            Path::Portable => portable::<R>(job, bits, res),
            // SAFETY (both): the lengths were checked above; the CPU has the instruction sets
            // (`detect`).
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 if bits == 4 => unsafe { x86::rows_avx2::<4, R>(job, sd, res) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { x86::rows_avx2::<8, R>(job, sd, res) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx512(true) if bits == 4 => unsafe { x86::rows_vnni::<4, R>(job, sd, res) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx512(true) => unsafe { x86::rows_vnni::<8, R>(job, sd, res) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx512(false) if bits == 4 => unsafe { x86::rows_avx512::<4, R>(job, sd, res) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx512(false) => unsafe { x86::rows_avx512::<8, R>(job, sd, res) },
        }
    }
}

/// `a * b + c`, fused as the vector paths are where the target has FMA (see [`crate::simd`]).
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(any(target_feature = "fma", target_arch = "aarch64")) {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7))`.
#[inline(always)]
fn reduce(v: [f32; 8]) -> f32 {
    ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
}

/// Byte `k` of a row's little-endian packed stream.
#[inline(always)]
fn byte(w: &[u32], k: usize) -> i32 {
    ((w[k / 4] >> (8 * (k % 4))) & 0xff) as i32
}

/// The fixed arithmetic in plain Rust.
fn portable<const R: usize>(job: &Job<'_>, bits: usize, res: &mut [[f32; TILE]; TASK_ROWS]) {
    let a = job.acts;
    let words = a.inp * bits / 32;
    let blocks = job.group / BLOCK;
    for i in 0..job.rows {
        let w = &job.w[i * words..(i + 1) * words];
        for t in 0..R {
            let r = job.r0 + t;
            let mut acc = [0f32; 16];
            for g in 0..a.groups {
                // the high parts' lanes, then the low parts'
                let mut lanes = [[0i32; 16]; 2];
                for blk in 0..blocks {
                    let v0 = (g * blocks + blk) * BLOCK;
                    let base = v0 * bits / 8;
                    for part in 0..2 {
                        let xq = &a.q[2 * (r * a.inp + v0) + part * BLOCK..][..BLOCK];
                        for k in 0..32 {
                            let (w0, w1) = if bits == 4 {
                                let wb = byte(w, base + k);
                                (wb & 15, wb >> 4)
                            } else {
                                (byte(w, base + k), byte(w, base + 32 + k))
                            };
                            let p = w0 * xq[k] as i32 + w1 * xq[32 + k] as i32;
                            if bits == 4 {
                                // one integer: the high part's products shifted up
                                lanes[0][k / 2] += if part == 0 { p << SHIFT4 } else { p };
                            } else {
                                lanes[part][k / 2] += p;
                            }
                        }
                    }
                }
                let sd = job.s[i * a.groups + g] * a.d[r * a.groups + g];
                let sd_low = sd / LOW;
                for (l, acc) in acc.iter_mut().enumerate() {
                    *acc = madd(lanes[0][l] as f32, sd, *acc);
                    if bits == 8 {
                        *acc = madd(lanes[1][l] as f32, sd_low, *acc);
                    }
                }
            }
            let mut v: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
            let b = &job.b[i * a.groups..(i + 1) * a.groups];
            let sums = &a.sums[r * a.padded..(r + 1) * a.padded];
            for (j, sc) in sums.chunks_exact(8).enumerate() {
                for l in 0..8 {
                    // past the last group: the zero sums times zero biases
                    let bias = b.get(8 * j + l).copied().unwrap_or(0.0);
                    v[l] = madd(bias, sc[l], v[l]);
                }
            }
            res[i][t] = reduce(v);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The 256- and 512-bit paths. Every pointer they read was checked by [`Path::run`]: the
    //! job's weight rows hold `rows · inp · bits / 8` bytes, its parameters `rows · groups` and
    //! `rows · groups` floats, the activations `inp` values, `groups` steps and `padded` sums
    //! per row.

    use std::arch::x86_64::*;

    use super::{Job, BLOCK, LOW, TASK_ROWS, TILE};

    /// `((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7))` of 8 lanes.
    #[inline(always)]
    unsafe fn reduce(v: __m256) -> f32 {
        // SAFETY: the callers run with AVX.
        unsafe {
            let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            // [h0 + h1, _, h2 + h3, _]
            let p = _mm_add_ps(h, _mm_movehdup_ps(h));
            _mm_cvtss_f32(_mm_add_ss(p, _mm_movehl_ps(p, p)))
        }
    }

    /// The biases' part and the final reduction of a row: `v` the 8 added halves.
    ///
    /// # Safety
    /// AVX and FMA; `b` points at `groups` floats, `sums` at `groups` rounded up to a multiple
    /// of 8, zero past `groups`.
    #[inline(always)]
    unsafe fn finish(mut v: __m256, b: *const f32, sums: *const f32, groups: usize) -> f32 {
        // SAFETY: forwarded from the caller; the last chunk's biases are read through a mask
        // that stops at `groups` (the lanes past it are zero, as the sums there).
        unsafe {
            let mut j = 0;
            while j + 8 <= groups {
                v = _mm256_fmadd_ps(_mm256_loadu_ps(b.add(j)), _mm256_loadu_ps(sums.add(j)), v);
                j += 8;
            }
            if j < groups {
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((groups - j) as i32), lane);
                let bias = _mm256_maskload_ps(b.add(j), mask);
                v = _mm256_fmadd_ps(bias, _mm256_loadu_ps(sums.add(j)), v);
            }
            reduce(v)
        }
    }

    /// `acc + Σ pairs of w·x` per 32-bit lane, `x` 16 quantized activations.
    ///
    /// # Safety
    /// AVX2; `x` points at 16 readable values.
    #[inline(always)]
    unsafe fn madd(acc: __m256i, w: __m256i, x: *const i16) -> __m256i {
        // SAFETY: forwarded from the caller.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_loadu_si256(x.cast()))) }
    }

    /// `sd[2 (t · groups + g)] = s[g] · d[(r0 + t) · groups + g]` and, next to it, that over
    /// `2^15`: the steps of one weight row's groups (scales `s`) times those of each input
    /// row's high and low parts.
    ///
    /// # Safety
    /// `s` holds `groups` floats, `d` the rows `r0..r0 + R`, `sd` `2 · R · groups`.
    #[inline(always)]
    unsafe fn steps<const R: usize>(
        s: *const f32,
        d: *const f32,
        sd: *mut f32,
        r0: usize,
        groups: usize,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            for t in 0..R {
                let (d, sd) = (d.add((r0 + t) * groups), sd.add(2 * t * groups));
                for g in 0..groups {
                    let v = *s.add(g) * *d.add(g);
                    *sd.add(2 * g) = v;
                    *sd.add(2 * g + 1) = v / LOW;
                }
            }
        }
    }

    /// The 256-bit path: each 16-lane set as two 8-lane halves.
    ///
    /// # Safety
    /// AVX2 and FMA; the job fits its buffers (see [`super::Path::run`]), `sd` holds `R`
    /// rows of `groups` floats.
    #[target_feature(enable = "avx,avx2,fma")]
    pub(super) unsafe fn rows_avx2<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        sd: &mut [f32],
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        let a = job.acts;
        let (inp, groups, padded, r0) = (a.inp, a.groups, a.padded, job.r0);
        let words = inp * BITS / 32;
        let blocks = job.group / BLOCK;
        let m15 = _mm256_set1_epi16(15);
        let (qp, dp, sp, bp, sums) = (
            a.q.as_ptr(),
            a.d.as_ptr(),
            job.s.as_ptr(),
            job.b.as_ptr(),
            a.sums.as_ptr(),
        );
        let sdp = sd.as_mut_ptr();
        // SAFETY: every offset below stays inside the buffers `Path::run` checked.
        unsafe {
            for i in 0..job.rows {
                let w = job.w.as_ptr().add(i * words).cast::<u8>();
                steps::<R>(sp.add(i * groups), dp, sdp, r0, groups);
                let mut lo = [_mm256_setzero_ps(); R];
                let mut hi = [_mm256_setzero_ps(); R];
                for g in 0..groups {
                    // [part][half]: the high and low parts' lanes 0-7 and 8-15
                    let mut al = [[_mm256_setzero_si256(); 2]; R];
                    let mut ah = [[_mm256_setzero_si256(); 2]; R];
                    for blk in 0..blocks {
                        let v0 = (g * blocks + blk) * BLOCK;
                        let p = w.add(v0 * BITS / 8);
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4096).cast());
                        if BITS == 4 {
                            let w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
                            let w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16).cast()));
                            let (l0, h0) = (_mm256_and_si256(w0, m15), _mm256_srli_epi16::<4>(w0));
                            let (l1, h1) = (_mm256_and_si256(w1, m15), _mm256_srli_epi16::<4>(w1));
                            let (sl0, sh0) =
                                (_mm256_slli_epi16::<11>(l0), _mm256_slli_epi16::<11>(h0));
                            let (sl1, sh1) =
                                (_mm256_slli_epi16::<11>(l1), _mm256_slli_epi16::<11>(h1));
                            for t in 0..R {
                                // high parts in `[0]`, low parts in `[1]`, added at the end
                                let x = qp.add(2 * ((r0 + t) * inp + v0));
                                let ([a0, b0], [a1, b1]) = (&mut al[t], &mut ah[t]);
                                *a0 = madd(*a0, sl0, x);
                                *a1 = madd(*a1, sl1, x.add(16));
                                *b0 = madd(*b0, l0, x.add(64));
                                *b1 = madd(*b1, l1, x.add(80));
                                *a0 = madd(*a0, sh0, x.add(32));
                                *a1 = madd(*a1, sh1, x.add(48));
                                *b0 = madd(*b0, h0, x.add(96));
                                *b1 = madd(*b1, h1, x.add(112));
                            }
                        } else {
                            let w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
                            let w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16).cast()));
                            let w2 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(32).cast()));
                            let w3 = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(48).cast()));
                            for t in 0..R {
                                for part in 0..2 {
                                    let x = qp.add(2 * ((r0 + t) * inp + v0) + part * BLOCK);
                                    al[t][part] = madd(al[t][part], w0, x);
                                    al[t][part] = madd(al[t][part], w2, x.add(32));
                                    ah[t][part] = madd(ah[t][part], w1, x.add(16));
                                    ah[t][part] = madd(ah[t][part], w3, x.add(48));
                                }
                            }
                        }
                    }
                    if BITS == 4 {
                        for t in 0..R {
                            al[t][0] = _mm256_add_epi32(al[t][0], al[t][1]);
                            ah[t][0] = _mm256_add_epi32(ah[t][0], ah[t][1]);
                        }
                    }
                    for t in 0..R {
                        for part in 0..(BITS / 4) {
                            let sd = _mm256_set1_ps(*sdp.add(2 * (t * groups + g) + part));
                            lo[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(al[t][part]), sd, lo[t]);
                            hi[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ah[t][part]), sd, hi[t]);
                        }
                    }
                }
                for t in 0..R {
                    res[i][t] = finish(
                        _mm256_add_ps(lo[t], hi[t]),
                        bp.add(i * groups),
                        sums.add((r0 + t) * padded),
                        groups,
                    );
                }
            }
        }
    }

    /// `acc + Σ pairs of a·b` per 32-bit lane: `vpdpwssd` with VNNI, `vpmaddwd` + `vpaddd`
    /// without (the same integers).
    trait Dot {
        /// # Safety
        /// AVX-512BW, and VNNI for the implementation that uses it.
        unsafe fn dot(acc: __m512i, a: __m512i, b: __m512i) -> __m512i;
    }
    struct Vnni;
    struct Madd;
    impl Dot for Vnni {
        #[inline(always)]
        unsafe fn dot(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: forwarded from the caller.
            unsafe { dpwssd(acc, a, b) }
        }
    }
    /// `vpdpwssd` (see [`Vnni`]); inlined into its callers, which run with the same features.
    ///
    /// # Safety
    /// AVX-512F and VNNI.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dpwssd(mut acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        {
            // Written out: LLVM otherwise splits the intrinsic into `vpmaddwd` + `vpaddd`, two
            // uops on the multiply port where one does (measured: a 4-bit product 1.2x slower).
            // SAFETY: the caller runs with AVX-512 VNNI; the instruction reads and writes
            // registers only.
            unsafe {
                std::arch::asm!(
                    "vpdpwssd {acc}, {a}, {b}",
                    acc = inout(zmm_reg) acc,
                    a = in(zmm_reg) a,
                    b = in(zmm_reg) b,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }
    }
    impl Dot for Madd {
        #[inline(always)]
        unsafe fn dot(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: forwarded from the caller.
            unsafe { _mm512_add_epi32(acc, _mm512_madd_epi16(a, b)) }
        }
    }

    /// The 512-bit path: one register per 16-lane set.
    ///
    /// # Safety
    /// AVX2, FMA, AVX-512F and BW (and VNNI for [`Vnni`]); the job fits its buffers, `sd`
    /// holds `R` rows of `groups` floats.
    #[inline(always)]
    unsafe fn rows_512<D: Dot, const BITS: usize, const R: usize>(
        job: &Job<'_>,
        sd: &mut [f32],
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        let a = job.acts;
        let (inp, groups, padded, r0) = (a.inp, a.groups, a.padded, job.r0);
        let words = inp * BITS / 32;
        let blocks = job.group / BLOCK;
        let (qp, dp, sp, bp, sums) = (
            a.q.as_ptr(),
            a.d.as_ptr(),
            job.s.as_ptr(),
            job.b.as_ptr(),
            a.sums.as_ptr(),
        );
        let sdp = sd.as_mut_ptr();
        // SAFETY: every offset below stays inside the buffers `Path::run` checked.
        unsafe {
            let m15 = _mm512_set1_epi16(15);
            for i in 0..job.rows {
                let w = job.w.as_ptr().add(i * words).cast::<u8>();
                steps::<R>(sp.add(i * groups), dp, sdp, r0, groups);
                let mut acc = [_mm512_setzero_ps(); R];
                for g in 0..groups {
                    // [part]: the high and low parts' lanes
                    let mut lanes = [[_mm512_setzero_si512(); 2]; R];
                    for blk in 0..blocks {
                        let v0 = (g * blocks + blk) * BLOCK;
                        let p = w.add(v0 * BITS / 8);
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(4096).cast());
                        let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.cast()));
                        if BITS == 4 {
                            let (w0, w1) = (_mm512_and_si512(v, m15), _mm512_srli_epi16::<4>(v));
                            let (s0, s1) =
                                (_mm512_slli_epi16::<11>(w0), _mm512_slli_epi16::<11>(w1));
                            for t in 0..R {
                                // two chains (high and low parts), added at the group's end
                                let x = qp.add(2 * ((r0 + t) * inp + v0));
                                let [h, l] = &mut lanes[t];
                                *h = D::dot(*h, s0, _mm512_loadu_si512(x.cast()));
                                *l = D::dot(*l, w0, _mm512_loadu_si512(x.add(64).cast()));
                                *h = D::dot(*h, s1, _mm512_loadu_si512(x.add(32).cast()));
                                *l = D::dot(*l, w1, _mm512_loadu_si512(x.add(96).cast()));
                            }
                        } else {
                            let w1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.add(32).cast()));
                            for t in 0..R {
                                for part in 0..2 {
                                    let x = qp.add(2 * ((r0 + t) * inp + v0) + part * BLOCK);
                                    let l = &mut lanes[t][part];
                                    *l = D::dot(*l, v, _mm512_loadu_si512(x.cast()));
                                    *l = D::dot(*l, w1, _mm512_loadu_si512(x.add(32).cast()));
                                }
                            }
                        }
                    }
                    for t in 0..R {
                        if BITS == 4 {
                            let sum = _mm512_add_epi32(lanes[t][0], lanes[t][1]);
                            let sd = _mm512_set1_ps(*sdp.add(2 * (t * groups + g)));
                            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sd, acc[t]);
                        } else {
                            for part in 0..2 {
                                let sd = _mm512_set1_ps(*sdp.add(2 * (t * groups + g) + part));
                                let f = _mm512_cvtepi32_ps(lanes[t][part]);
                                acc[t] = _mm512_fmadd_ps(f, sd, acc[t]);
                            }
                        }
                    }
                }
                for t in 0..R {
                    let v = acc[t];
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                    res[i][t] = finish(
                        _mm256_add_ps(_mm512_castps512_ps256(v), hi),
                        bp.add(i * groups),
                        sums.add((r0 + t) * padded),
                        groups,
                    );
                }
            }
        }
    }

    /// [`rows_512`] with VNNI.
    ///
    /// # Safety
    /// As [`rows_512`], with AVX-512 VNNI.
    #[target_feature(enable = "avx,avx2,fma,avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn rows_vnni<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        sd: &mut [f32],
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { rows_512::<Vnni, BITS, R>(job, sd, res) }
    }

    /// [`rows_512`] without VNNI.
    ///
    /// # Safety
    /// As [`rows_512`].
    #[target_feature(enable = "avx,avx2,fma,avx512f,avx512bw")]
    pub(super) unsafe fn rows_avx512<const BITS: usize, const R: usize>(
        job: &Job<'_>,
        sd: &mut [f32],
        res: &mut [[f32; TILE]; TASK_ROWS],
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { rows_512::<Madd, BITS, R>(job, sd, res) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{isas, with_isa, Isa};
    use crate::testing::{bits as bits_of, expect_panic, CASES};
    use candle_core::DType;
    use proptest::prelude::*;

    /// The bound on `|got - x·w|` for one output (`w` the dequantized row, `b` its biases per
    /// group): the activations' rounding (half the finest step and f32's rounding of the scaled
    /// value, per value, times the value's `|s·q|`) plus f32 rounding of the sums.
    fn bound(x: &[f32], w: &[f32], group: usize, b: &[f32], bits: usize) -> f64 {
        let mut err = 0f64;
        let mut mag = 0f64;
        for (g, (xs, ws)) in x.chunks_exact(group).zip(w.chunks_exact(group)).enumerate() {
            let m = xs.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            // the finest step: 4 bits one integer of up to `xmax4`, 8 bits a low part
            let step = if bits == 4 {
                m / xmax4(group) as f64
            } else {
                m / QMAX as f64 / LOW as f64
            };
            for (&v, &wv) in xs.iter().zip(ws) {
                let sq = wv as f64 - b[g] as f64;
                err += (0.5001 * step + 2.5e-7 * (v as f64).abs()) * sq.abs();
                mag += (wv as f64 * v as f64).abs() + (sq * v as f64).abs();
            }
        }
        err + 2e-6 * mag + 1e-30
    }

    /// `x [n, inp]` times the dequantized matrix in f64.
    fn reference(x: &[f32], n: usize, deq: &[f32], inp: usize) -> Vec<f64> {
        let out = deq.len() / inp;
        let mut y = vec![0f64; n * out];
        for r in 0..n {
            for o in 0..out {
                y[r * out + o] = (0..inp)
                    .map(|j| x[r * inp + j] as f64 * deq[o * inp + j] as f64)
                    .sum();
            }
        }
        y
    }

    fn params(q: &QuantMatrix) -> (Vec<f32>, Vec<f32>) {
        let (mut s, mut b) = (Vec::new(), Vec::new());
        let (s, b) = q.params_rows(0, q.out_features(), &mut s, &mut b);
        (s.to_vec(), b.to_vec())
    }

    fn fused(isa: Isa) -> bool {
        isa != Isa::Portable || cfg!(any(target_feature = "fma", target_arch = "aarch64"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Every result is within the activations' rounding of the exact product with the
        /// dequantized matrix; every row has the bits of its product alone; and every path this
        /// CPU runs gives the same bits (the portable one where it fuses multiply-adds too).
        #[test]
        fn products_are_close_exact_per_row_and_the_same_on_every_path(
            n in 1usize..=9,
            bits in prop::sample::select(vec![4usize, 8]),
            group in prop::sample::select(vec![64usize, 128]),
            groups in 1usize..=5,
            out in 1usize..=70,
            params_dtype in prop::sample::select(vec![DType::F32, DType::BF16, DType::F16]),
            spread in prop::sample::select(vec![1e-3f32, 1.0, 300.0]),
            seed in any::<u64>(),
        ) {
            let (q, deq) = crate::quant::random_matrix(bits, group, groups, out, params_dtype, seed);
            let inp = q.in_features();
            let mut next = crate::testing::rng(!seed);
            // one group in three much larger than the rest (activation outliers)
            let x: Vec<f32> = (0..n * inp)
                .map(|i| next() * if (i / group) % 3 == 1 { spread } else { 1.0 })
                .collect();
            let want = reference(&x, n, &deq, inp);
            let (_, b) = params(&q);
            let groups = q.in_features() / q.group();
            let mut first: Option<(Isa, Vec<f32>)> = None;
            for isa in isas() {
                let y = with_isa(isa, || matmul(&x, n, &q));
                for r in 0..n {
                    let xr = &x[r * inp..(r + 1) * inp];
                    let alone = with_isa(isa, || matmul(xr, 1, &q));
                    prop_assert_eq!(bits_of(&y[r * out..(r + 1) * out]), bits_of(&alone), "{:?} row {}", isa, r);
                    for o in 0..out {
                        let tol = bound(xr, &deq[o * inp..(o + 1) * inp], group, &b[o * groups..], bits);
                        let (got, exact) = (y[r * out + o] as f64, want[r * out + o]);
                        prop_assert!((got - exact).abs() <= tol, "{:?} ({r}, {o}): {got} vs {exact} (bound {tol})", isa);
                    }
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

    /// The rounding helpers round to the nearest integer, ties to even, as the library does.
    #[test]
    fn rounding_matches_round_ties_even() {
        let mut next = crate::testing::rng(3);
        for i in 0..20_000 {
            let v = next() as f64 * 2f64.powi(i % 30) + [0.0, 0.5, -0.5, 1.5][i as usize % 4];
            assert_eq!(round64(v), v.round_ties_even(), "{v}");
            let f = v as f32;
            if f.abs() < 4e6 {
                assert_eq!(round32(f), f.round_ties_even(), "{f}");
            }
        }
        assert!(round64(f64::NAN).is_nan());
        assert_eq!(round32(2.5), 2.0);
        assert_eq!(round32(-3.5), -4.0);
    }

    /// Which matrices the integer path takes.
    #[test]
    fn supports_4_and_8_bits_in_whole_blocks() {
        for (bits, group, ok) in [
            (4, 64, true),
            (4, 128, true),
            (8, 64, true),
            (8, 1024, true),
            (8, 2048, false),
            (4, 32, false),
            (2, 64, false),
            (3, 64, false),
            (6, 64, false),
        ] {
            assert_eq!(supports(bits, group), ok, "{bits} bits, group {group}");
        }
    }

    /// A group holding a value that is not finite makes its row's outputs not finite (as the
    /// f32 product would); zero inputs give exactly zero; huge and tiny inputs stay finite and
    /// close.
    #[test]
    fn edge_inputs() {
        let (q, deq) = crate::quant::random_matrix(4, 64, 3, 5, DType::BF16, 7);
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
        for scale in [1e30f32, 1e-30, 1e-40] {
            let x: Vec<f32> = (0..inp).map(|i| (i as f32 - 90.0) * scale).collect();
            let want = reference(&x, 1, &deq, inp);
            for isa in isas() {
                let y = with_isa(isa, || matmul(&x, 1, &q));
                for (got, want) in y.iter().zip(&want) {
                    let rel = (*got as f64 - want).abs() / want.abs().max(1e-300);
                    assert!(
                        got.is_finite() && (rel < 1e-3 || scale < 1e-38),
                        "{isa:?} {scale}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The entry point checks the input against the matrix.
    #[test]
    fn checks_the_input() {
        let (q, _) = crate::quant::random_matrix(8, 64, 2, 3, DType::F32, 1);
        expect_panic(
            "qdot: the input holds 127 floats, expected 1 rows of 128",
            || {
                matmul(&[0.0; 127], 1, &q);
            },
        );
        let (q3, _) = crate::quant::random_matrix(3, 64, 2, 3, DType::F32, 1);
        expect_panic("qdot: 3 bits", || {
            matmul(&[0.0; 128], 1, &q3);
        });
    }
}
