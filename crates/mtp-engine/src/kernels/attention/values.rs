//! The weighted sums of the value rows in [`super::attention`]: `out[q] = inv[q] Σ_t w_q[t]
//! v[t]` for the queries of one KV head, a block of keys at a time ([`VALUE_BLOCK`]), in 8- or
//! 16-channel accumulators ([`Chunk`]).

use crate::kernels::lanes::Lanes;
use crate::kernels::weights::{wload, wload2, Weight};

/// The value rows of one KV head that a position's queries read: `visible` rows of `hd`
/// values (f32 or half precision, widened as loaded), row `t` at `values + t * stride`.
#[derive(Clone, Copy)]
pub(super) struct ValueRows<E> {
    pub(super) values: *const E,
    pub(super) stride: usize,
    pub(super) visible: usize,
    pub(super) hd: usize,
}

/// `N` heads of one position that read the same [`ValueRows`]: their softmax weights `ws[q]`
/// (`visible` floats), the weights' `1 / sum` `inv[q]`, their partial sums between blocks of
/// keys `part` (`2 N hd` floats: even chains, then odd ones; only used when a span is not all
/// the keys) and their outputs `outs[q]` (`hd` floats).
#[derive(Clone, Copy)]
pub(super) struct Heads<const N: usize> {
    pub(super) ws: [*const f32; N],
    pub(super) inv: [f32; N],
    pub(super) part: *mut f32,
    pub(super) outs: [*mut f32; N],
}

/// `out[q][c] = inv[q] * Σ_t w_q[t] v[t][c]` for `N` queries (`heads`) reading the same
/// `visible` value rows (`rows`: `v[t]` at `values + t * stride`, `hd` wide), the keys `span` of it: from zero when the
/// span starts at 0, else going on from the partial sums in `part`; written to `outs` when the
/// span ends at `visible`, else back to `part`. Even and odd `t` accumulate apart and are added
/// at the end: a fixed order per query and channel, whatever `N`, however the channels are
/// grouped into passes (eight accumulators each: four 8-channel chunks for one query, two for
/// two, one for four; sixteen with [`Lanes::WIDE`]: eight 16-channel chunks for one query, four
/// for two, two for four) and however the keys are split into spans (each starting on an even
/// key; see [`VALUE_BLOCK`]).
///
/// # Safety
/// `ws[q]` reads `visible` floats, `outs[q]` writes `hd`, `values` reads `visible` rows, `part`
/// holds `2 N hd` floats unless the span is all the keys; `span.start` is even and `span`
/// inside `0..visible`; the CPU supports `L`.
#[inline(always)]
pub(super) unsafe fn weighted_values<L: Lanes, E: Weight, const N: usize>(
    heads: Heads<N>,
    rows: ValueRows<E>,
    span: std::ops::Range<usize>,
) {
    let Heads {
        ws,
        inv,
        part,
        outs,
    } = heads;
    let ValueRows {
        values,
        stride,
        visible,
        hd,
    } = rows;
    // SAFETY (all accesses): within the bounds the caller guarantees.
    unsafe {
        let mut c = 0;
        // passes of `G` chunks of `$chunk` while `G` of them are left
        macro_rules! passes {
            ($chunk:ty, $g:literal) => {
                while c + <$chunk as Chunk<L>>::WIDTH * $g <= hd {
                    values_pass::<L, E, $chunk, N, $g>(heads, rows, span.clone(), c);
                    c += <$chunk as Chunk<L>>::WIDTH * $g;
                }
            };
        }
        // sixteen accumulators: in 16-channel registers where the CPU has 32 of them, else
        // in 8-channel ones
        if L::WIDE {
            match N {
                1 => passes!(Wide, 8),
                2 => passes!(Wide, 4),
                _ => passes!(Wide, 2),
            }
            passes!(Wide, 1);
        } else {
            match N {
                1 => passes!(Narrow, 4),
                2 => passes!(Narrow, 2),
                _ => {}
            }
        }
        passes!(Narrow, 1);
        for q in 0..N {
            for cc in c..hd {
                // (only read and written when the span is not all the keys, and so `part` is
                // allocated)
                let (pe, po) = (
                    part.wrapping_add(q * hd + cc),
                    part.wrapping_add((N + q) * hd + cc),
                );
                let (mut even, mut odd) = if span.start > 0 {
                    (*pe, *po)
                } else {
                    (0f32, 0f32)
                };
                let mut t = span.start;
                while t + 2 <= span.end {
                    even += *ws[q].add(t) * (*values.add(t * stride + cc)).to_f32();
                    odd += *ws[q].add(t + 1) * (*values.add((t + 1) * stride + cc)).to_f32();
                    t += 2;
                }
                if t < span.end {
                    even += *ws[q].add(t) * (*values.add(t * stride + cc)).to_f32();
                }
                if span.end == visible {
                    *outs[q].add(cc) = (even + odd) * inv[q];
                } else {
                    (*pe, *po) = (even, odd);
                }
            }
        }
    }
}

