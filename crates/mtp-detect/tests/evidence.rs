//! Each evidence rule on checkpoints the test builds itself.

mod common;

use common::*;
use mtp_detect::{
    probe, probe_local, CacheConfig, Format, ProbeOptions, Reason, Role, Runtime, Verdict,
};
use safetensors::Dtype;

fn nextn_names(base: u64, n: u64) -> Vec<String> {
    let mut v = vec![
        "model.embed_tokens.weight".to_string(),
        "model.norm.weight".to_string(),
        "lm_head.weight".to_string(),
    ];
    for l in 0..base {
        v.push(format!("model.layers.{l}.self_attn.q_proj.weight"));
    }
    for l in base..base + n {
        for t in [
            "eh_proj.weight",
            "enorm.weight",
            "hnorm.weight",
            "shared_head.norm.weight",
            "self_attn.q_proj.weight",
            "mlp.gate_proj.weight",
        ] {
            v.push(format!("model.layers.{l}.{t}"));
        }
    }
    v
}

/// An ERNIE-4.5 checkpoint's names (the Hugging Face layout of `baidu/ERNIE-4.5-*-PT`): `base`
/// decoder layers, then, with `mtp`, the head's four numbered module families.
fn ernie_names(base: u64, mtp: bool) -> Vec<String> {
    let mut v = vec![
        "model.embed_tokens.weight".to_string(),
        "model.norm.weight".to_string(),
        "lm_head.weight".to_string(),
    ];
    for l in 0..base {
        v.push(format!("model.layers.{l}.self_attn.q_proj.weight"));
        v.push(format!("model.layers.{l}.mlp.up_proj.weight"));
    }
    if mtp {
        for t in [
            "mtp_linear_proj.0.weight",
            "mtp_emb_norm.0.weight",
            "mtp_hidden_norm.0.weight",
            "mtp_block.0.input_layernorm.weight",
            "mtp_block.0.self_attn.q_proj.weight",
            "mtp_block.0.mlp.up_proj.weight",
        ] {
            v.push(format!("model.{t}"));
        }
    }
    v
}

struct StCase {
    name: &'static str,
    config: serde_json::Value,
    names: Vec<String>,
    dtype: Dtype,
    sharded: bool,
    head: bool,
    layers: u64,
    claims: bool,
    warning: Option<&'static str>,
    quantized: bool,
    vllm: bool,
    native: bool,
}

