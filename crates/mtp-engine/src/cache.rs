//! Per-sequence caches: a trimmable KV cache for full-attention layers and the conv + recurrent
//! state of linear-attention layers, with snapshots and a verify/commit protocol for MTP
//! speculation.
//!
//! Rollback design ("snapshot and recompute", with the live state as the snapshot): a verify
//! forward of `k + 1` positions computes every linear-attention layer's outputs without
//! advancing its conv window or recurrent state, and keeps that layer's per-position inputs
//! (conv inputs and the delta rule's `q, k, v, g, beta`: a few KiB per position). Committing
//! `n` accepted positions moves the conv window at once and leaves the `n` delta-rule steps
//! pending: the layer's next forward runs them first, in the same pass over the state that
//! its own steps make (the state is megabytes on a real model; each step of a row is a few
//! L1-resident vector operations). The arithmetic is the forward's, so the state is
//! bit-identical to `n` single-token forwards, and a round reads and writes the state once,
//! as a plain step does. Measured against the alternatives on a 32-layer shape
//! (`examples/verify_cost`): keeping a copy of the state after every verified position wrote
//! `k + 2` copies per round, and settling at commit time in a pass of its own cost 5% of a
//! step. KV caches are trimmed by length.

use crate::kernels::DeltaDims;

/// Why a forward is refused between a verify forward and its commit.
pub(crate) const SECOND_VERIFY_FORWARD: &str =
    "a second forward inside one verify (begin_verify covers one forward; commit it first)";

/// KV cache of one full-attention layer for one sequence; layout `[len, n_kv_heads, head_dim]`.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    row: usize,
}

impl KvCache {
    /// An empty cache for `n_kv_heads * head_dim` features per position.
    pub fn new(n_kv_heads: usize, head_dim: usize) -> Self {
        KvCache {
            k: Vec::new(),
            v: Vec::new(),
            row: n_kv_heads * head_dim,
        }
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.k.len() / self.row.max(1)
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }

    /// Appends positions (`[l, n_kv_heads, head_dim]` each).
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
    }

    /// Keeps the first `len` positions.
    pub fn trim_to(&mut self, len: usize) {
        self.k.truncate(len * self.row);
        self.v.truncate(len * self.row);
    }
}

/// Conv window and recurrent state of one linear-attention (Gated DeltaNet) layer.
#[derive(Debug, Clone, Default)]
pub struct LinearState {
    /// `[kernel - 1, conv_dim]`: the last inputs of the causal conv.
    pub(crate) conv: Vec<f32>,
    /// `[value_heads, value_dim, key_dim]`: the delta-rule state, before the `settle` pending
    /// steps.
    pub(crate) state: Vec<f32>,
    /// Delta-rule steps not yet applied to `state`: during a verify forward, all of its
    /// positions; after `commit_verify`, the kept ones, which the next forward settles.
    pub(crate) pending: PendingSteps,
    /// True between `begin_verify` and `commit_verify`.
    pub(crate) deferring: bool,
}

/// A verify forward's per-position inputs of one linear-attention layer. Allocations are
/// reused round after round.
#[derive(Debug, Clone, Default)]
pub(crate) struct PendingSteps {
    pub(crate) dims: DeltaDims,
    /// Positions committed: applied to the state by the next forward.
    pub(crate) settle: usize,
    /// Conv inputs `[len, conv_dim]` (until the commit moves the window).
    pub(crate) conv_in: Vec<f32>,
    /// Delta-rule inputs: `q`, `k` `[len, hk, dk]` (normalised and scaled), `v`
    /// `[len, hv, dv]`, `g`, `beta` `[len, hv]`.
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) g: Vec<f32>,
    pub(crate) beta: Vec<f32>,
}

impl PendingSteps {
    /// Positions held.
    pub(crate) fn len(&self) -> usize {
        self.g.len() / self.dims.hv.max(1)
    }

    pub(crate) fn clear(&mut self) {
        self.truncate(0);
        self.conv_in.clear();
    }

    /// Keeps the first `n` positions' delta-rule inputs.
    fn truncate(&mut self, n: usize) {
        let n = n.min(self.len());
        let d = self.dims;
        self.q.truncate(n * d.hk * d.dk);
        self.k.truncate(n * d.hk * d.dk);
        self.v.truncate(n * d.hv * d.dv);
        self.g.truncate(n * d.hv);
        self.beta.truncate(n * d.hv);
        self.settle = self.settle.min(n);
    }
}

