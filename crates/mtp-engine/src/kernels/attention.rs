//! Cached attention ([`attention`]): causal softmax attention of new queries against a
//! sequence's cached keys and values, in tasks per KV head and tile of positions, each query
//! with the arithmetic of a lone query. The weighted sums of the value rows are in `values`.

mod values;

use super::aligned::Aligned;
use super::cpu::{self, Isa};
use super::dot::dots;
use super::elements;
#[cfg(target_arch = "x86_64")]
use super::lanes::{Avx, Avx512};
use super::lanes::{Lanes, Portable};
use super::weights::{wload, wload2, Weight};
use values::{weighted_values, Heads, ValueRows, VALUE_BLOCK};

/// The shape of one [`attention`] call: `l` new queries of `h` heads over `hkv` KV heads, each
/// `hd` wide, their scores scaled by `scale`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// New queries (positions).
    pub l: usize,
    /// Query heads (a multiple of `hkv`).
    pub h: usize,
    /// Key and value heads.
    pub hkv: usize,
    /// Head width.
    pub hd: usize,
    /// The factor on every score.
    pub scale: f32,
}

/// Causal attention of `shape.l` new queries against a sequence's cached keys and values.
///
/// `q`: `[l, h, hd]`; `keys`, `values`: `[t, hkv, hd]` including the new positions, so query `i`
/// sees keys `0..=t - l + i`. Returns `[l, h, hd]`. Keys and values are f32, or half precision
/// (`f16`, `bf16`: a KV cache in half the memory and half the bytes read per step), widened to
/// f32 as they are loaded: exact, so the result has the bits of the same call over the keys and
/// values converted to f32 beforehand. The work is split into tasks, one per KV
/// head and tile of positions, run in parallel on the worker team when there is enough of it
/// (a decode step's KV heads run side by side). Within a task the queries that read the KV head
/// are scored against eight keys at a time, each key block brought into L1 once for all of them,
/// and the eight sums reduced together; the weighted values are summed a block of keys at a
/// time, every position of the task through each block while it is in L1 (see
/// `VALUE_BLOCK`). Each query's arithmetic is that of a lone query, whatever the tiling, so a
/// verify row has the bits of a single-token step. A task's scores
/// (its positions × queries per KV head × keys) stay within a budget (4 MiB), so a long prompt
/// does not hold a full score matrix.
///
/// # Panics
/// When `h`, `hkv` or `hd` is zero, `h` is not a multiple of `hkv`, `q` is not `[l, h, hd]`,
/// `keys` not whole `[hkv, hd]` positions, `values` not as long as `keys`, or fewer positions
/// are cached than there are queries.
pub fn attention<E: Weight>(
    q: &[f32],
    keys: &[E],
    values: &[E],
    shape: AttentionShape,
) -> Vec<f32> {
    // the queries on a cache line, like the cache's keys and values ([`Aligned`])
    let q = Aligned::copy(q);
    attention_impl(q.values(), keys, values, shape, Tiling::DEFAULT)
}

/// How [`attention_impl`] runs: on which instruction set (no wider than detected), with tasks
/// holding at most `budget` scores and the value rows taken in blocks of `value_block` keys.
#[derive(Clone, Copy, Debug)]
struct Tiling {
    isa: Isa,
    budget: usize,
    /// Keys per block of value rows (even; see [`VALUE_BLOCK`]).
    value_block: usize,
}

impl Tiling {
    /// What [`attention`] uses: the detected instruction set, [`SCORE_BUDGET`], [`VALUE_BLOCK`].
    const DEFAULT: Tiling = Tiling {
        isa: Isa::Avx512,
        budget: SCORE_BUDGET,
        value_block: VALUE_BLOCK,
    };
}

