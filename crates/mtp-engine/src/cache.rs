//! Per-sequence caches: a trimmable KV cache for full-attention layers and the conv + recurrent
//! state of linear-attention layers, with snapshots and a verify/commit protocol for MTP
//! speculation.
//!
//! Rollback design ("snapshot and recompute"): a verify forward of `k + 1` positions keeps
//! every linear-attention layer's per-position inputs (conv inputs and the delta rule's
//! `q, k, v, g, beta`: a few KiB per position) and moves neither its conv window nor, by
//! default, its recurrent state. Committing `n` accepted positions moves the conv window at
//! once and leaves the `n` delta-rule steps pending: the layer's next forward runs them first,
//! in the same pass over the state that its own steps make (each step of a row is a few
//! L1-resident vector operations). The arithmetic is the forward's, so the state is
//! bit-identical to `n` single-token forwards, and a round reads and writes the state once,
//! as a plain step does. Measured against the alternatives on a 32-layer shape
//! (`examples/verify_cost`): keeping a copy of the state after every verified position wrote
//! `k + 2` copies per round, and settling at commit time in a pass of its own cost 5% of a
//! step.
//!
//! The kept steps are thus computed twice (once for their outputs, once when settled). Where
//! the state is small ([`VerifyMode::Backup`], chosen by [`VerifyMode::Auto`] up to
//! [`BACKUP_MAX_BYTES`] per layer), the verify forward advances the state through all its
//! positions instead and keeps a copy of the state from before them, written in the same pass:
//! a commit that keeps every position has nothing left to do, and one that keeps fewer puts
//! the copy back and leaves the kept steps pending as above. KV caches are trimmed by length.

use crate::kernels::DeltaDims;

/// Why a forward is refused between a verify forward and its commit.
pub(crate) const SECOND_VERIFY_FORWARD: &str =
    "a second forward inside one verify (begin_verify covers one forward; commit it first)";

pub use mtp_contract::KvType;

/// KV cache of one full-attention layer for one sequence; layout `[len, n_kv_heads, head_dim]`,
/// in its [`KvType`].
#[derive(Debug, Clone)]
pub struct KvCache {
    store: KvStore,
    row: usize,
}

/// Keys and values on a cache line ([`crate::kernels::Aligned`]), as attention reads them many
/// times, in one of the [`KvType`]s.
#[derive(Debug, Clone)]
pub(crate) enum KvStore {
    F32(KvPair<f32>),
    F16(KvPair<half::f16>),
    Bf16(KvPair<half::bf16>),
}

#[derive(Debug, Clone, Default)]
pub(crate) struct KvPair<T: Copy + Default> {
    pub(crate) k: crate::kernels::Aligned<T>,
    pub(crate) v: crate::kernels::Aligned<T>,
}

impl<T: Copy + Default> KvPair<T> {
    fn with_room(&self, room: usize) -> KvPair<T> {
        KvPair {
            k: crate::kernels::Aligned::copy_with_room(self.k.values(), room),
            v: crate::kernels::Aligned::copy_with_room(self.v.values(), room),
        }
    }
}

/// `$body` with `$p` bound to the cache's [`KvPair`], whatever its element type.
macro_rules! with_pair {
    ($store:expr, $p:ident => $body:expr) => {
        match $store {
            KvStore::F32($p) => $body,
            KvStore::F16($p) => $body,
            KvStore::Bf16($p) => $body,
        }
    };
}

impl Default for KvCache {
    fn default() -> Self {
        KvCache::new(0, 0)
    }
}

impl KvCache {
    /// An empty f32 cache for `n_kv_heads * head_dim` features per position.
    pub fn new(n_kv_heads: usize, head_dim: usize) -> Self {
        KvCache::with_type(n_kv_heads, head_dim, KvType::F32)
    }

    /// An empty cache of `ty` for `n_kv_heads * head_dim` features per position.
    pub fn with_type(n_kv_heads: usize, head_dim: usize, ty: KvType) -> Self {
        let store = match ty {
            KvType::F32 => KvStore::F32(KvPair::default()),
            KvType::F16 => KvStore::F16(KvPair::default()),
            KvType::Bf16 => KvStore::Bf16(KvPair::default()),
        };
        KvCache {
            store,
            row: n_kv_heads * head_dim,
        }
    }

