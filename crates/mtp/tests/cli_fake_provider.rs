//! A deterministic fake [`Provider`] for the CLI tests, registered as `fake` inside the test
//! binaries only (never in shipped code). It follows the contract with `mtp::plan`: a lane is
//! loaded when the provider default asks for speculation (unless the model name contains
//! `nolane`), several tokens stream per round when speculating, and the report says what ran.
//!
//! Model names steer it: `slow` streams one round per 150 ms (for Ctrl-C), `nolane` loads no
//! drafter (`mtp_head_not_cached`), `fail-load` fails to load, `garbage` answers with
//! degenerate repetition, `empty` answers nothing, `knows` continues a few well-known prompts
//! correctly (others babble like the rest), `diverge` changes its last token when speculating, `think` reasons first ([`REASONING`],
//! streamed before the answer) unless the request says `thinking: false`, `sampler` recommends
//! [`RECOMMENDED`] (as a checkpoint's generation_config.json would).
//!
//! Tools: a request that offers tools answers with tool calls ([`tool_calls_for`]; no text,
//! [`CALL_TOKENS`] markup tokens per call, `finish_reason: tool_calls`, the calls streamed as
//! `StreamEvent::ToolCall` pieces before `Done`) when its `tool_choice` forces a call or its
//! prompt asks for one (`use a tool`, `use every tool`, or a tool's name after `call `).
//!
//! Included by the other `cli_*` tests with `#[path]`; compiled alone it tests itself.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use mtp::{
    plan, Capabilities, DraftStats, EventStream, FinishReason, GenerateRequest, GenerateResponse,
    Lane, Metadata, Plan, Provider, ProviderError, ProviderOptions, Reason, SpeculationMode,
    SpeculationReport, SpeculationStatus, StreamEvent, Timings, ToolCall, ToolCallDelta,
    ToolChoice, Usage,
};

/// Every request the fake received, in order (for assertions).
pub static REQUESTS: Mutex<Vec<GenerateRequest>> = Mutex::new(Vec::new());
/// Every provider the factory built: `(model, options)`.
pub static OPTIONS: Mutex<Vec<(String, ProviderOptions)>> = Mutex::new(Vec::new());
/// Every `prompt_cache_clear` key.
pub static CLEARS: Mutex<Vec<Option<String>>> = Mutex::new(Vec::new());

/// The sampling a `sampler` model recommends.
pub fn recommended() -> mtp::Sampling {
    mtp::Sampling {
        temperature: Some(0.6),
        top_p: Some(0.95),
        top_k: Some(20),
        ..Default::default()
    }
}

/// What a `think` model reasons before its answer.
pub const REASONING: &str = "The user wants code.\nStart with main.";

/// The tokens of tool-call markup each call costs.
pub const CALL_TOKENS: usize = 4;

/// The calls the fake makes for `req`: none unless it offers tools and its `tool_choice`
/// forces a call or its prompt asks (`use every tool`: each tool; `call NAME`: those named;
/// `use a tool`: the first). A named `tool_choice` calls that function once;
/// `parallel_tool_calls: false` keeps the first call only. Call `i` has the id `call_{i}` and
/// the arguments `{"i": i}` (as a JSON string, as OpenAI sends them).
pub fn tool_calls_for(req: &GenerateRequest) -> Vec<ToolCall> {
    let tools: Vec<&str> = req
        .offered_tools()
        .iter()
        .filter_map(mtp::tool_name)
        .collect();
    let p = &req.prompt;
    let named: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|n| p.contains(&format!("call {n}")))
        .collect();
    let mut names: Vec<&str> = match &req.tool_choice {
        _ if tools.is_empty() => Vec::new(),
        ToolChoice::Function(n) => vec![n.as_str()],
        _ if p.contains("use every tool") => tools.clone(),
        _ if !named.is_empty() => named,
        c if c.forces_a_call() || p.contains("use a tool") => vec![tools[0]],
        _ => Vec::new(),
    };
    if req.parallel_tool_calls == Some(false) {
        names.truncate(1);
    }
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            ToolCall::function(
                format!("call_{i}"),
                n,
                serde_json::Value::String(format!("{{\"i\": {i}}}")),
            )
        })
        .collect()
}

/// The words the fake "generates", cyclically.
pub const WORDS: [&str; 8] = ["fn", "main", "()", "{", "println!", "(\"hi\")", ";", "}\n"];

pub struct Fake {
    model: String,
    default: Option<mtp::Speculation>,
    lane: Lane,
}

