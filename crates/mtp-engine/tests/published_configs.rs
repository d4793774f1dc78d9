//! Configs with the key sets of published checkpoints (`tests/configs/`, whose README says which
//! file each one mirrors and where its key set was taken from) parse to the settings the
//! published files state, load as checkpoints of random weights named as each family names
//! them, and generate the same greedy tokens with and without MTP. Values this engine does not
//! implement are refused with an `Error::Config` naming the key.
//!
//! Every expected value below is copied from the JSON files (sizes shrunk there, token ids
//! taken modulo 256), never from what the code under test computes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use mtp_engine::config::{Family, GenerationConfig, ModelConfig};
use mtp_engine::{Engine, Error, GenerateOptions, WeightDtype};
use serde_json::{json, Value};

fn configs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/configs")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// Where a layout keeps the language model's tensors.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// Hugging Face VL wrapper: `model.language_model.*`, `model.visual.*`, `lm_head`, `mtp.*`.
    HfWrapper,
    /// Hugging Face text-only (`*ForCausalLM`): `model.*`, `lm_head`, `mtp.*`.
    HfText,
}

impl Layout {
    fn prefix(self) -> &'static str {
        match self {
            Layout::HfWrapper => "model.language_model.",
            Layout::HfText => "model.",
        }
    }
}

/// How a MoE checkpoint stores its routed experts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Experts {
    /// transformers 5 Qwen3.5-MoE: `experts.gate_up_proj` `[E, 2I, D]`, `experts.down_proj`.
    Fused,
    /// Qwen3-Next: `experts.{e}.{gate,up,down}_proj.weight`.
    PerExpert,
}

/// What a published config states (shrunk), written out by hand from its JSON.
#[derive(Debug, Clone)]
struct Case {
    dir: &'static str,
    model_type: &'static str,
    family: Family,
    layout: Layout,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    /// Dense MLP width (0 when every layer is MoE).
    intermediate: usize,
    /// (key heads, value heads, key head width, value head width, conv kernel)
    linear: (usize, usize, usize, usize, usize),
    full_layers: &'static [usize],
    moe_layers: &'static [usize],
    /// (experts, per token, expert width, shared expert width, storage)
    moe: Option<(usize, usize, usize, usize, Experts)>,
    norm_topk_prob: bool,
    rope_theta: f64,
    partial_rotary_factor: f64,
    rotary_dim: usize,
    tied: bool,
    /// `eos_token_id` of config.json, root first, then the text config's.
    eos_config: &'static [u32],
    /// The config's ids, then generation_config.json's.
    eos_engine: &'static [u32],
    mtp_declared: usize,
    /// The checkpoint carries an `mtp.*` head.
    head: bool,
    dtype: &'static str,
    /// (module as the checkpoint names it, bits it is stored at)
    quant_bits: &'static [(&'static str, Option<usize>)],
}

