//! The command line, as clap sees it. Flags are named after the request fields they set.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{DraftDepth, Speculation};

/// `--threads`' range: the one every lane reads `threads` with.
const THREADS: mtp_contract::IntRange = mtp_contract::IntRange::THREADS;

/// `mtp`: multi-token-prediction speculative decoding of local LLMs.
#[derive(Debug, Parser)]
#[command(
    name = "mtp",
    version,
    about = "Run local LLMs faster with multi-token prediction (MTP): the model drafts its own \
             next tokens and verifies them in one pass, with the same greedy output. Every answer \
             says whether it was accelerated, and why not.",
    long_about = None,
    after_help = "Start with `mtp generate \"fn main() {\"` (the bundled demo model), \
                  `mtp probe <repo or path>` (does it carry an MTP head, what can run it) and \
                  `mtp chat --model <path>`. `--provider help` lists the runtimes.",
    propagate_version = true
)]
pub struct Cli {
    /// Show detail on stderr (-v: debug, -vv: trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate one answer and print it (or, with --json, the whole response).
    Generate(GenerateArgs),
    /// An interactive chat (REPL) with a live tok/s and `/speculation` controls.
    Chat(ChatArgs),
    /// Report whether a repo or path carries an MTP head and which runtimes can run it.
    Probe(ProbeArgs),
    /// Measure what MTP is worth: one loaded model, speculation on vs off per call, interleaved.
    Bench(BenchArgs),
    /// Download, list and verify models in the Hugging Face cache.
    Models(ModelsArgs),
    /// Serve the model over an OpenAI-compatible HTTP API, with speculation per request and
    /// its report in every answer.
    Serve(ServeArgs),
}

/// `mtp serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Provider, model and the server's speculation default (a request's `speculation` field
    /// overrides it for that request). Here `--api-key` is the key clients must send
    /// (`Authorization: Bearer KEY`); it is not passed on to an HTTP runtime behind the server.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The address to listen on (0.0.0.0 to accept other machines; then set --api-key).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests generating at once. The native engine decodes them together (continuous
    /// batching: one weight pass per step for all of them, each with the tokens it gets
    /// alone); `gguf` generates one at a time (1); an HTTP runtime behind the server may take
    /// more.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_batch: u32,
    /// Requests that may wait for a slot; beyond that the answer is 429 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_queue: u32,
    /// The largest request body accepted, in bytes (413 above it).
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20,
          value_parser = clap::value_parser!(u64).range(1024..=(1 << 30)))]
    pub max_body_bytes: u64,
    /// The model id in /v1/models and in answers (default: the model as given).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Prompt tokens the native engine computes per step for a joining request (chunked
    /// prefill: a long prompt is computed a chunk per step while the others decode).
    #[arg(long, value_name = "TOKENS", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub prefill_chunk: u32,
    /// Memory for the native prefix cache (requests with a `prompt_cache_key` resume from the
    /// longest checkpoint of their key), in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 512 << 20)]
    pub cache_bytes: u64,
    /// Keep the native prefix cache's checkpoints on disk too, in this folder (one subfolder
    /// per model), so that they outlive the server: written to a temporary file, checksummed
    /// and renamed; a torn or corrupt file is removed, never loaded.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Disk for the checkpoints under --cache-dir, in bytes (least recently used go first).
    #[arg(long, value_name = "BYTES", requires = "cache_dir", default_value_t = 4 << 30)]
    pub cache_disk_bytes: u64,
    /// Connections open at once; a connection beyond is answered 503 (Retry-After) and closed.
    #[arg(long, value_name = "N", default_value_t = mtp_server::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Seconds a connection has to send a request's headers, from when it opens or from the
    /// end of its previous answer (so also how long an idle keep-alive connection stays open).
    #[arg(long, value_name = "SECS", default_value_t = mtp_server::DEFAULT_HEADER_TIMEOUT.as_secs_f64(),
          value_parser = seconds)]
    pub header_timeout: f64,
    /// Seconds a request's whole body has to arrive (408 past it).
    #[arg(long, value_name = "SECS", default_value_t = mtp_server::DEFAULT_BODY_TIMEOUT.as_secs_f64(),
          value_parser = seconds)]
    pub body_timeout: f64,
    /// Seconds a write to a client may make no progress (a client that stopped reading its
    /// stream) before its connection is closed and its generation cancelled.
    #[arg(long, value_name = "SECS", default_value_t = mtp_server::DEFAULT_WRITE_TIMEOUT.as_secs_f64(),
          value_parser = seconds)]
    pub write_timeout: f64,
    /// Seconds the requests in flight get to finish after SIGTERM or Ctrl-C (new ones are
    /// answered 503 meanwhile, /health too); then the rest are cut.
    #[arg(long, value_name = "SECS", default_value_t = mtp_server::DEFAULT_SHUTDOWN_GRACE.as_secs_f64(),
          value_parser = seconds)]
    pub shutdown_grace: f64,
    /// Stop strings one request may give.
    #[arg(long, value_name = "N", default_value_t = mtp_server::openai::Limits::default().max_stop)]
    pub max_stop: usize,
    /// Bytes of one stop string.
    #[arg(long, value_name = "BYTES", default_value_t = mtp_server::openai::Limits::default().max_stop_bytes)]
    pub max_stop_bytes: usize,
    /// Messages of one chat request.
    #[arg(long, value_name = "N", default_value_t = mtp_server::openai::Limits::default().max_messages)]
    pub max_messages: usize,
    /// Content parts (text, images) of one message.
    #[arg(long, value_name = "N", default_value_t = mtp_server::openai::Limits::default().max_content_parts)]
    pub max_content_parts: usize,
    /// Read special-token strings written in chat messages (`<|im_end|>`, ...) as the special
    /// tokens (native engine). By default client text is plain text and only the chat
    /// template's own markup is special; raw /v1/completions prompts are parsed either way.
    #[arg(long)]
    pub parse_special: bool,
    /// Tools of one chat request.
    #[arg(long, value_name = "N", default_value_t = mtp_server::openai::Limits::default().max_tools)]
    pub max_tools: usize,
    /// Bytes of text in one request (messages, prompt, tools), refused with 413 before it
    /// waits for a slot.
    #[arg(long, value_name = "BYTES", default_value_t = mtp_server::openai::Limits::default().max_prompt_bytes)]
    pub max_prompt_bytes: usize,
    /// Choices of one request: a text completion's prompts times `n`.
    #[arg(long, value_name = "N", default_value_t = mtp_server::openai::Limits::default().max_choices)]
    pub max_choices: usize,
    /// The reply's bound when a request sets none (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`). Unset: to the end of the context, as vLLM and llama-server do.
    #[arg(long, value_name = "N")]
    pub default_max_tokens: Option<u32>,
}