/// Registers the fake provider as `fake` (idempotent).
pub fn register() {
    mtp::register_provider(
        "fake",
        Arc::new(|model: &str, opts: &ProviderOptions| {
            if model.contains("fail-load") {
                return Err(ProviderError::ModelLoad {
                    model: model.into(),
                    message: "config.json is missing".into(),
                });
            }
            OPTIONS
                .lock()
                .unwrap()
                .push((model.to_string(), opts.clone()));
            let wants = mtp::resolve(opts.speculation.as_ref(), None).requested;
            let lane = if model.contains("nolane") {
                Lane::Unavailable {
                    reason: Reason::MtpHeadNotCached,
                    message: "the drafter fake/drafter is not in the local cache; fetch it with `mtp models download fake/drafter`".into(),
                }
            } else if !wants {
                Lane::Unavailable {
                    reason: mtp::resolve(opts.speculation.as_ref(), None)
                        .disabled_reason()
                        .unwrap_or(Reason::DisabledByDefault),
                    message: "started with --speculation off".into(),
                }
            } else {
                Lane::Ready {
                    drafter: opts
                        .speculation
                        .as_ref()
                        .and_then(|s| s.drafter.clone())
                        .unwrap_or_else(|| "embedded".into()),
                    default_depth: 3,
                    depth_source: mtp::DepthSource::BuiltIn,
                    output_preserving: Some(true),
                }
            };
            Ok(Arc::new(Fake {
                model: model.to_string(),
                default: opts.speculation.clone(),
                lane,
            }) as Arc<dyn Provider>)
        }),
    );
}

/// The greedy text the fake produces for `n` tokens.
pub fn expected_text(n: usize) -> String {
    (0..n).map(token).collect()
}

/// What a `knows` model continues a few well-known prompts with, as words.
fn known_reply(prompt: &str) -> Option<Vec<&'static str>> {
    let text = if prompt.contains("capital of France") {
        "Paris. It is also the largest city in the country and sits on the Seine."
    } else if prompt.contains("Wednesday,") {
        "Thursday, Friday, Saturday, Sunday. Those are the days of the week in order."
    } else if prompt.contains("fibonacci") {
        "if n < 2: return n ⏎ return fibonacci(n - 1) + fibonacci(n - 2)"
    } else {
        return None;
    };
    Some(text.split(' ').collect())
}

fn token(i: usize) -> String {
    let w = WORDS[i % WORDS.len()];
    if w.ends_with('\n') {
        w.to_string()
    } else {
        format!("{w} ")
    }
}

struct Run {
    reasoning: Option<String>,
    chunks: Vec<(String, Vec<u32>)>,
    /// The tool calls' pieces, streamed after the chunks.
    calls: Vec<ToolCallDelta>,
    response: GenerateResponse,
}