fn cases() -> Vec<Case> {
    let base = Case {
        dir: "",
        model_type: "qwen3_5",
        family: Family::Qwen35,
        layout: Layout::HfWrapper,
        hidden: 64,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        vocab: 256,
        intermediate: 128,
        linear: (2, 2, 16, 16, 4),
        full_layers: &[3],
        moe_layers: &[],
        moe: None,
        norm_topk_prob: true,
        rope_theta: 10_000_000.0,
        partial_rotary_factor: 0.25,
        rotary_dim: 4,
        tied: true,
        eos_config: &[236],
        eos_engine: &[236, 238],
        mtp_declared: 1,
        head: true,
        dtype: "bfloat16",
        quant_bits: &[],
    };
    vec![
        // Qwen/Qwen3.5-0.8B: tied embeddings at the root and in text_config, eos only in
        // text_config, generation_config's [<|im_end|>, <|endoftext|>].
        Case {
            dir: "qwen3_5-0.8b",
            ..base.clone()
        },
        // transformers 5 save of a Qwen3.5/3.6-35B-A3B: root eos (<|im_end|>) differs from
        // the text config's (<|endoftext|>), fused experts, MoE in every layer.
        Case {
            dir: "qwen3_5_moe-35b-a3b",
            model_type: "qwen3_5_moe",
            intermediate: 0,
            linear: (2, 4, 16, 16, 4),
            moe_layers: &[0, 1, 2, 3],
            moe: Some((8, 2, 32, 32, Experts::Fused)),
            tied: false,
            eos_config: &[238, 236],
            eos_engine: &[238, 236],
            ..base.clone()
        },
        // Qwen/Qwen3-Next-80B-A3B-Instruct: flat keys, `rope_scaling: null`, top-level
        // `rope_theta`, no `layer_types` (interval 4), `torch_dtype`, a head in the checkpoint
        // that the config does not declare.
        Case {
            dir: "qwen3_next-80b-a3b-instruct",
            model_type: "qwen3_next",
            family: Family::Qwen3Next,
            layout: Layout::HfText,
            intermediate: 160,
            linear: (2, 4, 16, 16, 4),
            moe_layers: &[0, 1, 2, 3],
            moe: Some((8, 2, 32, 32, Experts::PerExpert)),
            tied: false,
            eos_config: &[93],
            eos_engine: &[93, 91],
            mtp_declared: 0,
            ..base.clone()
        },
        // A text-only `Qwen3_5ForCausalLM` export (transformers 5.24's own serialization of
        // the 0.8B text config): flat, tied, no head (transformers drops `mtp.*`).
        Case {
            dir: "qwen3_5_text-causal-lm",
            model_type: "qwen3_5_text",
            layout: Layout::HfText,
            eos_engine: &[236],
            head: false,
            ..base.clone()
        },
        // Intel/Qwen3.6-27B-int4-mlx-AutoRound: rope keys flattened into text_config (no
        // rope_parameters), `output_gate_type: swish`, MLX `quantization` with per-module
        // objects and `false` entries under HF names; three entries shrunk to 8 bits.
        Case {
            dir: "qwen3_6-27b-mlx-autoround",
            heads: 6,
            kv_heads: 1,
            linear: (2, 6, 16, 16, 4),
            tied: false,
            eos_engine: &[236],
            head: false,
            quant_bits: &[
                ("model.language_model.layers.0.mlp.down_proj", Some(8)),
                ("model.language_model.layers.0.mlp.gate_proj", Some(4)),
                (
                    "model.language_model.layers.0.linear_attn.in_proj_qkv",
                    Some(4),
                ),
                ("model.language_model.layers.3.self_attn.q_proj", Some(4)),
                ("model.language_model.layers.3.self_attn.k_proj", Some(8)),
                ("model.language_model.layers.3.self_attn.v_proj", Some(8)),
                // `false` in the file: no width of its own, the global one if asked
                ("model.language_model.embed_tokens", Some(4)),
            ],
            ..base
        },
    ]
}

/// Table-driven: `ModelConfig::from_value` on each published key set gives the values its file
/// states.
#[test]
fn parsed_settings_match_the_published_files() {
    for c in cases() {
        let path = configs().join(c.dir).join("config.json");
        let cfg = ModelConfig::from_value(&read_json(&path), &path)
            .unwrap_or_else(|e| panic!("{}: {e}", c.dir));
        let t = &cfg.text;
        let d = c.dir;
        assert_eq!(cfg.model_type, c.model_type, "{d}");
        assert_eq!(cfg.family, c.family, "{d}");
        assert_eq!(
            (t.hidden_size, t.num_hidden_layers, t.vocab_size),
            (c.hidden, c.layers, c.vocab),
            "{d}"
        );
        assert_eq!(
            (t.num_attention_heads, t.num_key_value_heads, cfg.head_dim()),
            (c.heads, c.kv_heads, c.head_dim),
            "{d}"
        );
        assert_eq!(
            (
                t.linear_num_key_heads,
                t.linear_num_value_heads,
                t.linear_key_head_dim,
                t.linear_value_head_dim,
                t.linear_conv_kernel_dim
            ),
            c.linear,
            "{d}"
        );
        let full: Vec<usize> = (0..c.layers)
            .filter(|i| cfg.is_full_attention(*i))
            .collect();
        assert_eq!(full, c.full_layers, "{d}: full-attention layers");
        let moe: Vec<usize> = (0..c.layers).filter(|i| cfg.is_moe_layer(*i)).collect();
        assert_eq!(moe, c.moe_layers, "{d}: MoE layers");
        if let Some((e, k, mi, si, _)) = c.moe {
            assert_eq!(
                (
                    t.num_experts,
                    t.num_experts_per_tok,
                    t.moe_intermediate_size,
                    t.shared_expert_intermediate_size
                ),
                (e, k, mi, si),
                "{d}"
            );
        }
        if c.intermediate > 0 {
            assert_eq!(t.intermediate_size, c.intermediate, "{d}");
        }
        assert_eq!(cfg.norm_topk_prob(), c.norm_topk_prob, "{d}");
        assert_eq!(cfg.rope.rope_type, "default", "{d}");
        assert_eq!(cfg.rope_theta(), c.rope_theta, "{d}: rope_theta");
        assert_eq!(
            cfg.partial_rotary_factor(),
            c.partial_rotary_factor,
            "{d}: partial_rotary_factor"
        );
        assert_eq!(cfg.rotary_dim(), c.rotary_dim, "{d}: rotated features");
        assert_eq!(t.tie_word_embeddings, c.tied, "{d}: tie_word_embeddings");
        assert_eq!(cfg.eos_token_ids, c.eos_config, "{d}: eos ids");
        assert_eq!(t.mtp_num_hidden_layers, c.mtp_declared, "{d}");
        assert_eq!(cfg.declared_dtype.as_deref(), Some(c.dtype), "{d}");
        for (module, bits) in c.quant_bits {
            let canonical = module.trim_start_matches("model.language_model.");
            assert_eq!(cfg.quant_bits(module, canonical), *bits, "{d}: {module}");
        }
        if c.quant_bits.is_empty() {
            assert!(cfg.quantization.is_none(), "{d}");
        }
    }
}

