//! The `mtp` command as a library: [`run`] is what the binary calls; [`run_with`] runs it with
//! in-memory output (and scripted chat input), so tests and embedders can drive it in-process
//! with providers they registered through [`register_provider`](crate::register_provider).
//!
//! ```
//! let (io, captured) = mtp::cli::Io::captured();
//! let code = mtp::cli::run_with(["mtp", "generate", "--provider", "nope", "hi"], io);
//! assert_ne!(code, std::process::ExitCode::SUCCESS);
//! assert!(captured.stderr().contains("unknown provider `nope`"));
//! ```
//!
//! ## Commands
//!
//! | command | what it does |
//! | --- | --- |
//! | `mtp generate [flags] PROMPT` | streams the answer to stdout (a thinking model's reasoning to stderr), then one summary line on stderr (tokens, tok/s, acceptance, or the reason MTP was not used); `--system`, `--messages FILE` (an OpenAI-style conversation), `--thinking on\|off\|hide`; `--tools FILE` (OpenAI tool objects) with `--tool-choice`, each call printed as one line of OpenAI's JSON; `--json` prints the whole response instead |
//! | `mtp chat [flags]` | the REPL: full history through the model's chat template + one `prompt_cache_key` per session; `/speculation [on\|off]`, `/depth N`, `/thinking`, `/system`, `/tools`, `/tool [ID] RESULT` (answers a tool call of `--tools`), `/stats`, `/reset`, `/help`, `/quit`; live tok/s; Ctrl-C stops the answer |
//! | `mtp probe REPO\|PATH [--json]` | `mtp-detect`'s report; exit 1 on bad input |
//! | `mtp bench [flags]` | one loaded model, speculation off vs on per call, interleaved A/B, medians, markdown table or `--json` |
//! | `mtp models download\|list\|verify` | Hub → Hugging Face cache (model + companion in one job), what is installed and its head, a greedy sanity check |
//!
//! Flags are named after the request fields (`--num-draft-tokens`, `--top-p`, …). Without
//! `--model`, `generate`, `chat` and `bench` load the bundled demo model
//! ([`default_model_path`]). `--speculation` (default `native_mtp`) is the provider-level
//! default and decides which lane is loaded; `--require-acceleration` refuses to start when the
//! provider shows no lane.
//!
//! ## Output and errors
//!
//! Everything is written through the `output` module (the only one that prints). An error is
//! one line on stderr, `mtp: error: <what>: <why> — <what to do>`, with exit code 1; usage
//! errors exit 2. `-v`/`-vv` (or `MTP_LOG`, else `RUST_LOG`) add `tracing` detail on stderr.
//!
//! ## How it is tested
//!
//! `tests/cli_fake_provider.rs` is a deterministic provider registered as `fake` inside the
//! test binaries only. `tests/cli_commands.rs` runs every command in-process through
//! [`run_with`] and the real binary (`assert_cmd`) for what needs no model;
//! `tests/cli_models.rs` downloads from a local server in the Hub's URL layout;
//! `tests/cli_repl.rs` re-executes its own test binary as the REPL inside a pseudo-terminal
//! (`expectrl`) for `/speculation` and Ctrl-C.

// A command fails at most once and prints its error; the error's size does not matter.
#![allow(clippy::result_large_err)]

mod args;
mod bench;
mod chat;
mod error;
mod generate;
pub(crate) mod hub;
mod messages;
mod models;
mod output;
mod probe;
mod serve;
mod tools;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

pub use args::Cli;
pub use bench::{bench_rows, markdown_table, BenchOptions, BenchRow};
pub use error::CliError;
pub use output::{Captured, Io};

use args::{Command, ModelArgs, SamplingArgs};
use output::Out;

use crate::{Provider, ProviderError, ProviderKind, ProviderOptions, Sampling, Speculation};

/// Runs the command with the process's arguments and terminal.
pub fn run() -> ExitCode {
    run_with(std::env::args_os(), Io::terminal())
}

