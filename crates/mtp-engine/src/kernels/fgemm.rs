//! Many-row products (prefill) in f32 over weight panels that are widened or dequantized as they
//! are packed, on the engine's worker team.
//!
//! Written here instead of calling the `gemm` crate (which candle uses) for two reasons measured
//! on this project's 2-core machine (`examples/prefill_product`, 3072 x 1024 by 1024 rows):
//! - `gemm` did not scale: two threads (its own rayon split, or two threads each multiplying
//!   half the rows) ran at 27-28 GMAC/s against 33 for one thread; its blocking takes the whole
//!   shared L3 for each thread.
//! - it needs the whole block of weights as f32 rows first, so bf16, f16 and MLX-quantized
//!   matrices were widened into a 16 MiB buffer and read again.
//!
//! Here a group of output features is packed into panels of 16 features, input-major (for each
//! input `k`, the 16 weights `w[o0 + c, k]` side by side), each panel filled by one task from
//! the matrix's own rows (`fill`: a widening, a dequantization, or a copy). Then the row bands
//! of the input are multiplied against every panel on the team: with AVX2 a tile of up to
//! [`TILE`] input rows times one panel is 2 · `TILE` vector accumulators, and each input `k`
//! costs two panel loads, `TILE` broadcasts and 2 · `TILE` fused multiply-adds; with AVX-512
//! (32 registers of 16 lanes) a tile is up to [`WIDE_TILE`] rows times [`WIDE_PANELS`] panels,
//! so each input `k` costs three panel loads and eight broadcasts for 24 multiply-adds of twice
//! the width (12 rows x 2 panels and 6 x 4 ran within 5% of it, 14 x 2 ~10% slower, in
//! `examples/prefill_product`).
//!
//! Every output is one chain `y = fma(x[k], w[k], y)` over `k = 0..inp` in order, whatever the
//! tile, band, thread count or instruction set, so the vector kernel and the portable one give
//! the same bits (`tests` below), and so does any split of the rows. The arithmetic is mlx's:
//! weights are dequantized to f32 (by the same `fill` a load-time dequantization uses), then
//! multiplied in f32.

// The kernels index several per-row arrays by the same row number, which `R` fixes at compile
// time, so the loops unroll to registers.
#![allow(clippy::needless_range_loop)]

use super::cpu::{self, Isa};

/// Output features per panel (two 8-lane vectors).
const PAIR: usize = 16;

/// Input rows per kernel call (twelve accumulators, two panel vectors and a broadcast fill
/// the sixteen AVX2 registers).
const TILE: usize = 6;

/// Input rows per AVX-512 kernel call, over [`WIDE_PANELS`] panels (24 accumulators, three
/// panel vectors and a broadcast of the 32 registers).
const WIDE_TILE: usize = 8;

/// Panels per AVX-512 kernel call.
const WIDE_PANELS: usize = 3;

/// The tests' panel group (the engine passes its own, `nn::WIDEN_BLOCK`).
#[cfg(test)]
const PANEL_VALUES: usize = 1 << 22;

/// Most input rows a task multiplies (a band of rows stays in L2 across the panels; a multiple
/// of both tiles' rows).
const BAND: usize = 12 * WIDE_TILE;

/// Input rows and panels per tile on `isa`: AVX-512 takes up to [`WIDE_PANELS`] panels per
/// tile, AVX2 and the portable loops one.
fn tile_shape(isa: Isa) -> (usize, usize) {
    match isa {
        Isa::Avx512 => (WIDE_TILE, WIDE_PANELS),
        Isa::Avx2 | Isa::Portable => (TILE, 1),
    }
}

/// `x [n, inp] · w^T` for a matrix of `out` rows of `inp` weights, `[n, out]`, where
/// `fill(o0, rows)` writes the matrix's rows `o0..o0 + rows.len() / inp` as f32 (it may run on
/// any thread, several at once, and is called with up to 16 rows), packing at most
/// `panel_values` weights at a time (at least one panel). The instruction set is decided once,
/// by the calling thread ([`cpu::isa`]; the team's threads do not see a test's cap).
///
/// # Panics
/// When `x` is not `n` rows of `inp`.
pub(crate) fn matmul(
    x: &[f32],
    n: usize,
    out: usize,
    inp: usize,
    panel_values: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    matmul_with(x, n, out, inp, fill, cpu::isa(), panel_values)
}