    /// The element type of its keys and values.
    pub fn kv_type(&self) -> KvType {
        match self.store {
            KvStore::F32(_) => KvType::F32,
            KvStore::F16(_) => KvType::F16,
            KvStore::Bf16(_) => KvType::Bf16,
        }
    }

    /// Values held in each of the keys and the values.
    fn values(&self) -> usize {
        with_pair!(&self.store, p => p.k.len())
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.values() / self.row.max(1)
    }

    /// Values per position in each of the keys and the values.
    pub(crate) fn row(&self) -> usize {
        self.row
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.values() == 0
    }

    /// Bytes held by the cached keys and values.
    pub fn bytes(&self) -> usize {
        2 * self.values() * self.kv_type().bytes()
    }

    /// Appends positions (`[l, n_kv_heads, head_dim]` each), rounded to the cache's type.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        match &mut self.store {
            KvStore::F32(p) => {
                p.k.extend_from_slice(k);
                p.v.extend_from_slice(v);
            }
            KvStore::F16(p) => {
                p.k.extend_with(k.len(), |o| o.convert_from_f32_slice(k));
                p.v.extend_with(v.len(), |o| o.convert_from_f32_slice(v));
            }
            KvStore::Bf16(p) => {
                p.k.extend_with(k.len(), |o| o.convert_from_f32_slice(k));
                p.v.extend_with(v.len(), |o| o.convert_from_f32_slice(v));
            }
        }
    }

    /// Causal attention of `q` (`[shape.l, shape.h, shape.hd]`, the last positions cached)
    /// over every cached key and value ([`crate::kernels::attention`]).
    pub(crate) fn attend(&self, q: &[f32], shape: crate::kernels::AttentionShape) -> Vec<f32> {
        with_pair!(&self.store, p => crate::kernels::attention(q, p.k.values(), p.v.values(), shape))
    }

    /// Keeps the first `len` positions.
    pub fn trim_to(&mut self, len: usize) {
        let n = len.saturating_mul(self.row);
        with_pair!(&mut self.store, p => {
            p.k.truncate(n);
            p.v.truncate(n);
        })
    }

    /// Makes room for `positions` in all, allocated but not written (see
    /// [`crate::kernels::Aligned`]): appends up to there never move the cache.
    pub(crate) fn reserve(&mut self, positions: usize) {
        let room = positions.saturating_mul(self.row);
        with_pair!(&mut self.store, p => {
            p.k.reserve(room);
            p.v.reserve(room);
        })
    }

    /// A copy with room for `positions` in all.
    pub(crate) fn clone_with_room(&self, positions: usize) -> KvCache {
        let room = positions.saturating_mul(self.row);
        let store = match &self.store {
            KvStore::F32(p) => KvStore::F32(p.with_room(room)),
            KvStore::F16(p) => KvStore::F16(p.with_room(room)),
            KvStore::Bf16(p) => KvStore::Bf16(p.with_room(room)),
        };
        KvCache {
            store,
            row: self.row,
        }
    }

    /// The keys and values as stored (`persist` writes them out).
    pub(crate) fn store(&self) -> &KvStore {
        &self.store
    }

    /// Replaces the keys and values (`persist` reads them back, checked against this cache's
    /// type and row).
    pub(crate) fn set_store(&mut self, store: KvStore) {
        self.store = store;
    }
}

/// How a verify forward treats the recurrent state of linear-attention layers (see the module
/// docs). Every mode gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyMode {
    /// [`VerifyMode::Backup`] for states of up to [`BACKUP_MAX_BYTES`], else
    /// [`VerifyMode::Deferred`].
    #[default]
    Auto,
    /// The state stays where it is; kept steps are settled by the next forward.
    Deferred,
    /// The state advances through every verified position, with a copy from before them for a
    /// commit that keeps fewer.
    Backup,
}

