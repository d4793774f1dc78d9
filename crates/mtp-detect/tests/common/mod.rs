//! Test helpers: a small GGUF writer, safetensors checkpoint builders (via the `safetensors`
//! crate), and the project's fake Hub (`mtp-fakehub`) serving checkpoint directories.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mtp_fakehub::{FakeFile, FakeHub, FakeRepo};

// ---------------------------------------------------------------------------------------
// GGUF writer
// ---------------------------------------------------------------------------------------

/// A GGUF metadata value to write.
#[derive(Debug, Clone)]
pub enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// element type tag, items
    Arr(u32, Vec<V>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl V {
    pub fn tag(&self) -> u32 {
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::Str(_) => 8,
            V::Arr(..) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
        }
    }
    pub fn s(x: &str) -> V {
        V::Str(x.to_string())
    }
}

/// Writes GGUF headers (v2 or v3, either endianness) followed by fake tensor data.
pub struct GgufWriter {
    pub version: u32,
    pub big_endian: bool,
    pub kv: Vec<(String, V)>,
    /// name, dims, ggml type
    pub tensors: Vec<(String, Vec<u64>, u32)>,
    /// bytes of fake tensor data appended after the header
    pub data_len: usize,
}

impl GgufWriter {
    pub fn new(version: u32) -> Self {
        GgufWriter {
            version,
            big_endian: false,
            kv: Vec::new(),
            tensors: Vec::new(),
            data_len: 64,
        }
    }
    pub fn kv(mut self, k: &str, v: V) -> Self {
        self.kv.push((k.to_string(), v));
        self
    }
    pub fn tensor(mut self, name: &str) -> Self {
        self.tensors.push((name.to_string(), vec![4, 4], 8));
        self
    }

    fn u32(&self, out: &mut Vec<u8>, v: u32) {
        if self.big_endian {
            out.extend(v.to_be_bytes())
        } else {
            out.extend(v.to_le_bytes())
        }
    }
    fn u64(&self, out: &mut Vec<u8>, v: u64) {
        if self.big_endian {
            out.extend(v.to_be_bytes())
        } else {
            out.extend(v.to_le_bytes())
        }
    }
    fn bytes_of<const N: usize>(&self, le: [u8; N]) -> [u8; N] {
        let mut a = le;
        if self.big_endian {
            a.reverse();
        }
        a
    }
    fn string(&self, out: &mut Vec<u8>, s: &[u8]) {
        self.u64(out, s.len() as u64);
        out.extend_from_slice(s);
    }
    fn value(&self, out: &mut Vec<u8>, v: &V) {
        match v {
            V::U8(x) => out.push(*x),
            V::I8(x) => out.push(*x as u8),
            V::U16(x) => out.extend(self.bytes_of(x.to_le_bytes())),
            V::I16(x) => out.extend(self.bytes_of(x.to_le_bytes())),
            V::U32(x) => self.u32(out, *x),
            V::I32(x) => out.extend(self.bytes_of(x.to_le_bytes())),
            V::F32(x) => out.extend(self.bytes_of(x.to_le_bytes())),
            V::Bool(x) => out.push(*x as u8),
            V::Str(s) => self.string(out, s.as_bytes()),
            V::Arr(t, items) => {
                self.u32(out, *t);
                self.u64(out, items.len() as u64);
                for i in items {
                    self.value(out, i);
                }
            }
            V::U64(x) => self.u64(out, *x),
            V::I64(x) => out.extend(self.bytes_of(x.to_le_bytes())),
            V::F64(x) => out.extend(self.bytes_of(x.to_le_bytes())),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        self.u32(&mut out, self.version);
        self.u64(&mut out, self.tensors.len() as u64);
        self.u64(&mut out, self.kv.len() as u64);
        for (k, v) in &self.kv {
            self.string(&mut out, k.as_bytes());
            self.u32(&mut out, v.tag());
            self.value(&mut out, v);
        }
        let mut off = 0u64;
        for (name, dims, ty) in &self.tensors {
            self.string(&mut out, name.as_bytes());
            self.u32(&mut out, dims.len() as u32);
            for d in dims {
                self.u64(&mut out, *d);
            }
            self.u32(&mut out, *ty);
            self.u64(&mut out, off);
            off += 32;
        }
        // alignment padding + fake data
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend(std::iter::repeat_n(0xAB, self.data_len));
        out
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.to_bytes()).unwrap();
    }
}

