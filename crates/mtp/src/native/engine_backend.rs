//! [`Backend`] over the candle engine (`mtp-engine`).

use std::path::Path;

use mtp_contract::{GenerateRequest, ProviderError, Role};
use mtp_engine::{ChatMessage, Engine, GenerateOptions};

use super::backend::{Backend, DrafterLane, Job, RunOutput};
use super::prefix_cache::CacheState;

/// The candle engine with the name of the drafter it loaded.
pub struct EngineBackend {
    engine: Engine,
    drafter: Option<DrafterLane>,
    runtime: String,
    weight_bytes: usize,
}

/// Decoding state snapshots of the candle engine (for the prefix cache).
pub struct EngineState(mtp_engine::PromptState);

impl CacheState for EngineState {
    fn bytes(&self) -> usize {
        self.0.bytes()
    }
    fn tokens(&self) -> usize {
        self.0.tokens()
    }
}

fn api(e: mtp_engine::Error) -> ProviderError {
    ProviderError::Api {
        provider: "native".into(),
        model: String::new(),
        status: None,
        message: e.to_string(),
    }
}

impl EngineBackend {
    /// Wraps a loaded engine. `drafter` is set when an MTP head or companion was loaded.
    pub fn new(engine: Engine, drafter: Option<DrafterLane>, runtime: String) -> Self {
        let weight_bytes = dir_weight_bytes(engine.dir());
        EngineBackend {
            engine,
            drafter,
            runtime,
            weight_bytes,
        }
    }
}

/// Bytes of the safetensors files of a checkpoint (what loading maps into memory).
fn dir_weight_bytes(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len() as usize)
                .sum()
        })
        .unwrap_or(0)
}

impl Backend for EngineBackend {
    type State = EngineState;

    fn runtime(&self) -> String {
        self.runtime.clone()
    }

    fn drafter(&self) -> Option<DrafterLane> {
        self.drafter.clone()
    }

    fn render(&self, request: &GenerateRequest) -> Result<Vec<u32>, ProviderError> {
        let tok = self
            .engine
            .tokenizer()
            .ok_or_else(|| ProviderError::ModelLoad {
                model: self.engine.dir().display().to_string(),
                message: "the checkpoint has no tokenizer.json, so text cannot be encoded".into(),
            })?;
        if request.raw_prompt {
            return tok.encode(&request.prompt).map_err(api);
        }
        let mut msgs = Vec::new();
        if let Some(s) = &request.system_prompt {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        for m in request.messages.iter().flatten() {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            msgs.push(ChatMessage::new(role, m.content.clone()));
        }
        if !request.prompt.is_empty() {
            msgs.push(ChatMessage::new("user", request.prompt.clone()));
        }
        let text = tok
            .apply_chat_template(&msgs, request.thinking)
            .map_err(api)?;
        let ids = tok.encode(&text).map_err(api)?;
        if ids.is_empty() {
            return Err(ProviderError::InvalidRequest {
                field: "prompt",
                message: "the rendered prompt has no tokens".into(),
            });
        }
        Ok(ids)
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, ProviderError> {
        match self.engine.tokenizer() {
            Some(t) => t.decode(ids).map_err(api),
            None => Err(ProviderError::ModelLoad {
                model: self.engine.dir().display().to_string(),
                message: "the checkpoint has no tokenizer.json, so tokens cannot be decoded".into(),
            }),
        }
    }

    fn run(&self, job: Job<'_, EngineState>) -> Result<RunOutput<EngineState>, ProviderError> {
        let mut opts = GenerateOptions::greedy(job.max_tokens).sampling(job.sampling.clone());
        if let Some(d) = job.depth {
            opts = opts.num_draft_tokens(d as usize);
        }
        let resume = job.resume.as_ref().map(|(_, s)| &s.0);
        let out = self
            .engine
            .generate_resumable(job.prompt, resume, job.checkpoint, &opts, job.on_tokens)
            .map_err(api)?;
        let stats = out
            .output
            .speculation
            .as_ref()
            .filter(|s| s.used)
            .map(|s| s.stats.clone())
            .unwrap_or_default();
        Ok(RunOutput {
            tokens: out.output.tokens,
            finish: out.output.finish_reason,
            stats,
            timings: out.output.timings,
            computed_prompt_tokens: out.computed_prompt_tokens,
            prompt_state: out
                .prompt_state
                .map(|s| std::sync::Arc::new(EngineState(s))),
            final_state: out.final_state.map(|s| std::sync::Arc::new(EngineState(s))),
        })
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }
}