#[test]
fn safetensors_evidence_table() {
    let mut qwen = qwen_base_names(4);
    qwen.extend(qwen_mtp_names());
    let base_only = qwen_base_names(4);
    // MLX 4-bit: quantized weights carry .scales / .biases companions.
    let mut mlx = Vec::new();
    for n in qwen.iter() {
        mlx.push(n.clone());
        if n.ends_with("proj.weight") || n.ends_with("fc.weight") {
            let stem = n.trim_end_matches(".weight");
            mlx.push(format!("{stem}.scales"));
            mlx.push(format!("{stem}.biases"));
        }
    }
    let mut mlx_cfg = qwen_config(64, 256, 4, Some(1));
    mlx_cfg["quantization"] = serde_json::json!({"group_size": 64, "bits": 4});
    let ds_cfg = serde_json::json!({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3, "num_nextn_predict_layers": 1});
    let ernie_cfg = serde_json::json!({"model_type": "ernie4_5_moe", "hidden_size": 64, "vocab_size": 256, "num_hidden_layers": 2, "num_nextn_predict_layers": 1});
    let cases = vec![
        StCase {
            name: "qwen3.5 single file with embedded mtp.* head",
            config: qwen_config(64, 256, 4, Some(1)),
            names: qwen.clone(),
            dtype: Dtype::BF16,
            sharded: false,
            head: true,
            layers: 1,
            claims: true,
            warning: None,
            quantized: false,
            vllm: true,
            native: true,
        },
        StCase {
            name: "qwen3.5 sharded with index",
            config: qwen_config(64, 256, 4, Some(1)),
            names: qwen.clone(),
            dtype: Dtype::F32,
            sharded: true,
            head: true,
            layers: 1,
            claims: true,
            warning: None,
            quantized: false,
            vllm: true,
            native: true,
        },
        StCase {
            name: "config claims a head the weights lack (mlx-community 4-bit case)",
            config: qwen_config(64, 256, 4, Some(1)),
            names: base_only.clone(),
            dtype: Dtype::BF16,
            sharded: true,
            head: false,
            layers: 0,
            claims: true,
            warning: Some("claims 1 MTP layer(s)"),
            quantized: false,
            vllm: false,
            native: false,
        },
        StCase {
            name: "MLX affine-quantized checkpoint that keeps mtp.*",
            config: mlx_cfg,
            names: mlx,
            dtype: Dtype::U32,
            sharded: false,
            head: true,
            layers: 1,
            claims: true,
            warning: Some("mlx-vlm"),
            quantized: true,
            vllm: false,
            native: true,
        },
        StCase {
            name: "weights carry a head the config does not declare",
            config: qwen_config(64, 256, 4, None),
            names: qwen.clone(),
            dtype: Dtype::BF16,
            sharded: false,
            head: true,
            layers: 1,
            claims: false,
            warning: Some("does not declare"),
            quantized: false,
            vllm: true,
            native: true,
        },
        StCase {
            name: "DeepSeek NextN layers after num_hidden_layers",
            config: ds_cfg.clone(),
            names: nextn_names(3, 1),
            dtype: Dtype::BF16,
            sharded: true,
            head: true,
            layers: 1,
            claims: true,
            warning: None,
            quantized: false,
            vllm: true,
            native: false,
        },
        StCase {
            name: "DeepSeek config claims NextN, weights have none",
            config: ds_cfg,
            names: nextn_names(3, 0),
            dtype: Dtype::BF16,
            sharded: false,
            head: false,
            layers: 0,
            claims: true,
            warning: Some("claims 1 MTP layer(s)"),
            quantized: false,
            vllm: false,
            native: false,
        },
        StCase {
            name: "ERNIE-4.5 model.mtp_* head, sharded with index",
            config: ernie_cfg.clone(),
            names: ernie_names(2, true),
            dtype: Dtype::BF16,
            sharded: true,
            head: true,
            layers: 1,
            claims: true,
            warning: None,
            quantized: false,
            vllm: true,
            native: false,
        },
        StCase {
            name: "ERNIE-4.5 model.mtp_* head, one file",
            config: ernie_cfg.clone(),
            names: ernie_names(2, true),
            dtype: Dtype::BF16,
            sharded: false,
            head: true,
            layers: 1,
            claims: true,
            warning: None,
            quantized: false,
            vllm: true,
            native: false,
        },
        StCase {
            name: "ERNIE-4.5 config claims a head, weights have no model.mtp_*",
            config: ernie_cfg,
            names: ernie_names(2, false),
            dtype: Dtype::BF16,
            sharded: true,
            head: false,
            layers: 0,
            claims: true,
            warning: Some("claims 1 MTP layer(s)"),
            quantized: false,
            vllm: false,
            native: false,
        },
    ];
    for c in cases {
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), &c.config, &c.names, c.dtype, c.sharded);
        let r = probe_local(dir.path()).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(r.format, Format::Safetensors, "{}", c.name);
        assert_eq!(r.role, Role::Target, "{}", c.name);
        assert_eq!(r.mtp_head, c.head, "{}: {r:#?}", c.name);
        assert_eq!(r.mtp_layers, c.layers, "{}", c.name);
        assert_eq!(r.config_claims_mtp, c.claims, "{}", c.name);
        assert_eq!(r.mlx_affine_quantized, c.quantized, "{}", c.name);
        if c.head {
            assert!(!r.evidence.is_empty(), "{}", c.name);
            assert!(
                r.evidence.iter().all(|e| e.starts_with("(+")
                    || mtp_detect::classify_tensor(e, r.base_layers).is_some()),
                "{}: {:?}",
                c.name,
                r.evidence
            );
            assert!(
                !r.mtp_dtypes.is_empty(),
                "{}: dtypes from the header",
                c.name
            );
        } else {
            assert!(r.evidence.is_empty(), "{}", c.name);
        }
        match c.warning {
            Some(w) => assert!(
                r.warnings.iter().any(|x| x.contains(w)),
                "{}: expected a warning with {w:?}, got {:?}",
                c.name,
                r.warnings
            ),
            None => assert!(r.warnings.is_empty(), "{}: {:?}", c.name, r.warnings),
        }
        let vllm = r.runtime(Runtime::Vllm).unwrap();
        assert_eq!(vllm.can_run_mtp, c.vllm, "{}: {vllm:?}", c.name);
        if c.vllm {
            assert!(vllm
                .command
                .contains(r#"--speculative-config '{"method":"mtp","num_speculative_tokens":3}'"#));
        }
        let native = r.runtime(Runtime::Native).unwrap();
        assert_eq!(native.can_run_mtp, c.native, "{}: {native:?}", c.name);
        let llama = r.runtime(Runtime::LlamaServer).unwrap();
        assert_eq!(llama.verdict, Verdict::FormatUnsupported);
        assert!(!r.runtime(Runtime::Ollama).unwrap().can_run_mtp);
        // Reads only JSON and headers: far less than the weights.
        assert!(r.bytes_read > 0);
    }
}