/// A positive number of seconds (fractions allowed), at most a day.
fn seconds(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if x.is_finite() && x > 0.0 && x <= 86_400.0 {
        Ok(x)
    } else {
        Err(format!(
            "`{s}`: give a number of seconds above 0 and at most 86400"
        ))
    }
}

/// Which provider and model to load, and the provider-level speculation default.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// The runtime: `native` (this engine, in process; `mlx` is another name for it), `gguf`
    /// (llama.cpp in process), or an HTTP server: `llama-server`, `lmstudio`, `vllm`, `ollama`,
    /// `openai-compatible`. `--provider help` lists them.
    #[arg(long, default_value = "native")]
    pub provider: String,
    /// Model repo id or path (for an HTTP server: the model name it serves). Without it, the
    /// in-process runtimes load the bundled demo model (`models/tiny-code`, or
    /// `MTP_DEFAULT_MODEL`), and an HTTP server's one model is used (from its `/v1/models`;
    /// one that lists several asks for `--model`).
    #[arg(short = 'm', long)]
    pub model: Option<String>,
    /// Provider-level speculation: `native_mtp`, `off`, `true`, `false` or a JSON block. It
    /// decides which lane is loaded at startup.
    #[arg(long, default_value = "native_mtp", value_parser = parse_speculation)]
    pub speculation: Speculation,
    /// Proposals per round (excluding the target's seed token): any positive number (1 to 8
    /// measured; the native engine verifies up to 31), or `auto`: the native engine chooses
    /// each round's depth (0 to 8) from measured acceptance and cost.
    #[arg(long, value_name = "N|auto", value_parser = parse_depth)]
    pub num_draft_tokens: Option<DraftDepth>,
    /// Companion MTP drafter (repo id or path) when the runtime needs a separate one.
    #[arg(long, value_name = "REPO|PATH")]
    pub drafter: Option<String>,
    /// Refuse to run unaccelerated: fail at startup when no MTP lane is loaded.
    #[arg(long)]
    pub require_acceleration: bool,
    /// Base URL of an HTTP runtime (llama-server, LM Studio, vLLM, Ollama).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// API key of an HTTP runtime (never printed); for `mtp serve`, the key its clients must
    /// send.
    #[arg(long, env = "MTP_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Context length (prompt and reply) of an in-process runtime: for `native`, a limit below
    /// the model's own (`max_position_embeddings`); for `gguf`, llama.cpp's n_ctx (default 4096).
    /// An HTTP server sets its context when it starts.
    #[arg(short = 'c', long, value_name = "N", value_parser = clap::value_parser!(u32).range(mtp_contract::MIN_CTX_SIZE as i64..))]
    pub ctx_size: Option<u32>,
    /// CPU threads of an in-process runtime (default: every core; MTP_NUM_THREADS for native).
    #[arg(short = 't', long, value_name = "N", value_parser = clap::value_parser!(u32).range(THREADS.min as i64..=THREADS.max as i64))]
    pub threads: Option<u32>,
    /// The precision the native engine keeps weights in: `auto` (as the checkpoint stores them:
    /// bf16 stays bf16), `f32`, `bf16` or `f16`.
    #[arg(long, value_name = "DTYPE", value_parser = ["auto", "f32", "bf16", "f16"])]
    pub dtype: Option<String>,
    /// The KV cache's element type in an in-process runtime (keys and values, as llama.cpp's
    /// `-ctk` / `-ctv` together): `f32`, `f16` or `bf16`. Native default f32 (the reference's
    /// output); f16 and bf16 halve the cache's memory and the bytes each step reads from a
    /// long context, where attention is most of a step. The `gguf` default is llama.cpp's
    /// (f16).
    #[arg(long, visible_alias = "ctk", value_name = "TYPE", value_parser = ["f32", "f16", "bf16"])]
    pub cache_type: Option<String>,
    /// The native engine's arithmetic for 4- and 8-bit MLX weights: `exact` (the default:
    /// mlx's f32 arithmetic, bit for bit) or `fast` (activations quantized to int8 per group,
    /// integer products, as llama.cpp's Q8_0; greedy output with MTP still equals output
    /// without). On an AVX2 CPU `fast` is about 3x faster for several rows at once (prefill,
    /// verify rounds, batches) and slower for one (plain decode); its quality against `exact`
    /// is not yet measured on real text (crates/mtp-engine/README.md).
    #[arg(long, value_name = "MODE", value_parser = ["exact", "fast"])]
    pub arith: Option<String>,
}

