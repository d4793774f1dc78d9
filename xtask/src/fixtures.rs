//! `cargo xtask fixtures`: writes a random-weight Qwen3.5 checkpoint (`model_type: qwen3_5`,
//! Hugging Face layout: `model.language_model.*` names, zero-centred RMSNorm weights, torch conv
//! layout `[C, 1, K]`, optional embedded `mtp.*` head) of any size, so tests and benchmarks need
//! no Python.
//!
//! ```text
//! cargo xtask fixtures --out /tmp/bench-model            # the benchmark shape (default)
//! cargo xtask fixtures --out /tmp/t --hidden 64 --layers 4 --interval 2 --heads 4 --kv-heads 2 \
//!     --head-dim 16 --intermediate 128 --vocab 256 --linear-heads 2,4 --linear-dim 16
//! cargo xtask fixtures --out /tmp/oracle --oracle-head   # MTP machinery benchmark (see below)
//! cargo xtask fixtures --moe --out /tmp/moe [--oracle-head]
//!                        # Qwen3.5-35B-A3B scaled down (`moe_bench_shape`), real tokenizer
//! cargo xtask fixtures --out /tmp/big --dtype bf16 --hidden 2048 --layers 16 --shard-mib 512
//!                                                        # sharded, as published checkpoints are
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, RngCore, SeedableRng};

/// Shape of a generated checkpoint.
#[derive(Debug, Clone)]
pub struct Shape {
    pub hidden: usize,
    pub layers: usize,
    pub interval: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub linear_k_heads: usize,
    pub linear_v_heads: usize,
    pub linear_dim: usize,
    pub mtp: bool,
    /// Benchmark-only weights whose MTP head agrees with the target by construction (see
    /// [`write_checkpoint`]): the cost of every matrix is real, acceptance is ~100%.
    pub oracle_head: bool,
    pub seed: u64,
    pub dtype: DType,
    /// The LM head is the embedding (`tie_word_embeddings`): no `lm_head.weight` is written.
    pub tied: bool,
    /// Weights from integer arithmetic only (uniform, no `ln`/`cos`), so that the checkpoint
    /// is bit-identical on every machine and a reference golden computed on one holds on all.
    pub portable: bool,
    /// Write shards of about this many bytes with a `model.safetensors.index.json`, as
    /// published checkpoints are (`None`: one `model.safetensors`).
    pub shard_bytes: Option<usize>,
}

impl Default for Shape {
    /// The benchmark shape of the engine issue: hidden 1024, 8 layers at 3 linear : 1 full,
    /// 8 query / 2 KV heads of 128, intermediate 3072, vocab 32000, with an MTP head.
    fn default() -> Self {
        Shape {
            hidden: 1024,
            layers: 8,
            interval: 4,
            heads: 8,
            kv_heads: 2,
            head_dim: 128,
            intermediate: 3072,
            vocab: 32000,
            linear_k_heads: 8,
            linear_v_heads: 16,
            linear_dim: 128,
            mtp: true,
            oracle_head: false,
            seed: 0,
            dtype: DType::F32,
            tied: false,
            portable: false,
            shard_bytes: None,
        }
    }
}

/// The sparse MLP of a Qwen3.5-MoE (`qwen3_5_moe`) checkpoint: routed experts in the fused
/// Hugging Face layout (`mlp.experts.gate_up_proj` `[E, 2I, D]`, `mlp.experts.down_proj`
/// `[E, D, I]`), a router (`mlp.gate`), one shared expert and its sigmoid gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeShape {
    pub experts: usize,
    pub top_k: usize,
    pub expert_intermediate: usize,
    pub shared_intermediate: usize,
}

impl MoeShape {
    /// Qwen3.5-35B-A3B's experts as published (256 routed, 8 per token, one shared expert,
    /// expert and shared widths a quarter of the hidden size: 512 at hidden 2048), at `hidden`.
    pub fn qwen3_5_35b_a3b(hidden: usize) -> Self {
        MoeShape {
            experts: 256,
            top_k: 8,
            expert_intermediate: hidden / 4,
            shared_intermediate: hidden / 4,
        }
    }
}

