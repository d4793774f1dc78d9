//! Prefix-cache states as bytes, for a cache that outlives the process (`mtp serve
//! --cache-dir`).
//!
//! [`PromptState::to_bytes`] writes everything a state holds (the target's caches, pending
//! delta-rule steps included, the drafter's cache, the last hidden state, the prompt's images)
//! and [`Engine::state_from_bytes`] reads it back, checking every length against the loaded
//! model's own caches before anything is allocated: bytes from a disk are outside input, and a
//! state that does not fit this model is an error, never a panic or an out-of-bounds read.
//!
//! A state only continues the model that computed it. [`Engine::state_identity`] names that
//! model: the weights' files (their headers, sizes and samples of their contents), the
//! configuration, the drafter, the precision the matrices are kept in, the KV caches' type and
//! this format's version. A cache on disk keeps the states of one identity apart from any
//! other's.
//!
//! The format is ours and small (little-endian lengths, `f32` arrays, and the 16-bit values of
//! a half-precision KV cache): a state is a few vectors of floats, and a general serializer
//! would add a dependency for no gain.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::cache::{KvPair, KvStore, KvType, LayerCache, LinearState};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kernels::Aligned;
use crate::resume::PromptState;
use crate::vision::prompt::{ImageSpan, MultimodalPrompt};

/// The version of the byte layout (part of the identity: a new layout never reads an old
/// file).
pub const STATE_FORMAT: u32 = 1;

const MAGIC: &[u8; 8] = b"MTPSTATE";

/// Appends little-endian values.
#[derive(Default)]
pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u64(&mut self, v: usize) {
        self.0.extend_from_slice(&(v as u64).to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    /// Half-precision values by their bits (a KV cache in f16 or bf16).
    pub(crate) fn halves(&mut self, v: impl ExactSizeIterator<Item = u16>) {
        self.u64(v.len());
        self.0.reserve(v.len() * 2);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub(crate) fn floats(&mut self, v: &[f32]) {
        self.u64(v.len());
        self.0.reserve(v.len() * 4);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
}

/// Reads what [`Writer`] wrote; every read is checked against what is left.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

fn bad(message: impl Into<String>) -> Error {
    Error::State(message.into())
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.buf.len() - self.at;
        if n > left {
            return Err(bad(format!(
                "{what}: {n} bytes wanted at offset {}, {left} left (truncated?)",
                self.at
            )));
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<usize> {
        let b = self.take(8, what)?;
        let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        usize::try_from(v).map_err(|_| bad(format!("{what}: {v} does not fit this machine")))
    }
    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }
    /// A float array whose length must be `want` (when given); its bytes are checked to be
    /// there before anything is allocated.
    pub(crate) fn floats(&mut self, want: Option<usize>, what: &str) -> Result<Vec<f32>> {
        Ok(self
            .float_bytes(want, what)?
            .map(f32::from_le_bytes)
            .collect())
    }
    /// [`Reader::floats`] read straight into a buffer on a cache line (the attention cache's).
    pub(crate) fn floats_aligned(&mut self, want: Option<usize>, what: &str) -> Result<Aligned> {
        let bytes = self.float_bytes(want, what)?;
        Ok(Aligned::filled(bytes.len(), |out| {
            for (o, b) in out.iter_mut().zip(bytes) {
                *o = f32::from_le_bytes(b);
            }
        }))
    }
    /// `want` half-precision values written by [`Writer::halves`], read straight into a buffer
    /// on a cache line (an f16 or bf16 attention cache's) through `from_bits`; the length and
    /// the bytes are checked before anything is allocated.
    pub(crate) fn halves_aligned<T: Copy + Default>(
        &mut self,
        want: usize,
        what: &str,
        from_bits: fn(u16) -> T,
    ) -> Result<Aligned<T>> {
        let n = self.u64(what)?;
        if n != want {
            return Err(bad(format!("{what}: {n} values, this model has {want}")));
        }
        let bytes = n
            .checked_mul(2)
            .ok_or_else(|| bad(format!("{what}: length {n} overflows")))?;
        let raw = self.take(bytes, what)?;
        Ok(Aligned::filled(n, |out| {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = from_bits(u16::from_le_bytes([b[0], b[1]]));
            }
        }))
    }
    /// The little-endian bytes of a float array, checked as [`Reader::floats`] says.
    fn float_bytes(
        &mut self,
        want: Option<usize>,
        what: &str,
    ) -> Result<impl ExactSizeIterator<Item = [u8; 4]> + 'a> {
        let n = self.u64(what)?;
        if let Some(w) = want.filter(|&w| w != n) {
            return Err(bad(format!("{what}: {n} values, this model has {w}")));
        }
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| bad(format!("{what}: length {n} overflows")))?;
        let raw = self.take(bytes, what)?;
        Ok(raw.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]))
    }
    fn end(&self) -> Result<()> {
        match self.buf.len() - self.at {
            0 => Ok(()),
            n => Err(bad(format!("{n} bytes after the end of the state"))),
        }
    }
}