/// Runs the command with these arguments (the first is the program name) and this I/O.
/// Exit codes: 0 success, 1 failure (one `mtp: error:` line on stderr), 2 bad usage (clap's
/// and ours: a flag's value out of range, a bad combination), 130 after Ctrl-C.
pub fn run_with<I, T>(args: I, io: Io) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let Io {
        stdout,
        stderr,
        input,
        live,
    } = io;
    let mut out = Out::new(stdout, stderr, live);
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // `--provider help` lists the runtimes, whatever else the line lacks (e.g. a prompt)
    let asks_providers = args
        .windows(2)
        .any(|w| w[0] == "--provider" && w[1] == "help")
        || args.iter().any(|a| a == "--provider=help");
    if asks_providers {
        return match out.line(&provider_list()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let text = if live {
                e.render().ansi().to_string()
            } else {
                e.render().to_string()
            };
            let _ = if e.use_stderr() {
                out.note(text.trim_end())
            } else {
                out.line(text.trim_end())
            };
            return ExitCode::from(code);
        }
    };
    init_tracing(cli.verbose);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            out.error(&CliError::Io(e));
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Generate(a) => rt.block_on(generate::run(a, &mut out)),
        Command::Chat(a) => chat::run(a, &rt, &mut out, input),
        Command::Probe(a) => probe::run(a, cli.verbose, &mut out),
        Command::Bench(a) => rt.block_on(bench::run(a, &mut out)),
        Command::Models(a) => models::run(a, &rt, &mut out),
        Command::Serve(a) => rt.block_on(serve::run(a, &mut out)),
    };
    // Work still running on the blocking pool (a request `mtp serve` cancelled at its shutdown
    // deadline, stopping at its next check) gets a moment, not a wait without end: dropping
    // the runtime would wait for every blocking task.
    rt.shutdown_timeout(std::time::Duration::from_millis(250));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`mtp probe … | head`): nothing left to say.
        Err(CliError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        // Ctrl-C: the partial answer and its stats were printed; 130 as shells expect
        Err(CliError::Interrupted) => ExitCode::from(130),
        Err(e) => {
            tracing::debug!(error = ?e, "command failed");
            out.error(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

fn init_tracing(verbose: u8) {
    // -v: this workspace's crates at debug (not the HTTP stack's chatter); -vv: everything.
    let default = match verbose {
        0 => "warn",
        1 => {
            "warn,mtp=debug,mtp_contract=debug,mtp_detect=debug,mtp_engine=debug,mtp_runtimes=debug"
        }
        _ => "trace",
    };
    // MTP_LOG, else RUST_LOG (what every tracing-based tool reads), else -v's level
    let filter = tracing_subscriber::EnvFilter::try_from_env("MTP_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_env("RUST_LOG"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // A second run in the same process (tests) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// The bundled demo model: `MTP_DEFAULT_MODEL`, else `models/tiny-code` in this workspace.
pub fn default_model_path() -> PathBuf {
    match std::env::var_os("MTP_DEFAULT_MODEL") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            manifest
                .ancestors()
                .nth(2)
                .unwrap_or(manifest)
                .join("models")
                .join("tiny-code")
        }
    }
}

/// Whether `--provider NAME` names one of the HTTP providers.
pub(crate) fn is_http(provider: &str) -> bool {
    ProviderKind::from_name(provider).is_some_and(ProviderKind::is_http)
}

/// `--provider help`: every registered runtime, with a line on what it is.
fn provider_list() -> String {
    let about = |name: &str| {
        match ProviderKind::from_name(name) {
        Some(ProviderKind::Native) => "this engine, in process: safetensors checkpoints (HF or MLX layout), MTP head or companion drafter",
        Some(ProviderKind::Mlx) => "an alias of native, kept for the seed's users: the same CPU engine (it reads MLX-layout checkpoints; Apple's MLX framework is not used)",
        Some(ProviderKind::Gguf) => "llama.cpp b11434 in process: a .gguf file with its nextn head",
        Some(ProviderKind::LlamaServer) => "a running llama-server (--base-url); MTP with --spec-type draft-mtp at launch",
        Some(ProviderKind::LmStudio) => "a running LM Studio server (--base-url)",
        Some(ProviderKind::Vllm) => "a running vLLM server (--base-url); MTP with --speculative-config at launch",
        Some(ProviderKind::Ollama) => "a running Ollama server (--base-url); it exposes no MTP",
        Some(ProviderKind::OpenAiCompatible) => "any other OpenAI-compatible server (--base-url)",
        None => "registered by the embedding application",
    }
    };
    let mut s = String::from("providers (--provider NAME):\n");
    for name in crate::providers() {
        s.push_str(&format!("  {name:<18} {}\n", about(&name)));
    }
    s.trim_end().to_string()
}

/// The model to load: `--model`, else the bundled demo model (which must exist); an HTTP
/// server without `--model`: the one model its `/v1/models` lists (said on stderr), or a
/// usage error naming them when it lists several.
async fn model_name(
    m: &ModelArgs,
    opts: &ProviderOptions,
    out: &mut Out,
) -> Result<String, CliError> {
    if let Some(name) = &m.model {
        return Ok(name.clone());
    }
    if is_http(&m.provider) {
        return match mtp_runtimes::served_model(&m.provider, opts).await {
            Ok(id) => {
                out.note(&format!(
                    "model: {id} (the one model the {} server lists; --model names another)",
                    m.provider
                ))?;
                Ok(id)
            }
            Err(ProviderError::InvalidRequest { message, .. }) => Err(CliError::InvalidFlag {
                flag: "--model",
                message,
            }),
            Err(source) => Err(CliError::Start {
                provider: m.provider.clone(),
                model: "the served model".into(),
                source: crate::Error::Provider(source),
            }),
        };
    }
    let path = default_model_path();
    if !path.exists() {
        return Err(CliError::DefaultModelMissing { path });
    }
    let path = path.canonicalize().unwrap_or(path);
    Ok(path.to_string_lossy().into_owned())
}

/// The provider-level speculation block the flags describe.
fn provider_speculation(m: &ModelArgs) -> Result<Speculation, CliError> {
    let mut s = m.speculation.clone();
    if let Some(n) = m.num_draft_tokens {
        s = s.with_num_draft_tokens(n)?;
    }
    if let Some(d) = &m.drafter {
        s = s.with_drafter(d.clone())?;
    }
    if m.require_acceleration {
        s = s.with_require_acceleration(true);
    }
    Ok(s)
}

/// Creates the provider the flags name; with `--require-acceleration`, refuses when no lane
/// is loaded.
async fn open_provider(
    m: &ModelArgs,
    out: &mut Out,
) -> Result<(Arc<dyn Provider>, String), CliError> {
    open_provider_with(m, out, crate::native::NativeOptions::default()).await
}

/// [`open_provider`] with the native engine's options set by the command (e.g. `max_batch`
/// for `mtp serve`). The in-process providers get their options typed
/// ([`crate::native::create_with`], and [`mtp_runtimes::GgufOptions`] for `gguf`); only a
/// provider registered by name gets the flags as option strings.
async fn open_provider_with(
    m: &ModelArgs,
    out: &mut Out,
    mut native: crate::native::NativeOptions,
) -> Result<(Arc<dyn Provider>, String), CliError> {
    let known = crate::providers();
    if !known.contains(&m.provider) {
        // Say so before looking for a model the provider would never load.
        return Err(CliError::Start {
            provider: m.provider.clone(),
            model: m.model.clone().unwrap_or_else(|| "the demo model".into()),
            source: crate::Error::UnknownProvider {
                name: m.provider.clone(),
                known,
            },
        });
    }
    let mut opts = ProviderOptions::default().speculation(provider_speculation(m)?);
    if let Some(u) = &m.base_url {
        opts = opts.base_url(u.clone());
    }
    if let Some(k) = &m.api_key {
        opts = opts.api_key(k.clone());
    }
    let kind = ProviderKind::from_name(&m.provider);
    let is_native = kind.is_some_and(ProviderKind::is_native);
    let cache_type = m
        .cache_type
        .as_deref()
        .map(str::parse::<crate::KvType>)
        .transpose()
        .map_err(|message| CliError::InvalidFlag {
            flag: "--cache-type",
            message,
        })?;
    let gguf = (kind == Some(ProviderKind::Gguf)).then_some(mtp_runtimes::GgufOptions {
        n_ctx: m.ctx_size,
        threads: m.threads,
        cache_type,
    });
    if is_native {
        native.ctx_size = m.ctx_size.map(|n| n as usize);
        native.threads = m.threads.map(|n| n as usize);
        if let Some(kv) = cache_type {
            native.cache_type = kv;
        }
        if let Some(a) = &m.arith {
            native.arith = a.parse().map_err(|message| CliError::InvalidFlag {
                flag: "--arith",
                message,
            })?;
        }
        if let Some(d) = &m.dtype {
            native.dtype = d.parse().map_err(|message| CliError::InvalidFlag {
                flag: "--dtype",
                message,
            })?;
        }
    } else if gguf.is_some() {
        if m.arith.is_some() {
            return Err(CliError::InvalidFlag {
                flag: "--arith",
                message: "applies to the native engine; llama.cpp picks its own products".into(),
            });
        }
        if m.dtype.is_some() {
            return Err(CliError::InvalidFlag {
                flag: "--dtype",
                message: "applies to the native engine; a GGUF file's precision is its \
                          quantization type"
                    .into(),
            });
        }
    } else {
        opts = runtime_options(m, opts)?;
    }
    let model = model_name(m, &opts, out).await?;
    tracing::debug!(provider = %m.provider, model = %model, speculation = %opts.speculation.as_ref().map(|s| s.to_json()).unwrap_or_default(), "creating provider");
    let spinner = out.spinner(&format!("loading {model} ({})", m.provider));
    let llm = if is_native {
        crate::native::create_with(&m.provider, &model, &opts, native).map_err(crate::Error::from)
    } else if let Some(g) = gguf {
        crate::builtin::gguf_with(&model, &opts, g).map_err(crate::Error::from)
    } else {
        crate::create_llm(&m.provider, &model, opts)
    };
    spinner.finish_and_clear();
    let llm = llm.map_err(|source| CliError::Start {
        provider: m.provider.clone(),
        model: model.clone(),
        source,
    })?;
    if m.require_acceleration {
        let st = llm.speculation_status();
        // A server that has not shown its settings yet (`not_reported`) is not refused here:
        // the provider default carries `require_acceleration`, so each call fails rather
        // than run unaccelerated.
        if !st.lane_loaded && st.reason != Some(crate::Reason::NotReported) {
            return Err(CliError::NoLane {
                provider: m.provider.clone(),
                model,
                reason: st.reason,
                message: st
                    .message
                    .unwrap_or_else(|| "the provider reports no drafter".into()),
            });
        }
    }
    Ok((llm, model))
}

/// `--ctx-size`, `--threads`, `--dtype`, `--cache-type` and `--arith` as a registered
/// provider's option strings (`ctx_size`, `threads`, `dtype`, `cache_type`, `arith`); an HTTP server's context, threads and precision are its
/// launch settings, so there they are usage errors that say so. (The in-process providers get
/// them typed: see [`open_provider_with`].)
fn runtime_options(m: &ModelArgs, mut opts: ProviderOptions) -> Result<ProviderOptions, CliError> {
    let http = is_http(&m.provider);
    let given = [
        (
            "--ctx-size",
            m.ctx_size.map(|n| ("ctx_size", n.to_string())),
        ),
        ("--threads", m.threads.map(|n| ("threads", n.to_string()))),
        ("--dtype", m.dtype.clone().map(|d| ("dtype", d))),
        (
            "--cache-type",
            m.cache_type.clone().map(|d| ("cache_type", d)),
        ),
        ("--arith", m.arith.clone().map(|a| ("arith", a))),
    ];
    for (flag, value) in given {
        let Some((key, value)) = value else { continue };
        if http {
            return Err(CliError::InvalidFlag {
                flag,
                message: format!(
                    "applies to the in-process providers (native, gguf); a {} server sets it \
                     when it starts (e.g. llama-server -c N -t N -ctk f16)",
                    m.provider
                ),
            });
        }
        opts = opts.extra(key, value);
    }
    Ok(opts)
}

/// The sampling of a call and, when it came from the model, how the summary names it.
pub(crate) struct ChosenSampling {
    pub(crate) sampling: Sampling,
    pub(crate) note: Option<String>,
}

impl SamplingArgs {
    /// The flags' sampling; when no flag chose a decoding (temperature, top-p, top-k, min-p),
    /// the model's recommended one (its `generation_config.json`), as transformers and mlx-vlm
    /// use it, with the seed and penalties the flags gave.
    pub(crate) fn choose(&self, llm: &dyn Provider) -> ChosenSampling {
        let (sampling, taken) = self
            .to_sampling()
            .or_recommended(llm.recommended_sampling().as_ref());
        let note = taken.map(|r| {
            if r.is_greedy() {
                "greedy (generation_config.json)".to_string()
            } else {
                let mut parts = vec![format!("temperature {}", r.temperature.unwrap_or(1.0))];
                if let Some(p) = r.top_p {
                    parts.push(format!("top-p {p}"));
                }
                if let Some(k) = r.top_k {
                    parts.push(format!("top-k {k}"));
                }
                if let Some(m) = r.min_p {
                    parts.push(format!("min-p {m}"));
                }
                format!("sampled: {} (generation_config.json)", parts.join(", "))
            }
        });
        ChosenSampling { sampling, note }
    }

    fn to_sampling(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            ..Default::default()
        }
    }
}