/// `generation_config.json` with Qwen's published key set (`bos_token_id`, `do_sample`, a list
/// `eos_token_id`, `pad_token_id`, `temperature`, `top_k`, `top_p`, `transformers_version`).
#[test]
fn generation_configs_read_as_published() {
    let g = GenerationConfig::load(&configs().join("qwen3_5-0.8b")).unwrap();
    assert_eq!(
        g,
        GenerationConfig {
            eos_token_ids: vec![238, 236],
            do_sample: Some(true),
            temperature: Some(1.0),
            top_p: Some(0.95),
            top_k: Some(20),
            min_p: None,
            repetition_penalty: None,
        }
    );
    let g = GenerationConfig::load(&configs().join("qwen3_next-80b-a3b-instruct")).unwrap();
    assert_eq!(g.eos_token_ids, [93, 91]);
    assert_eq!(g.do_sample, Some(true));
    assert_eq!(
        (g.temperature, g.top_p, g.top_k),
        (Some(0.7), Some(0.8), Some(20))
    );
    // a checkpoint without one has the empty default
    let g = GenerationConfig::load(&configs().join("qwen3_5_moe-35b-a3b")).unwrap();
    assert_eq!(g, GenerationConfig::default());
}

/// Deterministic pseudo-random numbers (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[-scale, scale)`.
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
            .collect()
    }
}

/// Builds the tensors of a checkpoint for `c` as its family names and lays them out, in
/// `dtype`; MLX-quantized where the config's `quantization` gives a module an object entry.
struct Writer<'a> {
    rng: Rng,
    dtype: DType,
    quant: Option<&'a serde_json::Map<String, Value>>,
    out: HashMap<String, Tensor>,
}