/// [`attention`] on `tiling.isa` (narrowed to what was detected).
fn attention_impl<E: Weight>(
    q: &[f32],
    keys: &[E],
    values: &[E],
    shape: AttentionShape,
    tiling: Tiling,
) -> Vec<f32> {
    let AttentionShape { l, h, hkv, hd, .. } = shape;
    let Tiling {
        budget,
        value_block,
        ..
    } = tiling;
    assert!(
        h > 0 && hkv > 0 && hd > 0 && h.is_multiple_of(hkv) && value_block >= 2,
        "attention: {h} heads over {hkv} KV heads of width {hd}"
    );
    let stride = elements(&[hkv, hd]).expect("attention: KV heads × width overflow");
    let t_total = keys.len() / stride;
    assert!(
        elements(&[l, h, hd]) == Some(q.len()),
        "attention: the queries hold {} floats, expected [{l}, {h}, {hd}]",
        q.len()
    );
    assert!(
        keys.len() == t_total * stride && values.len() == keys.len(),
        "attention: keys ({}) and values ({}) are not the same whole positions of [{hkv}, {hd}]",
        keys.len(),
        values.len()
    );
    assert!(
        t_total >= l,
        "attention: {t_total} cached positions for {l} queries"
    );
    let mut out = crate::scratch::zeroed(q.len());
    if l == 0 {
        return out;
    }
    let rep = h / hkv;
    let tile = (budget / rep.saturating_mul(t_total)).clamp(1, l);
    let tiles = l.div_ceil(tile);
    let job = AttentionJob {
        q,
        keys,
        values,
        shape,
        tile,
        value_block: value_block & !1,
        out: out.as_mut_ptr(),
    };
    let isa = tiling.isa.min(cpu::isa());
    let work = |task: usize| {
        let (kvh, ti) = (task / tiles, task % tiles);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2, FMA and AVX-512F were detected on this CPU; as below.
            Isa::Avx512 => unsafe { attention_task_avx512(&job, kvh, ti) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX (with F16C) was detected on this CPU; task `(kvh, ti)` writes only its own
            // heads and positions of `out`, which outlives the loop.
            Isa::Avx2 => unsafe { attention_task_avx(&job, kvh, ti) },
            // SAFETY: the portable lanes need no particular instruction set; as above.
            _ => unsafe { attention_task::<Portable, E>(&job, kvh, ti) },
        }
    };
    let tasks = hkv * tiles;
    // a few microseconds of work pay for a split (see `matmul_rows`)
    if tasks >= 2 && l * h * t_total * hd >= 1 << 14 {
        crate::team::run(tasks, &work);
    } else {
        (0..tasks).for_each(work);
    }
    out
}

/// Most scores one attention task holds (4 MiB of f32).
const SCORE_BUDGET: usize = 1 << 20;

/// One [`attention`] call, shared by its tasks.
struct AttentionJob<'a, E> {
    q: &'a [f32],
    keys: &'a [E],
    values: &'a [E],
    shape: AttentionShape,
    /// Positions per task.
    tile: usize,
    /// Keys per block of value rows (even; see [`VALUE_BLOCK`]).
    value_block: usize,
    /// The `[l, h, hd]` result, written in place by the tasks.
    out: *mut f32,
}

// SAFETY: tasks write disjoint heads and positions of `out` (see `attention`).
unsafe impl<E: Sync> Sync for AttentionJob<'_, E> {}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn attention_task_avx<E: Weight>(job: &AttentionJob<'_, E>, kvh: usize, tile: usize) {
    // SAFETY: this function is only called when AVX and F16C were detected; the rest is
    // forwarded.
    unsafe { attention_task::<Avx, E>(job, kvh, tile) }
}

/// [`attention_task_avx`] with the score products' chunk pairs in 16-lane vectors (same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c,avx512f")]
unsafe fn attention_task_avx512<E: Weight>(job: &AttentionJob<'_, E>, kvh: usize, tile: usize) {
    // SAFETY: this function is only called when AVX-512F (with F16C) was detected; the rest is
    // forwarded.
    unsafe { attention_task::<Avx512, E>(job, kvh, tile) }
}