/// Value rows per block of `attention`'s weighted sums (even, so that each block starts on an
/// even key and the even and odd chains stay the same): a task takes the keys a block at a
/// time, and every position of its tile sums its weights of the block's rows while they are in
/// L1 (16 KiB at 128 channels), carrying its partial sums from block to block; position by
/// position, a long prompt's value rows came from L3 again for every position (each byte
/// used by four multiply-adds per head group).
pub(super) const VALUE_BLOCK: usize = 32;

/// The vectors a [`values_pass`] accumulates in: 8 channels ([`Narrow`], `L::V`) or 16
/// ([`Wide`], `L::W`: one register where [`Lanes::WIDE`], twice the channels per multiply-add
/// and per broadcast weight). Each lane is one channel's chain either way, so the bits do not
/// depend on which.
trait Chunk<L: Lanes> {
    type T: Copy;
    /// Channels per vector.
    const WIDTH: usize;
    /// # Safety
    /// The CPU supports `L`.
    unsafe fn zero() -> Self::T;
    /// # Safety
    /// `p` reads [`Chunk::WIDTH`] floats; the CPU supports `L`.
    unsafe fn load(p: *const f32) -> Self::T;
    /// [`Chunk::WIDTH`] values at `p` widened to f32 (exact).
    ///
    /// # Safety
    /// `p` reads [`Chunk::WIDTH`] values; the CPU supports `L`.
    unsafe fn load_e<E: Weight>(p: *const E) -> Self::T;
    /// # Safety
    /// The CPU supports `L`.
    unsafe fn splat(x: f32) -> Self::T;
    /// `acc + a * b` per lane, as [`Lanes::mul_add`].
    ///
    /// # Safety
    /// The CPU supports `L`.
    unsafe fn mul_add(acc: Self::T, a: Self::T, b: Self::T) -> Self::T;
    /// # Safety
    /// `p` writes [`Chunk::WIDTH`] floats; the CPU supports `L`.
    unsafe fn store(p: *mut f32, v: Self::T);
    /// `p[j] = (even[j] + odd[j]) * s`.
    ///
    /// # Safety
    /// As [`Chunk::store`].
    unsafe fn store_sum_scaled(p: *mut f32, even: Self::T, odd: Self::T, s: f32);
}

/// 8-channel [`Chunk`]s.
struct Narrow;