fn matmul_with(
    x: &[f32],
    n: usize,
    out: usize,
    inp: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync,
    isa: Isa,
    panel_values: usize,
) -> Vec<f32> {
    assert!(
        crate::kernels::elements(&[n, inp]) == Some(x.len()),
        "fgemm: the input holds {} floats, expected {n} rows of {inp}",
        x.len()
    );
    if n == 0 || out == 0 || inp == 0 {
        return vec![0f32; n * out];
    }
    // never wider than this CPU runs (the tests pass each path)
    let isa = isa.min(cpu::isa());
    // every element is written below (each band, panel and row of a tile)
    let mut y = crate::scratch::overwritten(n * out);
    thread_local! {
        static PANELS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let cols = (panel_values / inp / PAIR * PAIR).clamp(PAIR, out.next_multiple_of(PAIR));
    // bands of at most `BAND` rows, as few as that allows, a multiple of the thread count, all
    // of one size (up to a row): the team's threads take them in turn and finish together, and
    // each band streams the panels from L3 once
    let threads = crate::team::threads().max(1).min(n);
    let tasks = threads * n.div_ceil(threads * BAND);
    let band = n.div_ceil(tasks);
    PANELS.with_borrow_mut(|panels| {
        for o0 in (0..out).step_by(cols) {
            let m = cols.min(out - o0);
            let pairs = m.div_ceil(PAIR);
            // grown, never shrunk: the products of a forward alternate between sizes, and each
            // regrowth wrote zeros over what `pack` overwrites anyway (~0.7% of a prefill)
            if panels.len() < pairs * PAIR * inp {
                panels.resize(pairs * PAIR * inp, 0.0);
            }
            pack(&fill, o0, m, inp, &mut panels[..pairs * PAIR * inp], isa);
            let panels = &panels[..pairs * PAIR * inp];
            crate::team::chunks_mut(&mut y, band * out, |ti, ys| {
                let r0 = ti * band;
                let rows = ys.len() / out;
                let xs = &x[r0 * inp..(r0 + rows) * inp];
                let mut res = [[0f32; WIDE_PANELS * PAIR]; WIDE_TILE];
                let (tile_rows, tile_panels) = tile_shape(isa);
                let mut pi = 0;
                while pi < pairs {
                    let np = tile_panels.min(pairs - pi);
                    let panel = &panels[pi * PAIR * inp..(pi + np) * PAIR * inp];
                    let width = (np * PAIR).min(m - pi * PAIR);
                    let mut t = 0;
                    while t < rows {
                        let take = tile_rows.min(rows - t);
                        let tx = &xs[t * inp..(t + take) * inp];
                        macro_rules! tiles {
                            ($($r:literal)*) => {
                                match take {
                                    $($r => tile::<$r>(tx, panel, inp, isa, &mut res),)*
                                    _ => tile::<1>(tx, panel, inp, isa, &mut res),
                                }
                            };
                        }
                        const { assert!(TILE <= WIDE_TILE && WIDE_TILE <= 8) };
                        tiles!(8 7 6 5 4 3 2);
                        for (i, vals) in res.iter().enumerate().take(take) {
                            let at = (t + i) * out + o0 + pi * PAIR;
                            // whole panels: a copy of known length, inlined (a call to
                            // `memcpy` per row of a tile was ~0.7% of a 4-bit prefill)
                            if width == WIDE_PANELS * PAIR {
                                ys[at..at + WIDE_PANELS * PAIR].copy_from_slice(vals);
                            } else if width == PAIR {
                                ys[at..at + PAIR].copy_from_slice(&vals[..PAIR]);
                            } else {
                                ys[at..at + width].copy_from_slice(&vals[..width]);
                            }
                        }
                        t += take;
                    }
                    pi += np;
                }
            });
        }
    });
    y
}

/// Packs rows `o0..o0 + m` into `panels` (`m.div_ceil(16)` panels of `16 · inp` floats; the
/// features past `m` are zero), a panel per task.
fn pack(
    fill: &(impl Fn(usize, &mut [f32]) + Sync),
    o0: usize,
    m: usize,
    inp: usize,
    panels: &mut [f32],
    isa: Isa,
) {
    thread_local! {
        static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let isa = isa.min(cpu::isa());
    crate::team::chunks_mut(panels, PAIR * inp, |pi, panel| {
        let width = PAIR.min(m - pi * PAIR);
        ROWS.with_borrow_mut(|rows| {
            if rows.len() < width * inp {
                rows.resize(width * inp, 0.0);
            }
            let rows = &mut rows[..width * inp];
            fill(o0 + pi * PAIR, rows);
            if width < PAIR {
                panel.fill(0.0);
            }
            // 16 inputs at a time: each row's 16 values are one cache line, and the panel's
            // 16 x 16 block stays in L1 (reading all 16 rows at one input at a time hit the
            // same L1 set 16 times when rows are a multiple of 4 KiB apart)
            for (kb, block) in panel.chunks_mut(PAIR * PAIR).enumerate() {
                let k0 = kb * PAIR;
                #[cfg(target_arch = "x86_64")]
                if width == PAIR && block.len() == PAIR * PAIR {
                    // SAFETY (both): the instruction set was detected (`cpu::isa`); the 16
                    // rows hold `inp >= k0 + 16` floats each (a whole block) and `block` 256.
                    match isa {
                        Isa::Avx512 => {
                            unsafe { x86::transpose16(rows, inp, k0, block) };
                            continue;
                        }
                        Isa::Avx2 => {
                            unsafe { x86::transpose16_avx(rows, inp, k0, block) };
                            continue;
                        }
                        Isa::Portable => {}
                    }
                }
                for (c, row) in rows.chunks_exact(inp).enumerate() {
                    for (kk, v) in row[k0..(k0 + PAIR).min(inp)].iter().enumerate() {
                        block[kk * PAIR + c] = *v;
                    }
                }
            }
        });
    });
}

/// `R` rows of `x` (`inp` each) against 1 to [`WIDE_PANELS`] consecutive panels (`panel`:
/// `16 · inp` floats each), into `res[..R]` (16 features per panel), on `isa` (which
/// [`matmul_with`] narrowed to what this CPU runs).
fn tile<const R: usize>(
    x: &[f32],
    panel: &[f32],
    inp: usize,
    isa: Isa,
    res: &mut [[f32; WIDE_PANELS * PAIR]; WIDE_TILE],
) {
    let np = panel.len() / (PAIR * inp).max(1);
    assert!(
        R <= WIDE_TILE
            && x.len() == R * inp
            && (1..=WIDE_PANELS).contains(&np)
            && panel.len() == np * PAIR * inp
    );
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY (all): the CPU has the instruction sets (`cpu::isa`); `x` holds `R` rows of
        // `inp` floats and `panel` `np` panels of `inp` groups of 16 (asserted above).
        Isa::Avx512 => {
            const { assert!(WIDE_PANELS == 3) };
            return unsafe {
                match np {
                    3 => x86::tile512::<R, 3>(x, panel, inp, res),
                    2 => x86::tile512::<R, 2>(x, panel, inp, res),
                    _ => x86::tile512::<R, 1>(x, panel, inp, res),
                }
            };
        }
        Isa::Avx2 if np == 1 && R <= TILE => return unsafe { x86::tile::<R>(x, panel, inp, res) },
        _ => {}
    }
    let _ = isa;
    for (p, panel) in panel.chunks_exact(PAIR * inp).enumerate() {
        for i in 0..R {
            let xr = &x[i * inp..(i + 1) * inp];
            for c in 0..PAIR {
                let mut f = 0f32;
                for (k, xv) in xr.iter().enumerate() {
                    f = xv.mul_add(panel[k * PAIR + c], f);
                }
                res[i][p * PAIR + c] = f;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{PAIR, WIDE_PANELS, WIDE_TILE};

    /// `$step!(k)` for every input `k = 0..$inp` in order: four per turn of the loop, then the
    /// rest (each chain stays in input order).
    macro_rules! each_input {
        ($inp:expr, $step:ident) => {{
            let inp = $inp;
            let mut k = 0;
            while k + 4 <= inp {
                $step!(k);
                $step!(k + 1);
                $step!(k + 2);
                $step!(k + 3);
                k += 4;
            }
            while k < inp {
                $step!(k);
                k += 1;
            }
        }};
    }

    /// [`super::tile`]'s arithmetic in AVX2 registers: per input `k`, the panel's two vectors
    /// times each row's `x[k]` broadcast, one fused multiply-add per lane.
    ///
    /// # Safety
    /// AVX2 and FMA must be present; `x` must hold `R` rows of `inp` floats and `panel` `inp`
    /// groups of 16 (checked by [`super::tile`]).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const R: usize>(
        x: &[f32],
        panel: &[f32],
        inp: usize,
        res: &mut [[f32; WIDE_PANELS * PAIR]; WIDE_TILE],
    ) {
        let (xp, wp) = (x.as_ptr(), panel.as_ptr());
        let mut f = [[_mm256_setzero_ps(); 2]; R];
        // input `k` of the tile: each row's `x[k]` broadcast times the panel's two vectors
        macro_rules! step {
            ($k:expr) => {{
                let k = $k;
                // SAFETY: `k < inp`: the panel's floats `16 k .. 16 k + 16` and each row's
                // float `k` are inside the slices.
                unsafe {
                    let w0 = _mm256_loadu_ps(wp.add(k * PAIR));
                    let w1 = _mm256_loadu_ps(wp.add(k * PAIR + 8));
                    for i in 0..R {
                        let xv = _mm256_broadcast_ss(&*xp.add(i * inp + k));
                        f[i][0] = _mm256_fmadd_ps(xv, w0, f[i][0]);
                        f[i][1] = _mm256_fmadd_ps(xv, w1, f[i][1]);
                    }
                }
            }};
        }
        each_input!(inp, step);
        for i in 0..R {
            // SAFETY: `res[i]` holds 16 floats.
            unsafe {
                _mm256_storeu_ps(res[i].as_mut_ptr(), f[i][0]);
                _mm256_storeu_ps(res[i].as_mut_ptr().add(8), f[i][1]);
            }
        }
    }

    /// Panics unless a 16 x 16 transpose of `rows` from input `k0` into `block` stays inside
    /// both (what [`transpose16`] and [`transpose16_avx`] read and write).
    fn check_transpose(rows: &[f32], inp: usize, k0: usize, block: &[f32]) {
        assert!(
            k0 + PAIR <= inp
                && rows.len() >= (PAIR - 1) * inp + k0 + PAIR
                && block.len() == PAIR * PAIR,
            "fgemm: a transpose outside its buffers"
        );
    }

    /// `block[kk · 16 + c] = rows[c · inp + k0 + kk]` for `c, kk < 16`: a 16 x 16 transpose in
    /// registers (four rounds of in-lane and cross-lane shuffles, 64 in all, where the scalar
    /// loop moved the 256 values one at a time: ~6% of a 512-token 4-bit prefill).
    ///
    /// # Safety
    /// AVX-512F must be present.
    ///
    /// # Panics
    /// When `rows` holds fewer than `15 · inp + k0 + 16` floats, `k0 + 16 > inp`, or `block`
    /// is not 256 floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose16(rows: &[f32], inp: usize, k0: usize, block: &mut [f32]) {
        check_transpose(rows, inp, k0, block);
        // SAFETY: the 16 loads read `rows[c · inp + k0 ..][..16]`, the stores write
        // `block[kk · 16 ..][..16]`, all inside the slices (asserted above).
        unsafe {
            let r: [__m512; PAIR] =
                std::array::from_fn(|c| _mm512_loadu_ps(rows.as_ptr().add(c * inp + k0)));
            // per 128-bit lane `l`: `t[2g]` = rows 2g, 2g + 1 at inputs 4l, 4l + 1; `t[2g + 1]`
            // at 4l + 2, 4l + 3
            let t: [__m512; PAIR] = std::array::from_fn(|i| {
                let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
                if i % 2 == 0 {
                    _mm512_unpacklo_ps(a, b)
                } else {
                    _mm512_unpackhi_ps(a, b)
                }
            });
            // `u[4g + m]`, lane `l`: rows 4g..4g + 4 at input 4l + m
            let u: [__m512; PAIR] = std::array::from_fn(|i| {
                let (g, m) = (i / 4, i % 4);
                let (a, b) = (t[4 * g + m / 2], t[4 * g + 2 + m / 2]);
                if m % 2 == 0 {
                    _mm512_shuffle_ps::<0x44>(a, b)
                } else {
                    _mm512_shuffle_ps::<0xEE>(a, b)
                }
            });
            for m in 0..4 {
                let (u0, u1, u2, u3) = (u[m], u[4 + m], u[8 + m], u[12 + m]);
                // lanes 0 and 1 of each, then 2 and 3
                let (a0, b0) = (
                    _mm512_shuffle_f32x4::<0x44>(u0, u1),
                    _mm512_shuffle_f32x4::<0x44>(u2, u3),
                );
                let (a1, b1) = (
                    _mm512_shuffle_f32x4::<0xEE>(u0, u1),
                    _mm512_shuffle_f32x4::<0xEE>(u2, u3),
                );
                // input 4l + m: lane `l` of each of the four row groups
                let out = block.as_mut_ptr();
                _mm512_storeu_ps(out.add(m * PAIR), _mm512_shuffle_f32x4::<0x88>(a0, b0));
                _mm512_storeu_ps(
                    out.add((4 + m) * PAIR),
                    _mm512_shuffle_f32x4::<0xDD>(a0, b0),
                );
                _mm512_storeu_ps(
                    out.add((8 + m) * PAIR),
                    _mm512_shuffle_f32x4::<0x88>(a1, b1),
                );
                _mm512_storeu_ps(
                    out.add((12 + m) * PAIR),
                    _mm512_shuffle_f32x4::<0xDD>(a1, b1),
                );
            }
        }
    }

    /// [`transpose16`] in four 8 x 8 blocks of AVX registers (three rounds of shuffles, 24 per
    /// block).
    ///
    /// # Safety
    /// AVX must be present.
    ///
    /// # Panics
    /// As [`transpose16`].
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose16_avx(rows: &[f32], inp: usize, k0: usize, block: &mut [f32]) {
        check_transpose(rows, inp, k0, block);
        for (c0, kk0) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
            // SAFETY: the loads read `rows[(c0 + c) · inp + k0 + kk0 ..][..8]`, the stores write
            // `block[(kk0 + kk) · 16 + c0 ..][..8]`, all inside the slices (asserted above).
            unsafe {
                let r: [__m256; 8] = std::array::from_fn(|c| {
                    _mm256_loadu_ps(rows.as_ptr().add((c0 + c) * inp + k0 + kk0))
                });
                let t: [__m256; 8] = std::array::from_fn(|i| {
                    let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
                    if i % 2 == 0 {
                        _mm256_unpacklo_ps(a, b)
                    } else {
                        _mm256_unpackhi_ps(a, b)
                    }
                });
                // `u[4g + m]`, lane `l`: rows 4g..4g + 4 at input 4l + m
                let u: [__m256; 8] = std::array::from_fn(|i| {
                    let (g, m) = (i / 4, i % 4);
                    let (a, b) = (t[4 * g + m / 2], t[4 * g + 2 + m / 2]);
                    if m % 2 == 0 {
                        _mm256_shuffle_ps::<0x44>(a, b)
                    } else {
                        _mm256_shuffle_ps::<0xEE>(a, b)
                    }
                });
                let out = block.as_mut_ptr().add(kk0 * PAIR + c0);
                for m in 0..4 {
                    let (lo, hi) = (u[m], u[4 + m]);
                    _mm256_storeu_ps(out.add(m * PAIR), _mm256_permute2f128_ps::<0x20>(lo, hi));
                    _mm256_storeu_ps(
                        out.add((4 + m) * PAIR),
                        _mm256_permute2f128_ps::<0x31>(lo, hi),
                    );
                }
            }
        }
    }

    /// [`super::tile`]'s arithmetic in AVX-512 registers over `P` panels (up to
    /// [`WIDE_PANELS`]): per input `k`, each panel's 16 weights times each row's `x[k]`
    /// broadcast, one fused multiply-add per lane (the same chains as [`tile`]).
    ///
    /// # Safety
    /// AVX-512F must be present; `x` must hold `R` rows of `inp` floats and `panel` `P` panels
    /// of `inp` groups of 16 (checked by [`super::tile`]).
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn tile512<const R: usize, const P: usize>(
        x: &[f32],
        panel: &[f32],
        inp: usize,
        res: &mut [[f32; WIDE_PANELS * PAIR]; WIDE_TILE],
    ) {
        const { assert!(P >= 1 && P <= WIDE_PANELS) };
        let (xp, wp) = (x.as_ptr(), panel.as_ptr());
        let mut f = [[_mm512_setzero_ps(); P]; R];
        macro_rules! step {
            ($k:expr) => {{
                let k = $k;
                // SAFETY: `k < inp`: each panel's floats `16 k .. 16 k + 16` and each row's
                // float `k` are inside the slices.
                unsafe {
                    let mut w = [_mm512_setzero_ps(); P];
                    for p in 0..P {
                        w[p] = _mm512_loadu_ps(wp.add(p * PAIR * inp + k * PAIR));
                    }
                    for i in 0..R {
                        let xv = _mm512_set1_ps(*xp.add(i * inp + k));
                        for p in 0..P {
                            f[i][p] = _mm512_fmadd_ps(xv, w[p], f[i][p]);
                        }
                    }
                }
            }};
        }
        each_input!(inp, step);
        for i in 0..R {
            for p in 0..P {
                // SAFETY: `res[i]` holds `16 · WIDE_PANELS` floats.
                unsafe { _mm512_storeu_ps(res[i].as_mut_ptr().add(p * PAIR), f[i][p]) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::isas;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 20001) as f32 / 10000.0 - 1.0
            })
            .collect()
    }

    /// The product in f64, as the reference the f32 chains are held to.
    fn reference(x: &[f32], n: usize, w: &[f32], out: usize, inp: usize) -> Vec<f64> {
        let mut y = vec![0f64; n * out];
        for r in 0..n {
            for o in 0..out {
                y[r * out + o] = (0..inp)
                    .map(|k| f64::from(x[r * inp + k]) * f64::from(w[o * inp + k]))
                    .sum();
            }
        }
        y
    }

    /// Each output of `got` is one chain of fused multiply-adds in input order.
    fn assert_chains(
        x: &[f32],
        w: &[f32],
        got: &[f32],
        n: usize,
        out: usize,
        inp: usize,
        what: &str,
    ) {
        for r in 0..n {
            for o in 0..out {
                let chain = (0..inp).fold(0f32, |f, k| x[r * inp + k].mul_add(w[o * inp + k], f));
                assert_eq!(
                    chain.to_bits(),
                    got[r * out + o].to_bits(),
                    "{what} {n}x{out}x{inp}: output ({r}, {o})"
                );
            }
        }
    }

    /// Packed panels hold every weight at `[panel][input][feature]`, zeros past the last
    /// feature, on every kernel this CPU runs (AVX-512 transposes whole 16 x 16 blocks in
    /// registers): partial panels, inputs not a multiple of 16, an offset first row.
    #[test]
    fn panels_hold_the_weights_on_every_kernel() {
        for (out, inp, o0, m) in [
            (16usize, 16usize, 0usize, 16usize),
            (40, 48, 3, 37),
            (64, 40, 16, 48),
            (48, 1024, 0, 33),
        ] {
            let w = values(out * inp, (out * inp) as u64);
            let fill = |r0: usize, rows: &mut [f32]| {
                rows.copy_from_slice(&w[r0 * inp..r0 * inp + rows.len()]);
            };
            let pairs = m.div_ceil(PAIR);
            for isa in isas() {
                let mut panels = vec![f32::NAN; pairs * PAIR * inp];
                pack(&fill, o0, m, inp, &mut panels, isa);
                for p in 0..pairs {
                    for k in 0..inp {
                        for c in 0..PAIR {
                            let f = p * PAIR + c;
                            let want = if f < m { w[(o0 + f) * inp + k] } else { 0.0 };
                            assert_eq!(
                                panels[(p * inp + k) * PAIR + c].to_bits(),
                                want.to_bits(),
                                "{isa:?}: {m} of {out} x {inp} from {o0}, feature {f}, input {k}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A large product's result comes from the scratch pool with its last user's values in it;
    /// every one of them is overwritten.
    #[test]
    fn a_recycled_result_buffer_is_wholly_overwritten() {
        let (n, out, inp) = (301, 250, 19);
        assert!(n * out >= crate::scratch::MIN_FLOATS);
        let x = values(n * inp, 5);
        let w = values(out * inp, 6);
        let fill = |o0: usize, rows: &mut [f32]| {
            rows.copy_from_slice(&w[o0 * inp..o0 * inp + rows.len()]);
        };
        for isa in isas() {
            // (other tests share the pool: offer several)
            for _ in 0..4 {
                crate::scratch::recycle(vec![f32::NAN; n * out]);
            }
            let got = matmul_with(&x, n, out, inp, fill, isa, PANEL_VALUES);
            assert_eq!(got.len(), n * out);
            assert_chains(&x, &w, &got, n, out, inp, &format!("{isa:?}"));
        }
    }

    #[test]
    fn products_match_f64_and_every_split_has_the_same_bits() {
        for (n, out, inp) in [
            (1, 1, 1),
            (7, 17, 5),
            (40, 33, 64),
            (97, 50, 130),
            (13, 16, 3),
            (20, 40, 549),
            (25, 80, 37),
        ] {
            let x = values(n * inp, 3 + n as u64);
            let w = values(out * inp, 11 + out as u64);
            let fill = |o0: usize, rows: &mut [f32]| {
                rows.copy_from_slice(&w[o0 * inp..o0 * inp + rows.len()]);
            };
            let want = reference(&x, n, &w, out, inp);
            let got = matmul_with(&x, n, out, inp, fill, Isa::Portable, PANEL_VALUES);
            for (a, b) in want.iter().zip(&got) {
                assert!(
                    (a - f64::from(*b)).abs() <= 1e-5 * (inp as f64),
                    "{n}x{out}x{inp}: {a} {b}"
                );
            }
            // each output is one chain of fused multiply-adds in input order
            assert_chains(&x, &w, &got, n, out, inp, "");
            // every kernel this CPU runs, small panel groups (one or three panels), and each
            // row alone: the same bits
            for isa in isas() {
                for panel_values in [16 * inp, 48 * inp, PANEL_VALUES] {
                    let ys = matmul_with(&x, n, out, inp, fill, isa, panel_values);
                    assert!(
                        ys.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{n}x{out}x{inp}: {isa:?} with panel groups of {panel_values} differs"
                    );
                }
                for r in 0..n {
                    let one = matmul_with(
                        &x[r * inp..(r + 1) * inp],
                        1,
                        out,
                        inp,
                        fill,
                        isa,
                        PANEL_VALUES,
                    );
                    assert!(
                        one.iter()
                            .zip(&got[r * out..(r + 1) * out])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{n}x{out}x{inp}: {isa:?} row {r} alone differs"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_shapes() {
        assert!(matmul(&[], 0, 5, 3, PANEL_VALUES, |_, _| unreachable!()).is_empty());
        assert_eq!(
            matmul(&[1.0; 6], 2, 0, 3, PANEL_VALUES, |_, _| unreachable!()),
            Vec::<f32>::new()
        );
        assert_eq!(
            matmul(&[], 2, 3, 0, PANEL_VALUES, |_, _| unreachable!()),
            vec![0.0; 6]
        );
    }

    #[test]
    fn non_finite_inputs_give_non_finite_outputs() {
        let (n, out, inp) = (3, 20, 8);
        let mut x = values(n * inp, 5);
        x[inp + 2] = f32::INFINITY;
        x[2 * inp + 4] = f32::NAN;
        let w = values(out * inp, 9);
        let y = matmul(&x, n, out, inp, PANEL_VALUES, |o0, rows| {
            rows.copy_from_slice(&w[o0 * inp..o0 * inp + rows.len()])
        });
        assert!(y[..out].iter().all(|v| v.is_finite()));
        assert!(y[out..].iter().all(|v| !v.is_finite()));
    }
}