/// A layer's kind in the bytes: full attention with an f32 KV cache (as every cache was in the
/// first version of the format), linear attention, full attention with an f16 or a bf16 cache.
const KIND_KV_F32: u8 = 0;
const KIND_LINEAR: u8 = 1;
const KIND_KV_F16: u8 = 2;
const KIND_KV_BF16: u8 = 3;

/// The kind byte of a full-attention layer whose KV cache is of `kv`.
fn kv_kind(kv: KvType) -> u8 {
    match kv {
        KvType::F32 => KIND_KV_F32,
        KvType::F16 => KIND_KV_F16,
        KvType::Bf16 => KIND_KV_BF16,
    }
}

fn write_layers(w: &mut Writer, layers: &[LayerCache]) {
    w.u64(layers.len());
    for l in layers {
        match l {
            LayerCache::Attention(kv) => match kv.store() {
                KvStore::F32(p) => {
                    w.u8(KIND_KV_F32);
                    w.floats(p.k.values());
                    w.floats(p.v.values());
                }
                KvStore::F16(p) => {
                    w.u8(KIND_KV_F16);
                    w.halves(p.k.values().iter().map(|x| x.to_bits()));
                    w.halves(p.v.values().iter().map(|x| x.to_bits()));
                }
                KvStore::Bf16(p) => {
                    w.u8(KIND_KV_BF16);
                    w.halves(p.k.values().iter().map(|x| x.to_bits()));
                    w.halves(p.v.values().iter().map(|x| x.to_bits()));
                }
            },
            LayerCache::Linear(s) => {
                w.u8(KIND_LINEAR);
                w.floats(&s.conv);
                w.floats(&s.state);
                let p = &s.pending;
                w.u64(p.settle);
                for v in [&p.q, &p.k, &p.v, &p.g, &p.beta] {
                    w.floats(v);
                }
            }
        }
    }
}

