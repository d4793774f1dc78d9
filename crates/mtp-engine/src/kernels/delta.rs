//! The gated delta rule (Gated DeltaNet's recurrence), step form: [`gated_delta`] runs a
//! sequence's steps over its state, settling the steps an earlier verify kept, advancing the
//! state or not and keeping a backup; the state rows run in blocks of steps held in L1.

use super::cpu::{self, Isa};
use super::elements;
#[cfg(target_arch = "x86_64")]
use super::lanes::Avx;
use super::lanes::{madd, Lanes, Portable};
use crate::team::Chunked;

/// Shapes of the gated delta rule.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeltaDims {
    /// Key heads.
    pub hk: usize,
    /// Value heads (a multiple of `hk`).
    pub hv: usize,
    /// Key head width.
    pub dk: usize,
    /// Value head width.
    pub dv: usize,
}

/// The gated delta rule, step form, for one sequence over `s` steps (Gated DeltaNet's
/// recurrence; see [`DeltaDims`] for the shapes): advances `state` by the steps and
/// returns their outputs `[s, hv, dv]`. See [`gated_delta`].
#[cfg(test)]
pub fn gated_delta_steps(
    d: DeltaDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    gated_delta(
        DeltaIn {
            d,
            q,
            k,
            v,
            g,
            beta,
            settle: 0,
            advance: true,
        },
        state,
        &mut [],
    )
}

/// Runs `s` steps of the gated delta rule ([`DeltaIn`]) over `state`: the first `settle` are
/// written into the state and give no output (steps that an earlier verify forward kept), the
/// others return their outputs `[s - settle, hv, dv]` and are written into the state only when
/// `advance` (a verify forward leaves its own steps for the next call to settle, or advances
/// and keeps a copy). A non-empty `backup` (`state.len()` floats) receives the state as it is
/// after the settled steps, before the others.
///
/// `q`, `k`: `[s, hk, dk]` (already normalised and scaled); `v`: `[s, hv, dv]`; `g`, `beta`:
/// `[s, hv]`; `state`: `[hv, dv, dk]`. Per value head and state row `S_r`: `S_r = g S_r;
/// d = beta (v_r - S_r · k); S_r += d k; y_r = S_r · q`, the dot products over 8 lanes as
/// everywhere in this module.
///
/// Each state row (one value feature of one head, `dk` floats) evolves on its own, so the
/// steps run innermost over rows held in L1, in blocks of `DELTA_STEPS` steps (a block's `q`
/// and `k` stay in L1 across the head's rows): a call reads and writes the state once per
/// block (once for a decode step or a verify), and settling costs no pass of its own. A step's arithmetic does not
/// depend on how many steps run together, so outputs and state are bit-identical to one call
/// per step. Unless the call is tiny, the heads are split over the worker team.
///
/// # Panics
/// When a dimension is zero, `hv` is not a multiple of `hk`, an input or the state does not
/// have the shape above for `s = g.len() / hv` steps, `settle > s`, or a non-empty `backup` is
/// not as long as the state.
pub fn gated_delta(inp: DeltaIn<'_>, state: &mut [f32], backup: &mut [f32]) -> Vec<f32> {
    inp.run(state, backup)
}