/// Sampling controls (see `Sampling` in the contract). Without any of temperature, top-p,
/// top-k and min-p, the model's own recommendation (its generation_config.json) is used, else
/// greedy.
#[derive(Debug, Clone, Default, Args)]
pub struct SamplingArgs {
    /// Softmax temperature, 0 or more; 0 is greedy.
    #[arg(long, visible_alias = "temp", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Drop tokens below min_p × the top probability, in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Seed for deterministic sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Repetition penalty (1.0 neutral; other values force target-only decoding).
    #[arg(long, visible_alias = "repeat-penalty", allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// Presence penalty (0.0 neutral; other values force target-only decoding).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty (0.0 neutral; other values force target-only decoding).
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
}

/// Whether a thinking model reasons before it answers, and whether its reasoning is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ThinkingMode {
    /// Reason first (`enable_thinking: true`); the reasoning is shown, dimmed, on stderr.
    On,
    /// Answer directly (`enable_thinking: false`).
    Off,
    /// Reason first, but show only the answer.
    Hide,
}

impl ThinkingMode {
    /// The request's `thinking` field for this mode.
    pub fn request_value(self) -> bool {
        !matches!(self, ThinkingMode::Off)
    }
}

/// `mtp generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Provider, model and speculation.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Upper bound on generated tokens, 1 to 4294967295 (the reply also stops at the
    /// context length).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// Stop the reply at this string (repeatable); the string is not part of the reply.
    #[arg(long = "stop", value_name = "STRING")]
    pub stops: Vec<String>,
    /// Print one JSON object: content, token_ids, finish_reason, usage, metadata.
    #[arg(long)]
    pub json: bool,
    /// An image for the prompt (PNG, JPEG or WebP; a path, `file://` or `data:` URL;
    /// repeatable, shown before the prompt's text in this order). Needs a checkpoint with a
    /// vision tower.
    #[arg(long = "image", value_name = "PATH", conflicts_with = "raw")]
    pub images: Vec<String>,
    /// Structured output.
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// Tool calling.
    #[command(flatten)]
    pub tools: ToolArgs,
    /// After the answer, generate it again on the same loaded model with speculation off and
    /// print the target-only decode rate, the speed-up MTP gave and whether the text is the
    /// same.
    #[arg(long, conflicts_with = "json")]
    pub compare: bool,
    /// Use the prompt verbatim (no chat template).
    #[arg(long, conflicts_with_all = ["system", "messages", "thinking"])]
    pub raw: bool,
    /// A system prompt, placed first in the conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// The conversation so far: a JSON file holding an OpenAI-style messages array (roles
    /// system, user, assistant with `reasoning_content`/`tool_calls`, tool), `-` for stdin.
    /// The prompt, when given, is added as the last user turn.
    #[arg(long, value_name = "FILE")]
    pub messages: Option<PathBuf>,
    /// A thinking model's reasoning: `on` (shown dimmed on stderr), `off` (answer directly),
    /// `hide` (reason, show only the answer). Without it, the chat template's default.
    #[arg(long, value_enum, value_name = "MODE")]
    pub thinking: Option<ThinkingMode>,
    /// Read the prompt from a file (`-` for stdin).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "prompt_flag"])]
    pub prompt_file: Option<PathBuf>,
    /// The prompt, as a flag (llama.cpp's `-p`).
    #[arg(
        short = 'p',
        long = "prompt",
        value_name = "TEXT",
        conflicts_with = "prompt"
    )]
    pub prompt_flag: Option<String>,
    /// The prompt (the last user turn); optional with --messages, --prompt-file or -p. `-`
    /// reads it from stdin.
    #[arg(required_unless_present_any = ["messages", "prompt_file", "prompt_flag"])]
    pub prompt: Option<String>,
}