impl Writer<'_> {
    fn float(&mut self, name: &str, shape: &[usize], scale: f32, offset: f32) {
        let n = shape.iter().product();
        let v: Vec<f32> = self
            .rng
            .values(n, scale)
            .into_iter()
            .map(|x| x + offset)
            .collect();
        let t = Tensor::from_vec(v, shape, &Device::Cpu)
            .and_then(|t| t.to_dtype(self.dtype))
            .unwrap();
        self.out.insert(name.to_string(), t);
    }

    /// A matrix `module.weight` `[out, inp]`, packed when the config quantizes `module`.
    fn matrix(&mut self, module: &str, out: usize, inp: usize) {
        let entry = self.quant.and_then(|q| q.get(module)).cloned();
        let Some(Value::Object(o)) = entry else {
            return self.float(&format!("{module}.weight"), &[out, inp], 0.15, 0.0);
        };
        let bits = o["bits"].as_u64().unwrap() as usize;
        let group = o["group_size"].as_u64().unwrap() as usize;
        assert!(
            inp.is_multiple_of(group) && (inp * bits).is_multiple_of(32),
            "{module}"
        );
        let words: Vec<u32> = (0..out * inp * bits / 32)
            .map(|_| self.rng.next() as u32)
            .collect();
        let packed = Tensor::from_vec(words, (out, inp * bits / 32), &Device::Cpu).unwrap();
        self.out.insert(format!("{module}.weight"), packed);
        let levels = ((1u32 << bits) - 1) as f32;
        let scales: Vec<f32> = self
            .rng
            .values(out * inp / group, 0.05)
            .into_iter()
            .map(|s| (0.2 + s) / levels)
            .collect();
        let biases: Vec<f32> = scales.iter().map(|s| -s * levels / 2.0).collect();
        for (suffix, v) in [("scales", scales), ("biases", biases)] {
            let t = Tensor::from_vec(v, (out, inp / group), &Device::Cpu)
                .and_then(|t| t.to_dtype(self.dtype))
                .unwrap();
            self.out.insert(format!("{module}.{suffix}"), t);
        }
    }

    /// One decoder layer `p` (`…layers.N`): full attention or Gated DeltaNet, dense or MoE.
    fn layer(&mut self, c: &Case, p: &str, full: bool, moe: bool) {
        let d = c.hidden;
        // HF RMSNorm weights are zero-centred (used as 1 + w)
        self.float(&format!("{p}.input_layernorm.weight"), &[d], 0.1, 0.0);
        self.float(
            &format!("{p}.post_attention_layernorm.weight"),
            &[d],
            0.1,
            0.0,
        );
        if full {
            let (h, kv, hd) = (c.heads, c.kv_heads, c.head_dim);
            let a = format!("{p}.self_attn");
            // q_proj carries the output gate: [heads * head_dim * 2, hidden]
            self.matrix(&format!("{a}.q_proj"), h * hd * 2, d);
            self.matrix(&format!("{a}.k_proj"), kv * hd, d);
            self.matrix(&format!("{a}.v_proj"), kv * hd, d);
            self.matrix(&format!("{a}.o_proj"), d, h * hd);
            self.float(&format!("{a}.q_norm.weight"), &[hd], 0.1, 0.0);
            self.float(&format!("{a}.k_norm.weight"), &[hd], 0.1, 0.0);
        } else {
            let (nk, nv, dk, dv, k) = c.linear;
            let l = format!("{p}.linear_attn");
            let conv = 2 * nk * dk + nv * dv;
            if c.family == Family::Qwen3Next {
                // fused per key head: [q dk | k dk | v r*dv | z r*dv] and [b r | a r]
                self.matrix(
                    &format!("{l}.in_proj_qkvz"),
                    nk * (2 * dk + 2 * nv / nk * dv),
                    d,
                );
                self.matrix(&format!("{l}.in_proj_ba"), 2 * nv, d);
            } else {
                self.matrix(&format!("{l}.in_proj_qkv"), conv, d);
                self.matrix(&format!("{l}.in_proj_z"), nv * dv, d);
                self.matrix(&format!("{l}.in_proj_b"), nv, d);
                self.matrix(&format!("{l}.in_proj_a"), nv, d);
            }
            // torch conv layout [channels, 1, kernel]
            self.float(&format!("{l}.conv1d.weight"), &[conv, 1, k], 0.3, 0.0);
            self.float(&format!("{l}.A_log"), &[nv], 0.5, 0.0);
            self.float(&format!("{l}.dt_bias"), &[nv], 0.5, 0.0);
            // the gated norm is stored as used
            self.float(&format!("{l}.norm.weight"), &[dv], 0.1, 1.0);
            self.matrix(&format!("{l}.out_proj"), d, nv * dv);
        }
        let m = format!("{p}.mlp");
        match (moe, c.moe) {
            (true, Some((e, _, mi, si, storage))) => {
                self.matrix(&format!("{m}.gate"), e, d);
                match storage {
                    Experts::Fused => {
                        self.float(
                            &format!("{m}.experts.gate_up_proj"),
                            &[e, 2 * mi, d],
                            0.15,
                            0.0,
                        );
                        self.float(&format!("{m}.experts.down_proj"), &[e, d, mi], 0.15, 0.0);
                    }
                    Experts::PerExpert => {
                        for x in 0..e {
                            self.matrix(&format!("{m}.experts.{x}.gate_proj"), mi, d);
                            self.matrix(&format!("{m}.experts.{x}.up_proj"), mi, d);
                            self.matrix(&format!("{m}.experts.{x}.down_proj"), d, mi);
                        }
                    }
                }
                self.matrix(&format!("{m}.shared_expert.gate_proj"), si, d);
                self.matrix(&format!("{m}.shared_expert.up_proj"), si, d);
                self.matrix(&format!("{m}.shared_expert.down_proj"), d, si);
                self.matrix(&format!("{m}.shared_expert_gate"), 1, d);
            }
            _ => {
                self.matrix(&format!("{m}.gate_proj"), c.intermediate, d);
                self.matrix(&format!("{m}.up_proj"), c.intermediate, d);
                self.matrix(&format!("{m}.down_proj"), d, c.intermediate);
            }
        }
    }
}