impl DeltaIn<'_> {
    /// [`gated_delta`] over these operands.
    fn run(self, state: &mut [f32], backup: &mut [f32]) -> Vec<f32> {
        let inp = self;
        let DeltaIn {
            d,
            q,
            k,
            v,
            g,
            beta,
            settle,
            ..
        } = inp;
        let DeltaDims { hk, hv, dk, dv } = d;
        assert!(
            hk > 0 && hv > 0 && dk > 0 && dv > 0 && hv.is_multiple_of(hk),
            "gated_delta: {hk} key heads, {hv} value heads, widths {dk} and {dv}"
        );
        let s = g.len() / hv;
        let sized = |what: &str, len: usize, dims: &[usize]| {
            assert!(
                elements(dims) == Some(len),
                "gated_delta: {what} holds {len} floats, expected {dims:?}"
            )
        };
        sized("g", g.len(), &[s, hv]);
        sized("beta", beta.len(), &[s, hv]);
        sized("q", q.len(), &[s, hk, dk]);
        sized("k", k.len(), &[s, hk, dk]);
        sized("v", v.len(), &[s, hv, dv]);
        sized("the state", state.len(), &[hv, dv, dk]);
        assert!(settle <= s, "gated_delta: {settle} steps to settle of {s}");
        assert!(
            backup.is_empty() || backup.len() == state.len(),
            "gated_delta: a backup of {} floats for a state of {}",
            backup.len(),
            state.len()
        );
        let head = dv * dk;
        let isa = cpu::isa();
        // one value head: its state rows `[dv, dk]`, its outputs `[s - settle, dv]` and its part
        // of the backup (`[dv, dk]` or empty)
        let run = |h: usize, st: &mut [f32], y: &mut [f32], b: &mut [f32]| {
            #[cfg(target_arch = "x86_64")]
            if isa >= Isa::Avx2 {
                // SAFETY: AVX2 and FMA were detected on this CPU.
                unsafe { delta_head_avx(inp, h, st, y, b) };
                return;
            }
            let _ = isa;
            // SAFETY: the portable lanes need no particular instruction set.
            unsafe { delta_head::<Portable>(inp, h, st, y, b) };
        };
        let out = s - settle;
        // per head `[hv, out, dv]`, reordered to `[out, hv, dv]` at the end
        let mut yh = crate::scratch::zeroed(d.hv * out * d.dv);
        let per_y = out * d.dv;
        // split by head unless the whole call is a few microseconds of work (even the bundled
        // demo model's 64 KiB state gains from it, measured)
        let per_b = if backup.is_empty() { 0 } else { head };
        if d.hv > 1 && state.len() * s >= 1 << 13 {
            let (st, ys, bs) = (
                Chunked {
                    data: state,
                    size: head,
                },
                Chunked {
                    data: &mut yh,
                    size: per_y,
                },
                Chunked {
                    data: backup,
                    size: per_b,
                },
            );
            crate::team::chunks_mut3(d.hv, st, ys, bs, run);
        } else {
            for (h, st) in state.chunks_mut(head).enumerate() {
                let b = &mut backup[h * per_b..(h + 1) * per_b];
                run(h, st, &mut yh[h * per_y..(h + 1) * per_y], b);
            }
        }
        // every element is copied in below
        let mut y = crate::scratch::overwritten(out * d.hv * d.dv);
        for h in 0..d.hv {
            for t in 0..out {
                y[(t * d.hv + h) * d.dv..(t * d.hv + h + 1) * d.dv]
                    .copy_from_slice(&yh[(h * out + t) * d.dv..(h * out + t + 1) * d.dv]);
            }
        }
        crate::scratch::recycle(yh);
        y
    }
}

/// The operands of a delta-rule call ([`gated_delta`]), shared by its per-head tasks.
#[derive(Clone, Copy, Debug)]
pub struct DeltaIn<'a> {
    /// The heads and their widths.
    pub d: DeltaDims,
    /// Queries `[s, hk, dk]`, normalised and scaled.
    pub q: &'a [f32],
    /// Keys `[s, hk, dk]`, normalised.
    pub k: &'a [f32],
    /// Values `[s, hv, dv]`.
    pub v: &'a [f32],
    /// Decay gates `[s, hv]`.
    pub g: &'a [f32],
    /// Write strengths `[s, hv]`.
    pub beta: &'a [f32],
    /// The first steps, written into the state without output.
    pub settle: usize,
    /// Whether the other steps are written into the state too.
    pub advance: bool,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma")]
unsafe fn delta_head_avx(
    inp: DeltaIn<'_>,
    h: usize,
    st: &mut [f32],
    y: &mut [f32],
    backup: &mut [f32],
) {
    // SAFETY: this function is only called when the instruction sets were detected.
    unsafe { delta_head::<Avx>(inp, h, st, y, backup) }
}

/// State rows of one head that [`delta_head`] runs side by side: each row's steps are two
/// chains of dependent multiply-adds and a reduction, so one row at a time waits on latency;
/// four rows give the core four independent chains (measured on the demo model: the delta
/// rule ~3x faster). Every row keeps its own arithmetic, so the bits do not change.
const DELTA_ROWS: usize = 4;

