//! Which provider: the one list of provider names, spelled here once. The facade's registry,
//! the HTTP adapters' server kinds, the probe's runtimes and the command line all name
//! providers through [`ProviderKind`].

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// A provider this workspace ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProviderKind {
    /// The native in-process engine (safetensors, HF or MLX layout).
    Native,
    /// An alias of [`ProviderKind::Native`] kept for the seed's users (MLX-layout checkpoints
    /// on the same CPU engine; Apple's MLX framework is not used).
    Mlx,
    /// llama.cpp linked in-process (GGUF).
    Gguf,
    /// A running llama.cpp `llama-server`.
    LlamaServer,
    /// Any other OpenAI-compatible server.
    OpenAiCompatible,
    /// A running LM Studio server.
    LmStudio,
    /// A running vLLM server.
    Vllm,
    /// A running Ollama server.
    Ollama,
}

impl ProviderKind {
    /// Every provider, in the registry's order.
    pub const ALL: [ProviderKind; 8] = [
        ProviderKind::Native,
        ProviderKind::Mlx,
        ProviderKind::Gguf,
        ProviderKind::LlamaServer,
        ProviderKind::OpenAiCompatible,
        ProviderKind::LmStudio,
        ProviderKind::Vllm,
        ProviderKind::Ollama,
    ];

    /// The providers reached over HTTP, in the registry's order.
    pub const HTTP: [ProviderKind; 5] = [
        ProviderKind::LlamaServer,
        ProviderKind::OpenAiCompatible,
        ProviderKind::LmStudio,
        ProviderKind::Vllm,
        ProviderKind::Ollama,
    ];

    /// The name `create_llm`, `--provider`, reports and the registry use.
    pub const fn name(self) -> &'static str {
        match self {
            ProviderKind::Native => "native",
            ProviderKind::Mlx => "mlx",
            ProviderKind::Gguf => "gguf",
            ProviderKind::LlamaServer => "llama-server",
            ProviderKind::OpenAiCompatible => "openai-compatible",
            ProviderKind::LmStudio => "lmstudio",
            ProviderKind::Vllm => "vllm",
            ProviderKind::Ollama => "ollama",
        }
    }

    /// The provider a name stands for (exact, as registered).
    pub fn from_name(name: &str) -> Option<ProviderKind> {
        ProviderKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether it talks to a server over HTTP (rather than running in this process).
    pub fn is_http(self) -> bool {
        ProviderKind::HTTP.contains(&self)
    }

    /// Whether it is this workspace's own engine (`native` or its alias `mlx`).
    pub fn is_native(self) -> bool {
        matches!(self, ProviderKind::Native | ProviderKind::Mlx)
    }

    /// Every name, comma-separated (for messages listing what is known).
    pub fn names() -> String {
        ProviderKind::ALL.map(ProviderKind::name).join(", ")
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProviderKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProviderKind::from_name(s).ok_or_else(|| {
            format!(
                "unknown provider `{}`; known: {}",
                s.chars().take(64).collect::<String>(),
                ProviderKind::names()
            )
        })
    }
}

impl Serialize for ProviderKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_http_is_a_subset() {
        for k in ProviderKind::ALL {
            assert_eq!(ProviderKind::from_name(k.name()), Some(k));
            assert_eq!(k.to_string().parse::<ProviderKind>(), Ok(k));
            assert_eq!(k.is_http(), ProviderKind::HTTP.contains(&k));
        }
        assert!(ProviderKind::HTTP
            .iter()
            .all(|k| ProviderKind::ALL.contains(k)));
        assert!("tgi"
            .parse::<ProviderKind>()
            .unwrap_err()
            .contains("llama-server"));
        assert_eq!(
            serde_json::to_string(&ProviderKind::LlamaServer).unwrap(),
            "\"llama-server\""
        );
    }
}
