//! Test helpers: a small GGUF writer, safetensors checkpoint builders (via the `safetensors`
//! crate), and a local HTTP server in the Hub's URL layout that honours `Range` and counts
//! bytes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

// ---------------------------------------------------------------------------------------
// A local Hub
// ---------------------------------------------------------------------------------------

/// Serves `root/<org>/<name>/…` as `/{org}/{name}/resolve/{rev}/{file}` and
/// `/api/models/{org}/{name}/tree/{rev}`, honouring `Range`, counting body bytes per path.
pub struct HubServer {
    pub base: String,
    pub total: Arc<AtomicU64>,
    pub per_file: Arc<Mutex<BTreeMap<String, u64>>>,
    pub auth_seen: Arc<Mutex<Vec<String>>>,
}

impl HubServer {
    pub fn start(root: PathBuf) -> HubServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let total = Arc::new(AtomicU64::new(0));
        let per_file = Arc::new(Mutex::new(BTreeMap::new()));
        let auth_seen = Arc::new(Mutex::new(Vec::new()));
        let (t, p, a) = (total.clone(), per_file.clone(), auth_seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (root, t, p, a) = (root.clone(), t.clone(), p.clone(), a.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &root, &t, &p, &a);
                });
            }
        });
        HubServer {
            base: format!("http://{addr}"),
            total,
            per_file,
            auth_seen,
        }
    }

    pub fn bytes_for(&self, file: &str) -> u64 {
        self.per_file
            .lock()
            .unwrap()
            .get(file)
            .copied()
            .unwrap_or(0)
    }
}

fn list_tree(dir: &Path, rel: &str, out: &mut Vec<serde_json::Value>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let relname = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let meta = e.metadata().unwrap();
        if meta.is_dir() {
            out.push(serde_json::json!({"type": "directory", "path": relname}));
            list_tree(&e.path(), &relname, out);
        } else {
            out.push(serde_json::json!({"type": "file", "path": relname, "size": meta.len()}));
        }
    }
}

fn serve(
    stream: TcpStream,
    root: &Path,
    total: &AtomicU64,
    per_file: &Mutex<BTreeMap<String, u64>>,
    auth_seen: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("range: bytes=") {
            let v = v.trim();
            if let Some((a, b)) = v.split_once('-') {
                range = Some((a.parse::<u64>().unwrap_or(0), b.parse::<u64>().ok()));
            }
        }
        if lower.starts_with("authorization:") {
            auth_seen.lock().unwrap().push(h.trim().to_string());
        }
    }
    let mut out = stream;
    let (path, _query) = path.split_once('?').unwrap_or((&path, ""));
    let respond =
        |out: &mut TcpStream, status: &str, headers: &str, body: &[u8]| -> std::io::Result<()> {
            write!(
                out,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
                body.len()
            )?;
            out.write_all(body)?;
            out.flush()
        };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        // {org}/{name}/tree/{rev}
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() >= 4 && parts[2] == "tree" {
            let dir = root.join(parts[0]).join(parts[1]);
            if !dir.is_dir() {
                return respond(&mut out, "404 Not Found", "", b"{\"error\":\"not found\"}");
            }
            let mut v = Vec::new();
            list_tree(&dir, "", &mut v);
            let body = serde_json::to_vec(&v).unwrap();
            total.fetch_add(body.len() as u64, Ordering::Relaxed);
            return respond(
                &mut out,
                "200 OK",
                "Content-Type: application/json\r\n",
                &body,
            );
        }
        return respond(&mut out, "404 Not Found", "", b"");
    }
    // /{org}/{name}/resolve/{rev}/{file...}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if parts.len() < 5 || parts[2] != "resolve" || parts[4].contains("..") {
        return respond(&mut out, "404 Not Found", "", b"");
    }
    let file = root.join(parts[0]).join(parts[1]).join(parts[4]);
    let Ok(mut f) = std::fs::File::open(&file) else {
        return respond(&mut out, "404 Not Found", "", b"");
    };
    let len = f.metadata()?.len();
    let key = parts[4].to_string();
    match range {
        Some((start, end)) => {
            let end = end
                .unwrap_or(len.saturating_sub(1))
                .min(len.saturating_sub(1));
            if start >= len {
                return respond(
                    &mut out,
                    "416 Range Not Satisfiable",
                    &format!("Content-Range: bytes */{len}\r\n"),
                    b"",
                );
            }
            let n = end - start + 1;
            let mut body = vec![0u8; n as usize];
            use std::io::Seek;
            f.seek(std::io::SeekFrom::Start(start))?;
            f.read_exact(&mut body)?;
            total.fetch_add(n, Ordering::Relaxed);
            *per_file.lock().unwrap().entry(key).or_default() += n;
            respond(
                &mut out,
                "206 Partial Content",
                &format!("Content-Range: bytes {start}-{end}/{len}\r\n"),
                &body,
            )
        }
        None => {
            let mut body = Vec::new();
            f.read_to_end(&mut body)?;
            total.fetch_add(body.len() as u64, Ordering::Relaxed);
            *per_file.lock().unwrap().entry(key).or_default() += body.len() as u64;
            respond(&mut out, "200 OK", "", &body)
        }
    }
}