/// The MoE benchmark shape (`--moe`): Qwen3.5-35B-A3B's published config (hidden 2048, 40
/// layers at 3 linear : 1 full, 16 query / 2 KV heads of 256, linear attention 16 key / 32 value
/// heads of 128, 256 experts with 8 routed per token and one shared expert of 512, vocab
/// 248320) with the hidden size and the widths that follow it divided by 4 and the layers cut
/// to 8: hidden 512, 4 query / 2 KV heads of 256, linear 4 / 8 heads of 128, experts of 128,
/// the real vocabulary. 0.68B parameters in the trunk (0.73B with the MTP head), 0.29B of
/// them used per token (0.25B embeddings and LM head).
pub fn moe_bench_shape() -> (Shape, MoeShape) {
    let hidden = 512;
    let s = Shape {
        hidden,
        layers: 8,
        interval: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 256,
        intermediate: 0,
        vocab: REAL_VOCAB,
        linear_k_heads: 4,
        linear_v_heads: 8,
        linear_dim: 128,
        ..Shape::default()
    };
    (s, MoeShape::qwen3_5_35b_a3b(hidden))
}

struct Gen {
    rng: rand::rngs::StdRng,
    dtype: DType,
    out: HashMap<String, Tensor>,
    /// Write zeros for layer outputs and unit norms (the oracle head's target).
    oracle: bool,
    /// Uniform values of standard deviation `std` from integer bits (see [`Shape::portable`]).
    portable: bool,
}