impl LinearState {
    /// Ends a verify forward keeping its first `n` positions: moves the conv window past
    /// them and leaves their delta-rule steps for the next forward to settle.
    fn commit(&mut self, n: usize) {
        let p = &mut self.pending;
        let held = p.len();
        let n = n.min(held);
        if n > 0 {
            let conv_dim = p.conv_in.len() / held;
            crate::kernels::conv_window_push(&mut self.conv, &p.conv_in[..n * conv_dim], conv_dim);
        }
        p.conv_in.clear();
        p.truncate(n);
        p.settle = n;
        self.deferring = false;
    }

    /// True when a verify forward has run on this layer and is not committed yet: a further
    /// forward would not see its steps, and fails with [`SECOND_VERIFY_FORWARD`].
    pub(crate) fn verify_pending(&self) -> bool {
        self.deferring && self.pending.len() > self.pending.settle
    }
}

/// The cache of one layer.
#[derive(Debug, Clone)]
pub enum LayerCache {
    /// Full attention.
    Attention(KvCache),
    /// Linear attention.
    Linear(LinearState),
}

/// Everything one sequence carries between forwards.
#[derive(Debug, Clone)]
pub struct SeqCache {
    pub(crate) layers: Vec<LayerCache>,
    pos: usize,
    verify_start: Option<usize>,
}

/// A saved copy of a [`SeqCache`]'s position-dependent state (linear states copied, KV caches by
/// length since they are append-only).
#[derive(Debug, Clone)]
pub struct CacheSnapshot {
    pos: usize,
    layers: Vec<SnapshotLayer>,
}

#[derive(Debug, Clone)]
enum SnapshotLayer {
    Kv(usize),
    Linear(Box<LinearState>),
}

impl SeqCache {
    pub(crate) fn new(layers: Vec<LayerCache>) -> Self {
        SeqCache {
            layers,
            pos: 0,
            verify_start: None,
        }
    }

    /// Tokens processed so far (the position of the next token).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes held by the cached keys, values and linear states.
    pub fn bytes(&self) -> usize {
        layers_bytes(&self.layers)
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.pos += n;
    }

    /// True between `begin_verify` and `commit_verify`.
    pub fn verifying(&self) -> bool {
        self.verify_start.is_some()
    }

    /// Copies the linear states and notes the KV lengths.
    pub fn snapshot(&self) -> CacheSnapshot {
        CacheSnapshot {
            pos: self.pos,
            layers: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerCache::Attention(kv) => SnapshotLayer::Kv(kv.len()),
                    LayerCache::Linear(s) => SnapshotLayer::Linear(Box::new(s.clone())),
                })
                .collect(),
        }
    }

    /// Returns to a snapshot taken from this cache (KV caches are trimmed back).
    pub fn restore(&mut self, snap: &CacheSnapshot) {
        self.pos = snap.pos;
        for (l, s) in self.layers.iter_mut().zip(&snap.layers) {
            match (l, s) {
                (LayerCache::Attention(kv), SnapshotLayer::Kv(len)) => kv.trim_to(*len),
                (LayerCache::Linear(st), SnapshotLayer::Linear(saved)) => {
                    st.clone_from(&**saved);
                    st.deferring = false;
                }
                _ => {}
            }
        }
        self.verify_start = None;
    }

    /// [`LinearState::verify_pending`] for any layer.
    pub(crate) fn verify_pending(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerCache::Linear(s) if s.verify_pending()))
    }

    /// Starts a verify forward: the next forward leaves the linear states where they are and
    /// keeps its per-position inputs for [`SeqCache::commit_verify`].
    pub fn begin_verify(&mut self) {
        self.verify_start = Some(self.pos);
        for l in &mut self.layers {
            if let LayerCache::Linear(s) = l {
                s.deferring = true;
            }
        }
    }

    /// Ends a verify forward keeping its first `keep` positions: trims KV caches and advances
    /// the linear states by the kept positions.
    pub fn commit_verify(&mut self, keep: usize) {
        let Some(start) = self.verify_start.take() else {
            return;
        };
        let verified = self.pos - start;
        let keep = keep.min(verified);
        for l in &mut self.layers {
            match l {
                LayerCache::Attention(kv) => kv.trim_to(start + keep),
                LayerCache::Linear(s) => s.commit(keep),
            }
        }
        self.pos = start + keep;
    }
}

/// Bytes held by a list of layer caches (f32 elements).
pub(crate) fn layers_bytes(layers: &[LayerCache]) -> usize {
    layers
        .iter()
        .map(|l| match l {
            LayerCache::Attention(kv) => kv.k.len() + kv.v.len(),
            LayerCache::Linear(s) => s.conv.len() + s.state.len(),
        })
        .sum::<usize>()
        * std::mem::size_of::<f32>()
}