/// llama.cpp b11434's converter drops ERNIE-4.5's `model.mtp_*` tensors
/// (`conversion/ernie.py`), so the convert-then-serve line for an ERNIE head carries no MTP
/// flags and says why; a head the converter keeps (DeepSeek NextN) does carry them.
#[test]
fn ernie_head_is_named_and_its_gguf_conversion_runs_without_mtp() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({"model_type": "ernie4_5_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_nextn_predict_layers": 1});
    write_checkpoint(dir.path(), &cfg, &ernie_names(2, true), Dtype::BF16, true);
    let r = probe_local(dir.path()).unwrap();
    assert_eq!(r.mtp_style, Some(mtp_detect::MtpStyle::Ernie));
    assert_eq!(r.mtp_tensor_count, 6);
    assert_eq!(r.mtp_dtypes, ["BF16"]);
    let llama = r.runtime(Runtime::LlamaServer).unwrap();
    assert!(
        llama.command.starts_with("python convert_hf_to_gguf.py ")
            && llama.command.ends_with("llama-server -m ./model.gguf"),
        "{}",
        llama.command
    );
    assert!(
        llama.note.contains("drops ERNIE-4.5's MTP tensors"),
        "{}",
        llama.note
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3, "num_nextn_predict_layers": 1});
    write_checkpoint(dir.path(), &cfg, &nextn_names(3, 1), Dtype::BF16, false);
    let llama = probe_local(dir.path())
        .unwrap()
        .runtime(Runtime::LlamaServer)
        .unwrap()
        .clone();
    assert!(
        llama
            .command
            .ends_with("llama-server -m ./model.gguf --spec-type draft-mtp --spec-draft-n-max 3"),
        "{}",
        llama.command
    );
    assert!(
        llama.note.contains("keeps the nextn head"),
        "{}",
        llama.note
    );
}

#[test]
fn mlx_quantized_head_reports_dtypes_from_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let names = vec![
        ("model.language_model.embed_tokens.weight", Dtype::U32),
        ("mtp.fc.weight", Dtype::U32),
        ("mtp.fc.scales", Dtype::BF16),
        ("mtp.fc.biases", Dtype::BF16),
        ("mtp.layers.0.mlp.up_proj.weight", Dtype::U32),
        ("mtp.layers.0.mlp.up_proj.scales", Dtype::BF16),
        ("mtp.layers.0.mlp.up_proj.biases", Dtype::BF16),
        ("mtp.layers.1.mlp.up_proj.weight", Dtype::U32),
    ];
    write_safetensors(&dir.path().join("model.safetensors"), &names, Some("mlx"));
    let r = probe_local(dir.path()).unwrap();
    assert!(r.mtp_head);
    assert_eq!(r.mtp_layers, 2);
    assert!(r.mlx_affine_quantized);
    assert_eq!(r.mtp_dtypes, vec!["BF16".to_string(), "U32".to_string()]);
    assert!(r.warnings.iter().any(|w| w.contains("no config.json")));
}

#[test]
fn drafter_checkpoint_is_recognised_by_its_model_type_and_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({"model_type": "qwen3_5_mtp", "block_size": 3,
        "text_config": {"hidden_size": 64, "vocab_size": 256, "mtp_num_hidden_layers": 1}});
    // MLX drafter layout: no `mtp.` prefix.
    let names: Vec<String> = qwen_mtp_names()
        .iter()
        .map(|n| n.trim_start_matches("mtp.").to_string())
        .collect();
    write_checkpoint(dir.path(), &cfg, &names, Dtype::BF16, false);
    let r = probe_local(dir.path()).unwrap();
    assert_eq!(r.role, Role::Drafter);
    assert!(r.mtp_head, "{r:#?}");
    assert_eq!(r.mtp_layers, 1);
    let native = r.runtime(Runtime::Native).unwrap();
    assert!(native.can_run_mtp);
    assert!(native.command.contains("with_drafter"));

    // Same type, no tensors: not a head.
    let empty = tempfile::tempdir().unwrap();
    write_checkpoint(
        empty.path(),
        &cfg,
        &["lm_head.weight".to_string()],
        Dtype::BF16,
        false,
    );
    let r = probe_local(empty.path()).unwrap();
    assert!(!r.mtp_head);
    assert!(r.warnings.iter().any(|w| w.contains("core tensors")));
}

