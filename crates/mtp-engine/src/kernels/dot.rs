//! The dot products the few-row kernels share: [`dots`] (`N` rows by `M` weight rows in one
//! pass, each result with the arithmetic of its lone dot product) and [`dots_many`] (any number
//! of rows against one weight row), over any [`Lanes`] and [`Weight`] type.

use super::lanes::Lanes;
use super::weights::{wload, wload2, Weight};

/// The `N × M` dot products of the rows at `xs` with the weight rows at `ws`, all `len` long.
/// Even and odd 8-float chunks accumulate apart (two dependency chains per product) and are
/// added before the reduction, so each result has the arithmetic of its lone dot product
/// whatever `N` and `M` are. Each input chunk is loaded once for all `M` weight rows: with
/// `M = 2` a product whose weights sit in cache does twice the multiply-adds per load.
///
/// # Safety
/// Every pointer reads `len` floats; the CPU supports `L`.
#[inline(always)]
pub(super) unsafe fn dots<L: Lanes, E: Weight, const N: usize, const M: usize>(
    xs: [*const f32; N],
    ws: [*const E; M],
    len: usize,
) -> [[f32; N]; M] {
    let chunks = len / 8;
    // a lone weight row prefetches 4 KiB ahead; several prefetch the same columns of the next
    // group of rows (or further), so that every stream runs ahead
    let lone = PREFETCH_AHEAD / std::mem::size_of::<E>();
    let ahead = if M == 1 { lone } else { (M * len).max(lone) };
    // SAFETY (all reads): `c * 8 + 8 <= len` and `i < len`.
    unsafe {
        // `acc` holds each product's even and odd chunks: [`Lanes::W`]
        let mut acc = [[L::zero2(); N]; M];
        let mut c = 0;
        while c + 2 <= chunks {
            let mut y = [L::zero2(); M];
            for m in 0..M {
                L::prefetch(ws[m].wrapping_add(c * 8 + ahead).cast());
                y[m] = wload2::<L, E>(ws[m].add(c * 8));
            }
            for r in 0..N {
                let x = L::load2(xs[r].add(c * 8));
                for m in 0..M {
                    acc[m][r] = L::mul_add2(acc[m][r], x, y[m]);
                }
            }
            c += 2;
        }
        let mut even = [[L::zero(); N]; M];
        let mut odd = [[L::zero(); N]; M];
        for m in 0..M {
            for r in 0..N {
                (even[m][r], odd[m][r]) = L::halves(acc[m][r]);
            }
        }
        if c < chunks {
            for r in 0..N {
                let x0 = L::load(xs[r].add(c * 8));
                for m in 0..M {
                    even[m][r] = L::mul_add(even[m][r], x0, wload::<L, E>(ws[m].add(c * 8)));
                }
            }
        }
        let mut out = [[0f32; N]; M];
        for m in 0..M {
            for r in 0..N {
                let mut tail = 0f32;
                for i in chunks * 8..len {
                    tail += *xs[r].add(i) * (*ws[m].add(i)).to_f32();
                }
                out[m][r] = L::reduce(L::add(even[m][r], odd[m][r])) + tail;
            }
        }
        out
    }
}

/// Dot products of `rows` (pointers to `len` floats) with `w`, in one pass over `w` for up to
/// six rows (twelve accumulators and two weight vectors fit in sixteen registers), four at a
/// time before that; `sink(i, value)` receives row `i`'s result.
///
/// # Safety
/// As [`dots`].
#[inline(always)]
pub(super) unsafe fn dots_many<L: Lanes, E: Weight>(
    rows: &[*const f32],
    w: *const E,
    len: usize,
    mut sink: impl FnMut(usize, f32),
) {
    let n = rows.len();
    let mut r = 0;
    // SAFETY: forwarded from the caller.
    unsafe {
        while n - r > 6 {
            let [d] = dots::<L, E, 4, 1>(first(&rows[r..]), [w], len);
            for (j, v) in d.into_iter().enumerate() {
                sink(r + j, v);
            }
            r += 4;
        }
        let rest = &rows[r..];
        let mut put = |d: &[f32]| {
            for (j, v) in d.iter().enumerate() {
                sink(r + j, *v);
            }
        };
        match rest.len() {
            6 => put(&dots::<L, E, 6, 1>(first(rest), [w], len)[0]),
            5 => put(&dots::<L, E, 5, 1>(first(rest), [w], len)[0]),
            4 => put(&dots::<L, E, 4, 1>(first(rest), [w], len)[0]),
            3 => put(&dots::<L, E, 3, 1>(first(rest), [w], len)[0]),
            2 => put(&dots::<L, E, 2, 1>(first(rest), [w], len)[0]),
            1 => put(&dots::<L, E, 1, 1>(first(rest), [w], len)[0]),
            _ => {}
        }
    }
}

/// The first `N` row pointers.
#[inline(always)]
pub(super) fn first<T, const N: usize>(rows: &[*const T]) -> [*const T; N] {
    std::array::from_fn(|i| rows[i])
}

/// How far ahead of its use a weight row is prefetched, in bytes (4 KiB). Decode streams the
/// weights from memory once per step; without the hint one core keeps too few cache lines in
/// flight once a few rows share each weight load, and a verify forward of 2–5 rows cost
/// 1.15–1.8 times one row on a matrix larger than the caches (`examples/matmul_rows`);
/// with it, 1.0–1.1. [`dots`] over two weight rows prefetches the same columns of the next
/// pair (7–12% faster for one and two inputs than 4 KiB, measured interleaved).
const PREFETCH_AHEAD: usize = 4096;

/// The reference arithmetic of one dot product, written out.
#[cfg(test)]
pub(super) fn lone(a: &[f32], b: &[f32], fused: bool) -> f32 {
    let chunks = a.len() / 8;
    let (mut even, mut odd) = ([0f32; 8], [0f32; 8]);
    for c in 0..chunks {
        let acc = if c % 2 == 0 { &mut even } else { &mut odd };
        for j in 0..8 {
            acc[j] = if fused {
                a[c * 8 + j].mul_add(b[c * 8 + j], acc[j])
            } else {
                a[c * 8 + j] * b[c * 8 + j] + acc[j]
            };
        }
    }
    let acc: Vec<f32> = even.iter().zip(&odd).map(|(e, o)| e + o).collect();
    let mut tail = 0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}
