//! Which runtime can run an artifact's MTP head, and the exact command that starts it.
//!
//! ```
//! use mtp_detect::runtimes::{launch_command, Runtime};
//! assert_eq!(
//!     launch_command(Runtime::LlamaServer, "/models/q.gguf", None, true, 3),
//!     "llama-server -m /models/q.gguf --spec-type draft-mtp --spec-draft-n-max 3"
//! );
//! assert_eq!(
//!     launch_command(Runtime::Vllm, "org/model", None, true, 3),
//!     r#"vllm serve org/model --speculative-config '{"method":"mtp","num_speculative_tokens":3}'"#
//! );
//! ```

use std::fmt;

use mtp_contract::{ProviderKind, Reason};
use serde::{Deserialize, Serialize};

/// The runtimes the probe reports on (each one of the contract's [`ProviderKind`]s, whose
/// names they carry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// llama.cpp's server (GGUF), MTP switched on at launch.
    LlamaServer,
    /// LM Studio (GGUF through llama.cpp), MTP switched on at load.
    LmStudio,
    /// vLLM (HF safetensors), MTP in the server's speculative config.
    Vllm,
    /// This project's in-process engine (safetensors).
    Native,
    /// This project's in-process GGUF provider (llama.cpp linked in).
    Gguf,
    /// Ollama: does not expose MTP.
    Ollama,
}

impl Runtime {
    /// Every runtime, in report order.
    pub const ALL: [Runtime; 6] = [
        Runtime::Native,
        Runtime::Gguf,
        Runtime::LlamaServer,
        Runtime::LmStudio,
        Runtime::Vllm,
        Runtime::Ollama,
    ];

    /// The provider that runs it.
    pub fn kind(self) -> ProviderKind {
        match self {
            Runtime::LlamaServer => ProviderKind::LlamaServer,
            Runtime::LmStudio => ProviderKind::LmStudio,
            Runtime::Vllm => ProviderKind::Vllm,
            Runtime::Native => ProviderKind::Native,
            Runtime::Gguf => ProviderKind::Gguf,
            Runtime::Ollama => ProviderKind::Ollama,
        }
    }

    /// The name used in reports and by `create_llm` (the provider's).
    pub fn as_str(self) -> &'static str {
        self.kind().name()
    }
}

impl Serialize for Runtime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The verdict for one runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The weights carry a head and the runtime can run it.
    HeadPresentRuntimeReady,
    /// A companion drafter is in the cache, matches, and the runtime can run it.
    CompanionReady,
    /// A companion drafter is known but not downloaded.
    CompanionNotCached,
    /// A companion drafter is there but does not fit the target.
    CompanionMismatch,
    /// The runtime implements MTP for this architecture but the weights carry no head.
    RuntimeReadyNoHead,
    /// The weights carry a head but this runtime (version) has no MTP graph for it.
    HeadPresentNeedsNewerRuntime,
    /// No head, and the runtime has no MTP graph for this architecture either.
    NoHeadRuntimeUnsupported,
    /// The runtime does not load this format (e.g. GGUF in vLLM, MLX-quantized weights).
    FormatUnsupported,
    /// The runtime does not expose MTP at all.
    NotExposed,
}

/// One runtime's line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeSupport {
    /// The runtime.
    pub runtime: Runtime,
    /// Whether it can run MTP for this artifact now.
    pub can_run_mtp: bool,
    /// Why (or why not).
    pub verdict: Verdict,
    /// The contract reason when it cannot.
    pub reason: Option<Reason>,
    /// The exact launch command or code (with MTP flags when it can run MTP).
    pub command: String,
    /// One sentence on what to do.
    pub note: String,
}

/// Quotes a shell word when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'/' | b'.' | b'_' | b'-' | b':' | b'@' | b'+' | b'=' | b','
                )
        });
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command that starts `runtime` on `model` (a path, or a repo id), with MTP at `depth`
/// when `mtp` is true. `file` names the GGUF inside a remote repo (llama-server's
/// `--hf-file`). For the native engine it is Rust code.
pub fn launch_command(
    runtime: Runtime,
    model: &str,
    file: Option<&str>,
    mtp: bool,
    depth: u32,
) -> String {
    let m = shell_quote(model);
    match runtime {
        Runtime::LlamaServer => {
            let src = match file {
                Some(f) => format!("--hf-repo {m} --hf-file {}", shell_quote(f)),
                None if looks_local(model) => format!("-m {m}"),
                None => format!("--hf-repo {m}"),
            };
            if mtp {
                format!("llama-server {src} --spec-type draft-mtp --spec-draft-n-max {depth}")
            } else {
                format!("llama-server {src}")
            }
        }
        Runtime::LmStudio => {
            if mtp {
                format!("lms load {m} --speculative-draft-mtp")
            } else {
                format!("lms load {m}")
            }
        }
        Runtime::Vllm => {
            if mtp {
                format!(
                    r#"vllm serve {m} --speculative-config '{{"method":"mtp","num_speculative_tokens":{depth}}}'"#
                )
            } else {
                format!("vllm serve {m}")
            }
        }
        Runtime::Native => native_code(model, None, mtp, depth),
        Runtime::Gguf => provider_code(ProviderKind::Gguf.name(), model, None, mtp, depth),
        Runtime::Ollama => format!("ollama run {m}"),
    }
}