/// `mtp chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Provider, model and speculation.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Upper bound on generated tokens per answer, 1 to 4294967295 (an answer also stops at
    /// the context length).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// A system prompt for the whole session (`/system` changes it).
    #[arg(long)]
    pub system: Option<String>,
    /// A thinking model's reasoning: `on` (shown dimmed), `off` (answer directly), `hide`
    /// (reason, show only the answer); `/thinking` changes it. Without it, the chat template's
    /// default.
    #[arg(long, value_enum, value_name = "MODE")]
    pub thinking: Option<ThinkingMode>,
    /// Structured output, for every answer.
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// Tool calling, offered every turn (`/tool` answers a call).
    #[command(flatten)]
    pub tools: ToolArgs,
}

/// The tools the model may call (`generate` and `chat`), as OpenAI's `tools`, `tool_choice`
/// and `parallel_tool_calls`.
#[derive(Debug, Args)]
pub struct ToolArgs {
    /// Tools the model may call: FILE holds a JSON list of OpenAI tool objects,
    /// `[{"type": "function", "function": {"name": ..., "description": ..., "parameters":
    /// {JSON Schema}}}]` (at most 16 MiB), which the chat template shows the model. `generate`
    /// prints each call the reply makes as one line of OpenAI's JSON on stdout (`--json`: the
    /// response's `tool_calls`, `finish_reason` `tool_calls`); `chat` shows the calls, keeps
    /// them in the history, and `/tool` answers them.
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,
    /// With --tools: `auto` (the model decides; the default), `none` (the tools are not
    /// shown), `required` (the reply is tool calls, decoded under the grammar of the template's
    /// tool-call markup), or a tool's NAME (one call of that function, forced the same way).
    #[arg(long, value_name = "auto|none|required|NAME")]
    pub tool_choice: Option<String>,
    /// With --tools: at most one tool call per reply (OpenAI's `parallel_tool_calls: false`).
    #[arg(long)]
    pub no_parallel_tool_calls: bool,
}