/// The largest per-layer recurrent state [`VerifyMode::Auto`] advances with a backup copy.
/// Measured with `examples/verify_cost` (a verify of 2 after a fully kept round): on the
/// bundled demo model (64 KiB per layer) 1.18-1.20 plain steps against 1.29-1.31 deferred;
/// on a 32-layer 615M-parameter shape (1 MiB per layer) 1.07 against 1.08. Real Qwen3.5
/// checkpoints have up to a few MiB per layer in f32; above this, the copy (which doubles
/// the state's memory while a verify is in flight) is not worth it.
pub const BACKUP_MAX_BYTES: usize = 4 << 20;

impl VerifyMode {
    /// Whether a layer with a `state_len`-float state advances during a verify.
    fn backs_up(self, state_len: usize) -> bool {
        match self {
            VerifyMode::Auto => state_len * std::mem::size_of::<f32>() <= BACKUP_MAX_BYTES,
            VerifyMode::Deferred => false,
            VerifyMode::Backup => true,
        }
    }
}

/// Conv window and recurrent state of one linear-attention (Gated DeltaNet) layer.
#[derive(Debug, Default)]
pub struct LinearState {
    /// `[kernel - 1, conv_dim]`: the last inputs of the causal conv.
    pub(crate) conv: Vec<f32>,
    /// `[value_heads, value_dim, key_dim]`: the delta-rule state, before the `settle` pending
    /// steps (after a verify forward that advanced it: after all of its positions).
    pub(crate) state: Vec<f32>,
    /// Delta-rule steps not yet applied to `state`: during a verify forward, all of its
    /// positions; after `commit_verify`, the kept ones, which the next forward settles.
    pub(crate) pending: PendingSteps,
    /// True between `begin_verify` and `commit_verify`.
    pub(crate) deferring: bool,
    /// Set by `begin_verify`: the verify forward advances `state` and fills `backup`.
    pub(crate) backs_up: bool,
    /// The state from before the verified positions (its allocation is reused round after
    /// round; clones leave it out unless a verify is in flight).
    pub(crate) backup: Vec<f32>,
}