/// The dot products of each of the `Q` rows `xs` with the eight key rows `ks` (`len` values
/// each, widened to f32 as loaded),
/// each summed exactly as [`dots`] sums one (even and odd 8-float chunks apart,
/// [`Lanes::reduce`], then the tail), one vector per row of `xs`. Two rows of `xs` share each
/// load of the keys (with [`Lanes::WIDE`]: eight pair accumulators of the 32 registers); every
/// product keeps its own chain, so the bits do not depend on `Q`. (Loops, not closures: a
/// closure is not compiled for the caller's instruction set.)
///
/// # Safety
/// Every row of `xs` and `ks` reads `len` values; the CPU supports `L`.
#[inline(always)]
unsafe fn dots8<L: Lanes, E: Weight, const Q: usize>(
    xs: [*const f32; Q],
    ks: [*const E; 8],
    len: usize,
) -> [L::V; Q] {
    let chunks = len / 8;
    // SAFETY (all reads): `c * 8 + 8 <= len` and `i < len`.
    unsafe {
        let mut v = [[L::zero(); 8]; Q];
        for half in 0..2 {
            let mut k = [ks[0]; 4];
            for m in 0..4 {
                k[m] = ks[half * 4 + m];
            }
            // `[even | odd]` chunk pairs: one 16-lane multiply-add for both where the CPU has
            // them (`Lanes::W`), each lane's chain as with two 8-lane ones
            let mut pair = [[L::zero2(); 4]; Q];
            let mut c = 0;
            while c + 2 <= chunks {
                let mut x = [L::zero2(); Q];
                for i in 0..Q {
                    x[i] = L::load2(xs[i].add(c * 8));
                }
                for m in 0..4 {
                    let km = wload2::<L, E>(k[m].add(c * 8));
                    for i in 0..Q {
                        pair[i][m] = L::mul_add2(pair[i][m], x[i], km);
                    }
                }
                c += 2;
            }
            for i in 0..Q {
                for m in 0..4 {
                    let (mut even, odd) = L::halves(pair[i][m]);
                    if c < chunks {
                        even = L::mul_add(
                            even,
                            L::load(xs[i].add(c * 8)),
                            wload::<L, E>(k[m].add(c * 8)),
                        );
                    }
                    v[i][half * 4 + m] = L::add(even, odd);
                }
            }
        }
        let mut out = [L::zero(); Q];
        for i in 0..Q {
            let mut tails = [0f32; 8];
            for (m, tail) in tails.iter_mut().enumerate() {
                for j in chunks * 8..len {
                    *tail += *xs[i].add(j) * (*ks[m].add(j)).to_f32();
                }
            }
            out[i] = L::add(L::reduce8(v[i]), L::load(tails.as_ptr()));
        }
        out
    }
}

/// Turns scores into unnormalised softmax weights in place; returns `1 / sum`. Max and sum run
/// over 8 lanes in a fixed order, so the result depends only on the row; the exponentials are
/// one flat pass (vectorized where the caller's instruction set allows).
#[inline(always)]
fn softmax_weights(s: &mut [f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            m[j] = m[j].max(c[j]);
        }
    }
    let max = chunks.remainder().iter().fold(
        m.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        |a, b| a.max(*b),
    );
    for v in s.iter_mut() {
        *v = crate::kernels::exp(*v - max);
    }
    let mut acc = [0f32; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] += c[j];
        }
    }
    let tail = chunks.remainder().iter().fold(0f32, |a, v| a + v);
    let sum =
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
    1.0 / sum
}

/// What task `(kvh, tile)` of [`attention`] covers: the heads of KV head `kvh` at positions
/// `i0..i1`, and the keys they see.
#[derive(Clone, Copy)]
struct TaskSpan {
    kvh: usize,
    i0: usize,
    i1: usize,
    /// Query heads per KV head.
    rep: usize,
    /// Keys before `shared` are visible to every query; key `shared + i` only to positions > i.
    shared: usize,
    /// The keys the tile's last position sees (earlier positions' extra scores go unread).
    seen: usize,
    /// The task's queries: query `j` is position `i0 + j / rep`, head `j % rep` of the group.
    nq: usize,
}

impl TaskSpan {
    #[inline(always)]
    fn new<E>(job: &AttentionJob<'_, E>, kvh: usize, tile: usize) -> TaskSpan {
        let AttentionShape { l, h, hkv, hd, .. } = job.shape;
        let t_total = job.keys.len() / (hkv * hd);
        let rep = h / hkv;
        let shared = t_total - l + 1;
        let i0 = tile * job.tile;
        let i1 = (i0 + job.tile).min(l);
        let seen = shared + i1 - 1;
        TaskSpan {
            kvh,
            i0,
            i1,
            rep,
            shared,
            seen,
            nq: (i1 - i0) * rep,
        }
    }
}