/// A qwen35-style GGUF: `block_count` blocks including `nextn` NextN blocks at the end.
pub fn qwen35_gguf(
    arch: &str,
    base: u64,
    nextn: u64,
    with_key: bool,
    with_tensors: bool,
) -> GgufWriter {
    let mut w = GgufWriter::new(3)
        .kv("general.architecture", V::s(arch))
        .kv("general.name", V::s("test model"))
        .kv(
            &format!("{arch}.block_count"),
            V::U32((base + nextn) as u32),
        )
        .kv(&format!("{arch}.embedding_length"), V::U32(64));
    if with_key {
        w = w.kv(
            &format!("{arch}.nextn_predict_layers"),
            V::U32(nextn as u32),
        );
    }
    w = w.kv(
        "tokenizer.ggml.tokens",
        V::Arr(8, (0..300).map(|i| V::Str(format!("tok{i}"))).collect()),
    );
    w = w.tensor("token_embd.weight");
    for b in 0..base {
        w = w.tensor(&format!("blk.{b}.attn_norm.weight"));
    }
    if with_tensors {
        for b in base..base + nextn {
            for t in [
                "eh_proj.weight",
                "enorm.weight",
                "hnorm.weight",
                "shared_head_norm.weight",
            ] {
                w = w.tensor(&format!("blk.{b}.nextn.{t}"));
            }
            w = w.tensor(&format!("blk.{b}.attn_norm.weight"));
        }
    }
    w.tensor("output.weight")
}

// ---------------------------------------------------------------------------------------
// safetensors checkpoints
// ---------------------------------------------------------------------------------------

/// Writes one safetensors file with the given `(name, dtype)` tensors (shape [2, 4]).
pub fn write_safetensors(
    path: &Path,
    tensors: &[(&str, safetensors::Dtype)],
    format: Option<&str>,
) {
    let data: Vec<(String, Vec<u8>, safetensors::Dtype)> = tensors
        .iter()
        .map(|(n, d)| {
            let bytes = match d {
                safetensors::Dtype::F32 | safetensors::Dtype::U32 => 32,
                _ => 16,
            };
            (n.to_string(), vec![0u8; bytes], *d)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
        .iter()
        .map(|(n, b, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, vec![2, 4], b).unwrap(),
            )
        })
        .collect();
    let meta = format.map(|f| {
        let mut m = std::collections::HashMap::new();
        m.insert("format".to_string(), f.to_string());
        m
    });
    safetensors::tensor::serialize_to_file(views, meta, path).unwrap();
}

/// Base tensors of a Qwen3.5-layout target (HF names).
pub fn qwen_base_names(layers: u64) -> Vec<String> {
    let mut v = vec![
        "model.language_model.embed_tokens.weight".to_string(),
        "model.language_model.norm.weight".to_string(),
        "lm_head.weight".to_string(),
    ];
    for l in 0..layers {
        v.push(format!(
            "model.language_model.layers.{l}.input_layernorm.weight"
        ));
        v.push(format!(
            "model.language_model.layers.{l}.mlp.up_proj.weight"
        ));
    }
    v
}