/// Steps run together over each group of state rows before the next group takes them (a block
/// of steps). The steps' `q` and `k` (`2 · dk` floats per step, 4 KiB apart from one step to the
/// next in `[s, hk, dk]`) stay in L1 while every group of the head runs them; one group running
/// all of a long prompt's steps in turn read 1 MB of `q` and `k` per group from L3 (the delta
/// rule was ~9% of a 1006-token prefill, most of it waiting on those loads). A row's steps are
/// the same in any blocking, so are its bits.
const DELTA_STEPS: usize = 16;

/// Runs the steps of value head `h` over its state rows `st` (`[dv, dk]`), writing its
/// outputs `y` (`[s - settle, dv]`); steps after `settle` run on a copy of each row unless
/// `advance`. A non-empty `backup` (`[dv, dk]`) receives each row as it is before them.
///
/// # Safety
/// The CPU supports `L`.
#[inline(always)]
unsafe fn delta_head<L: Lanes>(
    inp: DeltaIn<'_>,
    h: usize,
    st: &mut [f32],
    y: &mut [f32],
    backup: &mut [f32],
) {
    let s = inp.g.len() / inp.d.hv;
    // the rows' copies for the steps after `settle` when they must not advance the state: one
    // group's, reused, when the steps are one block (decode, verify), else every row's
    let one_block = s <= DELTA_STEPS;
    let dk = inp.d.dk;
    let copies = if one_block { DELTA_ROWS * dk } else { st.len() };
    let mut scratch = vec![0f32; if inp.advance { 0 } else { copies }];
    // row `i`'s place in the backup, when there is one
    let backup = (!backup.is_empty()).then_some(backup.as_mut_ptr());
    let whole = st.len() / (DELTA_ROWS * dk) * DELTA_ROWS;
    let mut t0 = 0;
    loop {
        let t1 = (t0 + DELTA_STEPS).min(s);
        let mut i = 0;
        while i < st.len() / dk {
            let r = if i < whole { DELTA_ROWS } else { 1 };
            let rows = &mut st[i * dk..(i + r) * dk];
            let copy: &mut [f32] = if inp.advance {
                &mut []
            } else {
                let at = if one_block { 0 } else { i * dk };
                &mut scratch[at..at + r * dk]
            };
            let b = backup.map(|b| b.wrapping_add(i * dk));
            let group = RowGroup {
                rows,
                i0: i,
                scratch: copy,
                backup: b,
            };
            // SAFETY: forwarded from the caller; `b` has room for these rows.
            unsafe {
                if r == DELTA_ROWS {
                    delta_rows::<L, DELTA_ROWS>(inp, h, group, y, t0..t1);
                } else {
                    delta_rows::<L, 1>(inp, h, group, y, t0..t1);
                }
            }
            i += r;
        }
        if t1 == s {
            break;
        }
        t0 = t1;
    }
}

/// A group of state rows that [`delta_rows`] steps side by side: `rows` (`[R, dk]`, rows
/// `i0..i0 + R` of the head), the copies `scratch` the steps from `settle` on run on when they
/// must not advance the state (`R * dk` floats, or empty), and where the rows' backup goes.
struct RowGroup<'a> {
    rows: &'a mut [f32],
    i0: usize,
    scratch: &'a mut [f32],
    backup: Option<*mut f32>,
}