/// Reads layer caches shaped as `template` (a fresh cache of the same model): `pos` positions
/// in every KV cache, linear states of the template's sizes, pending steps of its shapes.
fn read_layers(
    r: &mut Reader<'_>,
    template: &[LayerCache],
    pos: usize,
    what: &str,
) -> Result<Vec<LayerCache>> {
    let n = r.u64(what)?;
    if n != template.len() {
        return Err(bad(format!(
            "{what}: {n} layers, this model has {}",
            template.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    for (i, t) in template.iter().enumerate() {
        let kind = r.u8(what)?;
        let layer = match (kind, t) {
            (KIND_KV_F32 | KIND_KV_F16 | KIND_KV_BF16, LayerCache::Attention(kv))
                if kind == kv_kind(kv.kv_type()) =>
            {
                let mut c = kv.clone();
                let want = pos.checked_mul(kv.row()).ok_or_else(|| bad("overflow"))?;
                let (keys, values) = (
                    format!("{what} layer {i} keys"),
                    format!("{what} layer {i} values"),
                );
                c.set_store(match kv.kv_type() {
                    KvType::F32 => KvStore::F32(KvPair {
                        k: r.floats_aligned(Some(want), &keys)?,
                        v: r.floats_aligned(Some(want), &values)?,
                    }),
                    KvType::F16 => KvStore::F16(KvPair {
                        k: r.halves_aligned(want, &keys, half::f16::from_bits)?,
                        v: r.halves_aligned(want, &values, half::f16::from_bits)?,
                    }),
                    KvType::Bf16 => KvStore::Bf16(KvPair {
                        k: r.halves_aligned(want, &keys, half::bf16::from_bits)?,
                        v: r.halves_aligned(want, &values, half::bf16::from_bits)?,
                    }),
                });
                LayerCache::Attention(c)
            }
            (KIND_LINEAR, LayerCache::Linear(s)) => {
                let d = s.pending.dims;
                let conv = r.floats(Some(s.conv.len()), &format!("{what} layer {i} conv"))?;
                let state = r.floats(Some(s.state.len()), &format!("{what} layer {i} state"))?;
                let settle = r.u64(what)?;
                let per = [d.hk * d.dk, d.hk * d.dk, d.hv * d.dv, d.hv, d.hv];
                let mut v = Vec::with_capacity(5);
                for (j, width) in per.into_iter().enumerate() {
                    let want = settle.checked_mul(width).ok_or_else(|| bad("overflow"))?;
                    v.push(r.floats(Some(want), &format!("{what} layer {i} pending {j}"))?);
                }
                let mut st = LinearState {
                    conv,
                    state,
                    ..Default::default()
                };
                let p = &mut st.pending;
                p.dims = d;
                p.beta = v.pop().unwrap_or_default();
                p.g = v.pop().unwrap_or_default();
                p.v = v.pop().unwrap_or_default();
                p.k = v.pop().unwrap_or_default();
                p.q = v.pop().unwrap_or_default();
                p.settle = settle;
                LayerCache::Linear(st)
            }
            (k, _) => {
                return Err(bad(format!(
                    "{what} layer {i}: kind {k} where this model has {}",
                    match t {
                        LayerCache::Attention(kv) => format!(
                            "full attention, its KV cache in {} ({})",
                            kv.kv_type(),
                            kv_kind(kv.kv_type())
                        ),
                        LayerCache::Linear(_) => format!("linear attention ({KIND_LINEAR})"),
                    }
                )))
            }
        };
        out.push(layer);
    }
    Ok(out)
}

impl PromptState {
    /// The state as bytes (see the module docs); [`Engine::state_from_bytes`] reads them back
    /// on the model that computed it. A state is never taken inside a verify, so there is
    /// nothing in flight to write.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(MAGIC);
        w.bytes(&STATE_FORMAT.to_le_bytes());
        w.u64(self.tokens);
        w.floats(&self.last_hidden);
        w.u64(self.cache.position());
        write_layers(&mut w, &self.cache.layers);
        match &self.mcache {
            None => w.u8(0),
            Some(m) => {
                w.u8(1);
                w.u64(m.position());
                write_layers(&mut w, m.layers());
            }
        }
        match self.cache.images() {
            None => w.u8(0),
            Some(m) => {
                w.u8(1);
                m.write_to(&mut w);
            }
        }
        w.0
    }
}

impl Engine {
    /// Reads a state written by [`PromptState::to_bytes`], checking that it fits this model
    /// (layer kinds, cache sizes, drafter, hidden size, images) and that nothing is left over.
    /// Whether it was computed by this model's weights is the caller's to know: keep states
    /// apart by [`Engine::state_identity`].
    pub fn state_from_bytes(&self, bytes: &[u8]) -> Result<PromptState> {
        let mut r = Reader::new(bytes);
        if &r.array::<8>("the magic")? != MAGIC {
            return Err(bad("not a saved state (no MTPSTATE magic)"));
        }
        let version = u32::from_le_bytes(r.array::<4>("the version")?);
        if version != STATE_FORMAT {
            return Err(bad(format!(
                "format version {version}, this engine reads {STATE_FORMAT}"
            )));
        }
        let model = self.model();
        let tokens = r.u64("the token count")?;
        if tokens == 0 {
            return Err(bad("a state of no tokens"));
        }
        let last_hidden = r.floats(Some(model.hidden_size()), "the last hidden state")?;
        let pos = r.u64("the cache position")?;
        if pos != tokens {
            return Err(bad(format!(
                "the cache is at position {pos} for a state of {tokens} tokens"
            )));
        }
        let fresh = model.new_cache();
        let layers = read_layers(&mut r, &fresh.layers, pos, "the target cache")?;
        let mut cache = fresh;
        cache.layers = layers;
        cache.advance(pos);
        let mcache = match r.u8("the drafter flag")? {
            0 => None,
            1 => {
                let head = self.drafter().ok_or_else(|| {
                    bad("the state carries a drafter cache and this engine loaded no drafter")
                })?;
                let mpos = r.u64("the drafter position")?;
                if mpos >= tokens {
                    return Err(bad(format!(
                        "the drafter cache holds {mpos} entries for {tokens} tokens"
                    )));
                }
                let mut m = head.new_cache();
                let layers = read_layers(&mut r, m.layers(), mpos, "the drafter cache")?;
                m.restore(layers, mpos);
                Some(m)
            }
            f => return Err(bad(format!("drafter flag {f}"))),
        };
        match r.u8("the images flag")? {
            0 => {}
            1 => {
                let pad = self.image_token_id().ok_or_else(|| {
                    bad("the state holds images and this model has no vision tower")
                })?;
                let m = MultimodalPrompt::read_from(&mut r, model.hidden_size(), pad)?;
                cache.set_images(Some(Arc::new(m)));
            }
            f => return Err(bad(format!("images flag {f}"))),
        }
        r.end()?;
        Ok(PromptState {
            cache,
            mcache,
            last_hidden,
            tokens,
        })
    }

    /// A digest (64 hex digits) of what a state of this engine depends on: its weights and
    /// configuration (see `checkpoint_identity`), its drafter's, the precision its matrices
    /// are kept in, its KV caches' type and [`STATE_FORMAT`]. Two engines with the same identity compute the same
    /// states. Computed on the first call (it reads samples of the weights files).
    pub fn state_identity(&self) -> Result<&str> {
        let (drafter, head, dtype) = &self.identity_of;
        self.identity
            .get_or_init(|| {
                let (kv, arith) = (self.model().kv_type(), self.model().arith());
                engine_identity(self.dir(), drafter.as_deref(), *head, *dtype, kv, arith)
                    .map_err(|e| e.to_string())
            })
            .as_deref()
            .map_err(|m| Error::Config {
                path: self.dir().to_path_buf(),
                message: format!("the weights cannot be read to name this model's states: {m}"),
            })
    }
}

/// Bytes hashed from each sample of a weights file.
const SAMPLE: u64 = 4096;
/// Samples spread over each weights file (besides its first 64 KiB and its end).
const SAMPLES: u64 = 64;

/// Feeds `h` with what identifies the checkpoint in `dir`: `config.json`, and for every
/// `*.safetensors` file (in name order) its name, length, first 64 KiB (the header and the
/// first tensors), [`SAMPLES`] samples of [`SAMPLE`] bytes spread over the rest and its last
/// bytes. Hashing whole files would read gigabytes at every load; a fine-tune changes every
/// tensor, so samples across the file tell two checkpoints of one shape apart, and a copy of
/// the same files gets the same identity.
pub(crate) fn checkpoint_identity(dir: &Path, h: &mut Sha256) -> Result<()> {
    let io = |path: &Path, source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let config = dir.join("config.json");
    match std::fs::read(&config) {
        Ok(b) => {
            h.update((b.len() as u64).to_le_bytes());
            h.update(&b);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => h.update(b"no config"),
        Err(e) => return Err(io(&config, e)),
    }
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let mut buf = vec![0u8; 64 * 1024];
    for path in files {
        let mut f = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
        let len = f.metadata().map_err(|e| io(&path, e))?.len();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        h.update(name.unwrap_or_default().as_bytes());
        h.update(len.to_le_bytes());
        let mut read_at = |at: u64, n: u64, buf: &mut [u8]| -> Result<()> {
            let n = n.min(len.saturating_sub(at)) as usize;
            f.seek(SeekFrom::Start(at)).map_err(|e| io(&path, e))?;
            f.read_exact(&mut buf[..n]).map_err(|e| io(&path, e))?;
            h.update(&buf[..n]);
            Ok(())
        };
        read_at(0, 64 * 1024, &mut buf)?;
        if len > 64 * 1024 {
            let span = len - 64 * 1024;
            for i in 0..SAMPLES {
                read_at(64 * 1024 + span / SAMPLES * i, SAMPLE, &mut buf)?;
            }
            read_at(len.saturating_sub(SAMPLE), SAMPLE, &mut buf)?;
        }
    }
    Ok(())
}

/// The identity of an engine loaded from `dir` with `drafter` (a companion directory, or the
/// embedded head / none, which `dir` covers), matrices kept as `dtype`, KV caches of `kv` and
/// quantized products in `arith`.
pub(crate) fn engine_identity(
    dir: &Path,
    drafter: Option<&Path>,
    head: bool,
    dtype: crate::loader::WeightDtype,
    kv: KvType,
    arith: crate::arith::Arith,
) -> Result<String> {
    let mut h = Sha256::new();
    h.update(MAGIC);
    h.update(STATE_FORMAT.to_le_bytes());
    h.update(format!("{dtype:?}").as_bytes());
    checkpoint_identity(dir, &mut h)?;
    match (drafter, head) {
        (Some(d), true) => {
            h.update(b"companion drafter");
            checkpoint_identity(d, &mut h)?;
        }
        (_, true) => h.update(b"embedded drafter"),
        (_, false) => h.update(b"no drafter"),
    }
    // (f32 caches add nothing: the identities of the states saved before the cache had a
    // type stay the same)
    if kv != KvType::F32 {
        h.update(format!("KV cache {kv}").as_bytes());
    }
    // (likewise `exact`, the default)
    if arith != crate::arith::Arith::Exact {
        h.update(format!("arithmetic {arith}").as_bytes());
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

impl MultimodalPrompt {
    pub(crate) fn write_to(&self, w: &mut Writer) {
        w.u64(self.image_token_id() as usize);
        w.u64(self.spans().len());
        for s in self.spans() {
            w.u64(s.start);
            for g in s.grid {
                w.u64(g);
            }
            w.bytes(&s.digest);
            w.floats(&s.features);
        }
    }

    /// Reads what [`MultimodalPrompt::write_to`] wrote, for a model of width `hidden` whose
    /// image token is `pad`: spans in order, not overlapping, each with its features.
    pub(crate) fn read_from(r: &mut Reader<'_>, hidden: usize, pad: u32) -> Result<Self> {
        let id = r.u64("the image token")?;
        if id != pad as usize {
            return Err(bad(format!(
                "images placed on token {id}, this model's image token is {pad}"
            )));
        }
        let n = r.u64("the image count")?;
        let mut spans = Vec::new();
        let mut end = 0usize;
        for k in 0..n {
            let start = r.u64("an image start")?;
            let mut grid = [0usize; 3];
            for g in &mut grid {
                *g = r.u64("an image grid")?;
            }
            let digest = r.array::<32>("an image digest")?;
            let len = grid
                .iter()
                .try_fold(1usize, |a, &g| a.checked_mul(g))
                .filter(|&l| l > 0)
                .ok_or_else(|| bad(format!("image {k}: grid {grid:?}")))?;
            if start < end {
                return Err(bad(format!(
                    "image {k} starts at {start}, inside the one before"
                )));
            }
            let want = len.checked_mul(hidden).ok_or_else(|| bad("overflow"))?;
            let features = r.floats(Some(want), &format!("image {k}'s features"))?;
            end = start.checked_add(len).ok_or_else(|| bad("overflow"))?;
            spans.push(ImageSpan {
                start,
                grid,
                features: features.into(),
                digest,
            });
        }
        Ok(MultimodalPrompt::from_parts(spans, hidden, pad))
    }
}