/// Task `(kvh, tile)` of [`attention`]: the heads of KV head `kvh` at the positions of `tile`.
///
/// # Safety
/// The CPU supports `L`; no other task writes the same heads and positions of `job.out`.
#[inline(always)]
unsafe fn attention_task<L: Lanes, E: Weight>(job: &AttentionJob<'_, E>, kvh: usize, tile: usize) {
    thread_local! {
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        static PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let task = TaskSpan::new(job, kvh, tile);
    // (taken out of the thread's buffer and put back: code in a closure would not be compiled
    // for `L`'s instruction set)
    let mut scores = SCORES.with_borrow_mut(std::mem::take);
    {
        // scores[j * seen + t]
        scores.resize(
            task.nq
                .checked_mul(task.seen)
                .expect("attention: too many scores for one task"),
            0.0,
        );
        // SAFETY: the caller guarantees `L`.
        unsafe { task_scores::<L, E>(job, task, &mut scores) };
        let inv = task_softmax(task, &mut scores);
        // each query's partial sums between blocks: even chains, then odd ones, per head group
        let mut part = PARTS.with_borrow_mut(std::mem::take);
        if task.seen > job.value_block {
            part.resize(task.nq * 2 * job.shape.hd, 0.0);
        }
        // SAFETY: forwarded from the caller.
        unsafe { task_values::<L, E>(job, task, &scores, &inv, &mut part) };
        PARTS.with_borrow_mut(|p| *p = part);
    }
    SCORES.with_borrow_mut(|s| *s = scores);
}

/// The scaled scores of the task's queries against the keys they see: `scores[j · seen + t]`.
///
/// # Safety
/// The CPU supports `L`.
///
/// # Panics
/// When `scores` is not `nq · seen` floats.
#[inline(always)]
unsafe fn task_scores<L: Lanes, E: Weight>(
    job: &AttentionJob<'_, E>,
    task: TaskSpan,
    scores: &mut [f32],
) {
    let AttentionShape {
        h, hkv, hd, scale, ..
    } = job.shape;
    let TaskSpan {
        kvh,
        i0,
        rep,
        seen,
        nq,
        ..
    } = task;
    assert_eq!(scores.len(), nq * seen, "attention: the scores of a task");
    let qp = |j: usize| {
        let head = kvh * rep + j % rep;
        job.q[((i0 + j / rep) * h + head) * hd..].as_ptr()
    };
    let key = |t: usize| job.keys[(t * hkv + kvh) * hd..].as_ptr();
    let sp = scores.as_mut_ptr();
    // SAFETY: every query and key row holds `hd` floats and `t + 8 <= seen` (or `t <
    // seen`) keys exist; `sp` holds `nq * seen` floats; the caller guarantees `L`.
    unsafe {
        let mut t = 0;
        while t + 8 <= seen {
            let ks = std::array::from_fn(|m| key(t + m));
            let mut j = 0;
            // two queries share each key load where the registers allow it
            while L::WIDE && j + 2 <= nq {
                let [s0, s1] = dots8::<L, E, 2>([qp(j), qp(j + 1)], ks, hd);
                L::store(sp.add(j * seen + t), L::mul(s0, L::splat(scale)));
                L::store(sp.add((j + 1) * seen + t), L::mul(s1, L::splat(scale)));
                j += 2;
            }
            while j < nq {
                let [s] = dots8::<L, E, 1>([qp(j)], ks, hd);
                L::store(sp.add(j * seen + t), L::mul(s, L::splat(scale)));
                j += 1;
            }
            t += 8;
        }
        while t < seen {
            for j in 0..nq {
                let [[v]] = dots::<L, E, 1, 1>([qp(j)], [key(t)], hd);
                *sp.add(j * seen + t) = v * scale;
            }
            t += 1;
        }
    }
}

/// Each query's scores, over the keys its position sees, turned into softmax weights (see
/// [`softmax_weights`]); their sums' inverses, one per query.
#[inline(always)]
fn task_softmax(task: TaskSpan, scores: &mut [f32]) -> Vec<f32> {
    let TaskSpan {
        i0,
        i1,
        rep,
        shared,
        seen,
        nq,
        ..
    } = task;
    let mut inv = vec![0f32; nq];
    for i in i0..i1 {
        let visible = shared + i;
        for r in 0..rep {
            let j = (i - i0) * rep + r;
            inv[j] = softmax_weights(&mut scores[j * seen..j * seen + visible]);
        }
    }
    inv
}

/// The task's outputs: each query's value rows weighted by its softmax weights (`scores`,
/// scaled by `inv`), in blocks of `job.value_block` keys, the partial sums between blocks in
/// `part` (`nq · 2 · hd` floats where the keys seen are more than one block).
///
/// # Safety
/// The CPU supports `L`; no other task writes the same heads and positions of `job.out`.
///
/// # Panics
/// When `scores` is not `nq · seen` floats, `inv` not `nq`, or `part` too short for the
/// partial sums.
#[inline(always)]
unsafe fn task_values<L: Lanes, E: Weight>(
    job: &AttentionJob<'_, E>,
    task: TaskSpan,
    scores: &[f32],
    inv: &[f32],
    part: &mut [f32],
) {
    let AttentionShape { h, hkv, hd, .. } = job.shape;
    let TaskSpan {
        kvh,
        i0,
        i1,
        rep,
        shared,
        seen,
        nq,
    } = task;
    let block = job.value_block;
    assert!(
        scores.len() == nq * seen
            && inv.len() == nq
            && (seen <= block || part.len() >= nq * 2 * hd),
        "attention: the buffers of a task"
    );
    let stride = hkv * hd;
    let vals = job.values[kvh * hd..].as_ptr();
    let (sp, pp) = (scores.as_ptr(), part.as_mut_ptr());
    let mut t0 = 0;
    while t0 < seen {
        let t1 = t0.saturating_add(block).min(seen);
        for i in i0..i1 {
            let visible = shared + i;
            if visible <= t0 {
                continue;
            }
            let span = t0..t1.min(visible);
            let rows = ValueRows {
                values: vals,
                stride,
                visible,
                hd,
            };
            let row = (i - i0) * rep;
            // SAFETY (both): `(row + r) * seen + seen <= nq * seen`, the scores' length;
            // `(i * h + head) * hd + hd <= l * h * hd`, the result's.
            let w = |r: usize| unsafe { sp.add((row + r) * seen) };
            let o = |r: usize| unsafe { job.out.add((i * h + kvh * rep + r) * hd) };
            // inside the partial sums (`nq * 2 * hd`) when a span is not all the keys, and
            // not read otherwise
            let p = |r: usize| pp.wrapping_add((row + r) * 2 * hd);
            // the heads of this position, four, two or one at a time
            let mut r = 0;
            // SAFETY: each weight row holds `visible` floats, each output `hd`, each group's
            // partial sums `2 N hd` where used, and `values` `visible` rows of `stride`;
            // spans start on even keys (`block` is even); the caller guarantees `L` and
            // that no other task writes these outputs.
            unsafe {
                while r + 4 <= rep {
                    let heads = Heads {
                        ws: [w(r), w(r + 1), w(r + 2), w(r + 3)],
                        inv: [
                            inv[row + r],
                            inv[row + r + 1],
                            inv[row + r + 2],
                            inv[row + r + 3],
                        ],
                        part: p(r),
                        outs: [o(r), o(r + 1), o(r + 2), o(r + 3)],
                    };
                    weighted_values::<L, E, 4>(heads, rows, span.clone());
                    r += 4;
                }
                if r + 2 <= rep {
                    let heads = Heads {
                        ws: [w(r), w(r + 1)],
                        inv: [inv[row + r], inv[row + r + 1]],
                        part: p(r),
                        outs: [o(r), o(r + 1)],
                    };
                    weighted_values::<L, E, 2>(heads, rows, span.clone());
                    r += 2;
                }
                if r < rep {
                    let heads = Heads {
                        ws: [w(r)],
                        inv: [inv[row + r]],
                        part: p(r),
                        outs: [o(r)],
                    };
                    weighted_values::<L, E, 1>(heads, rows, span);
                }
            }
        }
        t0 = t1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::cpu::{isas, with_isa, Isa};
    use crate::kernels::lanes::detected_fused;
    use crate::testing::{self, close, dot64, expect_panic, rng, CASES};
    use proptest::prelude::*;

    /// Value rows in blocks of keys give the bits of one pass over all the keys, on both paths,
    /// for 1-4 heads per KV head, widths with and without a tail of 8-channel chunks or of
    /// channels, caches of one block, one and a key, and several blocks and some (every
    /// position of a task going through each block); a verify's rows still equal single
    /// queries there.
    #[test]
    fn value_blocks_keep_the_bits() {
        let mut next = rng(41);
        for (rep, hkv, hd) in [
            (1usize, 2usize, 16usize),
            (2, 1, 40),
            (3, 2, 24),
            (4, 2, 128),
            (3, 1, 13),
        ] {
            let h = rep * hkv;
            for t_total in [VALUE_BLOCK, VALUE_BLOCK + 1, 3 * VALUE_BLOCK + 7] {
                let l = 3;
                let keys: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let values: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
                let scale = 1.0 / (hd as f32).sqrt();
                for avx in [false, true] {
                    let run = |block: usize| {
                        attention_impl(
                            &q,
                            &keys,
                            &values,
                            AttentionShape {
                                l,
                                h,
                                hkv,
                                hd,
                                scale,
                            },
                            Tiling {
                                isa: if avx { Isa::Avx512 } else { Isa::Portable },
                                budget: SCORE_BUDGET,
                                value_block: block,
                            },
                        )
                    };
                    let blocked = run(VALUE_BLOCK);
                    assert_eq!(
                        testing::bits(&blocked),
                        testing::bits(&run(usize::MAX)),
                        "{rep} x {hkv} heads of {hd}, {t_total} keys, avx {avx}"
                    );
                    assert_eq!(testing::bits(&blocked), testing::bits(&run(2)));
                    // every vector instruction set this CPU runs: the same bits (AVX-512 takes
                    // the score products' chunk pairs in 16-lane vectors)
                    if avx {
                        for isa in isas().into_iter().filter(|&isa| isa != Isa::Portable) {
                            let got = with_isa(isa, || run(VALUE_BLOCK));
                            assert_eq!(testing::bits(&blocked), testing::bits(&got), "{isa:?}");
                        }
                    }
                    for i in 0..l {
                        let seen = (t_total - l + i + 1) * hkv * hd;
                        let one = attention_impl(
                            &q[i * h * hd..(i + 1) * h * hd],
                            &keys[..seen],
                            &values[..seen],
                            AttentionShape {
                                l: 1,
                                h,
                                hkv,
                                hd,
                                scale,
                            },
                            Tiling {
                                isa: if avx { Isa::Avx512 } else { Isa::Portable },
                                budget: SCORE_BUDGET,
                                value_block: VALUE_BLOCK,
                            },
                        );
                        assert_eq!(
                            testing::bits(&blocked[i * h * hd..(i + 1) * h * hd]),
                            testing::bits(&one)
                        );
                    }
                }
            }
        }
    }

    /// A verify forward's attention rows equal the single-query results bit for bit, and agree
    /// with a plain softmax-attention written out.
    #[test]
    fn attention_rows_match_single_queries_and_the_definition() {
        let mut next = rng(7);
        for (h, hkv, hd) in [
            (4usize, 2usize, 16usize),
            (2, 2, 12),
            (8, 1, 32),
            (4, 2, 64),
        ] {
            for l in 1..=6 {
                let t_total = 9 + l;
                let keys: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let values: Vec<f32> = (0..t_total * hkv * hd).map(|_| next()).collect();
                let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
                let scale = 1.0 / (hd as f32).sqrt();
                let shape = AttentionShape {
                    l,
                    h,
                    hkv,
                    hd,
                    scale,
                };
                // each query alone
                let lone = AttentionShape { l: 1, ..shape };
                let all = attention(&q, &keys, &values, shape);
                // SAFETY: no particular instruction set needed.
                let portable = attention_impl(
                    &q,
                    &keys,
                    &values,
                    shape,
                    Tiling {
                        isa: Isa::Portable,
                        budget: SCORE_BUDGET,
                        value_block: VALUE_BLOCK,
                    },
                );
                // one position per task: the same bits
                for budget in [1, 2 * (h / hkv) * t_total] {
                    let tiled = attention_impl(
                        &q,
                        &keys,
                        &values,
                        shape,
                        Tiling {
                            isa: Isa::Avx512,
                            budget,
                            value_block: VALUE_BLOCK,
                        },
                    );
                    assert!(all
                        .iter()
                        .zip(&tiled)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
                for i in 0..l {
                    let seen = t_total - l + i + 1;
                    let one = attention(
                        &q[i * h * hd..(i + 1) * h * hd],
                        &keys[..seen * hkv * hd],
                        &values[..seen * hkv * hd],
                        lone,
                    );
                    let row = &all[i * h * hd..(i + 1) * h * hd];
                    assert!(row
                        .iter()
                        .zip(&one)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                    let one_portable = attention_impl(
                        &q[i * h * hd..(i + 1) * h * hd],
                        &keys[..seen * hkv * hd],
                        &values[..seen * hkv * hd],
                        lone,
                        Tiling {
                            isa: Isa::Portable,
                            budget: SCORE_BUDGET,
                            value_block: VALUE_BLOCK,
                        },
                    );
                    let same = |a: &[f32], b: &[f32]| {
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    let prow = &portable[i * h * hd..(i + 1) * h * hd];
                    assert!(same(prow, &one_portable));
                    if Portable::FUSED == detected_fused() {
                        assert!(same(prow, &one));
                    }
                    for head in 0..h {
                        let kvh = head / (h / hkv);
                        let qv = &q[(i * h + head) * hd..(i * h + head + 1) * hd];
                        let s: Vec<f64> = (0..seen)
                            .map(|t| {
                                let k = &keys[(t * hkv + kvh) * hd..(t * hkv + kvh + 1) * hd];
                                qv.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>()
                                    * scale as f64
                            })
                            .collect();
                        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                        for c in 0..hd {
                            let want: f64 = (0..seen)
                                .map(|t| {
                                    (s[t] - m).exp() / z * values[(t * hkv + kvh) * hd + c] as f64
                                })
                                .sum();
                            let got = row[head * hd + c] as f64;
                            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    /// Half-precision keys and values (a KV cache in f16 or bf16) give the bits of the same
    /// call over them widened to f32 beforehand, on every path this CPU runs, for widths with
    /// and without tails and caches across value blocks (the widening is exact and the
    /// arithmetic after it the f32 path's).
    #[test]
    fn half_precision_caches_are_widened_exactly() {
        let mut next = rng(43);
        for (rep, hkv, hd, t_total, l) in [
            (2usize, 2usize, 256usize, 3 * VALUE_BLOCK + 5, 1usize),
            (1, 2, 16, 9, 3),
            (3, 1, 13, VALUE_BLOCK + 1, 2),
            (4, 2, 40, 70, 4),
        ] {
            let h = rep * hkv;
            let keys: Vec<f32> = (0..t_total * hkv * hd).map(|_| next() * 3.0).collect();
            let values: Vec<f32> = (0..t_total * hkv * hd).map(|_| next() * 3.0).collect();
            let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
            let shape = AttentionShape {
                l,
                h,
                hkv,
                hd,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let (k16, v16): (Vec<half::f16>, Vec<half::f16>) = (
                keys.iter().map(|&x| half::f16::from_f32(x)).collect(),
                values.iter().map(|&x| half::f16::from_f32(x)).collect(),
            );
            let (kb, vb): (Vec<half::bf16>, Vec<half::bf16>) = (
                keys.iter().map(|&x| half::bf16::from_f32(x)).collect(),
                values.iter().map(|&x| half::bf16::from_f32(x)).collect(),
            );
            fn wide<E: Weight>(x: &[E]) -> Vec<f32> {
                x.iter().map(|v| v.to_f32()).collect()
            }
            for isa in isas() {
                with_isa(isa, || {
                    let want = attention(&q, &wide(&k16), &wide(&v16), shape);
                    let got = attention(&q, &k16, &v16, shape);
                    assert_eq!(testing::bits(&got), testing::bits(&want), "f16 {isa:?}");
                    let want = attention(&q, &wide(&kb), &wide(&vb), shape);
                    let got = attention(&q, &kb, &vb, shape);
                    assert_eq!(testing::bits(&got), testing::bits(&want), "bf16 {isa:?}");
                });
            }
        }
    }

    /// `attention` checks the shapes and every slice against them.
    #[test]
    fn attention_checks_every_length() {
        let (h, hkv, hd, l, t) = (4usize, 2usize, 8usize, 2usize, 5usize);
        let q = vec![0f32; l * h * hd];
        let kv = vec![0f32; t * hkv * hd];
        let att = |q: &[f32], k: &[f32], v: &[f32], l, h, hkv, hd| {
            attention(
                q,
                k,
                v,
                AttentionShape {
                    l,
                    h,
                    hkv,
                    hd,
                    scale: 1.0,
                },
            );
        };
        expect_panic(
            "attention: the queries hold 63 floats, expected [2, 4, 8]",
            || att(&q[..63], &kv, &kv, l, h, hkv, hd),
        );
        expect_panic(
            "attention: the queries hold 64 floats, expected [3, 4, 8]",
            || att(&q, &kv, &kv, 3, h, hkv, hd),
        );
        expect_panic("attention: keys (79) and values (80)", || {
            att(&q, &kv[..79], &kv, l, h, hkv, hd)
        });
        expect_panic("attention: keys (80) and values (64)", || {
            att(&q, &kv, &kv[..64], l, h, hkv, hd)
        });
        expect_panic("attention: 1 cached positions for 2 queries", || {
            att(&q, &kv[..16], &kv[..16], l, h, hkv, hd)
        });
        expect_panic("attention: 4 heads over 3 KV heads", || {
            att(&q, &kv, &kv, l, h, 3, hd)
        });
        expect_panic("attention: 4 heads over 0 KV heads", || {
            att(&q, &kv, &kv, l, h, 0, hd)
        });
        expect_panic("attention: 4 heads over 2 KV heads of width 0", || {
            att(&q, &kv, &kv, l, h, hkv, 0)
        });
        // `l * h * hd` wrapping to the queries' length
        expect_panic("attention: the queries hold 0 floats", || {
            att(&[], &kv[..16], &kv[..16], 2, usize::MAX / 2 + 1, 1, 1)
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Attention follows the definition (softmax over the visible keys, in f64) for any
        /// head grouping, odd widths and cache lengths, on every path this CPU runs, and
        /// tiling the positions into tasks keeps the bits.
        #[test]
        fn attention_follows_the_definition(
            hkv in 1usize..=3,
            rep in 1usize..=4,
            hd in 1usize..=40,
            l in 1usize..=6,
            extra in 0usize..=12,
            seed in any::<u64>(),
        ) {
            let (h, t) = (hkv * rep, l + extra);
            let mut next = testing::rng(seed);
            let keys: Vec<f32> = (0..t * hkv * hd).map(|_| next()).collect();
            let values: Vec<f32> = (0..t * hkv * hd).map(|_| next()).collect();
            let q: Vec<f32> = (0..l * h * hd).map(|_| next()).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            for isa in isas() {
                let (all, tiled) = with_isa(isa, || {
                    let shape = AttentionShape { l, h, hkv, hd, scale };
                    let all = attention(&q, &keys, &values, shape);
                    let one_per_task = Tiling { isa: Isa::Avx512, budget: 1, value_block: VALUE_BLOCK };
                    let tiled = attention_impl(&q, &keys, &values, shape, one_per_task);
                    (all, tiled)
                });
                prop_assert_eq!(testing::bits(&all), testing::bits(&tiled));
                for i in 0..l {
                    let seen = t - l + i + 1;
                    for head in 0..h {
                        let kvh = head / rep;
                        let qv = &q[(i * h + head) * hd..(i * h + head + 1) * hd];
                        fn row(m: &[f32], t: usize, hkv: usize, kvh: usize, hd: usize) -> &[f32] {
                            &m[(t * hkv + kvh) * hd..(t * hkv + kvh + 1) * hd]
                        }
                        let s: Vec<f64> =
                            (0..seen).map(|t| dot64(qv, row(&keys, t, hkv, kvh, hd)).0 * scale as f64).collect();
                        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = s.iter().map(|v| (v - max).exp()).sum();
                        for c in 0..hd {
                            let want: f64 = (0..seen)
                                .map(|t| (s[t] - max).exp() / z * row(&values, t, hkv, kvh, hd)[c] as f64)
                                .sum();
                            let got = all[(i * h + head) * hd + c];
                            prop_assert!(close(got, want, 1.0, 1e-5), "{:?}: {} vs {}", isa, got, want);
                        }
                    }
                }
            }
        }
    }
}