impl Gen {
    fn normal(&mut self, n: usize, std: f32) -> Vec<f32> {
        if self.portable {
            // uniform on [-√3·std, √3·std): exact in f32 (24 random bits, power-of-two scale,
            // one rounding of the final product)
            let half = std * 3f32.sqrt();
            return (0..n)
                .map(|_| {
                    let bits = (self.rng.next_u64() >> 40) as i64 - (1 << 23);
                    half * (bits as f32 / (1u32 << 23) as f32)
                })
                .collect();
        }
        (0..n)
            .map(|_| {
                let u1: f32 = self.rng.random_range(1e-7f32..1.0);
                let u2: f32 = self.rng.random();
                std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect()
    }

    fn put(&mut self, name: &str, data: Vec<f32>, shape: &[usize]) -> Result<()> {
        let t = Tensor::from_vec(data, shape, &Device::Cpu)?.to_dtype(self.dtype)?;
        self.out.insert(name.to_string(), t);
        Ok(())
    }

    fn linear(&mut self, name: &str, out: usize, inp: usize) -> Result<()> {
        let w = self.normal(out * inp, 1.0 / (inp as f32).sqrt());
        self.put(&format!("{name}.weight"), w, &[out, inp])
    }

    /// A layer's output projection: random, or zeros for the oracle shape (the residual
    /// stream then carries the token embedding through every layer unchanged).
    fn output(&mut self, name: &str, out: usize, inp: usize) -> Result<()> {
        if self.oracle {
            return self.put(&format!("{name}.weight"), vec![0.0; out * inp], &[out, inp]);
        }
        self.linear(name, out, inp)
    }

    /// HF zero-centred RMSNorm weight (used as 1 + w), with a little jitter (none for the
    /// oracle shape).
    fn norm(&mut self, name: &str, n: usize) -> Result<()> {
        let w = if self.oracle {
            vec![0.0; n]
        } else {
            self.normal(n, 0.05)
        };
        self.put(name, w, &[n])
    }

    fn attention_layer(&mut self, p: &str, s: &Shape) -> Result<()> {
        let (d, h, kv, hd) = (s.hidden, s.heads, s.kv_heads, s.head_dim);
        self.linear(&format!("{p}.self_attn.q_proj"), h * hd * 2, d)?;
        self.linear(&format!("{p}.self_attn.k_proj"), kv * hd, d)?;
        self.linear(&format!("{p}.self_attn.v_proj"), kv * hd, d)?;
        self.output(&format!("{p}.self_attn.o_proj"), d, h * hd)?;
        self.norm(&format!("{p}.self_attn.q_norm.weight"), hd)?;
        self.norm(&format!("{p}.self_attn.k_norm.weight"), hd)
    }

    fn common(&mut self, p: &str, s: &Shape, moe: Option<&MoeShape>) -> Result<()> {
        self.norm(&format!("{p}.input_layernorm.weight"), s.hidden)?;
        self.norm(&format!("{p}.post_attention_layernorm.weight"), s.hidden)?;
        if let Some(m) = moe {
            return self.moe(p, s.hidden, m);
        }
        self.linear(&format!("{p}.mlp.gate_proj"), s.intermediate, s.hidden)?;
        self.linear(&format!("{p}.mlp.up_proj"), s.intermediate, s.hidden)?;
        self.output(&format!("{p}.mlp.down_proj"), s.hidden, s.intermediate)
    }
}

impl Gen {
    /// The sparse MLP (see [`MoeShape`]); the oracle shape zeroes the experts' and the shared
    /// expert's down projections, as it zeroes every other layer output.
    fn moe(&mut self, p: &str, d: usize, m: &MoeShape) -> Result<()> {
        let (e, i) = (m.experts, m.expert_intermediate);
        self.linear(&format!("{p}.mlp.gate"), e, d)?;
        let gate_up = self.normal(e * 2 * i * d, 1.0 / (d as f32).sqrt());
        self.put(
            &format!("{p}.mlp.experts.gate_up_proj"),
            gate_up,
            &[e, 2 * i, d],
        )?;
        let down = if self.oracle {
            vec![0.0; e * d * i]
        } else {
            self.normal(e * d * i, 1.0 / (i as f32).sqrt())
        };
        self.put(&format!("{p}.mlp.experts.down_proj"), down, &[e, d, i])?;
        let si = m.shared_intermediate;
        self.linear(&format!("{p}.mlp.shared_expert.gate_proj"), si, d)?;
        self.linear(&format!("{p}.mlp.shared_expert.up_proj"), si, d)?;
        self.output(&format!("{p}.mlp.shared_expert.down_proj"), d, si)?;
        self.linear(&format!("{p}.mlp.shared_expert_gate"), 1, d)
    }
}

/// Writes the checkpoint into `out` and returns the number of parameters.
///
/// With `oracle_head` the weights are for measuring the draft/verify machinery, not for
/// text: every layer's output projection is zero and every norm is the identity scale, so the
/// target's next-token logits are `lm_head(rms(embed(t)))` (a bigram table), and the MTP head
/// gets `fc = [I | 0]`, so its proposal after `t + 1` is `lm_head(rms(embed(t + 1)))`: the
/// target's own next choice. Every matrix is still multiplied at full size, so the cost of a
/// step is that of the shape, and greedy acceptance is ~100% (ties aside): efficiency is then
/// measured without the head's quality in the way.
pub fn write_checkpoint(out: &Path, s: &Shape) -> Result<usize> {
    write_checkpoint_with(out, s, None)
}

/// [`write_checkpoint`] with a sparse MLP in every layer (the MTP head's too) when `moe` is
/// given: a `qwen3_5_moe` checkpoint.
pub fn write_checkpoint_with(out: &Path, s: &Shape, moe: Option<&MoeShape>) -> Result<usize> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut g = Gen {
        rng: rand::rngs::StdRng::seed_from_u64(s.seed),
        dtype: s.dtype,
        out: HashMap::new(),
        oracle: s.oracle_head,
        portable: s.portable,
    };
    let d = s.hidden;
    let e = g.normal(s.vocab * d, 1.0);
    g.put("model.language_model.embed_tokens.weight", e, &[s.vocab, d])?;
    let key_dim = s.linear_k_heads * s.linear_dim;
    let value_dim = s.linear_v_heads * s.linear_dim;
    let conv_dim = 2 * key_dim + value_dim;
    let mut layer_types = Vec::new();
    for i in 0..s.layers {
        let p = format!("model.language_model.layers.{i}");
        if (i + 1) % s.interval == 0 {
            layer_types.push("full_attention");
            g.attention_layer(&p, s)?;
        } else {
            layer_types.push("linear_attention");
            let a = format!("{p}.linear_attn");
            g.linear(&format!("{a}.in_proj_qkv"), conv_dim, d)?;
            g.linear(&format!("{a}.in_proj_z"), value_dim, d)?;
            g.linear(&format!("{a}.in_proj_b"), s.linear_v_heads, d)?;
            g.linear(&format!("{a}.in_proj_a"), s.linear_v_heads, d)?;
            g.output(&format!("{a}.out_proj"), d, value_dim)?;
            let conv = g.normal(conv_dim * 4, 0.5);
            g.put(&format!("{a}.conv1d.weight"), conv, &[conv_dim, 1, 4])?;
            let a_log: Vec<f32> = (0..s.linear_v_heads)
                .map(|_| {
                    if g.portable {
                        // ln of 1..16 spans 0..2.77: eighths in that range, exact in f32
                        (g.rng.next_u32() % 23) as f32 * 0.125
                    } else {
                        g.rng.random_range(1.0f32..16.0).ln()
                    }
                })
                .collect();
            g.put(&format!("{a}.A_log"), a_log, &[s.linear_v_heads])?;
            g.put(
                &format!("{a}.dt_bias"),
                vec![1.0; s.linear_v_heads],
                &[s.linear_v_heads],
            )?;
            let nw: Vec<f32> = g
                .normal(s.linear_dim, 0.05)
                .iter()
                .map(|x| 1.0 + x)
                .collect();
            g.put(&format!("{a}.norm.weight"), nw, &[s.linear_dim])?;
        }
        g.common(&p, s, moe)?;
    }
    g.norm("model.language_model.norm.weight", d)?;
    if !s.tied {
        g.linear("lm_head", s.vocab, d)?;
    }
    if s.mtp && s.oracle_head {
        // fc over [norm(embed(t + 1)) | norm(hidden(t))]: keep the embedding half only.
        let mut fc = vec![0f32; d * 2 * d];
        for i in 0..d {
            fc[i * 2 * d + i] = 1.0;
        }
        g.put("mtp.fc.weight", fc, &[d, 2 * d])?;
    } else if s.mtp {
        g.linear("mtp.fc", d, 2 * d)?;
    }
    if s.mtp {
        g.norm("mtp.pre_fc_norm_embedding.weight", d)?;
        g.norm("mtp.pre_fc_norm_hidden.weight", d)?;
        g.norm("mtp.norm.weight", d)?;
        g.attention_layer("mtp.layers.0", s)?;
        g.common("mtp.layers.0", s, moe)?;
    }
    let n: usize = g.out.values().map(|t| t.elem_count()).sum();
    match s.shard_bytes {
        None => candle_core::safetensors::save(&g.out, out.join("model.safetensors"))?,
        Some(limit) => write_shards(out, g.out, limit)?,
    }
    let mut text = serde_json::json!({
        "model_type": "qwen3_5_text",
        "hidden_size": d,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "full_attention_interval": s.interval,
        "layer_types": layer_types,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "linear_num_value_heads": s.linear_v_heads,
        "linear_num_key_heads": s.linear_k_heads,
        "linear_key_head_dim": s.linear_dim,
        "linear_value_head_dim": s.linear_dim,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "vocab_size": s.vocab,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": s.tied,
        "attention_bias": false,
        "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true},
        "mtp_num_hidden_layers": if s.mtp { 1 } else { 0 },
        "mtp_use_dedicated_embeddings": false,
        "eos_token_id": 0,
        "dtype": match s.dtype { DType::BF16 => "bfloat16", DType::F16 => "float16", _ => "float32" },
    });
    let (arch, model_type) = match moe {
        None => ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
        Some(m) => {
            let t = text.as_object_mut().expect("an object");
            t.remove("intermediate_size");
            t.insert("model_type".into(), "qwen3_5_moe_text".into());
            t.insert("num_experts".into(), m.experts.into());
            t.insert("num_experts_per_tok".into(), m.top_k.into());
            t.insert("moe_intermediate_size".into(), m.expert_intermediate.into());
            t.insert(
                "shared_expert_intermediate_size".into(),
                m.shared_intermediate.into(),
            );
            t.insert("norm_topk_prob".into(), true.into());
            // as published (the long-context rows prefill 32k tokens)
            t.insert("max_position_embeddings".into(), 262_144.into());
            t.insert("router_aux_loss_coef".into(), 0.001.into());
            ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")
        }
    };
    let cfg = serde_json::json!({
        "architectures": [arch],
        "model_type": model_type,
        "text_config": text,
        "vision_config": {"model_type": model_type, "depth": 1, "hidden_size": 32, "intermediate_size": 64,
            "out_hidden_size": d, "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 64, "in_channels": 3,
            "deepstack_visual_indexes": []},
        "tie_word_embeddings": s.tied,
        "eos_token_id": 0,
        "vocab_size": s.vocab,
    });
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    std::fs::write(
        out.join("generation_config.json"),
        r#"{"do_sample": false, "eos_token_id": 0}"#,
    )?;
    Ok(n)
}

/// Writes `tensors` as `model-0000i-of-0000n.safetensors` shards of about `limit` bytes each
/// (tensors in name order, a shard closed once it passes the limit) and the
/// `model.safetensors.index.json` that maps every tensor to its shard, as transformers'
/// `save_pretrained` lays out published checkpoints.
fn write_shards(out: &Path, tensors: HashMap<String, Tensor>, limit: usize) -> Result<()> {
    let mut names: Vec<String> = tensors.keys().cloned().collect();
    names.sort();
    let mut shards: Vec<Vec<String>> = vec![Vec::new()];
    let mut size = 0usize;
    let mut total = 0usize;
    for name in names {
        let bytes = tensors[&name].elem_count() * tensors[&name].dtype().size_in_bytes();
        if size > 0 && size + bytes > limit.max(1) {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        total += bytes;
        shards.last_mut().expect("one shard").push(name);
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, names) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        // tensors share their storage: the clones are cheap
        let part: HashMap<&str, Tensor> = names
            .iter()
            .map(|k| (k.as_str(), tensors[k].clone()))
            .collect();
        candle_core::safetensors::save(&part, out.join(&file))?;
        for k in names {
            weight_map.insert(k.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(
        out.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index)?,
    )?;
    Ok(())
}

/// The vocabulary size of the Qwen3.5 checkpoints (and of `--moe`): the real tokenizer's ids
/// fit in it.
const REAL_VOCAB: usize = 248_320;

const HELP: &str = "\
cargo xtask fixtures [options]   a random-weight Qwen3.5 checkpoint (Hugging Face layout)

  --out DIR              where it goes (target/fixtures/bench-qwen3_5)
  --hidden N             hidden size (1024)
  --layers N             decoder layers (8)
  --interval N           every N-th layer is full attention, the others linear (4)
  --heads N              query heads (8)
  --kv-heads N           KV heads (2)
  --head-dim N           width of an attention head (128)
  --intermediate N       MLP width (3072)
  --vocab N              vocabulary size (32000)
  --linear-heads K,V     linear-attention key and value heads (8,16)
  --linear-dim N         width of a linear-attention head (128)
  --seed N               weights' seed (0)
  --dtype f32|bf16|f16   stored precision (f32)
  --shard-mib N          shards of about N MiB, with model.safetensors.index.json
  --tied                 the LM head is the embedding
  --no-mtp               no MTP head
  --oracle-head          zero layer outputs and an MTP head that drafts the target's own choice
                         (acceptance ~100%: the draft/verify machinery's cost alone)
  --moe                  the MoE benchmark shape instead (Qwen3.5-35B-A3B scaled down, see
                         `moe_bench_shape`; the flags above still apply), with the real Qwen
                         tokenizer of llama.cpp's ggml-vocab-qwen35.gguf
  --real-tokenizer       that tokenizer for the dense shape too (give it --vocab 248320, the
                         real vocabulary's size): a checkpoint `bench --gguf-from` converts
  --real-vocab           instead: the tiny checkpoint at a real Qwen vocabulary (only --out)
";

/// `cargo xtask fixtures [--out DIR] [shape flags]`.
pub fn run(args: &[String]) -> Result<()> {
    if crate::print_help_if_asked(args, HELP) {
        return Ok(());
    }
    let moe_flag = args.iter().any(|a| a == "--moe");
    let (mut s, moe) = if moe_flag {
        let (s, m) = moe_bench_shape();
        (s, Some(m))
    } else {
        (Shape::default(), None)
    };
    let mut out = PathBuf::from(if moe_flag {
        "target/fixtures/bench-qwen3_5_moe"
    } else {
        "target/fixtures/bench-qwen3_5"
    });
    if args.iter().any(|a| a == "--real-vocab") {
        let mut out = PathBuf::from("target/fixtures/real-vocab");
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--real-vocab" => {}
                "--out" => out = PathBuf::from(it.next().context("--out needs a value")?),
                other => bail!("`{other}` does not go with --real-vocab (its shape is fixed)"),
            }
        }
        let src = crate::llama::source_dir()?;
        crate::real_vocab::write(&out, &src)?;
        println!(
            "wrote {} (the real-vocabulary test checkpoint)",
            out.display()
        );
        return Ok(());
    }
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        let num = |v: &String| {
            v.parse::<usize>()
                .with_context(|| format!("{a}: `{v}` is not a number"))
        };
        match a.as_str() {
            "--out" => out = PathBuf::from(val()?),
            "--moe" | "--real-tokenizer" => {}
            "--hidden" => s.hidden = num(val()?)?,
            "--layers" => s.layers = num(val()?)?,
            "--interval" => s.interval = num(val()?)?,
            "--heads" => s.heads = num(val()?)?,
            "--kv-heads" => s.kv_heads = num(val()?)?,
            "--head-dim" => s.head_dim = num(val()?)?,
            "--intermediate" => s.intermediate = num(val()?)?,
            "--vocab" => s.vocab = num(val()?)?,
            "--linear-heads" => {
                let v = val()?;
                let (k, vv) = v.split_once(',').context("--linear-heads K,V")?;
                s.linear_k_heads = k.parse()?;
                s.linear_v_heads = vv.parse()?;
            }
            "--linear-dim" => s.linear_dim = num(val()?)?,
            "--seed" => s.seed = num(val()?)? as u64,
            "--shard-mib" => s.shard_bytes = Some(num(val()?)? << 20),
            "--tied" => s.tied = true,
            "--no-mtp" => s.mtp = false,
            "--oracle-head" => s.oracle_head = true,
            "--dtype" => {
                s.dtype = match val()?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => bail!("--dtype {other}: use f32, bf16 or f16"),
                }
            }
            other => bail!("unknown fixtures flag `{other}`\n\n{HELP}"),
        }
    }
    let real_tokenizer = moe.is_some() || args.iter().any(|a| a == "--real-tokenizer");
    if real_tokenizer && s.vocab < REAL_VOCAB {
        bail!(
            "the real tokenizer has ids up to {REAL_VOCAB}, more than a vocabulary of {}: give \
             --vocab {REAL_VOCAB}",
            s.vocab
        );
    }
    let n = write_checkpoint_with(&out, &s, moe.as_ref())?;
    if real_tokenizer {
        let gguf = crate::llama::source_dir()?
            .join("models")
            .join("ggml-vocab-qwen35.gguf");
        let opts = crate::tokenizer::Options {
            nfc: Some(true),
            qwen3_special_tokens: true,
        };
        crate::tokenizer::write_tokenizer_files(&gguf, &out, &opts)?;
    }
    println!("wrote {} ({n} parameters, {:?})", out.display(), s.dtype);
    Ok(())
}