struct GgufCase {
    name: &'static str,
    writer: GgufWriter,
    head: bool,
    layers: u64,
    verdict: Verdict,
    reason: Option<Reason>,
    warning: Option<&'static str>,
}

#[test]
fn gguf_evidence_table() {
    let mut v2 = qwen35_gguf("qwen35", 4, 1, true, true);
    v2.version = 2;
    let mut be = qwen35_gguf("qwen35", 4, 1, true, true);
    be.big_endian = true;
    let cases = vec![
        GgufCase {
            name: "qwen35 v3 with nextn head",
            writer: qwen35_gguf("qwen35", 4, 1, true, true),
            head: true,
            layers: 1,
            verdict: Verdict::HeadPresentRuntimeReady,
            reason: None,
            warning: None,
        },
        GgufCase {
            name: "qwen35 v2",
            writer: v2,
            head: true,
            layers: 1,
            verdict: Verdict::HeadPresentRuntimeReady,
            reason: None,
            warning: None,
        },
        GgufCase {
            name: "qwen35 big-endian v3",
            writer: be,
            head: true,
            layers: 1,
            verdict: Verdict::HeadPresentRuntimeReady,
            reason: None,
            warning: None,
        },
        GgufCase {
            name: "mimo2 with 3 nextn layers",
            writer: qwen35_gguf("mimo2", 4, 3, true, true),
            head: true,
            layers: 3,
            verdict: Verdict::HeadPresentRuntimeReady,
            reason: None,
            warning: None,
        },
        GgufCase {
            name: "qwen3next without a head: runtime ready, weights not",
            writer: qwen35_gguf("qwen3next", 4, 0, false, false),
            head: false,
            layers: 0,
            verdict: Verdict::RuntimeReadyNoHead,
            reason: Some(Reason::NoMtpHead),
            warning: None,
        },
        GgufCase {
            name: "glm5next head: needs a newer runtime",
            writer: qwen35_gguf("glm5next", 4, 1, true, true),
            head: true,
            layers: 1,
            verdict: Verdict::HeadPresentNeedsNewerRuntime,
            reason: Some(Reason::RuntimeUnsupported),
            warning: None,
        },
        GgufCase {
            name: "llama without a head",
            writer: qwen35_gguf("llama", 4, 0, false, false),
            head: false,
            layers: 0,
            verdict: Verdict::NoHeadRuntimeUnsupported,
            reason: Some(Reason::NoMtpHead),
            warning: None,
        },
        GgufCase {
            name: "header key without tensors",
            writer: qwen35_gguf("qwen35", 4, 1, true, false),
            head: false,
            layers: 0,
            verdict: Verdict::RuntimeReadyNoHead,
            reason: Some(Reason::NoMtpHead),
            warning: Some("no blk.N.nextn"),
        },
    ];
    for c in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model-Q4_K_M.gguf");
        c.writer.write(&path);
        let r = probe_local(&path).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(r.format, Format::Gguf, "{}", c.name);
        assert_eq!(r.mtp_head, c.head, "{}: {r:#?}", c.name);
        assert_eq!(r.mtp_layers, c.layers, "{}", c.name);
        let llama = r.runtime(Runtime::LlamaServer).unwrap();
        assert_eq!(llama.verdict, c.verdict, "{}", c.name);
        assert_eq!(llama.reason, c.reason, "{}", c.name);
        assert_eq!(r.runtime(Runtime::LmStudio).unwrap().verdict, c.verdict);
        if c.head {
            assert!(
                r.evidence[0].ends_with(&format!(".nextn_predict_layers = {}", c.layers)),
                "{}: {:?}",
                c.name,
                r.evidence
            );
            assert!(
                r.evidence.iter().any(|e| e.contains(".nextn.")),
                "{}",
                c.name
            );
        }
        if c.verdict == Verdict::HeadPresentRuntimeReady {
            assert_eq!(
                llama.command,
                format!(
                    "llama-server -m {} --spec-type draft-mtp --spec-draft-n-max 3",
                    path.display()
                )
            );
            let lms = r.runtime(Runtime::LmStudio).unwrap();
            assert!(
                lms.command.ends_with("--speculative-draft-mtp"),
                "{}",
                lms.command
            );
        }
        match c.warning {
            Some(w) => assert!(
                r.warnings.iter().any(|x| x.contains(w)),
                "{}: {:?}",
                c.name,
                r.warnings
            ),
            None => assert!(r.warnings.is_empty(), "{}: {:?}", c.name, r.warnings),
        }
        assert_eq!(
            r.runtime(Runtime::Vllm).unwrap().verdict,
            Verdict::FormatUnsupported
        );
        assert_eq!(
            r.runtime(Runtime::Native).unwrap().verdict,
            Verdict::FormatUnsupported
        );
    }
}

