//! Per-sequence caches: a trimmable KV cache for full-attention layers and the conv + recurrent
//! state of linear-attention layers, with snapshots and a verify/commit protocol for MTP
//! speculation.
//!
//! Rollback design: during a verify forward of `k + 1` positions every linear-attention layer
//! records its conv window and recurrent state after each position ("keep per-position states").
//! Committing `n` accepted positions then costs one copy per layer instead of a second forward
//! ("snapshot and recompute"); KV caches are trimmed by length.

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
    /// `[value_heads, value_dim, key_dim]`: the delta-rule state.
    pub(crate) state: Vec<f32>,
    /// During a verify forward: conv windows, slot `j` after `j` verified positions (slot 0 is
    /// the window before the forward). Flat, and its allocation is reused round after round.
    pub(crate) rec_conv: Vec<f32>,
    /// The same for the recurrent state.
    pub(crate) rec_state: Vec<f32>,
    /// True between `begin_verify` and `commit_verify`.
    pub(crate) recording: bool,
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
    Linear(Vec<f32>, Vec<f32>),
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

    /// True while a verify forward is recording per-position states.
    pub fn recording(&self) -> bool {
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
                    LayerCache::Linear(s) => SnapshotLayer::Linear(s.conv.clone(), s.state.clone()),
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
                (LayerCache::Linear(st), SnapshotLayer::Linear(c, r)) => {
                    st.conv.clone_from(c);
                    st.state.clone_from(r);
                    st.rec_conv.clear();
                    st.rec_state.clear();
                    st.recording = false;
                }
                _ => {}
            }
        }
        self.verify_start = None;
    }

    /// Starts a verify forward: the next forward records per-position linear states.
    pub fn begin_verify(&mut self) {
        self.verify_start = Some(self.pos);
        for l in &mut self.layers {
            if let LayerCache::Linear(s) = l {
                s.rec_conv.clear();
                s.rec_conv.extend_from_slice(&s.conv);
                s.rec_state.clear();
                s.rec_state.extend_from_slice(&s.state);
                s.recording = true;
            }
        }
    }

    /// Ends a verify forward keeping its first `keep` positions: trims KV caches and restores the
    /// linear states recorded after position `keep - 1`.
    pub fn commit_verify(&mut self, keep: usize) {
        let Some(start) = self.verify_start.take() else {
            return;
        };
        let verified = self.pos - start;
        let keep = keep.min(verified);
        for l in &mut self.layers {
            match l {
                LayerCache::Attention(kv) => kv.trim_to(start + keep),
                LayerCache::Linear(s) => {
                    if keep < verified {
                        let (cl, sl) = (s.conv.len(), s.state.len());
                        s.conv
                            .copy_from_slice(&s.rec_conv[keep * cl..(keep + 1) * cl]);
                        s.state
                            .copy_from_slice(&s.rec_state[keep * sl..(keep + 1) * sl]);
                    }
                    // emptied, capacity kept: clones (prefix cache) copy nothing
                    s.rec_conv.clear();
                    s.rec_state.clear();
                    s.recording = false;
                }
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