/// A checkpoint directory for case `c`: its config files and random weights, laid out and
/// named as the family's published checkpoints are (bf16, HF norms and conv layout, the head
/// under `mtp.`, the vision tower under `model.visual.`). Layer types, MoE layers and
/// quantized modules come from the case and the raw JSON, not from the parser under test.
fn checkpoint(c: &Case, tag: &str) -> PathBuf {
    let src = configs().join(c.dir);
    let dir = std::env::temp_dir().join(format!(
        "mtp-published-{}-{tag}-{}",
        c.dir,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json"] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    }
    let raw = read_json(&src.join("config.json"));
    let mut w = Writer {
        rng: Rng(0x9e37_79b9_7f4a_7c15 ^ c.dir.len() as u64),
        dtype: DType::BF16,
        quant: raw.get("quantization").and_then(|q| q.as_object()),
        out: HashMap::new(),
    };
    let pre = c.layout.prefix();
    let (d, v) = (c.hidden, c.vocab);
    w.float(&format!("{pre}embed_tokens.weight"), &[v, d], 0.05, 0.0);
    w.float(&format!("{pre}norm.weight"), &[d], 0.1, 0.0);
    if !c.tied {
        w.matrix("lm_head", v, d);
    }
    for i in 0..c.layers {
        let full = c.full_layers.contains(&i);
        let moe = c.moe_layers.contains(&i);
        w.layer(c, &format!("{pre}layers.{i}"), full, moe);
    }
    if c.head {
        w.float("mtp.fc.weight", &[d, 2 * d], 0.15, 0.0);
        for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"] {
            w.float(&format!("mtp.{n}.weight"), &[d], 0.1, 0.0);
        }
        w.layer(c, "mtp.layers.0", true, c.moe.is_some());
    }
    if matches!(c.layout, Layout::HfWrapper) {
        // a vision tower that does not build (one tensor of it): the language model still
        // loads, images are refused saying why
        w.float(
            "model.visual.patch_embed.proj.weight",
            &[32, 3 * 2 * 16 * 16],
            0.1,
            0.0,
        );
    }
    candle_core::safetensors::save(&w.out, dir.join("model.safetensors")).unwrap();
    dir
}

/// Each published key set, as a checkpoint of random weights, loads with the settings its file
/// states and generates the same greedy tokens with MTP (when it has a head) as without.
#[test]
fn each_published_config_loads_and_runs() {
    let prompt: Vec<u32> = vec![3, 17, 42, 99, 7, 150, 201, 64];
    for c in cases() {
        let dir = checkpoint(&c, "run");
        let d = c.dir;
        let engine = Engine::load(&dir, &Device::Cpu, WeightDtype::Stored)
            .unwrap_or_else(|e| panic!("{d}: {e}"));
        let cfg = engine.model().config();
        assert_eq!(cfg.rope_theta(), c.rope_theta, "{d}");
        assert_eq!(cfg.rotary_dim(), c.rotary_dim, "{d}");
        assert_eq!(cfg.text.tie_word_embeddings, c.tied, "{d}");
        assert_eq!(engine.eos_token_ids(), c.eos_engine, "{d}: eos ids");
        assert_eq!(engine.drafter().is_some(), c.head, "{d}: MTP head");
        let held = engine.weights_held();
        if !c.quant_bits.is_empty() {
            for kind in ["q4", "q8"] {
                assert!(
                    held.contains_key(kind),
                    "{d}: {kind} matrices kept: {held:?}"
                );
            }
        }

        let plain = GenerateOptions::greedy(16).ignore_eos(true);
        let want = engine.generate(&prompt, &plain, |_| true).unwrap();
        assert_eq!(want.tokens.len(), 16, "{d}");
        let mut distinct = want.tokens.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(
            distinct.len() >= 8,
            "{d}: a degenerate model: {:?}",
            want.tokens
        );
        let logits = engine.prompt_logits(&prompt).unwrap();
        assert_eq!(logits.len(), c.vocab, "{d}");
        assert!(logits.iter().all(|x| x.is_finite()), "{d}: finite logits");
        for depth in [1, 3] {
            let got = engine
                .generate(&prompt, &plain.clone().num_draft_tokens(depth), |_| true)
                .unwrap();
            assert_eq!(got.tokens, want.tokens, "{d}: depth {depth}");
            let spec = got.speculation.expect("speculation requested");
            assert_eq!(spec.used, c.head, "{d}: {:?}", spec.not_used_reason);
            if !c.head {
                assert_eq!(
                    spec.not_used_reason,
                    Some(mtp_contract::Reason::NoMtpHead),
                    "{d}: {:?}",
                    spec.not_used_message
                );
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// A config key set to a value this engine does not implement is an `Error::Config` naming the
/// key, never a silently different model.
#[test]
fn unimplemented_values_are_refused_by_name() {
    type Edit = fn(&mut Value);
    let table: Vec<(&str, Edit, &str)> = vec![
        (
            "qwen3_5-0.8b",
            |v| v["text_config"]["attn_output_gate"] = json!(false),
            "attn_output_gate = false",
        ),
        (
            "qwen3_5-0.8b",
            |v| v["text_config"]["rope_parameters"]["rope_type"] = json!("yarn"),
            "rope_parameters.rope_type = `yarn`",
        ),
        (
            "qwen3_5-0.8b",
            |v| {
                v["text_config"]["rope_parameters"] =
                    json!({"full_attention": {"rope_type": "linear", "factor": 4.0}})
            },
            "rope_parameters.full_attention.rope_type = `linear`",
        ),
        (
            "qwen3_next-80b-a3b-instruct",
            |v| v["rope_scaling"] = json!({"type": "dynamic", "factor": 2.0}),
            "rope_scaling.type = `dynamic`",
        ),
        (
            "qwen3_6-27b-mlx-autoround",
            |v| v["text_config"]["rope_type"] = json!("yarn"),
            "rope_type = `yarn`",
        ),
        (
            "qwen3_5-0.8b",
            |v| v["text_config"]["rope_parameters"]["partial_rotary_factor"] = json!(0.1875),
            "the rotated width must be even",
        ),
        (
            "qwen3_5-0.8b",
            |v| {
                v["text_config"]["layer_types"]
                    .as_array_mut()
                    .unwrap()
                    .pop();
            },
            "layer_types has 3 entries for num_hidden_layers = 4",
        ),
        (
            "qwen3_5-0.8b",
            |v| v["text_config"]["layer_types"][1] = json!("sliding_attention"),
            "layer_types[1] = `sliding_attention`",
        ),
        (
            "qwen3_6-27b-mlx-autoround",
            |v| v["text_config"]["output_gate_type"] = json!("sigmoid"),
            "output_gate_type = `sigmoid`",
        ),
        (
            "qwen3_5_text-causal-lm",
            |v| v["hidden_act"] = json!("gelu"),
            "hidden_act = `gelu`",
        ),
        (
            "qwen3_5_text-causal-lm",
            |v| v["attention_bias"] = json!(true),
            "attention_bias = true",
        ),
        (
            "qwen3_5-0.8b",
            |v| v["text_config"]["mtp_use_dedicated_embeddings"] = json!(true),
            "mtp_use_dedicated_embeddings = true",
        ),
        (
            "qwen3_5-0.8b",
            |v| v["tie_word_embeddings"] = json!("yes"),
            "tie_word_embeddings must be true or false",
        ),
        (
            "qwen3_5-0.8b",
            |v| v["text_config"]["num_experts"] = json!(8),
            "num_experts = 8 in a dense `qwen3_5` config",
        ),
        (
            "qwen3_5_moe-35b-a3b",
            |v| v["text_config"]["norm_topk_prob"] = json!(false),
            "norm_topk_prob = false",
        ),
        (
            "qwen3_5_moe-35b-a3b",
            |v| v["text_config"]["num_experts_per_tok"] = json!(0),
            "num_experts_per_tok (0) must be between 1 and num_experts (8)",
        ),
        (
            "qwen3_next-80b-a3b-instruct",
            |v| {
                v["quantization_config"] = json!({
                    "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": [128, 128]
                })
            },
            "quantization_config.quant_method = \"fp8\"",
        ),
        (
            "qwen3_6-27b-mlx-autoround",
            |v| v["quantization"]["mode"] = json!("mxfp4"),
            "quantization.mode = \"mxfp4\"",
        ),
        (
            "qwen3_6-27b-mlx-autoround",
            |v| {
                v["quantization"]["model.language_model.layers.0.mlp.up_proj"]["mode"] =
                    json!("nvfp4")
            },
            "quantization.model.language_model.layers.0.mlp.up_proj.mode = \"nvfp4\"",
        ),
    ];
    for (dir, edit, says) in table {
        let path = configs().join(dir).join("config.json");
        let mut v = read_json(&path);
        ModelConfig::from_value(&v, &path).expect("the published key set parses");
        edit(&mut v);
        match ModelConfig::from_value(&v, &path) {
            Err(e @ Error::Config { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(says), "{dir}: `{says}` not in: {msg}");
                assert!(msg.contains("config.json"), "{dir}: names the file: {msg}");
            }
            other => panic!("{dir}: expected a config error saying `{says}`, got {other:?}"),
        }
    }
}

/// A key of the wrong type, or a required one missing, is an error naming it and the file.
#[test]
fn malformed_keys_are_named() {
    let path = configs().join("qwen3_5-0.8b").join("config.json");
    let published = read_json(&path);
    type Edit = fn(&mut Value);
    let edits: [(Edit, &str); 4] = [
        (
            |v| v["text_config"]["hidden_size"] = json!("64"),
            "hidden_size: invalid type: string \"64\"",
        ),
        (
            |v| {
                v["text_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("vocab_size");
            },
            "vocab_size is missing",
        ),
        (
            |v| v["text_config"]["layer_types"] = json!("linear_attention"),
            "layer_types: invalid type",
        ),
        (
            |v| v["text_config"]["rope_parameters"]["rope_theta"] = json!("1e7"),
            "rope_parameters.rope_theta must be a number",
        ),
    ];
    for (edit, says) in edits {
        let mut v = published.clone();
        edit(&mut v);
        let err = ModelConfig::from_value(&v, &path).expect_err(says);
        assert!(matches!(err, Error::Config { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(says) && msg.contains("config.json"), "{msg}");
    }
}

/// Keys read the way transformers reads them where published exports differ: `rope_scaling`
/// (older exports) for `rope_parameters`, flat `rope_theta` filling what `rope_parameters`
/// lacks, the wrapper's root `tie_word_embeddings` over its text config's, `head_dim`'s
/// default, nested per-layer-type rotary settings.
#[test]
fn alternative_spellings_resolve_as_transformers_reads_them() {
    let path = configs().join("qwen3_5-0.8b").join("config.json");
    let published = read_json(&path);
    let parse = |edit: &dyn Fn(&mut Value)| {
        let mut v = published.clone();
        edit(&mut v);
        ModelConfig::from_value(&v, &path).unwrap()
    };
    // rope_scaling instead of rope_parameters
    let cfg = parse(&|v| {
        let t = v["text_config"].as_object_mut().unwrap();
        let rope = t.remove("rope_parameters").unwrap();
        t.insert("rope_scaling".into(), rope);
    });
    assert_eq!((cfg.rope_theta(), cfg.partial_rotary_factor()), (1e7, 0.25));
    // rope_parameters without rope_theta / partial_rotary_factor: the flat keys fill them in
    let cfg = parse(&|v| {
        let t = &mut v["text_config"];
        t["rope_parameters"] = json!({"rope_type": "default", "mrope_section": [1, 1, 0]});
        t["rope_theta"] = json!(5_000_000);
        t["partial_rotary_factor"] = json!(0.5);
    });
    assert_eq!(
        (
            cfg.rope_theta(),
            cfg.partial_rotary_factor(),
            cfg.rotary_dim()
        ),
        (5e6, 0.5, 8)
    );
    // no rotary keys at all: transformers' defaults (theta 10000, 25% rotated)
    let cfg = parse(&|v| {
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("rope_parameters");
    });
    assert_eq!(
        (cfg.rope_theta(), cfg.partial_rotary_factor()),
        (10_000.0, 0.25)
    );
    // nested per layer type: the full-attention entry
    let cfg = parse(&|v| {
        v["text_config"]["rope_parameters"] = json!({
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000, "partial_rotary_factor": 0.5},
            "linear_attention": null
        })
    });
    assert_eq!((cfg.rope_theta(), cfg.partial_rotary_factor()), (1e6, 0.5));
    // the wrapper's root tie_word_embeddings wins; the text config's is the fallback
    let cfg = parse(&|v| {
        v["tie_word_embeddings"] = json!(false);
        v["text_config"]["tie_word_embeddings"] = json!(true);
    });
    assert!(!cfg.text.tie_word_embeddings);
    let cfg = parse(&|v| {
        v.as_object_mut().unwrap().remove("tie_word_embeddings");
        v["text_config"]["tie_word_embeddings"] = json!(true);
    });
    assert!(cfg.text.tie_word_embeddings);
    // head_dim absent: transformers' default for this family, 256 (not hidden / heads)
    let cfg = parse(&|v| {
        v["text_config"].as_object_mut().unwrap().remove("head_dim");
    });
    assert_eq!(cfg.head_dim(), 256);
    // eos ids as a list at the root, merged before the text config's, without repeats
    let cfg = parse(&|v| v["eos_token_id"] = json!([238, 236]));
    assert_eq!(cfg.eos_token_ids, [238, 236]);
    // torch_dtype (older exports) when dtype is absent
    let cfg = parse(&|v| {
        let t = v["text_config"].as_object_mut().unwrap();
        t.remove("dtype");
        v["torch_dtype"] = json!("float16");
    });
    assert_eq!(cfg.declared_dtype.as_deref(), Some("float16"));
}

/// What transformers and mlx-vlm build for a Qwen3.5-MoE ignores the Qwen3-Next keys that pick
/// MoE layers (every layer is MoE there); Qwen3-Next reads them, and its `norm_topk_prob`
/// defaults to true (transformers' `Qwen3NextConfig`).
#[test]
fn moe_layer_keys_are_read_per_family() {
    let path = configs().join("qwen3_5_moe-35b-a3b").join("config.json");
    let mut v = read_json(&path);
    v["text_config"]["mlp_only_layers"] = json!([1]);
    v["text_config"]["decoder_sparse_step"] = json!(2);
    let cfg = ModelConfig::from_value(&v, &path).unwrap();
    assert!((0..4).all(|i| cfg.is_moe_layer(i)));

    let path = configs()
        .join("qwen3_next-80b-a3b-instruct")
        .join("config.json");
    let mut v = read_json(&path);
    v["mlp_only_layers"] = json!([1]);
    v["decoder_sparse_step"] = json!(2);
    v.as_object_mut().unwrap().remove("norm_topk_prob");
    let cfg = ModelConfig::from_value(&v, &path).unwrap();
    let moe: Vec<usize> = (0..4).filter(|i| cfg.is_moe_layer(*i)).collect();
    assert_eq!(moe, [3]);
    assert!(cfg.norm_topk_prob());
    v["mlp_only_layers"] = Value::Null;
    let cfg = ModelConfig::from_value(&v, &path).unwrap();
    let moe: Vec<usize> = (0..4).filter(|i| cfg.is_moe_layer(*i)).collect();
    assert_eq!(moe, [1, 3]);
}

/// The same weights under the VL wrapper's names and config and under a text-only export's
/// (`model.*`, the flat `qwen3_5_text` config) are the same model: the same logits, bit for bit.
#[test]
fn wrapper_and_text_only_exports_of_the_same_weights_agree() {
    let cases = cases();
    let wrapper = cases.iter().find(|c| c.dir == "qwen3_5-0.8b").unwrap();
    let flat = cases
        .iter()
        .find(|c| c.dir == "qwen3_5_text-causal-lm")
        .unwrap();
    let dir = checkpoint(wrapper, "as-wrapper");
    let text_dir = checkpoint(flat, "as-text");
    let tensors =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let renamed: HashMap<String, Tensor> = tensors
        .into_iter()
        .filter_map(|(k, t)| {
            k.strip_prefix("model.language_model.")
                .map(|rest| (format!("model.{rest}"), t))
        })
        .collect();
    candle_core::safetensors::save(&renamed, text_dir.join("model.safetensors")).unwrap();
    let prompt = [5u32, 80, 160, 33, 2, 250];
    let a = Engine::load(&dir, &Device::Cpu, WeightDtype::Stored).unwrap();
    let b = Engine::load(&text_dir, &Device::Cpu, WeightDtype::Stored).unwrap();
    assert!(b.drafter().is_none());
    assert_eq!(
        a.prompt_logits(&prompt).unwrap(),
        b.prompt_logits(&prompt).unwrap()
    );
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&text_dir).ok();
}

/// A per-module override applies to the module it names, under whichever prefix the config
/// spells it, and never across the target / MTP-head namespaces.
#[test]
fn quantization_overrides_stay_in_their_namespace() {
    let path = configs().join("qwen3_5_moe-35b-a3b").join("config.json");
    let mut v = read_json(&path);
    v["quantization"] = json!({
        "group_size": 64, "bits": 4, "mode": "affine",
        // mlx-vlm's spelling of the router of target layer 0
        "language_model.model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
        // the head's own layer 0, at another width
        "mtp.layers.0.mlp.gate": {"group_size": 64, "bits": 6},
    });
    let cfg = ModelConfig::from_value(&v, &path).unwrap();
    let bits = |module: &str, canonical: &str| cfg.quant_bits(module, canonical);
    // the same module under the HF prefix
    assert_eq!(
        bits(
            "model.language_model.layers.0.mlp.gate",
            "layers.0.mlp.gate"
        ),
        Some(8)
    );
    assert_eq!(
        bits(
            "language_model.model.layers.0.mlp.gate",
            "layers.0.mlp.gate"
        ),
        Some(8)
    );
    assert_eq!(bits("mtp.layers.0.mlp.gate", "layers.0.mlp.gate"), Some(6));
    assert_eq!(
        bits(
            "language_model.model.layers.1.mlp.gate",
            "layers.1.mlp.gate"
        ),
        Some(4)
    );
    assert_eq!(
        bits(
            "mtp.layers.0.mlp.shared_expert_gate",
            "layers.0.mlp.shared_expert_gate"
        ),
        Some(4)
    );
}

/// An embedded head must have the layers `mtp_num_hidden_layers` declares.
#[test]
fn a_head_with_other_layers_than_declared_is_refused() {
    let c = cases().remove(0);
    let dir = checkpoint(&c, "mtp-layers");
    let path = dir.join("config.json");
    let mut v = read_json(&path);
    v["text_config"]["mtp_num_hidden_layers"] = json!(2);
    std::fs::write(&path, v.to_string()).unwrap();
    match Engine::load(&dir, &Device::Cpu, WeightDtype::Stored) {
        Err(e @ Error::Config { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("mtp_num_hidden_layers = 2") && msg.contains("1 decoder layer"),
                "{msg}"
            );
        }
        other => panic!("expected a config error, got {:?}", other.map(|_| ())),
    }
    std::fs::remove_dir_all(&dir).ok();
}