#[test]
fn gguf_metadata_longer_than_the_first_prefix_grows_the_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    let mut w = qwen35_gguf("qwen35", 2, 1, true, true);
    // ~200 KB of merges after the architecture keys, before the tensor table (the order
    // llama.cpp's converter writes).
    w.kv.insert(
        5,
        (
            "tokenizer.ggml.merges".into(),
            V::Arr(
                8,
                (0..20_000).map(|i| V::Str(format!("merge {i}"))).collect(),
            ),
        ),
    );
    w.write(&path);
    let mut opts = ProbeOptions::offline(CacheConfig::new(dir.path().join("cache")));
    opts.gguf_prefix = 4096;
    let r = probe(path.to_str().unwrap(), &opts).unwrap();
    assert!(r.mtp_head, "{r:#?}");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    // A cap below the header: the key alone, with a warning saying so.
    opts.gguf_cap = 8192;
    let r = probe(path.to_str().unwrap(), &opts).unwrap();
    assert!(r.mtp_head);
    assert!(r.bytes_read <= 8192, "{}", r.bytes_read);
    assert!(
        r.warnings.iter().any(|w| w.contains("read cap")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn split_gguf_finds_the_nextn_block_in_the_last_shard() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = qwen35_gguf("qwen35", 4, 1, true, false);
    first.kv.push(("split.count".into(), V::U16(2)));
    first.write(&dir.path().join("m-Q4_K_M-00001-of-00002.gguf"));
    let second = GgufWriter::new(3)
        .kv("split.no", V::U16(1))
        .tensor("blk.4.nextn.eh_proj.weight")
        .tensor("blk.4.nextn.enorm.weight");
    second.write(&dir.path().join("m-Q4_K_M-00002-of-00002.gguf"));
    let r = probe_local(dir.path()).unwrap();
    assert!(r.mtp_head, "{r:#?}");
    assert_eq!(r.files_read.len(), 2);
    assert!(r.evidence.iter().any(|e| e == "blk.4.nextn.eh_proj.weight"));
    // Naming the first shard's path brings the others along.
    let r = probe_local(&dir.path().join("m-Q4_K_M-00001-of-00002.gguf")).unwrap();
    assert!(r.mtp_head, "{r:#?}");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn several_ggufs_pick_one_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    qwen35_gguf("qwen35", 4, 1, true, true).write(&dir.path().join("m-Q4_K_M.gguf"));
    qwen35_gguf("qwen35", 4, 0, false, false).write(&dir.path().join("m-Q8_0.gguf"));
    std::fs::write(dir.path().join("mmproj-f16.gguf"), b"GGUFxxxx").unwrap();
    let r = probe_local(dir.path()).unwrap();
    assert_eq!(r.file.as_deref(), Some("m-Q4_K_M.gguf"));
    // The library is told the library's knob; the CLI says --file (tests in crates/mtp).
    assert!(
        r.warnings.iter().any(|w| w.contains("ProbeOptions::file")),
        "{:?}",
        r.warnings
    );
    let mut opts = ProbeOptions::offline(CacheConfig::new(dir.path().join("c")));
    opts.file = Some("m-Q8_0.gguf".into());
    let r = probe(dir.path().to_str().unwrap(), &opts).unwrap();
    assert!(!r.mtp_head);
}

#[test]
fn human_summary_and_json_carry_the_required_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.gguf");
    qwen35_gguf("qwen35", 4, 1, true, true).write(&path);
    let r = probe_local(&path).unwrap();
    let j = r.to_json();
    for k in [
        "format",
        "arch",
        "mtp_head",
        "mtp_layers",
        "evidence",
        "config_claims_mtp",
        "warnings",
        "runtimes",
        "registry",
        "bytes_read",
    ] {
        assert!(j.get(k).is_some(), "missing {k}");
    }
    assert_eq!(j["format"], "gguf");
    assert_eq!(j["arch"], "qwen35");
    let llama = j["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runtime"] == "llama-server")
        .unwrap();
    assert_eq!(llama["can_run_mtp"], true);
    assert_eq!(llama["verdict"], "head_present_runtime_ready");
    let h = r.render_human();
    assert!(h.contains("MTP head: yes"), "{h}");
    assert!(h.contains("--spec-type draft-mtp"), "{h}");
}