/// The `mtp.*` head of a Qwen3.5 HF checkpoint (as make_tiny.py writes it).
pub fn qwen_mtp_names() -> Vec<String> {
    [
        "mtp.fc.weight",
        "mtp.layers.0.input_layernorm.weight",
        "mtp.layers.0.mlp.down_proj.weight",
        "mtp.layers.0.mlp.gate_proj.weight",
        "mtp.layers.0.mlp.up_proj.weight",
        "mtp.layers.0.post_attention_layernorm.weight",
        "mtp.layers.0.self_attn.k_proj.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.norm.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn qwen_config(hidden: u64, vocab: u64, layers: u64, claim: Option<u64>) -> serde_json::Value {
    let mut tc = serde_json::json!({
        "model_type": "qwen3_5_text",
        "hidden_size": hidden,
        "vocab_size": vocab,
        "num_hidden_layers": layers,
    });
    if let Some(c) = claim {
        tc["mtp_num_hidden_layers"] = c.into();
    }
    serde_json::json!({"model_type": "qwen3_5", "text_config": tc, "vocab_size": vocab})
}

pub fn write_json(path: &Path, v: &serde_json::Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

/// Writes a checkpoint dir: config + either one file or an index over two shards.
pub fn write_checkpoint(
    dir: &Path,
    config: &serde_json::Value,
    names: &[String],
    dtype: safetensors::Dtype,
    sharded: bool,
) {
    std::fs::create_dir_all(dir).unwrap();
    write_json(&dir.join("config.json"), config);
    let pairs: Vec<(&str, safetensors::Dtype)> = names
        .iter()
        .map(|n| {
            let d = if n.ends_with(".weight")
                && (n.contains("proj") || n.contains("fc."))
                && dtype == safetensors::Dtype::U32
            {
                safetensors::Dtype::U32
            } else if dtype == safetensors::Dtype::U32 {
                safetensors::Dtype::BF16
            } else {
                dtype
            };
            (n.as_str(), d)
        })
        .collect();
    if !sharded {
        write_safetensors(&dir.join("model.safetensors"), &pairs, Some("pt"));
        return;
    }
    let (a, b) = pairs.split_at(pairs.len() / 2);
    let s1 = "model-00001-of-00002.safetensors";
    let s2 = "model-00002-of-00002.safetensors";
    write_safetensors(&dir.join(s1), a, Some("pt"));
    write_safetensors(&dir.join(s2), b, Some("pt"));
    let mut wm = serde_json::Map::new();
    for (n, _) in a {
        wm.insert(n.to_string(), s1.into());
    }
    for (n, _) in b {
        wm.insert(n.to_string(), s2.into());
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &serde_json::json!({"metadata": {"total_size": 0}, "weight_map": wm}),
    );
}

/// A place in an HF cache: writes `models--org--name/{refs/main, snapshots/<rev>/}` and
/// returns the snapshot dir.
pub fn cache_snapshot(hub_cache: &Path, repo: &str, rev: &str) -> PathBuf {
    let root = hub_cache.join(format!("models--{}", repo.replace('/', "--")));
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), rev).unwrap();
    let snap = root.join("snapshots").join(rev);
    std::fs::create_dir_all(&snap).unwrap();
    snap
}

// A local Hub: mtp-fakehub serving directories from disk
// ---------------------------------------------------------------------------------------

/// A public [`FakeRepo`] `id` holding every file under `dir` (recursively), at its path
/// relative to `dir` with `/` separators. LFS as [`FakeFile::new`] decides (by extension or
/// size), so weights are served through the Hub's redirect to its CDN route.
pub fn fake_repo_from_dir(id: &str, dir: &Path) -> FakeRepo {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<FakeFile>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().into_string().expect("a UTF-8 file name");
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().unwrap().is_dir() {
                walk(&e.path(), &path, out);
            } else {
                out.push(FakeFile::new(&path, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, "", &mut files);
    FakeRepo::new(id, files)
}

/// A [`FakeHub`] serving one repository, `id`, built from `dir` ([`fake_repo_from_dir`]).
pub fn hub_from_dir(id: &str, dir: &Path) -> FakeHub {
    FakeHub::start(vec![fake_repo_from_dir(id, dir)])
}

/// One page of a file listing as the hub serves it: the path and query a client asks for
/// (as [`mtp_fakehub::Request::path`] records it) and the length of the JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListingPage {
    pub path: String,
    pub body_len: u64,
}

/// Fetches the recursive file listing of `repo` at `revision` from `hub` the way the Hub
/// client does (`/api/models/{repo}/tree/{revision}?recursive=true`, then each
/// `Link: <…>; rel="next"` to the end), and returns its pages. On a runtime of its own:
/// call it from synchronous tests.
pub fn listing_pages(hub: &FakeHub, repo: &str, revision: &str) -> Vec<ListingPage> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let mut url = format!(
            "{}/api/models/{repo}/tree/{revision}?recursive=true",
            hub.base
        );
        let mut pages = Vec::new();
        loop {
            let resp = client.get(&url).send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 200, "{url}");
            let next = resp
                .headers()
                .get(reqwest::header::LINK)
                .map(|v| v.to_str().unwrap().to_string());
            let body = resp.bytes().await.unwrap();
            let path = url
                .strip_prefix(&hub.base)
                .expect("a link on the same hub")
                .to_string();
            pages.push(ListingPage {
                path,
                body_len: body.len() as u64,
            });
            let next = next.and_then(|l| {
                let (target, rel) = l.split_once(';')?;
                (rel.trim() == "rel=\"next\"").then(|| {
                    target
                        .trim()
                        .trim_start_matches('<')
                        .trim_end_matches('>')
                        .to_string()
                })
            });
            match next {
                Some(n) => url = n,
                None => return pages,
            }
            assert!(pages.len() < 1000, "a listing that never ends");
        }
    })
}