/// The reply's constraint (`generate` and `chat`), enforced on every token, MTP drafts
/// included.
#[derive(Debug, Args)]
pub struct ConstraintArgs {
    /// Constrain the reply (every answer, in `chat`) to JSON valid against the JSON Schema in
    /// FILE (`-` for stdin), enforced on every token, MTP drafts included.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["regex", "grammar", "json_object"])]
    pub json_schema: Option<PathBuf>,
    /// Constrain the reply to any JSON object.
    #[arg(long, conflicts_with_all = ["regex", "grammar"])]
    pub json_object: bool,
    /// Constrain the reply to text matching this regular expression (whole).
    #[arg(long, value_name = "PATTERN", conflicts_with = "grammar")]
    pub regex: Option<String>,
    /// Constrain the reply to the Lark grammar in FILE (llguidance's dialect; rule `start`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// With --json-schema or --json-object: allow free whitespace between JSON tokens
    /// (default: compact `", "` and `": "`, as mlx-vlm compiles it).
    #[arg(long)]
    pub flexible_whitespace: bool,
    /// When the runtime cannot enforce the constraint (an HTTP server whose API has no field
    /// for a regex or a grammar): ask for it in the system message and check the reply instead
    /// of refusing. The summary's warnings say it was not enforced and whether the reply
    /// follows it.
    #[arg(long)]
    pub prompted_fallback: bool,
}

/// `mtp probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// A repo id (`org/name`) or a local path (directory, .safetensors or .gguf file).
    pub target: String,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Which GGUF to probe when the repo holds several (a file name inside it).
    #[arg(long, value_name = "NAME")]
    pub file: Option<String>,
}

/// `mtp bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Provider, model and speculation.
    #[command(flatten)]
    pub model: ModelArgs,
    /// A prompt to measure (repeatable); without it, the built-in code, prose and table prompts.
    #[arg(long = "prompt", value_name = "TEXT")]
    pub prompts: Vec<String>,
    /// Depths to sweep, e.g. `1,2,3`; without it, the provider's default depth only.
    #[arg(long, value_delimiter = ',', value_name = "N,N,…")]
    pub depths: Vec<u32>,
    /// Interleaved on/off repetitions per prompt and depth (medians are reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub reps: u32,
    /// Tokens generated per call.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 128)]
    pub max_tokens: u32,
    /// Send the prompts verbatim, without the chat template (base and demo models).
    #[arg(long)]
    pub raw: bool,
    /// Print the rows as JSON instead of a markdown table.
    #[arg(long)]
    pub json: bool,
}

/// `mtp models`.
#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ModelsCommand,
}

/// `mtp models …`.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Fetch a model and its MTP companion (in one job) into the Hugging Face cache.
    Download(DownloadArgs),
    /// List installed models and whether each has its MTP head.
    List(ListArgs),
    /// Load an installed model and check that greedy output is sensible.
    Verify(VerifyArgs),
}

/// `mtp models download`.
#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// Repo id, `org/name`.
    pub repo: String,
    /// The companion MTP drafter to fetch with it (else the registry's, when it names one).
    #[arg(long, value_name = "REPO")]
    pub drafter: Option<String>,
    /// Revision (branch, tag or commit).
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Hub token (never printed); without it, the login token file (`$HF_HOME/token`).
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Cache directory (default as huggingface_hub: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// `mtp models list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Cache directory (default as huggingface_hub: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `mtp models verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Repo id (`org/name`, from the cache) or a local path.
    pub repo: String,
    /// Provider to load it with (default: `gguf` when the weights are GGUF, else `native`).
    #[arg(long)]
    pub provider: Option<String>,
    /// Which GGUF to load when the repo holds several (a file name inside it).
    #[arg(long, value_name = "NAME")]
    pub file: Option<String>,
    /// Cache directory (default as huggingface_hub: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Tokens generated per check prompt.
    #[arg(long, value_name = "N", default_value_t = 48)]
    pub max_tokens: u32,
}

fn parse_speculation(s: &str) -> Result<Speculation, String> {
    s.parse::<Speculation>().map_err(|e| e.to_string())
}

fn parse_depth(s: &str) -> Result<DraftDepth, String> {
    DraftDepth::parse(s).map_err(|e| e.to_string())
}