impl<L: Lanes> Chunk<L> for Narrow {
    type T = L::V;
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> L::V {
        // SAFETY (all five): forwarded from the caller.
        unsafe { L::zero() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> L::V {
        unsafe { L::load(p) }
    }
    #[inline(always)]
    unsafe fn load_e<E: Weight>(p: *const E) -> L::V {
        unsafe { wload::<L, E>(p) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> L::V {
        unsafe { L::splat(x) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: L::V, a: L::V, b: L::V) -> L::V {
        unsafe { L::mul_add(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: L::V) {
        unsafe { L::store(p, v) }
    }
    #[inline(always)]
    unsafe fn store_sum_scaled(p: *mut f32, even: L::V, odd: L::V, s: f32) {
        // SAFETY: forwarded from the caller.
        unsafe { L::store(p, L::mul(L::add(even, odd), L::splat(s))) }
    }
}

/// 16-channel [`Chunk`]s (two 8-channel ones, `[low | high]`).
struct Wide;

impl<L: Lanes> Chunk<L> for Wide {
    type T = L::W;
    const WIDTH: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> L::W {
        // SAFETY (all four): forwarded from the caller.
        unsafe { L::zero2() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> L::W {
        unsafe { L::load2(p) }
    }
    #[inline(always)]
    unsafe fn load_e<E: Weight>(p: *const E) -> L::W {
        unsafe { wload2::<L, E>(p) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> L::W {
        unsafe { L::splat2(x) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: L::W, a: L::W, b: L::W) -> L::W {
        unsafe { L::mul_add2(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: L::W) {
        // SAFETY: forwarded from the caller (16 floats).
        unsafe {
            let (lo, hi) = L::halves(v);
            L::store(p, lo);
            L::store(p.add(8), hi);
        }
    }
    #[inline(always)]
    unsafe fn store_sum_scaled(p: *mut f32, even: L::W, odd: L::W, s: f32) {
        // SAFETY: forwarded from the caller (16 floats).
        unsafe {
            let ((e0, e1), (o0, o1)) = (L::halves(even), L::halves(odd));
            <Narrow as Chunk<L>>::store_sum_scaled(p, e0, o0, s);
            <Narrow as Chunk<L>>::store_sum_scaled(p.add(8), e1, o1, s);
        }
    }
}

/// Channels `c..c + C::WIDTH * G` of [`weighted_values`] over keys `span`: from zero when the
/// span starts at 0, else going on from the partial sums in `part` (even chains at `q · hd`,
/// odd ones at `(N + q) · hd`); the results go to `outs` when the span ends at `visible`, else
/// the partial sums back to `part`.
///
/// # Safety
/// As [`weighted_values`], with `c + C::WIDTH * G <= hd`, `span` inside `0..visible`, and
/// `part` holding `2 N hd` floats unless the span is all the keys.
#[inline(always)]
unsafe fn values_pass<L: Lanes, E: Weight, C: Chunk<L>, const N: usize, const G: usize>(
    heads: Heads<N>,
    rows: ValueRows<E>,
    span: std::ops::Range<usize>,
    c: usize,
) {
    let Heads {
        ws,
        inv,
        part,
        outs,
    } = heads;
    let ValueRows {
        values,
        stride,
        visible,
        hd,
    } = rows;
    let width = C::WIDTH;
    // SAFETY (all accesses): within the bounds the caller guarantees.
    unsafe {
        let mut even = [[C::zero(); G]; N];
        let mut odd = [[C::zero(); G]; N];
        if span.start > 0 {
            for q in 0..N {
                for g in 0..G {
                    even[q][g] = C::load(part.add(q * hd + c + g * width));
                    odd[q][g] = C::load(part.add((N + q) * hd + c + g * width));
                }
            }
        }
        let mut t = span.start;
        while t + 2 <= span.end {
            let (r0, r1) = (values.add(t * stride + c), values.add((t + 1) * stride + c));
            for q in 0..N {
                let (w0, w1) = (C::splat(*ws[q].add(t)), C::splat(*ws[q].add(t + 1)));
                for g in 0..G {
                    even[q][g] = C::mul_add(even[q][g], w0, C::load_e(r0.add(g * width)));
                    odd[q][g] = C::mul_add(odd[q][g], w1, C::load_e(r1.add(g * width)));
                }
            }
            t += 2;
        }
        if t < span.end {
            let r0 = values.add(t * stride + c);
            for q in 0..N {
                let w0 = C::splat(*ws[q].add(t));
                for (g, e) in even[q].iter_mut().enumerate() {
                    *e = C::mul_add(*e, w0, C::load_e(r0.add(g * width)));
                }
            }
        }
        for q in 0..N {
            for g in 0..G {
                let at = c + g * width;
                if span.end == visible {
                    C::store_sum_scaled(outs[q].add(at), even[q][g], odd[q][g], inv[q]);
                } else {
                    C::store(part.add(q * hd + at), even[q][g]);
                    C::store(part.add((N + q) * hd + at), odd[q][g]);
                }
            }
        }
    }
}