impl Fake {
    fn prepare(&self, req: &GenerateRequest) -> Result<Run, ProviderError> {
        req.validate()?;
        REQUESTS.lock().unwrap().push(req.clone());
        let p = plan(
            self.default.as_ref(),
            req.speculation.as_ref(),
            &req.sampling,
            &self.lane,
        )?;
        let calls = tool_calls_for(req);
        let n = if !calls.is_empty() {
            CALL_TOKENS * calls.len()
        } else if self.model.contains("empty") {
            0
        } else {
            req.max_output_tokens.unwrap_or(32) as usize
        };
        let known = if self.model.contains("knows") {
            known_reply(&req.prompt)
        } else {
            None
        };
        let mut tokens: Vec<(String, u32)> = (0..n)
            .map(|i| {
                if !calls.is_empty() {
                    // the calls' markup: tokens, and no text
                    (String::new(), 500 + i as u32)
                } else if self.model.contains("garbage") {
                    ("a".to_string(), 0)
                } else if let Some(words) = &known {
                    let w = words[i % words.len()];
                    (format!("{w} "), 100 + i as u32)
                } else {
                    (token(i), (i % WORDS.len()) as u32)
                }
            })
            .collect();
        // `diverge`: speculation changes the last token (a broken verifier)
        if self.model.contains("diverge") && matches!(p, Plan::Speculate { .. }) {
            if let Some(last) = tokens.last_mut() {
                *last = ("drift ".to_string(), 999);
            }
        }
        let mut stats = DraftStats::default();
        let (per, report) = match &p {
            Plan::Speculate {
                resolved,
                drafter,
                depth,
                depth_source,
                output_preserving,
            } => {
                let d = *depth as usize;
                let mut produced = 0;
                let mut round = 0;
                while produced < n {
                    // Every fourth round rejects the last proposal.
                    let acc = if round % 4 == 3 { d - 1 } else { d };
                    stats.record_round(d, acc);
                    produced += acc + 1;
                    round += 1;
                }
                let rep = SpeculationReport::used(
                    resolved,
                    "fake-cpu",
                    drafter.clone(),
                    *depth,
                    &stats,
                    *output_preserving,
                )
                .with_depth_source(*depth_source);
                (d + 1, rep)
            }
            Plan::TargetOnly { .. } => (1, p.target_only_report("fake-cpu").unwrap()),
        };
        let chunks: Vec<(String, Vec<u32>)> = tokens
            .chunks(per.max(1))
            .map(|c| {
                (
                    c.iter().map(|t| t.0.as_str()).collect(),
                    c.iter().map(|t| t.1).collect(),
                )
            })
            .collect();
        let rate = if report.used {
            40.0 * stats.tokens_per_round().unwrap_or(1.0) * 0.9
        } else {
            40.0
        };
        let reasoning = (self.model.contains("think") && req.thinking != Some(false))
            .then(|| REASONING.to_string());
        let response = GenerateResponse {
            content: tokens.iter().map(|t| t.0.as_str()).collect(),
            reasoning_content: reasoning.clone(),
            token_ids: Some(tokens.iter().map(|t| t.1).collect()),
            finish_reason: if calls.is_empty() {
                FinishReason::Length
            } else {
                FinishReason::ToolCalls
            },
            usage: Usage {
                input_tokens: req.prompt.len() as u64,
                output_tokens: n as u64,
                cached_input_tokens: req
                    .messages
                    .as_ref()
                    .map(|m| m.iter().map(|m| m.content.len() as u64).sum())
                    .unwrap_or(0),
            },
            metadata: Metadata {
                speculation: report,
                timings: Timings {
                    decode_tokens_per_s: Some(rate),
                    ..Default::default()
                },
            },
            partial: false,
            warnings: Vec::new(),
            tool_calls: calls.clone(),
            stop_sequence: None,
            prompt_logprobs: None,
            logprobs: None,
        };
        // each call in two pieces: id and name, then the arguments
        let calls = calls
            .iter()
            .enumerate()
            .flat_map(|(index, c)| {
                let args = c
                    .function
                    .arguments
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                [
                    ToolCallDelta {
                        index,
                        id: c.id.clone(),
                        name: Some(c.function.name.clone()),
                        arguments: String::new(),
                    },
                    ToolCallDelta {
                        index,
                        arguments: args,
                        ..Default::default()
                    },
                ]
            })
            .collect();
        Ok(Run {
            reasoning,
            chunks,
            calls,
            response,
        })
    }
}

#[async_trait::async_trait]
impl Provider for Fake {
    fn name(&self) -> &str {
        "fake"
    }
    fn model(&self) -> &str {
        &self.model
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            provider: "fake".into(),
            runtime: "fake-cpu".into(),
            streaming: true,
            prompt_cache: true,
            images: false,
            per_request_speculation: true,
        }
    }
    fn speculation_status(&self) -> SpeculationStatus {
        match &self.lane {
            Lane::Ready {
                drafter,
                default_depth,
                output_preserving,
                ..
            } => SpeculationStatus {
                lane_loaded: true,
                drafter: Some(drafter.clone()),
                num_draft_tokens: Some(
                    self.default
                        .as_ref()
                        .and_then(|s| s.num_draft_tokens)
                        .and_then(mtp_contract::DraftDepth::fixed)
                        .unwrap_or(*default_depth),
                ),
                default_mode: SpeculationMode::NativeMtp,
                reason: None,
                message: None,
                output_preserving: *output_preserving,
                auto_depth: false,
            },
            Lane::Unavailable { reason, message } => SpeculationStatus {
                lane_loaded: false,
                drafter: None,
                num_draft_tokens: None,
                default_mode: self
                    .default
                    .as_ref()
                    .and_then(|s| s.mode)
                    .unwrap_or(SpeculationMode::Off),
                reason: Some(*reason),
                message: Some(message.clone()),
                output_preserving: None,
                auto_depth: false,
            },
        }
    }
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        Ok(self.prepare(&request)?.response)
    }
    async fn generate_stream(
        &self,
        request: GenerateRequest,
    ) -> Result<EventStream, ProviderError> {
        let run = self.prepare(&request)?;
        let delay = if self.model.contains("slow") {
            Duration::from_millis(150)
        } else {
            Duration::ZERO
        };
        // reasoning first, in two pieces, as a thinking model streams it
        let mut pieces: Vec<(String, Vec<u32>, String)> = Vec::new();
        if let Some(r) = &run.reasoning {
            let (a, b) = r.split_at(r.len() / 2);
            pieces.push((String::new(), vec![900], a.to_string()));
            pieces.push((String::new(), vec![901], b.to_string()));
        }
        pieces.extend(
            run.chunks
                .into_iter()
                .map(|(t, ids)| (t, ids, String::new())),
        );
        let deltas = futures::stream::iter(pieces).then(move |(text, ids, reasoning)| async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok(StreamEvent::Delta {
                text,
                token_ids: ids,
                reasoning,
                logprobs: Vec::new(),
            })
        });
        let calls =
            futures::stream::iter(run.calls.into_iter().map(|c| Ok(StreamEvent::ToolCall(c))));
        let done =
            futures::stream::once(async move { Ok(StreamEvent::Done(Box::new(run.response))) });
        Ok(deltas.chain(calls).chain(done).boxed())
    }
    fn recommended_sampling(&self) -> Option<mtp::Sampling> {
        self.model.contains("sampler").then(recommended)
    }
    fn prompt_cache_clear(&self, key: Option<&str>) -> Result<(), ProviderError> {
        CLEARS.lock().unwrap().push(key.map(str::to_string));
        Ok(())
    }
    async fn unload(&self) -> Result<(), ProviderError> {
        Ok(())
    }
}