/// Steps `steps` of head `h` over its `R` state rows `group.rows` (`[R, dk]`, rows `i0..i0 + R` of
/// the head), interleaved row by row within each pass. `scratch` (`R * dk` floats, or empty
/// when `advance`) holds the rows' copies on which the steps from `settle` on run when they
/// must not advance the state: they are taken at step `settle`, and later blocks of steps
/// continue on them. `backup`, when given, receives the rows as they are before step `settle`
/// (or after the last step, when `settle` is the number of steps).
///
/// # Safety
/// The CPU supports `L`; `backup` points at `R * dk` writable floats apart from `rows`.
#[inline(always)]
unsafe fn delta_rows<L: Lanes, const R: usize>(
    inp: DeltaIn<'_>,
    h: usize,
    group: RowGroup<'_>,
    y: &mut [f32],
    steps: std::ops::Range<usize>,
) {
    let RowGroup {
        rows,
        i0,
        scratch,
        backup,
    } = group;
    let DeltaIn {
        d,
        q,
        k,
        v,
        g,
        beta,
        settle,
        advance,
    } = inp;
    let s = g.len() / d.hv;
    let hk = h / (d.hv / d.hk);
    let dk = d.dk;
    let chunks = dk / 8;
    debug_assert!(rows.len() == R * dk);
    let base = rows.as_mut_ptr();
    // the rows the steps run on: the state's, or from `settle` on their copies
    let on_copy = !advance && steps.start > settle;
    debug_assert!(advance || scratch.len() == R * dk);
    let at = if on_copy { scratch.as_mut_ptr() } else { base };
    // SAFETY: row `r < R` starts `r * dk` floats into `rows` (and into `scratch`).
    let mut rp: [*mut f32; R] = std::array::from_fn(|r| unsafe { at.add(r * dk) });
    for t in steps.clone() {
        if let (true, Some(b)) = (t == settle, backup) {
            // SAFETY: the caller gives room for `R * dk` floats apart from `rows`.
            unsafe { std::ptr::copy_nonoverlapping(base, b, R * dk) };
        }
        if t == settle && !advance {
            // SAFETY: `rows` and `scratch` are distinct and hold `R * dk` floats.
            unsafe { std::ptr::copy_nonoverlapping(base, scratch.as_mut_ptr(), R * dk) };
            let copy = scratch.as_mut_ptr();
            // SAFETY: as above.
            rp = std::array::from_fn(|r| unsafe { copy.add(r * dk) });
        }
        let qh = &q[(t * d.hk + hk) * dk..(t * d.hk + hk + 1) * dk];
        let kh = &k[(t * d.hk + hk) * dk..(t * d.hk + hk + 1) * dk];
        let vs = &v[(t * d.hv + h) * d.dv + i0..(t * d.hv + h) * d.dv + i0 + R];
        let gt = g[t * d.hv + h];
        let bt = beta[t * d.hv + h];
        // Per row `S_r`: `S_r = g S_r; d = beta (v_r - S_r · k); S_r += d k; y_r = S_r · q`.
        // SAFETY: `c * 8 + 8 <= dk` for every chunk; each `rp[r]` (a row or its copy), `kh`
        // and `qh` hold `dk` floats; the caller guarantees `L`.
        unsafe {
            let gv = L::splat(gt);
            let mut acc = [L::zero(); R];
            for c in 0..chunks {
                let kc = L::load(kh.as_ptr().add(c * 8));
                for r in 0..R {
                    // `g S_r` is computed again (the same bits) by the second pass, which
                    // stores it: one store per chunk instead of two
                    let sv = L::mul(L::load(rp[r].add(c * 8)), gv);
                    acc[r] = L::mul_add(acc[r], sv, kc);
                }
            }
            let mut delta = [0f32; R];
            for r in 0..R {
                let mut kv = 0f32;
                for (j, kj) in kh.iter().enumerate().skip(chunks * 8) {
                    *rp[r].add(j) *= gt;
                    kv = madd::<L>(*rp[r].add(j), *kj, kv);
                }
                let kv = L::reduce(acc[r]) + kv;
                delta[r] = (vs[r] - kv) * bt;
            }
            let dv: [L::V; R] = std::array::from_fn(|r| L::splat(delta[r]));
            let mut acc = [L::zero(); R];
            for c in 0..chunks {
                let kc = L::load(kh.as_ptr().add(c * 8));
                let qc = L::load(qh.as_ptr().add(c * 8));
                for r in 0..R {
                    let sv = L::mul_add(L::mul(L::load(rp[r].add(c * 8)), gv), kc, dv[r]);
                    L::store(rp[r].add(c * 8), sv);
                    acc[r] = L::mul_add(acc[r], sv, qc);
                }
            }
            for r in 0..R {
                let mut yq = 0f32;
                for (j, (kj, qj)) in kh.iter().zip(qh).enumerate().skip(chunks * 8) {
                    *rp[r].add(j) = madd::<L>(*kj, delta[r], *rp[r].add(j));
                    yq = madd::<L>(*rp[r].add(j), *qj, yq);
                }
                if t >= settle {
                    y[(t - settle) * d.dv + i0 + r] = L::reduce(acc[r]) + yq;
                }
            }
        }
    }
    if let (true, true, Some(b)) = (settle == s, steps.end == s, backup) {
        // SAFETY: as above (no step came after the settled ones).
        unsafe { std::ptr::copy_nonoverlapping(base, b, R * dk) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::cpu::{isas, with_isa};
    use crate::kernels::lanes::detected_fused;
    use crate::testing::{self, close, expect_panic, rng, CASES};
    use proptest::prelude::*;

    /// Calls longer than a block of steps (`DELTA_STEPS`): outputs, state and backup have the
    /// bits of one step at a time, wherever `settle` falls (first block, a block boundary, a
    /// later block, the end), advancing or not, on groups of rows and on single rows.
    #[test]
    fn delta_blocks_of_steps_match_single_steps() {
        let mut next = rng(23);
        let s = 2 * DELTA_STEPS + 5;
        for (hk, hv, dk, dv) in [(1usize, 2usize, 12usize, 5usize), (2, 4, 128, 128)] {
            let d = DeltaDims { hk, hv, dk, dv };
            let q: Vec<f32> = (0..s * hk * dk).map(|_| 0.2 * next()).collect();
            let k: Vec<f32> = (0..s * hk * dk).map(|_| 0.2 * next()).collect();
            let v: Vec<f32> = (0..s * hv * dv).map(|_| next()).collect();
            let g: Vec<f32> = (0..s * hv).map(|_| 0.9 + 0.05 * next()).collect();
            let beta: Vec<f32> = (0..s * hv).map(|_| 0.5 + 0.2 * next()).collect();
            let init: Vec<f32> = (0..hv * dv * dk).map(|_| next()).collect();
            // one step at a time: the outputs of every step and the state after each
            let mut states = vec![init.clone()];
            let mut ys = Vec::new();
            for t in 0..s {
                let mut st = states[t].clone();
                ys.push(gated_delta_steps(
                    d,
                    &q[t * hk * dk..(t + 1) * hk * dk],
                    &k[t * hk * dk..(t + 1) * hk * dk],
                    &v[t * hv * dv..(t + 1) * hv * dv],
                    &g[t * hv..(t + 1) * hv],
                    &beta[t * hv..(t + 1) * hv],
                    &mut st,
                ));
                states.push(st);
            }
            let bits = |a: &[f32], b: &[f32]| {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            };
            for settle in [0, 3, DELTA_STEPS, DELTA_STEPS + 3, s] {
                for advance in [true, false] {
                    for with_backup in [false, true] {
                        let mut state = init.clone();
                        let mut backup = vec![0f32; if with_backup { init.len() } else { 0 }];
                        let y = gated_delta(
                            DeltaIn {
                                d,
                                q: &q,
                                k: &k,
                                v: &v,
                                g: &g,
                                beta: &beta,
                                settle,
                                advance,
                            },
                            &mut state,
                            &mut backup,
                        );
                        let case = format!("dims {dk}x{dv}, settle {settle}, advance {advance}");
                        assert!(bits(&y, &ys[settle..].concat()), "outputs, {case}");
                        let want = if advance { &states[s] } else { &states[settle] };
                        assert!(bits(&state, want), "state, {case}");
                        if with_backup {
                            assert!(bits(&backup, &states[settle]), "backup, {case}");
                        }
                    }
                }
            }
        }
    }

    /// The operands of `s` delta-rule steps over `d`, and the state before them.
    struct Steps {
        d: DeltaDims,
        s: usize,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        init: Vec<f32>,
    }

    impl Steps {
        /// Random steps (decays and write strengths in `0..1`) and state, from `next`.
        fn random(d: DeltaDims, s: usize, next: &mut impl FnMut() -> f32) -> Steps {
            let DeltaDims { hk, hv, dk, dv } = d;
            Steps {
                d,
                s,
                q: (0..s * hk * dk).map(|_| next()).collect(),
                k: (0..s * hk * dk).map(|_| next()).collect(),
                v: (0..s * hv * dv).map(|_| next()).collect(),
                g: (0..s * hv).map(|_| 0.5 + next()).collect(),
                beta: (0..s * hv).map(|_| 0.5 + next()).collect(),
                init: (0..hv * dv * dk).map(|_| next()).collect(),
            }
        }

        /// The whole call's operands; the cases change where it settles and whether it
        /// advances.
        fn all(&self) -> DeltaIn<'_> {
            DeltaIn {
                d: self.d,
                q: &self.q,
                k: &self.k,
                v: &self.v,
                g: &self.g,
                beta: &self.beta,
                settle: 0,
                advance: true,
            }
        }
    }

    /// Whether `a` and `b` have the same bits, as far as both go.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Several delta-rule steps at once give the bits of one step at a time (with the state
    /// recorded after each), the portable path the same bits, and both follow the definition.
    #[test]
    fn delta_steps_match_single_steps_and_the_definition() {
        let mut next = rng(11);
        for (hk, hv, dk, dv) in [
            (2usize, 4usize, 16usize, 16usize),
            (1, 2, 12, 5),
            (2, 2, 64, 8),
            // large enough to be split over the worker team
            (2, 4, 128, 128),
        ] {
            let d = DeltaDims { hk, hv, dk, dv };
            let steps = Steps::random(d, 4, &mut next);
            let (inp, init) = (steps.all(), &steps.init);
            let mut untouched = init.clone();
            let peeked = gated_delta(
                DeltaIn {
                    advance: false,
                    ..inp
                },
                &mut untouched,
                &mut [],
            );
            let mut all_state = init.clone();
            let Steps {
                q, k, v, g, beta, ..
            } = &steps;
            let all = gated_delta_steps(d, q, k, v, g, beta, &mut all_state);
            assert!(same_bits(&peeked, &all) && same_bits(&untouched, init));
            settling_and_backups_match(&steps, &all, &all_state);
            portable_matches(&steps, &all, &all_state);
            single_steps_match_the_definition(&steps, &all, &all_state);
        }
    }

    /// Settling steps a verify left, with and without advancing, and with a backup, gives the
    /// outputs and states of `all` (every step at once) and `all_state` (the state after them).
    fn settling_and_backups_match(steps: &Steps, all: &[f32], all_state: &[f32]) {
        let Steps {
            d,
            s,
            ref q,
            ref k,
            ref v,
            ref g,
            ref beta,
            ref init,
        } = *steps;
        let DeltaDims { hk, hv, dk, dv } = d;
        let inp = steps.all();
        // settling: the first two steps as a verify left them, then two more
        let mut settled = init.clone();
        let y = gated_delta(DeltaIn { settle: 2, ..inp }, &mut settled, &mut []);
        assert!(same_bits(&y, &all[2 * hv * dv..]) && same_bits(&settled, all_state));
        let mut settled = init.clone();
        let y = gated_delta(
            DeltaIn {
                settle: s,
                advance: false,
                ..inp
            },
            &mut settled,
            &mut [],
        );
        assert!(y.is_empty() && same_bits(&settled, all_state));
        // advancing with a backup: the state after the settled steps is kept aside
        let (mut two, mut after_two) = (init.clone(), init.clone());
        gated_delta(
            DeltaIn {
                d,
                q: &q[..2 * hk * dk],
                k: &k[..2 * hk * dk],
                v: &v[..2 * hv * dv],
                g: &g[..2 * hv],
                beta: &beta[..2 * hv],
                settle: 2,
                advance: true,
            },
            &mut after_two,
            &mut [],
        );
        let mut backup = vec![0f32; init.len()];
        let y = gated_delta(DeltaIn { settle: 2, ..inp }, &mut two, &mut backup);
        assert!(same_bits(&y, &all[2 * hv * dv..]) && same_bits(&two, all_state));
        assert!(same_bits(&backup, &after_two));
        let y = gated_delta(DeltaIn { settle: s, ..inp }, &mut init.clone(), &mut backup);
        assert!(y.is_empty() && same_bits(&backup, all_state));
    }

    /// The portable lanes, one head at a time, give the bits of `all` and `all_state` where
    /// they fuse multiply-adds as the detected path does, else values close to them.
    fn portable_matches(steps: &Steps, all: &[f32], all_state: &[f32]) {
        let DeltaDims { hv, dk, dv, .. } = steps.d;
        let s = steps.s;
        let mut portable_state = steps.init.clone();
        let mut portable = vec![0f32; s * hv * dv];
        for h in 0..hv {
            let mut yh = vec![0f32; s * dv];
            let st = &mut portable_state[h * dv * dk..(h + 1) * dv * dk];
            // SAFETY: no particular instruction set needed.
            unsafe { delta_head::<Portable>(steps.all(), h, st, &mut yh, &mut []) };
            for t in 0..s {
                portable[(t * hv + h) * dv..(t * hv + h + 1) * dv]
                    .copy_from_slice(&yh[t * dv..(t + 1) * dv]);
            }
        }
        if Portable::FUSED == detected_fused() {
            assert!(same_bits(all, &portable) && same_bits(all_state, &portable_state));
        } else {
            assert!(all.iter().zip(&portable).all(|(a, b)| (a - b).abs() < 1e-4));
        }
    }

    /// One step at a time gives the bits of `all` and `all_state`, and every output is within
    /// 1e-4 of the definition computed in f64.
    fn single_steps_match_the_definition(steps: &Steps, all: &[f32], all_state: &[f32]) {
        let Steps {
            d,
            s,
            ref q,
            ref k,
            ref v,
            ref g,
            ref beta,
            ref init,
        } = *steps;
        let DeltaDims { hk, hv, dk, dv } = d;
        let mut one_state = init.clone();
        let mut want_state: Vec<f64> = init.iter().map(|x| *x as f64).collect();
        for t in 0..s {
            let y = gated_delta_steps(
                d,
                &q[t * hk * dk..(t + 1) * hk * dk],
                &k[t * hk * dk..(t + 1) * hk * dk],
                &v[t * hv * dv..(t + 1) * hv * dv],
                &g[t * hv..(t + 1) * hv],
                &beta[t * hv..(t + 1) * hv],
                &mut one_state,
            );
            assert!(same_bits(&y, &all[t * hv * dv..(t + 1) * hv * dv]));
            for h in 0..hv {
                let kh = h / (hv / hk);
                let kk = &k[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                let qq = &q[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                for r in 0..dv {
                    let row = &mut want_state[(h * dv + r) * dk..(h * dv + r + 1) * dk];
                    row.iter_mut().for_each(|x| *x *= g[t * hv + h] as f64);
                    let kv: f64 = row.iter().zip(kk).map(|(a, b)| a * *b as f64).sum();
                    let delta = (v[(t * hv + h) * dv + r] as f64 - kv) * beta[t * hv + h] as f64;
                    row.iter_mut()
                        .zip(kk)
                        .for_each(|(a, b)| *a += delta * *b as f64);
                    let want: f64 = row.iter().zip(qq).map(|(a, b)| a * *b as f64).sum();
                    let got = y[h * dv + r] as f64;
                    assert!((got - want).abs() < 1e-4, "{got} vs {want}");
                }
            }
        }
        assert!(same_bits(&one_state, all_state));
    }

    /// `gated_delta` checks every input, the state and the backup against the dimensions.
    #[test]
    fn gated_delta_checks_every_length() {
        let d = DeltaDims {
            hk: 1,
            hv: 2,
            dk: 8,
            dv: 4,
        };
        let s = 3;
        let (q, v) = (vec![0f32; s * 8], vec![0f32; s * 2 * 4]);
        let (g, state) = (vec![1f32; s * 2], vec![0f32; 2 * 4 * 8]);
        type Case<'a> = (&'a str, DeltaDims, [usize; 6], usize, usize);
        let cases: [Case; 11] = [
            (
                "q holds 23 floats, expected [3, 1, 8]",
                d,
                [23, 24, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "k holds 16 floats, expected [3, 1, 8]",
                d,
                [24, 16, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "v holds 23 floats, expected [3, 2, 4]",
                d,
                [24, 24, 23, 6, 6, 64],
                0,
                0,
            ),
            (
                "g holds 5 floats, expected [2, 2]",
                d,
                [24, 24, 24, 5, 5, 64],
                0,
                0,
            ),
            (
                "beta holds 4 floats, expected [3, 2]",
                d,
                [24, 24, 24, 6, 4, 64],
                0,
                0,
            ),
            (
                "the state holds 63 floats, expected [2, 4, 8]",
                d,
                [24, 24, 24, 6, 6, 63],
                0,
                0,
            ),
            ("4 steps to settle of 3", d, [24, 24, 24, 6, 6, 64], 4, 0),
            (
                "a backup of 8 floats for a state of 64",
                d,
                [24, 24, 24, 6, 6, 64],
                0,
                8,
            ),
            (
                "0 key heads, 2 value heads",
                DeltaDims { hk: 0, ..d },
                [24, 24, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "2 key heads, 3 value heads",
                DeltaDims { hk: 2, hv: 3, ..d },
                [24, 24, 24, 6, 6, 64],
                0,
                0,
            ),
            (
                "1 key heads, 2 value heads, widths 8 and 0",
                DeltaDims { dv: 0, ..d },
                [24, 24, 24, 6, 6, 64],
                0,
                0,
            ),
        ];
        for (want, d, [lq, lk, lv, lg, lb, ls], settle, lbackup) in cases {
            let mut st = state[..ls].to_vec();
            let mut backup = vec![0f32; lbackup];
            expect_panic(&format!("gated_delta: {want}"), || {
                gated_delta(
                    DeltaIn {
                        d,
                        q: &q[..lq],
                        k: &q[..lk],
                        v: &v[..lv],
                        g: &g[..lg],
                        beta: &g[..lb],
                        settle,
                        advance: true,
                    },
                    &mut st,
                    &mut backup,
                );
            });
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// The delta rule follows its definition (in f64) for any head grouping, odd widths,
        /// step counts, settled steps, with and without advancing or a backup, on every path
        /// this CPU runs.
        #[test]
        fn delta_rule_follows_the_definition(
            hk in 1usize..=2,
            per in 1usize..=2,
            dk in 1usize..=40,
            dv in 1usize..=9,
            s in 0usize..=4,
            settle in 0usize..=4,
            advance in any::<bool>(),
            backup in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let (hv, settle) = (hk * per, settle.min(s));
            let d = DeltaDims { hk, hv, dk, dv };
            let mut next = testing::rng(seed);
            let mut take = |len: usize, base: f32| -> Vec<f32> {
                (0..len).map(|_| base + next()).collect()
            };
            let (q, k, v) = (take(s * hk * dk, 0.0), take(s * hk * dk, 0.0), take(s * hv * dv, 0.0));
            let (g, beta, init) = (take(s * hv, 0.7), take(s * hv, 0.5), take(hv * dv * dk, 0.0));
            // the definition, step by step: the state after each step and the outputs
            let mut st: Vec<f64> = init.iter().map(|v| *v as f64).collect();
            let mut states = vec![st.clone()];
            let mut ys = Vec::new();
            for t in 0..s {
                for h in 0..hv {
                    let kh = h / per;
                    let kk = &k[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                    let qq = &q[(t * hk + kh) * dk..(t * hk + kh + 1) * dk];
                    for r in 0..dv {
                        let row = &mut st[(h * dv + r) * dk..(h * dv + r + 1) * dk];
                        row.iter_mut().for_each(|x| *x *= g[t * hv + h] as f64);
                        let kv: f64 = row.iter().zip(kk).map(|(a, b)| a * *b as f64).sum();
                        let delta = (v[(t * hv + h) * dv + r] as f64 - kv) * beta[t * hv + h] as f64;
                        row.iter_mut().zip(kk).for_each(|(a, b)| *a += delta * *b as f64);
                        ys.push(row.iter().zip(qq).map(|(a, b)| a * *b as f64).sum::<f64>());
                    }
                }
                states.push(st.clone());
            }
            for isa in isas() {
                let mut state = init.clone();
                let mut kept = vec![0f32; if backup { init.len() } else { 0 }];
                let y = with_isa(isa, || {
                    let inp = DeltaIn { d, q: &q, k: &k, v: &v, g: &g, beta: &beta, settle, advance };
                    gated_delta(inp, &mut state, &mut kept)
                });
                prop_assert_eq!(y.len(), (s - settle) * hv * dv);
                for (got, want) in y.iter().zip(&ys[settle * hv * dv..]) {
                    prop_assert!(close(*got, *want, want.abs(), 1e-4), "{:?}: {} vs {}", isa, got, want);
                }
                let after = &states[if advance { s } else { settle }];
                for (got, want) in state.iter().zip(after) {
                    prop_assert!(close(*got, *want, want.abs(), 1e-4), "{:?}: state {} vs {}", isa, got, want);
                }
                for (got, want) in kept.iter().zip(&states[settle]) {
                    prop_assert!(close(*got, *want, want.abs(), 1e-4), "{:?}: backup {} vs {}", isa, got, want);
                }
            }
        }
    }
}
