//! The gated delta rule of a Gated DeltaNet layer as one candle custom op with its exact backward,
//! for `train-tiny`.
//!
//! Written by hand because candle has no scan: as a chain of per-position autograd ops the
//! recurrence cost ~80% of a training step (thousands of small tensors, each kept for the
//! backward). Here the forward is a plain loop over positions, and the backward recomputes the
//! states of each (row, head) pair and walks them in reverse. Pairs are independent, so they run
//! on the machine's threads with no effect on the bits.
//!
//! Per (row, head), with state `S` (value × key, zero at the start), for every position `t`:
//! `S ← g S; δ = β (v − S k); S ← S + δ kᵀ; y = S q`.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};

/// `qkv: [b, t, h, 3, d]` (q, k, v of each head; q and k already normalized and scaled) and
/// `gb: [b, t, h, 2]` (decay `g` and write strength `β`) -> `y: [b, t, h, d]`.
pub fn delta_rule(qkv: &Tensor, gb: &Tensor) -> candle_core::Result<Tensor> {
    qkv.contiguous()?.apply_op2(&gb.contiguous()?, DeltaRule)
}

struct DeltaRule;

/// Dimensions of one call, checked against both inputs.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    t: usize,
    h: usize,
    d: usize,
}

impl Dims {
    fn of(qkv: &Shape, gb: &Shape) -> candle_core::Result<Dims> {
        let (b, t, h, three, d) = qkv.dims5()?;
        let (b2, t2, h2, two) = gb.dims4()?;
        if three != 3 || two != 2 || (b, t, h) != (b2, t2, h2) {
            candle_core::bail!("delta_rule: shapes {qkv:?} and {gb:?} do not match");
        }
        Ok(Dims { b, t, h, d })
    }
}

fn slice<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("delta_rule: f32 only");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("delta_rule: inputs must be contiguous");
    };
    Ok(&v[a..b])
}

/// Runs `f(scratch, pair)` for every (row, head) pair on the machine's threads, each thread with
/// its own `scratch` (reused across its pairs). `f` writes only its own pair's outputs, so the
/// result does not depend on the thread count.
fn for_pairs<S, F>(n: usize, scratch: impl Fn() -> S + Sync, f: F)
where
    F: Fn(&mut S, usize) + Sync,
{
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(n.max(1));
    std::thread::scope(|s| {
        for w in 0..threads {
            let (f, scratch) = (&f, &scratch);
            s.spawn(move || {
                let mut buf = scratch();
                for p in (w..n).step_by(threads) {
                    f(&mut buf, p);
                }
            });
        }
    });
}

/// A write-once output shared by the pairs: each pair writes a disjoint set of indices.
struct Shared(Vec<std::sync::atomic::AtomicU32>);

impl Shared {
    fn new(n: usize) -> Shared {
        Shared(
            (0..n)
                .map(|_| std::sync::atomic::AtomicU32::new(0))
                .collect(),
        )
    }
    fn set(&self, i: usize, x: f32) {
        self.0[i].store(x.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }
    fn into_vec(self) -> Vec<f32> {
        self.0
            .into_iter()
            .map(|a| f32::from_bits(a.into_inner()))
            .collect()
    }
}

/// The forward of one (row, head) pair; `states`, when given, receives `S` before position 0 and
/// after every position (`(t + 1) d²` floats).
fn forward_pair(
    qkv: &[f32],
    gb: &[f32],
    dm: Dims,
    pair: usize,
    mut y: impl FnMut(usize, usize, f32),
    mut states: Option<&mut [f32]>,
) {
    let Dims { t: tn, h, d, .. } = dm;
    let (bi, hi) = (pair / h, pair % h);
    let mut s = vec![0f32; d * d];
    let mut kv = vec![0f32; d];
    if let Some(st) = states.as_deref_mut() {
        st[..d * d].fill(0.0);
    }
    for t in 0..tn {
        let row = (bi * tn + t) * h + hi;
        let (q, k, v, g, beta) = inputs(qkv, gb, d, row);
        for (i, kvi) in kv.iter_mut().enumerate() {
            let row_s = &mut s[i * d..(i + 1) * d];
            row_s.iter_mut().for_each(|x| *x *= g);
            *kvi = dot(row_s, k);
        }
        for i in 0..d {
            let delta = beta * (v[i] - kv[i]);
            let row_s = &mut s[i * d..(i + 1) * d];
            axpy(row_s, delta, k);
            y(row * d, i, dot(row_s, q));
        }
        if let Some(st) = states.as_deref_mut() {
            st[(t + 1) * d * d..(t + 2) * d * d].copy_from_slice(&s);
        }
    }
}

/// The inputs of one position of one (row, head) pair: `q`, `k`, `v`, `g`, `β` (`row` is
/// `(b · t_len + t) · heads + head`).
fn inputs<'a>(
    qkv: &'a [f32],
    gb: &[f32],
    d: usize,
    row: usize,
) -> (&'a [f32], &'a [f32], &'a [f32], f32, f32) {
    let base = row * 3 * d;
    (
        &qkv[base..base + d],
        &qkv[base + d..base + 2 * d],
        &qkv[base + 2 * d..base + 3 * d],
        gb[row * 2],
        gb[row * 2 + 1],
    )
}