#[cfg(test)]
mod self_tests {
    use super::*;

    #[tokio::test]
    async fn speculating_streams_several_tokens_per_chunk_and_same_text() {
        register();
        let on =
            mtp::create_llm("fake", "m", ProviderOptions::default().speculation(true)).unwrap();
        let req = GenerateRequest::new("x").max_output_tokens(12);
        let mut s = on.generate_stream(req.clone()).await.unwrap();
        let first = s.next().await.unwrap().unwrap();
        match first {
            StreamEvent::Delta { token_ids, .. } => assert_eq!(token_ids.len(), 4),
            other => panic!("expected a delta, got {other:?}"),
        }
        let a = on.generate(req.clone()).await.unwrap();
        let b = on.generate(req.speculation(false)).await.unwrap();
        assert_eq!(a.content, b.content);
        assert_eq!(a.content, expected_text(12));
        assert!(a.metadata.speculation.used);
        assert_eq!(
            b.metadata.speculation.reason,
            Some(Reason::DisabledByRequest)
        );
    }

    #[tokio::test]
    async fn tools_are_called_when_forced_or_asked() {
        register();
        let llm = mtp::create_llm("fake", "m", ProviderOptions::default()).unwrap();
        let tool = |n: &str| serde_json::json!({"type": "function", "function": {"name": n}});
        let tools = vec![tool("a"), tool("b")];
        let names = |r: &GenerateRequest| -> Vec<String> {
            tool_calls_for(r)
                .into_iter()
                .map(|c| c.function.name)
                .collect()
        };
        let req = GenerateRequest::new("x").tools(tools.clone());
        assert!(names(&req).is_empty(), "auto, not asked: text");
        assert_eq!(names(&req.clone().tool_choice(ToolChoice::Required)), ["a"]);
        let b = req.clone().tool_choice(ToolChoice::Function("b".into()));
        assert_eq!(names(&b), ["b"]);
        assert!(names(&b.clone().tool_choice(ToolChoice::None)).is_empty());
        let every = GenerateRequest::new("use every tool").tools(tools.clone());
        assert_eq!(names(&every), ["a", "b"]);
        assert_eq!(names(&every.clone().parallel_tool_calls(false)), ["a"]);
        assert_eq!(names(&GenerateRequest::new("call b").tools(tools)), ["b"]);

        let mut s = llm.generate_stream(every).await.unwrap();
        let mut pieces = Vec::new();
        let mut done = None;
        while let Some(ev) = s.next().await {
            match ev.unwrap() {
                StreamEvent::Delta { text, .. } => assert!(text.is_empty()),
                StreamEvent::ToolCall(d) => pieces.push(d),
                StreamEvent::PromptProgress(_) => {}
                StreamEvent::Done(r) => done = Some(r),
            }
        }
        let r = done.unwrap();
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.usage.output_tokens, 2 * CALL_TOKENS as u64);
        assert_eq!(pieces.len(), 4);
        assert_eq!(pieces[3].arguments, "{\"i\": 1}");
    }
}