impl Clone for LinearState {
    fn clone(&self) -> Self {
        LinearState {
            conv: self.conv.clone(),
            state: self.state.clone(),
            pending: self.pending.clone(),
            deferring: self.deferring,
            backs_up: self.backs_up,
            backup: if self.advanced() {
                self.backup.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// Copies into the existing buffers, and keeps this state's backup allocation when the
    /// source has no verify in flight (as in the speculation loop, where it is reused round
    /// after round: a fresh one would be zero-filled by the next verify).
    fn clone_from(&mut self, src: &Self) {
        self.conv.clone_from(&src.conv);
        self.state.clone_from(&src.state);
        self.pending.clone_from(&src.pending);
        self.deferring = src.deferring;
        self.backs_up = src.backs_up;
        if src.advanced() {
            self.backup.clone_from(&src.backup);
        }
    }
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
        let advanced = self.advanced();
        let p = &mut self.pending;
        let held = p.len();
        let n = n.min(held);
        if n > 0 {
            let conv_dim = p.conv_in.len() / held;
            crate::kernels::conv_window_push(&mut self.conv, &p.conv_in[..n * conv_dim], conv_dim);
        }
        p.conv_in.clear();
        if advanced && n == held {
            // the state already holds every kept step
            p.truncate(0);
        } else {
            if advanced {
                self.state.copy_from_slice(&self.backup);
            }
            p.truncate(n);
            p.settle = n;
        }
        self.backs_up = false;
        self.deferring = false;
    }

    /// Drops a verify forward that was not committed: the state as it was before it.
    fn abandon_verify(&mut self) {
        if self.advanced() {
            // the backup was taken after the settled steps
            self.state.copy_from_slice(&self.backup);
            self.pending.truncate(0);
        } else {
            let settle = self.pending.settle;
            self.pending.truncate(settle);
        }
        self.pending.conv_in.clear();
        self.backs_up = false;
        self.deferring = false;
    }

    /// True when a verify forward has run on this layer and is not committed yet: a further
    /// forward would not see its steps, and fails with [`SECOND_VERIFY_FORWARD`].
    pub(crate) fn verify_pending(&self) -> bool {
        self.deferring && self.pending.len() > self.pending.settle
    }

    /// True once a verify forward that backs up ran: `state` includes its positions,
    /// `backup` is the state from before them.
    fn advanced(&self) -> bool {
        self.backs_up && self.verify_pending()
    }
}

/// The cache of one layer.
// One per layer, held in a `Vec` and matched in the hot loop: boxing the larger variant would
// add an indirection for no memory worth saving.
#[allow(clippy::large_enum_variant)]
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
    mode: VerifyMode,
    /// The images of the sequence's prompt (their features and the multimodal positions of
    /// every token), when it has any.
    images: Option<std::sync::Arc<crate::vision::MultimodalPrompt>>,
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
            mode: VerifyMode::Auto,
            images: None,
        }
    }

    /// Makes room for `positions` in all in its KV caches, allocated but not written: a
    /// sequence given room for its prompt and reply up front never moves its caches as they
    /// grow (a move at a 32k-token prompt's end cost about a second, see
    /// `kernels::Aligned`).
    pub fn reserve(&mut self, positions: usize) {
        layers_reserve(&mut self.layers, positions);
    }

    /// A copy with room for `positions` in all in its KV caches ([`SeqCache::reserve`]
    /// without a second copy).
    pub fn clone_with_room(&self, positions: usize) -> SeqCache {
        SeqCache {
            layers: layers_clone_with_room(&self.layers, positions),
            pos: self.pos,
            verify_start: self.verify_start,
            mode: self.mode,
            images: self.images.clone(),
        }
    }

    /// Gives a fresh sequence the images of its prompt: the forward writes their features over
    /// the image tokens' embeddings and turns every token with its multimodal position ids.
    pub fn set_images(&mut self, images: Option<std::sync::Arc<crate::vision::MultimodalPrompt>>) {
        self.images = images;
    }

    /// The images of the sequence's prompt.
    pub fn images(&self) -> Option<&std::sync::Arc<crate::vision::MultimodalPrompt>> {
        self.images.as_ref()
    }

    /// How later verify forwards treat linear-attention states (the default is
    /// [`VerifyMode::Auto`]); results are the same bits in every mode.
    pub fn set_verify_mode(&mut self, mode: VerifyMode) {
        self.mode = mode;
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

    /// Copies the linear states and notes the KV lengths. Inside a verify (between
    /// `begin_verify` and `commit_verify`) this is the cache as it was before the verify.
    pub fn snapshot(&self) -> CacheSnapshot {
        let pos = self.verify_start.unwrap_or(self.pos);
        let verified = self.pos - pos;
        CacheSnapshot {
            pos,
            layers: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerCache::Attention(kv) => {
                        SnapshotLayer::Kv(kv.len().saturating_sub(verified))
                    }
                    LayerCache::Linear(s) => {
                        let mut s = s.clone();
                        s.abandon_verify();
                        SnapshotLayer::Linear(Box::new(s))
                    }
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
                // (a snapshot never holds a verify in flight)
                (LayerCache::Linear(st), SnapshotLayer::Linear(saved)) => st.clone_from(saved),
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
                s.backs_up = self.mode.backs_up(s.state.len());
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

/// Makes room for `positions` in all in the KV caches of `layers` (see [`KvCache::reserve`]).
pub(crate) fn layers_reserve(layers: &mut [LayerCache], positions: usize) {
    for l in layers {
        if let LayerCache::Attention(kv) = l {
            kv.reserve(positions);
        }
    }
}

/// A copy of `layers` whose KV caches have room for `positions` in all.
pub(crate) fn layers_clone_with_room(layers: &[LayerCache], positions: usize) -> Vec<LayerCache> {
    layers
        .iter()
        .map(|l| match l {
            LayerCache::Attention(kv) => LayerCache::Attention(kv.clone_with_room(positions)),
            other => other.clone(),
        })
        .collect()
}

/// Bytes held by a list of layer caches.
pub(crate) fn layers_bytes(layers: &[LayerCache]) -> usize {
    layers
        .iter()
        .map(|l| match l {
            LayerCache::Attention(kv) => kv.bytes(),
            LayerCache::Linear(s) => (s.conv.len() + s.state.len()) * std::mem::size_of::<f32>(),
        })
        .sum::<usize>()
}
