//! Few-row products `x [n, inp] · w^T` for `1 <= n <=` [`MAX_ROWS`] rows (decode, verify):
//! each weight row is read once for all the rows, blocks of output features run on the worker
//! team, on the instruction set [`super::cpu`] names. Weights in f32, bf16 or f16
//! ([`matmul_rows`], [`matmul_rows_parts`]) and quantized matrices kept packed
//! ([`matmul_quant`]; 4 and 8 bits through `qdot`). More rows go to `fgemm`.

use super::cpu::{self, Isa};
use super::dot::{dots, dots_many, first};
#[cfg(target_arch = "x86_64")]
use super::lanes::{Avx, Avx512};
use super::lanes::{Lanes, Portable};
use super::weights::{Unpacked, Weight};
use crate::kernels::quant::QuantMatrix;

/// Output features of `w` computed per task when a product is split across threads.
const BLOCK: usize = 64;

/// Where [`matmul_block`] writes: the result of input row `r` and output feature `o` goes to
/// `ptr + r * out + o` (the `[n, out]` result, written in place by every block).
#[derive(Clone, Copy)]
struct Dst {
    ptr: *mut f32,
    out: usize,
}

// SAFETY: blocks write disjoint output features (see `matmul_rows`).
unsafe impl Send for Dst {}
// SAFETY: as above.
unsafe impl Sync for Dst {}

impl Dst {
    /// The same result seen from output feature `o` on (feature `o + j` is its `j`).
    ///
    /// # Safety
    /// `o` is inside every row of the result.
    #[inline(always)]
    unsafe fn from(self, o: usize) -> Dst {
        Dst {
            // SAFETY: forwarded from the caller.
            ptr: unsafe { self.ptr.add(o) },
            out: self.out,
        }
    }

    /// # Safety
    /// `(r, o)` is inside the result and no other thread writes it.
    #[inline(always)]
    unsafe fn put(self, r: usize, o: usize, v: f32) {
        // SAFETY: forwarded from the caller.
        unsafe { *self.ptr.add(r * self.out + o) = v };
    }
}

/// Writes `x[r] · w[o]` for every input row `r < n` and the `outs` output features
/// `o0..o0 + outs` of one block.
///
/// # Safety
/// The CPU supports `L`; `w` holds the block's weight rows; `dst` has room for `n` rows of
/// its features and no other thread writes them.
#[inline(always)]
unsafe fn matmul_block<L: Lanes, E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    let mut rows = [std::ptr::null::<f32>(); 32];
    let rows = &mut rows[..n];
    for (r, p) in rows.iter_mut().enumerate() {
        *p = x[r * inp..(r + 1) * inp].as_ptr();
    }
    if L::WIDE {
        // SAFETY: forwarded from the caller; `rows` holds `n` rows of `inp` floats.
        unsafe {
            match n {
                // half-precision or unpacked weights: four weight rows in flight for one or two
                // inputs too (see `block`)
                1 if E::WIDE_FOR_FEW => {
                    return groups::<L, E, 1, 4>(first(rows), w, inp, o0, outs, dst)
                }
                2 if E::WIDE_FOR_FEW => {
                    return groups::<L, E, 2, 4>(first(rows), w, inp, o0, outs, dst)
                }
                3 => return groups::<L, E, 3, 4>(first(rows), w, inp, o0, outs, dst),
                4 => return groups::<L, E, 4, 4>(first(rows), w, inp, o0, outs, dst),
                5 => return groups::<L, E, 5, 4>(first(rows), w, inp, o0, outs, dst),
                6 => return groups::<L, E, 6, 4>(first(rows), w, inp, o0, outs, dst),
                _ => {}
            }
        }
    }
    let mut j = 0;
    // one or two inputs (decode, a depth-1 verify): two weight rows per pass
    if n <= 2 {
        while j + 2 <= outs {
            let (w0, w1) = (
                w[(o0 + j) * inp..].as_ptr(),
                w[(o0 + j + 1) * inp..].as_ptr(),
            );
            // SAFETY: every row holds `inp` floats, and so do the weight rows `o0 + j` and
            // `o0 + j + 1` (`j + 1 < outs`); the caller guarantees `L` and `dst`.
            unsafe {
                if n == 1 {
                    put_dots(dst, o0 + j, dots::<L, E, 1, 2>(first(rows), [w0, w1], inp));
                } else {
                    put_dots(dst, o0 + j, dots::<L, E, 2, 2>(first(rows), [w0, w1], inp));
                }
            }
            j += 2;
        }
    }
    for jj in j..outs {
        let wr = &w[(o0 + jj) * inp..(o0 + jj + 1) * inp];
        // SAFETY: every row and `wr` hold `inp` floats; the caller guarantees `L` and `dst`.
        unsafe { dots_many::<L, E>(rows, wr.as_ptr(), inp, |r, v| dst.put(r, o0 + jj, v)) };
    }
}