/// The command that converts a Hugging Face checkpoint to GGUF with llama.cpp's converter
/// (`convert_hf_to_gguf.py`, run in a llama.cpp checkout), for llama-server and LM Studio,
/// which load GGUF only. Written here once: the probe's report and the HTTP adapters' hints
/// both use it.
///
/// ```
/// use mtp_detect::runtimes::convert_command;
/// assert_eq!(
///     convert_command("org/model", "model.gguf"),
///     "python convert_hf_to_gguf.py org/model --outfile model.gguf"
/// );
/// ```
pub fn convert_command(checkpoint: &str, outfile: &str) -> String {
    format!(
        "python convert_hf_to_gguf.py {} --outfile {}",
        shell_quote(checkpoint),
        shell_quote(outfile)
    )
}

/// How a report writes the way to run a model: as code (`mtp::create_llm(…)`, for library
/// users and `--json`), or as the `mtp` command line (what a person at the terminal types).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandStyle {
    /// `mtp::create_llm(…)` code for the in-process providers.
    #[default]
    Library,
    /// `mtp generate …` for the in-process providers.
    Cli,
}

/// [`launch_command`] in a [`CommandStyle`]: the servers' commands are the same either way;
/// the in-process providers are `mtp generate …` lines in the CLI style.
///
/// ```
/// use mtp_detect::runtimes::{launch_command_in, CommandStyle, Runtime};
/// assert_eq!(
///     launch_command_in(CommandStyle::Cli, Runtime::Native, "org/m", None, true, 3),
///     "mtp generate --model org/m --num-draft-tokens 3 \"Hello\""
/// );
/// assert_eq!(
///     launch_command_in(CommandStyle::Cli, Runtime::Gguf, "./m.gguf", None, false, 3),
///     "mtp generate --provider gguf --model ./m.gguf --speculation off \"Hello\""
/// );
/// ```
pub fn launch_command_in(
    style: CommandStyle,
    runtime: Runtime,
    model: &str,
    file: Option<&str>,
    mtp: bool,
    depth: u32,
) -> String {
    match (style, runtime) {
        (CommandStyle::Cli, Runtime::Native) => {
            cli_command(ProviderKind::Native.name(), model, None, mtp, depth)
        }
        (CommandStyle::Cli, Runtime::Gguf) => {
            let m = match file {
                Some(f) => format!("{}/{f}", model.trim_end_matches('/')),
                None => model.to_string(),
            };
            cli_command(ProviderKind::Gguf.name(), &m, None, mtp, depth)
        }
        _ => launch_command(runtime, model, file, mtp, depth),
    }
}

/// The native engine's way to run `model` with a named companion `drafter`, in `style`.
pub fn native_in(
    style: CommandStyle,
    model: &str,
    drafter: Option<&str>,
    mtp: bool,
    depth: u32,
) -> String {
    match style {
        CommandStyle::Library => native_code(model, drafter, mtp, depth),
        CommandStyle::Cli => cli_command(ProviderKind::Native.name(), model, drafter, mtp, depth),
    }
}

/// `mtp generate --provider P --model M [--drafter D] (--num-draft-tokens N | --speculation
/// off) "Hello"` (the provider flag left out for `native`, the default).
pub fn cli_command(
    provider: &str,
    model: &str,
    drafter: Option<&str>,
    mtp: bool,
    depth: u32,
) -> String {
    let mut s = String::from("mtp generate");
    if provider != ProviderKind::Native.name() {
        s.push_str(&format!(" --provider {provider}"));
    }
    s.push_str(&format!(" --model {}", shell_quote(model)));
    if let Some(d) = drafter {
        s.push_str(&format!(" --drafter {}", shell_quote(d)));
    }
    if mtp {
        s.push_str(&format!(" --num-draft-tokens {depth}"));
    } else {
        s.push_str(" --speculation off");
    }
    s.push_str(" \"Hello\"");
    s
}

/// The native engine's Rust code for `model`, with a named companion `drafter` when given.
pub fn native_code(model: &str, drafter: Option<&str>, mtp: bool, depth: u32) -> String {
    provider_code(ProviderKind::Native.name(), model, drafter, mtp, depth)
}

/// `mtp::create_llm(provider, model, …)` code with MTP at `depth` when `mtp` is true.
pub fn provider_code(
    provider: &str,
    model: &str,
    drafter: Option<&str>,
    mtp: bool,
    depth: u32,
) -> String {
    let model = serde_json::to_string(model).unwrap_or_default();
    if !mtp {
        return format!("mtp::create_llm(\"{provider}\", {model}, ProviderOptions::default())");
    }
    let spec = match drafter {
        Some(d) => format!(
            "Speculation::native_mtp().with_drafter({})?.with_num_draft_tokens({depth})?",
            serde_json::to_string(d).unwrap_or_default()
        ),
        None => format!("Speculation::native_mtp().with_num_draft_tokens({depth})?"),
    };
    format!(
        "mtp::create_llm(\"{provider}\", {model}, ProviderOptions::default().speculation({spec}))"
    )
}

/// Whether a model reference names a local path.
fn looks_local(model: &str) -> bool {
    model.starts_with('/')
        || model.starts_with('.')
        || model.starts_with('~')
        || model.ends_with(".gguf")
}