/// `Σ a·b` in eight lanes (a form the compiler vectorizes; a single running sum it may not).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += a·x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

impl CustomOp2 for DeltaRule {
    fn name(&self) -> &'static str {
        "gated-delta-rule"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dm = Dims::of(l1.shape(), l2.shape())?;
        let (qkv, gb) = (slice(s1, l1)?, slice(s2, l2)?);
        let out = Shared::new(dm.b * dm.t * dm.h * dm.d);
        for_pairs(
            dm.b * dm.h,
            || (),
            |_, p| forward_pair(qkv, gb, dm, p, |base, i, x| out.set(base + i, x), None),
        );
        Ok((
            CpuStorage::F32(out.into_vec()),
            Shape::from((dm.b, dm.t, dm.h, dm.d)),
        ))
    }

    fn bwd(
        &self,
        arg1: &Tensor,
        arg2: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let dm = Dims::of(arg1.shape(), arg2.shape())?;
        let qkv: Vec<f32> = arg1.flatten_all()?.to_vec1()?;
        let gb: Vec<f32> = arg2.flatten_all()?.to_vec1()?;
        let dy: Vec<f32> = grad_res.flatten_all()?.to_vec1()?;
        let Dims { t: tn, h, d, .. } = dm;
        let dqkv = Shared::new(qkv.len());
        let dgb = Shared::new(gb.len());
        let scratch = || vec![0f32; (tn + 1) * d * d];
        for_pairs(dm.b * h, scratch, |states, pair| {
            let (bi, hi) = (pair / h, pair % h);
            forward_pair(&qkv, &gb, dm, pair, |_, _, _| {}, Some(states));
            let mut ds = vec![0f32; d * d];
            let (mut kv, mut delta, mut ddelta, mut dkv) =
                (vec![0f32; d], vec![0f32; d], vec![0f32; d], vec![0f32; d]);
            let (mut dq, mut dk) = (vec![0f32; d], vec![0f32; d]);
            for t in (0..tn).rev() {
                let row = (bi * tn + t) * h + hi;
                let (q, k, v, g, beta) = inputs(&qkv, &gb, d, row);
                let (base, gbase, ybase) = (row * 3 * d, row * 2, row * d);
                let dyt = &dy[ybase..ybase + d];
                let prev = &states[t * d * d..(t + 1) * d * d];
                let cur = &states[(t + 1) * d * d..(t + 2) * d * d];
                // y = S_t q
                dq.fill(0.0);
                for i in 0..d {
                    axpy(&mut ds[i * d..(i + 1) * d], dyt[i], q);
                    axpy(&mut dq, dyt[i], &cur[i * d..(i + 1) * d]);
                }
                // recompute kv = g S_{t-1} k and delta
                for i in 0..d {
                    kv[i] = g * dot(&prev[i * d..(i + 1) * d], k);
                    delta[i] = beta * (v[i] - kv[i]);
                }
                // S_t = S' + delta kᵀ
                dk.fill(0.0);
                let mut dbeta = 0f32;
                for i in 0..d {
                    let row = &ds[i * d..(i + 1) * d];
                    let acc = dot(row, k);
                    axpy(&mut dk, delta[i], row);
                    ddelta[i] = acc;
                    dbeta += acc * (v[i] - kv[i]);
                    dkv[i] = -beta * acc;
                }
                // kv = S' k, S' = g S_{t-1}
                let mut dg = 0f32;
                for i in 0..d {
                    let row = &mut ds[i * d..(i + 1) * d];
                    let prow = &prev[i * d..(i + 1) * d];
                    axpy(row, dkv[i], k);
                    axpy(&mut dk, g * dkv[i], prow);
                    dg += dot(row, prow);
                    row.iter_mut().for_each(|x| *x *= g);
                }
                for j in 0..d {
                    dqkv.set(base + j, dq[j]);
                    dqkv.set(base + d + j, dk[j]);
                    dqkv.set(base + 2 * d + j, beta * ddelta[j]);
                }
                dgb.set(gbase, dg);
                dgb.set(gbase + 1, dbeta);
            }
        });
        let dqkv = Tensor::from_vec(dqkv.into_vec(), arg1.shape(), arg1.device())?;
        let dgb = Tensor::from_vec(dgb.into_vec(), arg2.shape(), arg2.device())?;
        Ok((Some(dqkv), Some(dgb)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};

    /// The recurrence as candle autograd ops, one position at a time (how `train-tiny` ran it
    /// before this op): the reference for the forward and for every gradient.
    fn reference(qkv: &Tensor, gb: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, h, _, d) = qkv.dims5()?;
        let mut state = Tensor::zeros((b, h, d, d), candle_core::DType::F32, qkv.device())?;
        let mut ys = Vec::new();
        for s in 0..t {
            let at = qkv.narrow(1, s, 1)?.squeeze(1)?; // [b, h, 3, d]
            let qt = at.narrow(2, 0, 1)?.squeeze(2)?;
            let kt = at.narrow(2, 1, 1)?.squeeze(2)?.unsqueeze(2)?;
            let vt = at.narrow(2, 2, 1)?.squeeze(2)?;
            let gt = gb.narrow(1, s, 1)?.squeeze(1)?; // [b, h, 2]
            let g = gt.narrow(2, 0, 1)?.unsqueeze(3)?;
            let beta = gt.narrow(2, 1, 1)?;
            state = state.broadcast_mul(&g)?;
            let kv = state.broadcast_mul(&kt)?.sum(3)?;
            let delta = (vt - kv)?.broadcast_mul(&beta)?;
            state = (state + delta.unsqueeze(3)?.broadcast_mul(&kt)?)?;
            ys.push(state.broadcast_mul(&qt.unsqueeze(2)?)?.sum(3)?);
        }
        Tensor::stack(&ys, 1)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn forward_and_gradients_match_the_per_position_autograd() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (b, t, h, d) = (2, 9, 3, 8);
        let qkv: Vec<f32> = (0..b * t * h * 3 * d)
            .map(|_| rng.random_range(-0.6..0.6))
            .collect();
        // g in (0, 1), beta in (0, 1), as the layer feeds them
        let gb: Vec<f32> = (0..b * t * h * 2)
            .map(|_| rng.random_range(0.2..0.99))
            .collect();
        let dev = Device::Cpu;
        let qkv = Var::from_tensor(&Tensor::from_vec(qkv, (b, t, h, 3, d), &dev).unwrap()).unwrap();
        let gb = Var::from_tensor(&Tensor::from_vec(gb, (b, t, h, 2), &dev).unwrap()).unwrap();
        // a loss that weighs every output differently, so every gradient path is exercised
        let w: Vec<f32> = (0..b * t * h * d)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let w = Tensor::from_vec(w, (b, t, h, d), &dev).unwrap();
        let ours = delta_rule(qkv.as_tensor(), gb.as_tensor()).unwrap();
        let theirs = reference(qkv.as_tensor(), gb.as_tensor()).unwrap();
        assert!(max_diff(&ours, &theirs) < 1e-5, "forward differs");
        let g1 = (&ours * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&theirs * &w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for v in [&qkv, &gb] {
            let (a, b) = (
                g1.get(v.as_tensor()).unwrap(),
                g2.get(v.as_tensor()).unwrap(),
            );
            let scale = b.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
            let scale = scale.to_scalar::<f32>().unwrap().max(1.0);
            assert!(
                max_diff(a, b) < 1e-4 * scale,
                "gradient differs by {}",
                max_diff(a, b)
            );
        }
    }

    #[test]
    fn mismatched_shapes_are_an_error() {
        let dev = Device::Cpu;
        let qkv = Tensor::zeros((1, 4, 2, 3, 8), candle_core::DType::F32, &dev).unwrap();
        let gb = Tensor::zeros((1, 5, 2, 2), candle_core::DType::F32, &dev).unwrap();
        assert!(delta_rule(&qkv, &gb).is_err());
    }
}