/// Writes the results of [`dots`] for output features `o..o + M`.
///
/// # Safety
/// As [`Dst::put`] for every row `r < N` and those features.
#[inline(always)]
unsafe fn put_dots<const N: usize, const M: usize>(dst: Dst, o: usize, d: [[f32; N]; M]) {
    for (m, dm) in d.iter().enumerate() {
        for (r, v) in dm.iter().enumerate() {
            // SAFETY: forwarded from the caller.
            unsafe { dst.put(r, o + m, *v) };
        }
    }
}

/// [`matmul_block`] for `N` inputs, `M` weight rows per pass (then one at a time): `N * M`
/// independent products, enough to keep the multiply-add units busy when the weights come from
/// cache, for lanes with registers to hold them ([`Lanes::WIDE`]).
///
/// # Safety
/// As [`dots`] and [`matmul_block`].
#[inline(always)]
unsafe fn groups<L: Lanes, E: Weight, const N: usize, const M: usize>(
    xs: [*const f32; N],
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    let mut j = 0;
    // SAFETY: every weight row `o0 + j + m < o0 + outs` holds `inp` floats, as do the inputs;
    // the caller guarantees `dst`.
    unsafe {
        while j + M <= outs {
            let ws = std::array::from_fn(|m| w[(o0 + j + m) * inp..].as_ptr());
            put_dots(dst, o0 + j, dots::<L, E, N, M>(xs, ws, inp));
            j += M;
        }
        while j < outs {
            put_dots(
                dst,
                o0 + j,
                dots::<L, E, N, 1>(xs, [w[(o0 + j) * inp..].as_ptr()], inp),
            );
            j += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn matmul_block_avx<E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    // SAFETY: this function is only called when AVX was detected; the caller guarantees `dst`.
    unsafe { matmul_block::<Avx, E>(x, n, w, inp, o0, outs, dst) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c,avx512f")]
unsafe fn matmul_block_avx512<E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    o0: usize,
    outs: usize,
    dst: Dst,
) {
    // SAFETY: this function is only called when AVX2, FMA and AVX-512F were detected; the
    // caller guarantees `dst`.
    unsafe { matmul_block::<Avx512, E>(x, n, w, inp, o0, outs, dst) }
}

/// Most rows [`matmul_rows`] takes.
pub const MAX_ROWS: usize = 32;

/// Sequences of `lens` rows in consecutive groups of at most [`MAX_ROWS`] rows together (a
/// longer sequence alone): the index ranges. A product over more rows takes `fgemm`, whose
/// bits differ from the few-row product's, so a forward over several sequences runs group by
/// group to give each the bits it gets alone.
pub(crate) fn row_groups(lens: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < lens.len() {
        let mut end = start + 1;
        let mut rows = lens[start];
        while end < lens.len() && rows + lens[end] <= MAX_ROWS {
            rows += lens[end];
            end += 1;
        }
        groups.push(start..end);
        start = end;
    }
    groups
}

/// [`matmul_block`] of the output features `feats` on the path `isa` (what was detected).
///
/// # Safety
/// As [`matmul_block`] (`o0` and `outs` being `feats`' start and length); `isa` is
/// [`cpu::isa`].
#[inline(always)]
unsafe fn block<E: Weight>(
    x: &[f32],
    n: usize,
    w: &[E],
    inp: usize,
    feats: std::ops::Range<usize>,
    dst: Dst,
    isa: Isa,
) {
    let (o0, outs) = (feats.start, feats.len());
    // The 512-bit path takes f32 weights from three rows up: one or two (decode, a depth-1
    // verify) stream them at memory speed either way, and on a 615M-parameter shape the
    // paired 256-bit path was 3% faster for two (`verify_cost`: 1.07-1.08 steps against
    // 1.08-1.12). It takes half-precision weights for every row count: widening 16 values
    // per instruction with four weight rows per pass streamed bf16 at 19.4-21.4 GB/s for
    // one or two rows instead of 16.1-17.3 (`examples/matmul_rows`, 512 MiB, interleaved).
    // SAFETY (all three): forwarded from the caller.
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && (n > 2 || E::WIDE_FOR_FEW) {
        // (and AVX2, FMA and AVX-512F were detected on this CPU)
        unsafe { matmul_block_avx512(x, n, w, inp, o0, outs, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // (and AVX was detected on this CPU)
        unsafe { matmul_block_avx(x, n, w, inp, o0, outs, dst) };
        return;
    }
    let _ = isa;
    // (and the portable lanes need no particular instruction set)
    unsafe { matmul_block::<Portable, E>(x, n, w, inp, o0, outs, dst) };
}

/// Panics unless `x` holds `n` rows of `inp > 0` floats and `1 <= n <=` [`MAX_ROWS`]: what the
/// few-row products read (the message starts with `what`).
fn check_rows(what: &str, x: &[f32], n: usize, inp: usize) {
    assert!(
        (1..=MAX_ROWS).contains(&n),
        "{what}: {n} input rows, expected 1 to {MAX_ROWS}"
    );
    assert!(inp > 0, "{what}: zero input features");
    assert!(
        n.checked_mul(inp) == Some(x.len()),
        "{what}: the input holds {} floats, expected {n} rows of {inp}",
        x.len()
    );
}

/// `x [n, inp] · w^T → [n, out]` for a quantized matrix kept packed, `1 <= n <=`
/// [`MAX_ROWS`]. 4- and 8-bit matrices in whole 32-value blocks go to [`super::qdot`], which
/// dequantizes in registers. Other widths: each block of output features
/// dequantizes [`QUANT_ROWS`] weight rows at a time into a buffer kept per thread and multiplies
/// them as f32 rows, so row `r` of the result has the bits of [`matmul_rows`] over the matrix
/// dequantized at load, while a step reads the packed bytes (a quarter of bf16's at 4 bits).
///
/// # Panics
/// When `n` is out of range or `x` is not `n` rows of the matrix's input features.
pub fn matmul_quant(x: &[f32], n: usize, q: &QuantMatrix) -> Vec<f32> {
    let (inp, out) = (q.in_features(), q.out_features());
    check_rows("matmul_quant", x, n, inp);
    if super::qdot::supports(q.bits(), q.group()) {
        return super::qdot::matmul(x, n, q);
    }
    thread_local! {
        static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let isa = cpu::isa();
    let mut y = vec![0f32; n * out];
    let dst = Dst {
        ptr: y.as_mut_ptr(),
        out,
    };
    let work = |bi: usize| {
        let end = (bi * BLOCK + BLOCK).min(out);
        ROWS.with_borrow_mut(|rows| {
            let mut o = bi * BLOCK;
            while o < end {
                let m = QUANT_ROWS.min(end - o);
                rows.resize(m * inp, 0.0);
                q.dequantize_rows(o, rows);
                // SAFETY: `Unpacked` is a transparent f32.
                let unpacked = unsafe {
                    std::slice::from_raw_parts(rows.as_ptr().cast::<Unpacked>(), rows.len())
                };
                // SAFETY: block `bi` writes only its features `o..o + m` of the `n` rows of
                // `y` (through `dst` moved to feature `o`), which outlives the loop; `unpacked`
                // holds those `m` weight rows.
                unsafe { block(x, n, unpacked, inp, 0..m, dst.from(o), isa) };
                o += m;
            }
        });
    };
    let blocks = out.div_ceil(BLOCK);
    if out * inp >= 1 << 12 {
        crate::team::run(blocks, &work);
    } else {
        (0..blocks).for_each(work);
    }
    y
}

/// Weight rows [`matmul_quant`] dequantizes at a time: the four that the 512-bit path
/// multiplies per pass (a few KiB to tens of KiB, in L1 or L2).
const QUANT_ROWS: usize = 4;

/// `x [n, inp] · w[out, inp]^T → [n, out]` for `1 <= n <=` [`MAX_ROWS`]: each weight row is read
/// once for all `n` inputs (decode reads every weight once per step), parallel over blocks of
/// output features when the matrix is large. Row `r` of the result is bit-identical to
/// `matmul_rows(x[r], 1, w, inp)`, and, for half-precision weights, to the product over the
/// weights widened to f32 (see [`Weight`]).
///
/// # Panics
/// When `n` is out of range, `inp` is zero, `x` is not `n` rows of `inp` or `w` not whole rows.
pub fn matmul_rows<E: Weight>(x: &[f32], n: usize, w: &[E], inp: usize) -> Vec<f32> {
    check_rows("matmul_rows", x, n, inp);
    assert!(
        w.len().is_multiple_of(inp),
        "matmul_rows: {} weights are not whole rows of {inp}",
        w.len()
    );
    let out = w.len() / inp;
    let isa = cpu::isa();
    let mut y = vec![0f32; n * out];
    let dst = Dst {
        ptr: y.as_mut_ptr(),
        out,
    };
    let work = |bi: usize| {
        let o0 = bi * BLOCK;
        // SAFETY: block `bi` writes only its features `o0..o0 + outs` of the `n` rows of `y`,
        // which outlives the loop; `w` holds them.
        unsafe { block(x, n, w, inp, o0..(o0 + BLOCK).min(out), dst, isa) };
    };
    let blocks = out.div_ceil(BLOCK);
    // the worker team makes a split pay from a few microseconds of work (measured on the demo
    // model: 128-wide matrices, 1 << 16 kept most of them on one thread, 15% slower decode);
    // each block writes its own features of every row, in place
    if out * inp >= 1 << 12 {
        crate::team::run(blocks, &work);
    } else {
        (0..blocks).for_each(work);
    }
    y
}

/// [`matmul_rows`] over a matrix held in parts (`[sum of out_i, inp]` whose rows are the parts'
/// rows in turn, e.g. a fused q/k/v projection whose parts stay where they lie in a mapped
/// checkpoint): `[n, sum of out_i]`, one task per block of any part, each output feature
/// computed exactly as [`matmul_rows`] computes it on the whole matrix (a feature's arithmetic
/// does not depend on its neighbours; tested below).
///
/// # Panics
/// As [`matmul_rows`], for every part.
pub fn matmul_rows_parts<E: Weight>(x: &[f32], n: usize, parts: &[&[E]], inp: usize) -> Vec<f32> {
    check_rows("matmul_rows_parts", x, n, inp);
    assert!(
        parts.iter().all(|w| w.len().is_multiple_of(inp)),
        "matmul_rows_parts: a part's weights are not whole rows of {inp}"
    );
    let outs: Vec<usize> = parts.iter().map(|w| w.len() / inp).collect();
    let out: usize = outs.iter().sum();
    let isa = cpu::isa();
    let mut y = vec![0f32; n * out];
    // (part, first feature in the part, first feature in the result) of every block
    let mut blocks = Vec::new();
    let mut at = 0;
    for (p, &o) in outs.iter().enumerate() {
        for o0 in (0..o).step_by(BLOCK) {
            blocks.push((p, o0, at + o0));
        }
        at += o;
    }
    let dst = Dst {
        ptr: y.as_mut_ptr(),
        out,
    };
    let work = |bi: usize| {
        let (p, o0, at) = blocks[bi];
        // SAFETY: the block writes only features `at..at + outs` of the `n` rows of `y` (its
        // own, disjoint from every other block's), which outlives the loop; `parts[p]` holds
        // the block's weight rows.
        unsafe {
            let dst = dst.from(at - o0);
            block(x, n, parts[p], inp, o0..(o0 + BLOCK).min(outs[p]), dst, isa)
        };
    };
    if out * inp >= 1 << 12 {
        crate::team::run(blocks.len(), &work);
    } else {
        (0..blocks.len()).for_each(work);
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::cpu::{has_avx, has_avx512, isas, with_isa};
    use crate::kernels::dot::lone;
    use crate::kernels::lanes::{detected_fused, fused};
    use crate::testing::{self, expect_panic, rng, CASES};
    use proptest::prelude::*;

    /// A matrix held in parts gives every feature the bits of the whole matrix, at every row
    /// count, for part sizes on and off the block and lane boundaries and odd widths.
    #[test]
    fn row_groups_hold_at_most_max_rows_and_a_long_sequence_alone() {
        assert_eq!(row_groups(&[]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(row_groups(&[4; 8]), vec![0..8]);
        assert_eq!(row_groups(&[4; 9]), vec![0..8, 8..9]);
        assert_eq!(row_groups(&[1, 40, 1, 31, 2]), vec![0..1, 1..2, 2..4, 4..5]);
        assert_eq!(row_groups(&[32, 1]), vec![0..1, 1..2]);
    }

    #[test]
    fn parts_match_the_whole_matrix() {
        let mut r = rng(11);
        for inp in [16usize, 67, 128] {
            for sizes in [
                vec![37usize, 53],
                vec![1, 8, 3],
                vec![64, 64],
                vec![7, 300, 5],
            ] {
                let total: usize = sizes.iter().sum();
                let w: Vec<half::bf16> = (0..total * inp)
                    .map(|_| half::bf16::from_f32(r()))
                    .collect();
                let mut parts = Vec::new();
                let mut at = 0;
                for s in &sizes {
                    parts.push(&w[at * inp..(at + s) * inp]);
                    at += s;
                }
                for n in 1..=MAX_ROWS {
                    let x: Vec<f32> = (0..n * inp).map(|_| r()).collect();
                    let whole = matmul_rows(&x, n, &w, inp);
                    let split = matmul_rows_parts(&x, n, &parts, inp);
                    let same = whole
                        .iter()
                        .zip(&split)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same && whole.len() == split.len(),
                        "inp {inp} {sizes:?} n {n}"
                    );
                }
            }
        }
    }

    /// Rows computed together give exactly the bits of lone dot products, for every row count
    /// and lengths with and without a tail, on the detected and the portable path (each with its
    /// own rounding of the multiply-add).
    #[test]
    fn rows_are_bit_identical_to_lone_dots() {
        let mut next = rng(1);
        for inp in [1usize, 7, 8, 9, 64, 100, 1027] {
            for n in 1..=9 {
                let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
                let w: Vec<f32> = (0..5 * inp).map(|_| next()).collect();
                let y = matmul_rows(&x, n, &w, inp);
                let mut portable = vec![0f32; 5 * n];
                let into = |v: &mut Vec<f32>| Dst {
                    ptr: v.as_mut_ptr(),
                    out: 5,
                };
                // SAFETY: no particular instruction set needed; `portable` is `[n, 5]`.
                unsafe { matmul_block::<Portable, f32>(&x, n, &w, inp, 0, 5, into(&mut portable)) };
                // both vector paths where the CPU has them, whichever `matmul_rows` picked
                #[cfg(target_arch = "x86_64")]
                for (wide, ok) in [(false, has_avx()), (true, has_avx512())] {
                    if !ok {
                        continue;
                    }
                    let mut v = vec![0f32; 5 * n];
                    // SAFETY: the instruction sets were detected just above; `v` is `[n, 5]`.
                    unsafe {
                        if wide {
                            matmul_block_avx512(&x, n, &w, inp, 0, 5, into(&mut v));
                        } else {
                            matmul_block_avx(&x, n, &w, inp, 0, 5, into(&mut v));
                        }
                    }
                    for r in 0..n {
                        for o in 0..5 {
                            let (xr, wo) = (&x[r * inp..(r + 1) * inp], &w[o * inp..(o + 1) * inp]);
                            let want = lone(xr, wo, true);
                            assert_eq!(v[r * 5 + o].to_bits(), want.to_bits(), "wide {wide}");
                        }
                    }
                }
                for r in 0..n {
                    for o in 0..5 {
                        let (xr, wo) = (&x[r * inp..(r + 1) * inp], &w[o * inp..(o + 1) * inp]);
                        let want = lone(xr, wo, detected_fused());
                        assert_eq!(y[r * 5 + o].to_bits(), want.to_bits(), "inp {inp} n {n}");
                        let want_portable = lone(xr, wo, Portable::FUSED);
                        assert_eq!(portable[r * 5 + o].to_bits(), want_portable.to_bits());
                        let single = matmul_rows(&x[r * inp..(r + 1) * inp], 1, &w, inp);
                        assert_eq!(single[o].to_bits(), want.to_bits());
                    }
                }
            }
        }
    }

    /// Half-precision weights give the bits of the same weights widened to f32 beforehand, on
    /// every path and row count, with and without a tail.
    #[test]
    fn half_weights_are_widened_exactly() {
        fn check<E: Weight>(from: fn(f32) -> E) {
            let mut next = rng(7);
            for inp in [1usize, 7, 8, 9, 16, 100, 1027] {
                for n in 1..=9 {
                    let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
                    let w: Vec<E> = (0..5 * inp).map(|_| from(next())).collect();
                    let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
                    let want = matmul_rows(&x, n, &wide, inp);
                    let got = matmul_rows(&x, n, &w, inp);
                    assert!(want
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                    let into = |v: &mut Vec<f32>| Dst {
                        ptr: v.as_mut_ptr(),
                        out: 5,
                    };
                    let (mut a, mut b) = (vec![0f32; 5 * n], vec![0f32; 5 * n]);
                    // SAFETY: no particular instruction set needed; both are `[n, 5]`.
                    unsafe {
                        matmul_block::<Portable, f32>(&x, n, &wide, inp, 0, 5, into(&mut a));
                        matmul_block::<Portable, E>(&x, n, &w, inp, 0, 5, into(&mut b));
                    }
                    assert_eq!(a, b, "portable, inp {inp} n {n}");
                    #[cfg(target_arch = "x86_64")]
                    for (wide512, ok) in [(false, has_avx()), (true, has_avx512())] {
                        if !ok {
                            continue;
                        }
                        let (mut a, mut b) = (vec![0f32; 5 * n], vec![0f32; 5 * n]);
                        // SAFETY: the instruction sets were detected just above.
                        unsafe {
                            if wide512 {
                                matmul_block_avx512(&x, n, &wide, inp, 0, 5, into(&mut a));
                                matmul_block_avx512(&x, n, &w, inp, 0, 5, into(&mut b));
                            } else {
                                matmul_block_avx(&x, n, &wide, inp, 0, 5, into(&mut a));
                                matmul_block_avx(&x, n, &w, inp, 0, 5, into(&mut b));
                            }
                        }
                        let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                        assert!(same, "wide {wide512}, inp {inp} n {n}");
                    }
                }
            }
        }
        check(half::bf16::from_f32);
        check(half::f16::from_f32);
    }

    /// `matmul_rows` checks every length it reads: rows, input, weights (and sizes whose product
    /// wraps around).
    #[test]
    fn matmul_rows_checks_every_length() {
        let (w, x) = (vec![0f32; 4 * 8], vec![0f32; 33 * 8]);
        let wb = vec![half::bf16::ZERO; 4 * 8];
        expect_panic(
            "matmul_rows: the input holds 23 floats, expected 3 rows of 8",
            || {
                matmul_rows(&x[..23], 3, &w, 8);
            },
        );
        expect_panic(
            "matmul_rows: the input holds 24 floats, expected 2 rows of 8",
            || {
                matmul_rows(&x[..24], 2, &wb, 8);
            },
        );
        expect_panic("matmul_rows: 0 input rows", || {
            matmul_rows(&[], 0, &w, 8);
        });
        expect_panic("matmul_rows: 33 input rows", || {
            matmul_rows(&x, 33, &w, 8);
        });
        expect_panic("matmul_rows: zero input features", || {
            matmul_rows(&[], 1, &w, 0);
        });
        expect_panic("matmul_rows: 31 weights are not whole rows of 8", || {
            matmul_rows(&x[..8], 1, &w[..31], 8);
        });
        expect_panic("matmul_rows: the input holds 0 floats", || {
            matmul_rows::<f32>(&[], 2, &[], usize::MAX / 2 + 1);
        });
    }

    /// `matmul_rows_parts` checks the input and every part.
    #[test]
    fn matmul_rows_parts_checks_every_length() {
        let (w, x) = (vec![half::f16::ZERO; 4 * 8], vec![0f32; 3 * 8]);
        expect_panic("matmul_rows_parts: the input holds 23 floats", || {
            matmul_rows_parts(&x[..23], 3, &[&w, &w], 8);
        });
        expect_panic("matmul_rows_parts: 0 input rows", || {
            matmul_rows_parts(&[], 0, &[&w], 8);
        });
        expect_panic(
            "matmul_rows_parts: a part's weights are not whole rows of 8",
            || {
                matmul_rows_parts(&x, 3, &[&w, &w[..12]], 8);
            },
        );
        expect_panic("matmul_rows_parts: zero input features", || {
            matmul_rows_parts(&[], 1, &[&w], 0);
        });
    }

    /// `matmul_quant` checks the input against the matrix's width.
    #[test]
    fn matmul_quant_checks_the_input() {
        let (q, _) = crate::kernels::quant::random_matrix(4, 32, 2, 3, candle_core::DType::BF16, 2);
        let x = vec![0f32; 33 * 64];
        expect_panic(
            "matmul_quant: the input holds 63 floats, expected 1 rows of 64",
            || {
                matmul_quant(&x[..63], 1, &q);
            },
        );
        expect_panic(
            "matmul_quant: the input holds 128 floats, expected 1 rows",
            || {
                matmul_quant(&x[..128], 1, &q);
            },
        );
        expect_panic("matmul_quant: 33 input rows", || {
            matmul_quant(&x, 33, &q);
        });
        expect_panic("matmul_quant: 0 input rows", || {
            matmul_quant(&[], 0, &q);
        });
    }

    /// Weights `[out, inp]` of type `E` from `next`, and the same widened to f32.
    fn weights<E: Weight>(
        from: fn(f32) -> E,
        len: usize,
        next: &mut impl FnMut() -> f32,
    ) -> (Vec<E>, Vec<f32>) {
        let w: Vec<E> = (0..len).map(|_| from(next())).collect();
        let wide = w.iter().map(|v| v.to_f32()).collect();
        (w, wide)
    }

    /// The property of [`matmul_rows_follow_the_lone_dot`] for weights of type `E`.
    fn rows_follow_the_lone_dot<E: Weight>(
        from: fn(f32) -> E,
        (n, inp, out, cut, seed): (usize, usize, usize, usize, u64),
    ) {
        let mut next = testing::rng(seed);
        let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
        let (w, wide) = weights(from, out * inp, &mut next);
        let cut = cut.min(out) * inp;
        for isa in isas() {
            let (y, split) = with_isa(isa, || {
                let split = matmul_rows_parts(&x, n, &[&w[..cut], &w[cut..]], inp);
                (matmul_rows(&x, n, &w, inp), split)
            });
            assert_eq!(testing::bits(&y), testing::bits(&split), "{isa:?}, parts");
            for r in 0..n {
                for o in 0..out {
                    let xr = &x[r * inp..(r + 1) * inp];
                    let want = lone(xr, &wide[o * inp..(o + 1) * inp], fused(isa));
                    assert_eq!(
                        y[r * out + o].to_bits(),
                        want.to_bits(),
                        "{isa:?}, {n} rows of {inp}, feature {o} of {out}"
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Every result of `matmul_rows` (and of the same matrix in two parts) has the bits of
        /// the lone dot product, for f32, bf16 and f16 weights, every row count, odd widths,
        /// matrices on and off the block size, on every path this CPU runs.
        #[test]
        fn matmul_rows_follow_the_lone_dot(
            n in 1usize..=MAX_ROWS,
            inp in 1usize..=80,
            out in 1usize..=72,
            cut in 0usize..=72,
            kind in 0usize..3,
            seed in any::<u64>(),
        ) {
            let case = (n, inp, out, cut, seed);
            match kind {
                0 => rows_follow_the_lone_dot::<f32>(|v| v, case),
                1 => rows_follow_the_lone_dot(half::bf16::from_f32, case),
                _ => rows_follow_the_lone_dot(half::f16::from_f32, case),
            }
        }

        /// `matmul_quant` gives the bits of the lone dot product over the matrix dequantized
        /// by the definition, at every width it multiplies as dequantized rows and on every
        /// path this CPU runs (4 and 8 bits in whole blocks are `qdot`'s, tested there).
        #[test]
        fn matmul_quant_follows_the_definition(
            n in 1usize..=MAX_ROWS,
            bits in prop::sample::select(vec![2usize, 3, 4, 5, 6, 8]),
            group in prop::sample::select(vec![8usize, 12, 16, 32, 64]),
            groups in 1usize..=3,
            out in 1usize..=40,
            seed in any::<u64>(),
        ) {
            let (q, deq) = crate::kernels::quant::random_matrix(
                bits, group, groups, out, candle_core::DType::BF16, seed,
            );
            prop_assume!(!crate::kernels::qdot::supports(bits, q.group()));
            let inp = q.in_features();
            let mut next = testing::rng(!seed);
            let x: Vec<f32> = (0..n * inp).map(|_| next()).collect();
            for isa in isas() {
                let y = with_isa(isa, || matmul_quant(&x, n, &q));
                for r in 0..n {
                    for o in 0..out {
                        let xr = &x[r * inp..(r + 1) * inp];
                        let want = lone(xr, &deq[o * inp..(o + 1) * inp], fused(isa));
                        prop_assert_eq!(y[r * out + o].to_bits(), want.to_bits(), "{:?}", isa);
                    }
                }
            }
        }
    }
}