/// An MLX-quantized target whose conversion dropped the head (mlx-vlm's `convert --mtp` moves it
/// to a companion drafter): the weights are reported as MLX-quantized, vLLM is refused for the
/// format (not for the missing head), and the GGUF routes name the original checkpoint, since
/// llama.cpp's converter does not read MLX quantization.
#[test]
fn mlx_quantized_target_without_a_head_names_what_can_read_it() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-moe-mlx4");
    let r = probe_local(&dir).unwrap();
    assert!(!r.mtp_head);
    assert!(r.mlx_quantized_weights && !r.mlx_affine_quantized, "{r:#?}");
    assert!(r.render_human().contains("MLX-quantized"));
    let vllm = r.runtime(Runtime::Vllm).unwrap();
    assert_eq!(vllm.verdict, Verdict::FormatUnsupported, "{vllm:?}");
    assert!(vllm.note.contains("MLX"), "{vllm:?}");
    for rt in [Runtime::LlamaServer, Runtime::LmStudio, Runtime::Gguf] {
        let line = r.runtime(rt).unwrap();
        assert!(
            line.command.contains("<original checkpoint>") && line.note.contains("MLX"),
            "{line:?}"
        );
    }
    // the same checkpoint before quantization: converted as it is
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-moe");
    let r = probe_local(&dir).unwrap();
    assert!(!r.mlx_quantized_weights);
    let llama = r.runtime(Runtime::LlamaServer).unwrap();
    assert!(
        !llama.command.contains("<original checkpoint>"),
        "{llama:?}"
    );
}

/// A vision tower is reported from its tensors (any of the namespaces) or, for GGUF, from a
/// projector file beside the weights; a config's `vision_config` alone is no evidence.
#[test]
fn vision_towers_come_from_tensors_or_projector_files() {
    for (prefix, sharded) in [
        ("model.visual.", false),
        ("vision_tower.", true),
        ("model.language_model.visual.", false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut names = qwen_base_names(4);
        names.push(format!("{prefix}blocks.0.attn.qkv.weight"));
        write_checkpoint(
            dir.path(),
            &qwen_config(64, 256, 4, None),
            &names,
            Dtype::BF16,
            sharded,
        );
        let r = probe_local(dir.path()).unwrap();
        assert!(r.vision, "{prefix}");
        assert_eq!(
            r.vision_evidence.as_deref(),
            Some(format!("{prefix}blocks.0.attn.qkv.weight").as_str())
        );
        assert!(r.render_human().contains("vision tower: yes"), "{prefix}");
        assert_eq!(r.to_json()["vision"], true);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = qwen_config(64, 256, 4, None);
    config["vision_config"] = serde_json::json!({"depth": 2});
    write_checkpoint(dir.path(), &config, &qwen_base_names(4), Dtype::BF16, false);
    let r = probe_local(dir.path()).unwrap();
    assert!(!r.vision && r.vision_evidence.is_none());
    assert!(r.render_human().contains("vision tower: no"));
    // GGUF: the projector file beside the weights
    let dir = tempfile::tempdir().unwrap();
    qwen35_gguf("qwen35", 4, 1, true, true).write(&dir.path().join("m-Q4_K_M.gguf"));
    assert!(!probe_local(dir.path()).unwrap().vision);
    std::fs::write(dir.path().join("mmproj-m-f16.gguf"), b"GGUFxxxx").unwrap();
    let r = probe_local(dir.path()).unwrap();
    assert!(r.vision);
    assert_eq!(r.vision_evidence.as_deref(), Some("mmproj-m-f16.gguf"));
}
