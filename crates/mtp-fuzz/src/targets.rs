//! The targets: each parser that reads outside input, its seeds and dictionary, and what it
//! may allocate. Seeds are built here (GGUF, safetensors, the speculation block) or read from
//! the repository's fixtures (72 published chat templates and their test conversations,
//! recorded server streams and `/metrics` pages).

use std::path::{Path, PathBuf};

use mtp_chat::{ChatTemplate, ReasoningParser, RenderInput, StopScanner, ThinkTags};
use serde_json::{json, Value};

use crate::Target;

const KIB: usize = 1024;

/// minijinja's limit on a repeated string (`MAX_REPEATED_STRING_LEN` in its `value/ops.rs`).
const MINIJINJA_MAX_REPEAT: usize = 100_000_000;

/// The model whose saved states the `state` target reads: the tiny trained checkpoint with its
/// MTP head (loaded once, by the seeds, before any input is measured).
fn state_engine() -> &'static mtp_engine::Engine {
    static ENGINE: std::sync::OnceLock<mtp_engine::Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        mtp_engine::Engine::load(
            &repo().join("tests/fixtures/tiny-trained"),
            &candle_core::Device::Cpu,
            candle_core::DType::F32,
        )
        .expect("the tiny-trained fixture loads")
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` whose name ends with one of `exts`, read whole (missing ones are
/// skipped: the seeds then come from the built-in ones).
fn files(dir: &Path, exts: &[&str]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            out.extend(files(&p, exts));
        } else if exts.iter().any(|e| p.to_string_lossy().ends_with(e)) {
            if let Ok(b) = std::fs::read(&p) {
                out.push(b);
            }
        }
    }
    out
}

pub(crate) fn all() -> Vec<Target> {
    vec![
        Target {
            name: "gguf",
            about: "GGUF header prefix parser (mtp_detect::gguf::parse_gguf_with, kept and whole arrays)",
            seeds: gguf_seeds,
            dictionary: &[b"GGUF", b"general.architecture", b".nextn_predict_layers"],
            run: |b| {
                use mtp_detect::gguf::{parse_gguf, parse_gguf_with, ParseOptions};
                // the claimed file length: exact, longer than the prefix, or absurd
                let tail = b.first().copied().unwrap_or(0) as u64;
                for len in [b.len() as u64, b.len() as u64 + tail * 4099, u64::MAX] {
                    let _ = parse_gguf(b, len);
                }
                let _ = parse_gguf_with(b, b.len() as u64, &ParseOptions::whole_arrays());
            },
            // kept items cost a few dozen bytes per input byte (documented on parse_gguf_with)
            alloc_cap: |n| 64 * KIB + 64 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "safetensors-header",
            about: "safetensors length prefix and JSON header (mtp_detect::st::header_len, parse_header)",
            seeds: st_seeds,
            dictionary: &[
                b"\"dtype\"",
                b"\"shape\"",
                b"\"data_offsets\"",
                b"\"__metadata__\"",
                b"{",
                b"}",
                b"[",
                b"]",
                b"18446744073709551615",
                b"-1",
                b"\"BF16\"",
                b"\"U32\"",
            ],
            run: |b| {
                let len = b.len() as u64 + 8 + b.first().copied().unwrap_or(0) as u64;
                let _ = mtp_detect::st::header_len(b, len, "fuzz.safetensors");
                let _ = mtp_detect::st::parse_header(b, len, "fuzz.safetensors");
                let _ = mtp_detect::st::parse_header(b, 0, "fuzz.safetensors");
            },
            alloc_cap: |n| 64 * KIB + 32 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "safetensors-index",
            about: "model.safetensors.index.json (mtp_detect::st::parse_index)",
            seeds: index_seeds,
            dictionary: &[
                b"\"weight_map\"",
                b"\"metadata\"",
                b"\"total_size\"",
                b"\"../x.safetensors\"",
                b"\"/abs\"",
                b"{",
                b"}",
                b"\"",
                b",",
            ],
            run: |b| {
                let _ = mtp_detect::st::parse_index(b, "model.safetensors.index.json");
            },
            alloc_cap: |n| 64 * KIB + 32 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "speculation",
            about: "the speculation block: CLI text, JSON, validation and per-request override",
            seeds: speculation_seeds,
            dictionary: &[
                b"\"mode\"",
                b"\"num_draft_tokens\"",
                b"\"drafter\"",
                b"\"require_acceleration\"",
                b"\"native_mtp\"",
                b"\"off\"",
                b"null",
                b"true",
                b"4294967296",
                b"-1",
                b"{",
                b"}",
            ],
            run: |b| {
                use mtp_contract::{resolve, Speculation};
                let text = String::from_utf8_lossy(b);
                let parsed = text.parse::<Speculation>().ok();
                let json = serde_json::from_slice::<Value>(b)
                    .ok()
                    .and_then(|v| Speculation::from_json(&v).ok());
                if let Some(s) = &parsed {
                    let _ = s.to_json();
                    let _ = resolve(Some(s), json.as_ref());
                    let r = resolve(json.as_ref(), Some(s));
                    let _ = (r.disabled_reason(), r.depth_or(3));
                }
            },
            alloc_cap: |n| 64 * KIB + 32 * n,
            max_len: 16 * KIB,
        },
        Target {
            name: "image",
            about: "image decoding and preprocessing (mtp_engine::vision::preprocess: PNG, JPEG, WebP headers and data, EXIF, the header-only size, resize, patches)",
            seeds: || {
                let exts = [".png", ".jpg", ".jpeg", ".webp"];
                let dir = repo().join("tests/fixtures/vision-resize");
                let mut s = files(&dir.join("images"), &exts);
                s.extend(files(&dir.join("hostile"), &exts));
                s
            },
            dictionary: &[
                b"\x89PNG\r\n\x1a\n",
                b"IHDR",
                b"IDAT",
                b"IEND",
                b"tRNS",
                b"eXIf",
                b"\xff\xd8\xff",
                b"\xff\xc0",
                b"\xff\xd9",
                b"Exif\0\0",
                b"RIFF",
                b"WEBPVP8L",
                b"\xff\xff\xff\x7f",
            ],
            run: |b| {
                use mtp_engine::vision::preprocess::{
                    decode_image, image_size, prepare, ImageLimits, ImageProcessorConfig,
                };
                // limits that keep one input's decoded pixels small (the product's are larger)
                let limits = ImageLimits {
                    max_bytes: 1 << 20,
                    max_pixels: 1 << 20,
                };
                let size = image_size(b, "fuzz", &limits);
                if let Ok(img) = decode_image(b, "fuzz", &limits) {
                    // what the header said is what decoding gave
                    assert_eq!(size.ok(), Some((img.width, img.height)));
                    let cfg = ImageProcessorConfig {
                        min_pixels: 32 * 32,
                        max_pixels: 64 * 64,
                        ..Default::default()
                    };
                    let _ = prepare(&img, &cfg, "fuzz");
                }
            },
            // a decoded image of at most 2^20 pixels in RGBA (and 16-bit) buffers, the
            // decoders' tables, and the small resized copy
            alloc_cap: |n| 40 * 1024 * KIB + 16 * n,
            max_len: 256 * KIB,
        },
        Target {
            name: "state",
            about: "a saved prefix-cache state read back on a loaded model (mtp_engine::Engine::state_from_bytes: lengths, layer kinds, drafter cache, images)",
            seeds: || {
                let e = state_engine();
                let mut seeds = Vec::new();
                for depth in [0, 2] {
                    let mut o = mtp_engine::GenerateOptions::greedy(4)
                        .ignore_eos(true)
                        .checkpoint(true);
                    if depth > 0 {
                        o = o.num_draft_tokens(depth);
                    }
                    o.checkpoint_at = Some(3);
                    let prompt: Vec<u32> = b"the quick brown ".iter().map(|&b| b.into()).collect();
                    if let Ok(out) = e.generate(&prompt, &o, |_| true) {
                        for st in out.states.into_vec() {
                            seeds.push(st.to_bytes());
                        }
                    }
                }
                seeds
            },
            dictionary: &[b"MTPSTATE", b"\x01\0\0\0", b"\0\0\0\0\0\0\0\0", b"\xff\xff\xff\xff\xff\xff\xff\x7f"],
            run: |b| {
                if let Ok(st) = state_engine().state_from_bytes(b) {
                    // what was read is written back as it came
                    assert_eq!(st.to_bytes(), b, "a state read back writes other bytes");
                }
            },
            // the state's floats (no more than the input's bytes), the model's fresh caches
            alloc_cap: |n| 256 * KIB + 2 * n,
            max_len: 256 * KIB,
        },
        Target {
            name: "chat-template",
            about: "compiling and rendering a chat template (mtp_chat::ChatTemplate), 72 published ones as seeds",
            seeds: || files(&repo().join("crates/mtp-chat/tests/templates"), &[".jinja"]),
            dictionary: &[
                b"{{ ",
                b" }}",
                b"{% ",
                b" %}",
                b"{%- ",
                b" -%}",
                b"{% for m in messages %}",
                b"{% endfor %}",
                b"{% if ",
                b"{% endif %}",
                b"{% set ns = namespace(a=1) %}",
                b"|tojson",
                b".startswith(",
                b".split(",
                b"[::-1]",
                b"raise_exception(",
                b"strftime_now(",
                b"range(99999999)",
                b"{% macro m(x) %}{{ m(x) }}{% endmacro %}{{ m(1) }}",
                b" * 99999999",
                b"loop.index",
                b"'",
                b"\"",
                b"(",
                b")",
            ],
            run: |b| {
                let src = String::from_utf8_lossy(b);
                if let Ok(t) = ChatTemplate::new(src, "fuzz") {
                    let _ = t.render(&conversation());
                }
            },
            // A template is a program, so its size does not bound what it makes: it compiles
            // to a few times its size, its output stops at `MAX_RENDERED_BYTES` and its fuel
            // (charged per byte made), but one expression may build a value up to minijinja's
            // own limit (`'x' * 99999999`: a 100 MB string, copied into a `Value` before the
            // fuel charge ends the render), three such copies at most at once.
            alloc_cap: |n| 3 * MINIJINJA_MAX_REPEAT + mtp_chat::MAX_RENDERED_BYTES + 16 * 1024 * KIB + 256 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "chat-messages",
            about: "hostile messages (JSON) rendered through the Qwen3.5, Llama 3.3 and gpt-oss templates",
            seeds: message_seeds,
            dictionary: &[
                b"\"role\"",
                b"\"content\"",
                b"\"tool_calls\"",
                b"\"function\"",
                b"\"arguments\"",
                b"\"reasoning_content\"",
                b"\"tool\"",
                b"\"assistant\"",
                b"\"system\"",
                b"null",
                b"[",
                b"]",
                b"{",
                b"}",
                b"<think>",
                b"</think>",
                b"<tool_call>",
            ],
            run: |b| {
                let Ok(Value::Array(messages)) = serde_json::from_slice::<Value>(b) else {
                    return;
                };
                for t in message_templates() {
                    let mut input = RenderInput::new(messages.clone());
                    input.tools = Some(vec![tool()]);
                    let _ = t.render(&input);
                }
            },
            alloc_cap: |n| 16 * 1024 * KIB + 256 * n,
            max_len: 16 * KIB,
        },
        Target {
            name: "tool-schemas",
            about: "hostile tool schemas (anyOf/$ref nesting) through the budget check, the forced-call grammar and the call readers (mtp_chat::toolcall)",
            seeds: tool_schema_seeds,
            dictionary: &[
                b"\"anyOf\"",
                b"\"oneOf\"",
                b"\"allOf\"",
                b"\"$ref\"",
                b"\"#/$defs/a\"",
                b"\"$defs\"",
                b"\"properties\"",
                b"\"type\"",
                b"\"enum\"",
                b"\"required\"",
                b"[",
                b"]",
                b"{",
                b"}",
            ],
            run: |b| {
                use mtp_chat::toolcall::{self, Forced, ToolCallFormat};
                let Ok(params) = serde_json::from_slice::<Value>(b) else {
                    return;
                };
                let tools = [json!({"type": "function", "function": {"name": "f", "parameters": params}})];
                if toolcall::check_tool_schemas(&tools).is_err() {
                    return;
                }
                for format in [ToolCallFormat::QwenXml, ToolCallFormat::HermesJson] {
                    let _ = toolcall::call_grammar(format, &tools, Forced::Required, true);
                }
                let text = "<tool_call>\n<function=f>\n<parameter=x>\n[1, {\"a\": null}]\n</parameter>\n\
                            <parameter=y>\n7\n</parameter>\n</function>\n</tool_call>";
                let _ = toolcall::parse(ToolCallFormat::QwenXml, text, &tools);
            },
            alloc_cap: |n| 16 * 1024 * KIB + 256 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "openai-request",
            about: "a request body read and checked as each server route reads it (mtp_server::openai::parse)",
            seeds: request_seeds,
            dictionary: &[
                b"\"messages\"",
                b"\"role\"",
                b"\"content\"",
                b"\"tools\"",
                b"\"tool_choice\"",
                b"\"response_format\"",
                b"\"max_tokens\"",
                b"\"logit_bias\"",
                b"\"stop\"",
                b"\"speculation\"",
                b"\"prompt_cache_key\"",
                b"\"image_url\"",
                b"\"logprobs\"",
                b"\"top_logprobs\"",
                b"\"echo\"",
                b"\"n\"",
                b"\"prompt\"",
                b"null",
                b"[",
                b"]",
                b"{",
                b"}",
            ],
            run: |b| {
                use mtp_server::openai::{parse, Endpoint, Limits};
                let Ok(body) = serde_json::from_slice::<Value>(b) else {
                    return;
                };
                for e in [Endpoint::Chat, Endpoint::Completion, Endpoint::Native] {
                    // every choice's request of a parsed body (a batch of prompts times `n`)
                    if let Ok(p) = parse(e, &body, &Limits::default()) {
                        assert_eq!(p.choice_requests().len(), p.choices());
                    }
                }
            },
            alloc_cap: |n| 16 * 1024 * KIB + 256 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "reasoning-stream",
            about: "<think> splitting and stop strings over a reply cut into random pieces (mtp_chat::stream)",
            seeds: || {
                vec![
                    b"<think>\nLet me see.\n</think>\n\nThe answer is 4.".to_vec(),
                    b"plain answer, no reasoning".to_vec(),
                    "<think>é中文</think>ok<|im_end|>".as_bytes().to_vec(),
                    b"<thi</th<think></think></think>".to_vec(),
                ]
            },
            dictionary: &[b"<think>", b"</think>", b"<", b"</", b"\n", b"STOP", b"<|im_end|>"],
            run: |b| {
                let text = String::from_utf8_lossy(b);
                // the first byte picks the cut points and whether the prompt opened reasoning
                let step = 1 + b.first().copied().unwrap_or(3) as usize % 7;
                let mut parser =
                    ReasoningParser::new(ThinkTags::default(), b.len() % 2 == 0);
                let mut stops = StopScanner::new(vec!["STOP".into(), "<|im_end|>".into(), "\n\n\n".into()]);
                let chars: Vec<char> = text.chars().collect();
                for piece in chars.chunks(step) {
                    let piece: String = piece.iter().collect();
                    let _ = parser.push(&piece);
                    let _ = stops.push(&piece);
                }
                let _ = parser.finish();
                let _ = stops.finish();
            },
            alloc_cap: |n| 64 * KIB + 64 * n,
            max_len: 16 * KIB,
        },
        Target {
            name: "sse",
            about: "server-sent events fed in random chunks (mtp_runtimes::sse::SseParser)",
            seeds: || files(&repo().join("crates/mtp-runtimes/tests/fixtures"), &[".sse"]),
            dictionary: &[b"data: ", b"event: ", b"\n\n", b"\r\n", b"\r", b":", b"[DONE]", b"id: "],
            run: |b| {
                let step = 1 + b.first().copied().unwrap_or(7) as usize % 97;
                let mut p = mtp_runtimes::sse::SseParser::new();
                for chunk in b.chunks(step) {
                    let _ = p.feed(chunk);
                }
                let _ = p.has_pending();
            },
            alloc_cap: |n| 64 * KIB + 16 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "messages",
            about: "an Anthropic Messages body (mtp_server::anthropic::parse, as /v1/messages \
                    and /v1/messages/count_tokens read it)",
            seeds: messages_seeds,
            dictionary: &[
                b"\"messages\"",
                b"\"role\"",
                b"\"content\"",
                b"\"type\"",
                b"\"text\"",
                b"\"image\"",
                b"\"source\"",
                b"\"tool_use\"",
                b"\"tool_result\"",
                b"\"tool_use_id\"",
                b"\"input\"",
                b"\"thinking\"",
                b"\"tools\"",
                b"\"input_schema\"",
                b"\"tool_choice\"",
                b"\"max_tokens\"",
                b"\"stop_sequences\"",
                b"\"system\"",
                b"\"speculation\"",
                b"\"output_config\"",
                b"null",
                b"-1",
                b"[",
                b"]",
                b"{",
                b"}",
            ],
            run: |b| {
                if let Ok(v) = serde_json::from_slice::<Value>(b) {
                    let limits = mtp_server::openai::Limits::default();
                    for count_only in [false, true] {
                        let _ = mtp_server::anthropic::parse(&v, &limits, count_only);
                    }
                }
            },
            alloc_cap: |n| 256 * KIB + 64 * n,
            max_len: 16 * KIB,
        },
        Target {
            name: "responses",
            about: "an OpenAI Responses body (mtp_server::responses::parse, as /v1/responses \
                    reads it)",
            seeds: responses_seeds,
            dictionary: &[
                b"\"input\"",
                b"\"instructions\"",
                b"\"role\"",
                b"\"content\"",
                b"\"type\"",
                b"\"message\"",
                b"\"input_text\"",
                b"\"input_image\"",
                b"\"image_url\"",
                b"\"output_text\"",
                b"\"function_call\"",
                b"\"function_call_output\"",
                b"\"call_id\"",
                b"\"arguments\"",
                b"\"output\"",
                b"\"reasoning\"",
                b"\"summary\"",
                b"\"effort\"",
                b"\"tools\"",
                b"\"parameters\"",
                b"\"tool_choice\"",
                b"\"text\"",
                b"\"format\"",
                b"\"json_schema\"",
                b"\"schema\"",
                b"\"max_output_tokens\"",
                b"\"speculation\"",
                b"null",
                b"-1",
                b"[",
                b"]",
                b"{",
                b"}",
            ],
            run: |b| {
                if let Ok(v) = serde_json::from_slice::<Value>(b) {
                    let limits = mtp_server::openai::Limits::default();
                    let _ = mtp_server::responses::parse(&v, &limits);
                }
            },
            alloc_cap: |n| 256 * KIB + 64 * n,
            max_len: 16 * KIB,
        },
        Target {
            name: "model-config",
            about: "a checkpoint's config.json, a target's or a qwen3_5_mtp drafter's, as the engine reads it (mtp_engine::ModelConfig::from_json: text_config, rope, quantization, vision_config) and asks it per layer",
            seeds: model_config_seeds,
            dictionary: CONFIG_DICTIONARY,
            run: |b| {
                let Ok(c) = mtp_engine::ModelConfig::from_json(b, Path::new("config.json")) else {
                    return;
                };
                // what building the model asks of it (the layer count itself is only checked
                // against the weights, so a few layers here)
                for i in 0..c.text.num_hidden_layers.min(64) {
                    let _ = (c.is_full_attention(i), c.is_moe_layer(i));
                }
                let _ = (c.head_dim(), c.rotary_dim(), c.norm_topk_prob(), c.rope_theta());
                for (module, canonical) in [
                    ("model.layers.0.mlp.up_proj", "layers.0.mlp.up_proj"),
                    ("mtp.layers.0.mlp.up_proj", "layers.0.mlp.up_proj"),
                    ("model.language_model.embed_tokens", "embed_tokens"),
                ] {
                    let _ = c.quant_bits(module, canonical);
                }
                if let Some(Ok(v)) = &c.vision {
                    let _ = (v.head_dim(), v.grid_per_side());
                }
            },
            alloc_cap: |n| 64 * KIB + 64 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "detect-config",
            about: "config.json as the probe and the drafter check read it (mtp_detect::config::parse_config: model types, sizes, MTP claims, block_size, MLX bits)",
            seeds: model_config_seeds,
            dictionary: CONFIG_DICTIONARY,
            run: |b| {
                if let Ok(c) = mtp_detect::config::parse_config(b, "config.json") {
                    let _ = c.claims_mtp();
                }
            },
            alloc_cap: |n| 64 * KIB + 64 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "generation-config",
            about: "generation_config.json (mtp_engine::GenerationConfig::from_json: eos ids and sampling defaults)",
            seeds: || {
                let mut s = checkpoint_files("generation_config.json");
                s.push(br#"{"eos_token_id": [248046, 248044], "do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.05}"#.to_vec());
                s
            },
            dictionary: &[
                b"\"eos_token_id\"",
                b"\"do_sample\"",
                b"\"temperature\"",
                b"\"top_p\"",
                b"\"top_k\"",
                b"\"min_p\"",
                b"\"repetition_penalty\"",
                b"4294967296",
                b"-1",
                b"1e309",
                b"null",
                b"[",
                b"]",
                b"{",
                b"}",
            ],
            run: |b| {
                let _ = mtp_engine::GenerationConfig::from_json(b, Path::new("generation_config.json"));
            },
            alloc_cap: |n| 64 * KIB + 32 * n,
            max_len: 16 * KIB,
        },
        Target {
            name: "preprocessor-config",
            about: "preprocessor_config.json and processor_config.json (split at the input's first NUL byte) as the vision lane reads them (mtp_engine::vision::preprocess::ImageProcessorConfig::from_json), then the resize rule on a few sizes",
            seeds: preprocessor_seeds,
            dictionary: &[
                b"\"patch_size\"",
                b"\"temporal_patch_size\"",
                b"\"merge_size\"",
                b"\"size\"",
                b"\"shortest_edge\"",
                b"\"longest_edge\"",
                b"\"min_pixels\"",
                b"\"max_pixels\"",
                b"\"image_mean\"",
                b"\"image_std\"",
                b"\"rescale_factor\"",
                b"\"do_rescale\"",
                b"\"do_normalize\"",
                b"\"do_convert_rgb\"",
                b"\"image_processor\"",
                b"\0",
                b"18446744073709551615",
                b"1e300",
                b"0",
                b"null",
                b"[",
                b"]",
                b"{",
                b"}",
            ],
            run: |b| {
                use mtp_engine::vision::preprocess::ImageProcessorConfig;
                let dir = Path::new("model");
                let (pre, pro) = match b.iter().position(|&c| c == 0) {
                    Some(i) => (Some(&b[..i]), Some(&b[i + 1..])),
                    None => (Some(b), None),
                };
                for (pre, pro) in [(pre, pro), (None, Some(b))] {
                    if let Ok(cfg) = ImageProcessorConfig::from_json(pre, pro, dir) {
                        for (h, w) in [(1, 1), (28, 28), (480, 640), (1, 200), (65535, 65535)] {
                            let _ = cfg.resized_size(h, w);
                        }
                    }
                }
            },
            alloc_cap: |n| 64 * KIB + 32 * n,
            max_len: 16 * KIB,
        },
        Target {
            name: "tokenizer-config",
            about: "tokenizer_config.json as mtp-chat reads it (mtp_chat::ChatTemplates::from_tokenizer_config: chat_template as a string or a named list, compiled; the special tokens)",
            seeds: tokenizer_config_seeds,
            dictionary: &[
                b"\"chat_template\"",
                b"\"name\"",
                b"\"template\"",
                b"\"tool_use\"",
                b"\"default\"",
                b"\"bos_token\"",
                b"\"eos_token\"",
                b"\"pad_token\"",
                b"\"unk_token\"",
                b"\"content\"",
                b"\"added_tokens_decoder\"",
                b"{{ ",
                b" }}",
                b"{% ",
                b" %}",
                b"null",
                b"[",
                b"]",
                b"{",
                b"}",
            ],
            run: |b| {
                let path = Path::new("tokenizer_config.json");
                if let Ok(t) = mtp_chat::ChatTemplates::from_tokenizer_config(b, path) {
                    let _ = (t.select(true), t.select(false), t.special_tokens().len());
                }
            },
            // the templates compile to a few times their size
            alloc_cap: |n| 16 * 1024 * KIB + 256 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "disk-cache",
            about: "a prefix-cache checkpoint file (`mtp serve --cache-dir`) read back as mtp_native's disk cache reads one (the header check on opening the folder, the SHA-256-checked read on lookup), as mutated and resealed with a matching SHA-256",
            seeds: disk_cache_seeds,
            dictionary: &[
                b"MTPCACHE",
                b"\x01\0\0\0",
                DISK_CACHE_IDENTITY_BYTES,
                b"\0\0\0\0\0\0\0\0",
                b"\xff\xff\xff\xff",
                b"\xff\xff\xff\xff\xff\xff\xff\xff",
                b"\xe0\xff\xff\xff\xff\xff\xff\xff",
                b"\0\0\x01\0",
            ],
            run: |b| {
                use sha2::{Digest, Sha256};
                let _ = mtp_native::read_checkpoint_bytes(b, DISK_CACHE_IDENTITY);
                // a mutated file almost never keeps its SHA-256: reseal it so that what comes
                // after the check is reached too
                if b.len() >= 32 {
                    let body = b.len() - 32;
                    let mut sealed = b[..body].to_vec();
                    sealed.extend_from_slice(&Sha256::digest(&b[..body]));
                    if let Ok((_, tokens, state)) =
                        mtp_native::read_checkpoint_bytes(&sealed, DISK_CACHE_IDENTITY)
                    {
                        assert!(!tokens.is_empty() && state.len() < sealed.len());
                    }
                }
            },
            // the file's copy, its resealed copy, and what is read out of each
            alloc_cap: |n| 64 * KIB + 8 * n,
            max_len: 64 * KIB,
        },
        Target {
            name: "prometheus",
            about: "a /metrics page (mtp_runtimes::prometheus::Metrics::parse)",
            seeds: || files(&repo().join("crates/mtp-runtimes/tests/fixtures"), &[".txt"]),
            dictionary: &[b"# HELP ", b"# TYPE ", b"{", b"}", b"=\"", b"\",", b" NaN", b" +Inf", b"\n", b"_total"],
            run: |b| {
                let m = mtp_runtimes::prometheus::Metrics::parse(&String::from_utf8_lossy(b));
                std::hint::black_box(m);
            },
            alloc_cap: |n| 64 * KIB + 16 * n,
            max_len: 64 * KIB,
        },
    ]
}

// ---- checkpoint files ----

/// Keys of `config.json` (the engine's and the probe's), with values that stress them.
const CONFIG_DICTIONARY: &[&[u8]] = &[
    b"\"model_type\"",
    b"\"qwen3_5_mtp\"",
    b"\"qwen3_next\"",
    b"\"qwen3_5_moe\"",
    b"\"text_config\"",
    b"\"vision_config\"",
    b"\"hidden_size\"",
    b"\"num_hidden_layers\"",
    b"\"num_attention_heads\"",
    b"\"num_key_value_heads\"",
    b"\"head_dim\"",
    b"\"linear_num_value_heads\"",
    b"\"linear_num_key_heads\"",
    b"\"layer_types\"",
    b"\"full_attention_interval\"",
    b"\"rope_parameters\"",
    b"\"rope_scaling\"",
    b"\"full_attention\"",
    b"\"mrope_section\"",
    b"\"partial_rotary_factor\"",
    b"\"rope_theta\"",
    b"\"quantization\"",
    b"\"quantization_config\"",
    b"\"bits\"",
    b"\"group_size\"",
    b"\"num_experts\"",
    b"\"num_experts_per_tok\"",
    b"\"mlp_only_layers\"",
    b"\"mtp_num_hidden_layers\"",
    b"\"num_nextn_predict_layers\"",
    b"\"block_size\"",
    b"\"eos_token_id\"",
    b"\"tie_word_embeddings\"",
    b"\"num_position_embeddings\"",
    b"\"out_hidden_size\"",
    b"18446744073709551615",
    b"4294967296",
    b"-1",
    b"0",
    b"1e309",
    b"null",
    b"[",
    b"]",
    b"{",
    b"}",
];

/// Every file named `name` in the repository's checkpoint fixtures (the tiny checkpoints, the
/// published configs' key sets, the probe's mlx-vlm exports, the vision configs).
fn checkpoint_files(name: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for dir in [
        "tests/fixtures",
        "models",
        "crates/mtp-engine/tests/configs",
        "crates/mtp-detect/tests/fixtures",
    ] {
        let suffix = format!("/{name}");
        out.extend(files(&repo().join(dir), &[suffix.as_str()]));
    }
    out
}

/// Every fixture `config.json`: targets of each family, quantized ones, a vision wrapper, and
/// `qwen3_5_mtp` companion drafters.
fn model_config_seeds() -> Vec<Vec<u8>> {
    checkpoint_files("config.json")
}

fn preprocessor_seeds() -> Vec<Vec<u8>> {
    let mut seeds = checkpoint_files("preprocessor_config.json");
    // the two files of one folder, joined by a NUL
    let dir = repo().join("tests/fixtures/vision-resize/configs");
    for case in ["processor_override", "malformed_processor"] {
        let pre = std::fs::read(dir.join(case).join("preprocessor_config.json"));
        let pro = std::fs::read(dir.join(case).join("processor_config.json"));
        if let (Ok(mut pre), Ok(pro)) = (pre, pro) {
            pre.push(0);
            pre.extend(pro);
            seeds.push(pre);
        }
    }
    seeds
}

fn tokenizer_config_seeds() -> Vec<Vec<u8>> {
    let mut seeds = checkpoint_files("tokenizer_config.json");
    let dir = repo().join("crates/mtp-chat/tests/templates");
    let read = |n: &str| std::fs::read_to_string(dir.join(n)).unwrap_or_default();
    let qwen = read("Qwen3.5-4B.jinja");
    let llama = read("meta-llama-Llama-3.3-70B-Instruct.jinja");
    for v in [
        json!({"chat_template": qwen, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "bos_token": null}),
        json!({"chat_template": [{"name": "default", "template": llama},
                                 {"name": "tool_use", "template": qwen}],
               "bos_token": {"content": "<|begin_of_text|>", "lstrip": false}}),
        json!({"chat_template": null, "unk_token": {"content": 5}}),
    ] {
        seeds.push(v.to_string().into_bytes());
    }
    seeds
}

/// The state identity the `disk-cache` target's files are written and read under.
const DISK_CACHE_IDENTITY: &str =
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const DISK_CACHE_IDENTITY_BYTES: &[u8] = DISK_CACHE_IDENTITY.as_bytes();

/// A state as the disk cache stores it: the backend's bytes.
struct RawState(Vec<u8>, usize);

impl mtp_native::CacheState for RawState {
    fn bytes(&self) -> usize {
        self.0.len()
    }
    fn tokens(&self) -> usize {
        self.1
    }
    fn to_bytes(&self) -> Option<Vec<u8>> {
        Some(self.0.clone())
    }
}

/// Checkpoint files written by the disk cache itself, in a folder of its own under the system's
/// temporary directory (removed afterwards).
fn disk_cache_seeds() -> Vec<Vec<u8>> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let root = std::env::temp_dir().join(format!(
        "mtp-fuzz-disk-cache-{}-{nanos}",
        std::process::id()
    ));
    let mut seeds = Vec::new();
    if let Ok(mut cache) =
        mtp_native::DiskCache::<RawState>::open(&root, DISK_CACHE_IDENTITY, 1 << 30, 8)
    {
        let state = |b: &[u8], n| std::sync::Arc::new(RawState(b.to_vec(), n));
        cache.store("", vec![1], state(b"x", 1));
        cache.store(
            "key",
            vec![1, 2, 3],
            state(b"MTPSTATE\x01\0\0\0 three tokens", 3),
        );
        cache.store("é中文", (0..40).collect(), state(&[7; 300], 40));
        cache.flush();
        let dir = cache.dir().to_path_buf();
        seeds = files(&dir, &[".state"]);
    }
    let _ = std::fs::remove_dir_all(&root);
    seeds
}

// ---- GGUF ----

fn kv_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// One GGUF v3 header with `kvs` (key, type tag, encoded value) and `tensors`.
fn gguf(kvs: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (k, tag, v) in kvs {
        kv_str(&mut b, k);
        b.extend(tag.to_le_bytes());
        b.extend(v);
    }
    let mut offset = 0u64;
    for (name, dims, ty) in tensors {
        kv_str(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offset += dims.iter().product::<u64>() * 2;
    }
    b
}

fn s(v: &str) -> Vec<u8> {
    let mut b = Vec::new();
    kv_str(&mut b, v);
    b
}

fn gguf_seeds() -> Vec<Vec<u8>> {
    let arr = |tag: u32, items: &[Vec<u8>]| {
        let mut b = tag.to_le_bytes().to_vec();
        b.extend((items.len() as u64).to_le_bytes());
        for i in items {
            b.extend(i);
        }
        b
    };
    let mut seeds = vec![
        gguf(
            &[
                ("general.architecture", 8, s("qwen35")),
                ("qwen35.block_count", 4, 25u32.to_le_bytes().to_vec()),
                (
                    "qwen35.nextn_predict_layers",
                    4,
                    1u32.to_le_bytes().to_vec(),
                ),
                ("general.file_type", 4, 15u32.to_le_bytes().to_vec()),
            ],
            &[
                ("token_embd.weight", &[64, 32], 1),
                ("blk.24.nextn.eh_proj.weight", &[128, 64], 1),
                ("blk.0.attn_q.weight", &[64, 64], 12),
            ],
        ),
        gguf(
            &[
                ("general.architecture", 8, s("llama")),
                (
                    "tokenizer.ggml.tokens",
                    9,
                    arr(8, &[s("a"), s("b"), s("<|im_end|>")]),
                ),
                (
                    "tokenizer.ggml.scores",
                    9,
                    arr(6, &vec![1f32.to_le_bytes().to_vec(); 3]),
                ),
                (
                    "tokenizer.ggml.token_type",
                    9,
                    arr(5, &vec![1i32.to_le_bytes().to_vec(); 3]),
                ),
                ("tokenizer.chat_template", 8, s("{{ messages[0].content }}")),
                ("x.bool", 7, vec![1]),
                ("x.u8", 0, vec![7]),
                ("x.i16", 3, (-2i16).to_le_bytes().to_vec()),
                ("x.u64", 10, u64::MAX.to_le_bytes().to_vec()),
                ("x.f64", 12, 1.5f64.to_le_bytes().to_vec()),
                (
                    "x.nested",
                    9,
                    arr(9, &[arr(4, &[1u32.to_le_bytes().to_vec()])]),
                ),
            ],
            &[("output.weight", &[32, 64], 0)],
        ),
    ];
    // a version-2 header and a big-endian one, as llama.cpp accepts
    let mut v2 = seeds[0].clone();
    v2[4..8].copy_from_slice(&2u32.to_le_bytes());
    seeds.push(v2);
    let mut be = b"GGUF".to_vec();
    be.extend(3u32.to_be_bytes());
    be.extend(0u64.to_be_bytes());
    be.extend(1u64.to_be_bytes());
    be.extend(20u64.to_be_bytes());
    be.extend(b"general.architecture");
    be.extend(8u32.to_be_bytes());
    be.extend(6u64.to_be_bytes());
    be.extend(b"qwen35");
    seeds.push(be);
    seeds
}

// ---- safetensors ----

fn st_seeds() -> Vec<Vec<u8>> {
    let headers = [
        json!({"__metadata__": {"format": "pt"},
               "model.embed_tokens.weight": {"dtype": "BF16", "shape": [32, 16], "data_offsets": [0, 1024]},
               "mtp.fc.weight": {"dtype": "BF16", "shape": [16, 32], "data_offsets": [1024, 2048]}}),
        json!({"model.layers.0.mlp.up_proj.weight": {"dtype": "U32", "shape": [64, 8], "data_offsets": [0, 2048]},
               "model.layers.0.mlp.up_proj.scales": {"dtype": "F16", "shape": [64, 1], "data_offsets": [2048, 2176]},
               "model.layers.0.mlp.up_proj.biases": {"dtype": "F16", "shape": [64, 1], "data_offsets": [2176, 2304]}}),
        json!({"x": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}),
    ];
    let mut seeds = Vec::new();
    for h in headers {
        let j = serde_json::to_vec(&h).unwrap_or_default();
        // the JSON alone (parse_header) and with its length prefix (header_len)
        let mut with_len = (j.len() as u64).to_le_bytes().to_vec();
        with_len.extend(&j);
        seeds.push(j);
        seeds.push(with_len);
    }
    seeds
}

fn index_seeds() -> Vec<Vec<u8>> {
    [
        json!({"metadata": {"total_size": 4096},
               "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                              "mtp.fc.weight": "model-00002-of-00002.safetensors"}}),
        json!({"weight_map": {}}),
        json!({"metadata": null, "weight_map": {"a": "sub/dir/b.safetensors"}}),
    ]
    .iter()
    .map(|v| serde_json::to_vec_pretty(v).unwrap_or_default())
    .collect()
}

// ---- speculation ----

fn speculation_seeds() -> Vec<Vec<u8>> {
    [
        "native_mtp",
        "off",
        "true",
        "false",
        "on",
        r#"{"mode": "native_mtp", "num_draft_tokens": 3}"#,
        r#"{"mode": "off"}"#,
        r#"{"mode": "native_mtp", "drafter": "org/model-MTP", "require_acceleration": true}"#,
        r#"{"num_draft_tokens": 16, "unknown": 1}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

// ---- Anthropic's Messages ----

fn messages_seeds() -> Vec<Vec<u8>> {
    let tools = json!([{"name": "get_weather", "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    [
        json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}),
        json!({"max_tokens": 16, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                    "data": "iVBORw0KGgo="}},
                {"type": "text", "text": "what is it?"}]}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "stream": true}),
        json!({"max_tokens": 64, "tools": tools, "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                        "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sun"}], "is_error": false}]}],
            "stop_sequences": ["\n\n"], "temperature": 0, "top_k": 4,
            "speculation": {"mode": "native_mtp", "num_draft_tokens": 3}}),
        json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

fn responses_seeds() -> Vec<Vec<u8>> {
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}]);
    [
        json!({"model": "m", "input": "hi", "max_output_tokens": 16}),
        json!({"instructions": "Be brief.", "stream": true, "reasoning": {"effort": "high"},
            "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                {"type": "input_text", "text": "what is it?"}]}]}),
        json!({"tools": tools, "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": false, "temperature": 0, "top_p": 0.9,
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "call it"}],
                    "content": [{"type": "reasoning_text", "text": "call it"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                    "arguments": "{\"city\": \"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sun"}],
            "speculation": {"mode": "native_mtp", "num_draft_tokens": 3}}),
        json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "x",
            "schema": {"type": "object"}, "strict": true}}, "store": false,
            "include": ["reasoning.encrypted_content"]}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

// ---- chat ----

fn tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

/// A conversation with every role and field the templates read.
fn conversation() -> RenderInput {
    let mut input = RenderInput::new(vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
               "tool_calls": [{"type": "function", "id": "call_1",
                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}),
        json!({"role": "user", "content": "Thanks"}),
    ]);
    input.tools = Some(vec![tool()]);
    input.variables.insert("bos_token".into(), json!("<s>"));
    input.variables.insert("eos_token".into(), json!("</s>"));
    input
        .variables
        .insert("enable_thinking".into(), json!(true));
    input
}

fn message_templates() -> &'static [ChatTemplate] {
    static T: std::sync::OnceLock<Vec<ChatTemplate>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let dir = repo().join("crates/mtp-chat/tests/templates");
        [
            "Qwen3.5-4B.jinja",
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
            "openai-gpt-oss-120b.jinja",
        ]
        .iter()
        .filter_map(|n| {
            let src = std::fs::read_to_string(dir.join(n)).ok()?;
            ChatTemplate::new(src, *n).ok()
        })
        .collect()
    })
}

/// Tool `parameters` schemas: plain, recursive through `$defs`, and the branching shape that
/// once took the reader exponential time.
fn tool_schema_seeds() -> Vec<Vec<u8>> {
    let branches: Vec<Value> = (0..8).map(|_| json!({"$ref": "#/$defs/a"})).collect();
    [
        json!({"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "integer"}}, "required": ["x"]}),
        json!({"type": "object", "$defs": {"a": {"anyOf": branches}}, "properties": {"x": {"$ref": "#/$defs/a"}}}),
        json!({"type": "object", "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
               "properties": {"x": {"$ref": "#/$defs/n"}, "y": {"enum": ["a", 1, null]}}}),
        json!({"type": "object", "properties": {"x": {"oneOf": [{"type": "array"}, {"allOf": [{"type": ["number", "null"]}]}]}}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

/// Request bodies of the chat and completion routes, with tools, constraints and images.
fn request_seeds() -> Vec<Vec<u8>> {
    [
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
        json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
            {"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
            "stream": true, "stream_options": {"include_usage": true}, "stop": ["\n", "END"]}),
        json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "1"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "speculation": {"num_draft_tokens": 2}, "prompt_cache_key": "k"}),
        json!({"prompt": "fn main", "max_tokens": 4, "logit_bias": {"5": -100}, "seed": 1, "best_of": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
        json!({"prompt": ["a"], "n_predict": -1, "return_tokens": true, "speculative.n_max": 3}),
        json!({"prompt": [[1, 2, 3], [4]], "max_tokens": 0, "logprobs": 5, "echo": true, "n": 2, "seed": 9}),
        json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 20, "n": 3}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

fn message_seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![serde_json::to_vec(&conversation().messages).unwrap_or_default()];
    let cases = std::fs::read(repo().join("crates/mtp-chat/tests/templates/cases.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    if let Some(Value::Array(cases)) = cases.as_ref().and_then(|c| c.get("cases")).cloned() {
        for c in cases {
            if let Some(m) = c.get("messages") {
                seeds.push(serde_json::to_vec(m).unwrap_or_default());
            }
        }
    }
    seeds
}
