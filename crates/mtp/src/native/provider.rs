//! `NativeProvider`: the contract's `Provider` over an in-process [`Backend`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use futures::StreamExt;
use mtp_contract::{
    plan, Capabilities, EventStream, FinishReason, GenerateRequest, GenerateResponse, Lane,
    Metadata, Plan, Provider, ProviderError, Speculation, SpeculationStatus, StreamEvent, Usage,
};
use tokio::sync::mpsc;

use super::backend::{Backend, Job};
use super::prefix_cache::{CacheState, PrefixCache};

/// A loaded model plus the prefix cache that every provider on these weights shares.
pub struct Loaded<B: Backend> {
    /// The model.
    pub backend: B,
    /// The shared native prefix cache.
    pub cache: Mutex<PrefixCache<B::State>>,
}

impl<B: Backend> Loaded<B> {
    /// Wraps a backend with an empty cache of the given budget.
    pub fn new(backend: B, cache_bytes: usize, checkpoints_per_key: usize) -> Self {
        Loaded {
            backend,
            cache: Mutex::new(PrefixCache::new(cache_bytes, checkpoints_per_key)),
        }
    }
}

/// The in-process provider. Speculation is switched per call on the same loaded weights.
pub struct NativeProvider<B: Backend> {
    name: String,
    model: String,
    loaded: RwLock<Option<Arc<Loaded<B>>>>,
    default: Option<Speculation>,
    lane: Lane,
    busy: Arc<AtomicBool>,
}

struct BusyGuard(Arc<AtomicBool>);
impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<B: Backend> NativeProvider<B> {
    /// A provider named `name` for `model` over loaded weights, with the provider default
    /// and the lane decided at construction.
    pub fn new(
        name: impl Into<String>,
        model: impl Into<String>,
        loaded: Arc<Loaded<B>>,
        default: Option<Speculation>,
        lane: Lane,
    ) -> Self {
        NativeProvider {
            name: name.into(),
            model: model.into(),
            loaded: RwLock::new(Some(loaded)),
            default,
            lane,
            busy: Arc::new(AtomicBool::new(false)),
        }
    }

    fn loaded(&self) -> Result<Arc<Loaded<B>>, ProviderError> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ProviderError::Unloaded {
                model: self.model.clone(),
            })
    }

    fn runtime(&self) -> String {
        self.loaded()
            .map(|l| l.backend.runtime())
            .unwrap_or_else(|_| "unloaded".into())
    }
}

/// Incremental detokenization: emits only complete UTF-8 text, never text past a stop
/// sequence, and holds back a suffix that may be the start of one.
#[derive(Default)]
struct TextStream {
    emitted: usize,
    stop_at: Option<usize>,
}

impl TextStream {
    /// Given the full text so far, returns the new text that is safe to emit.
    fn push(&mut self, full: &str, stops: &[String]) -> String {
        let mut end = full.trim_end_matches('\u{FFFD}').len();
        if let Some(pos) = stops.iter().filter_map(|s| full.find(s.as_str())).min() {
            self.stop_at = Some(pos);
            end = end.min(pos);
        } else {
            // Hold back the longest suffix that is a proper prefix of a stop sequence.
            let hold = stops
                .iter()
                .flat_map(|s| {
                    (1..s.len())
                        .filter(move |&n| s.is_char_boundary(n))
                        .map(move |n| &s[..n])
                })
                .filter(|p| full[..end].ends_with(p))
                .map(str::len)
                .max()
                .unwrap_or(0);
            end -= hold;
        }
        while end > 0 && !full.is_char_boundary(end) {
            end -= 1;
        }
        if end <= self.emitted || !full.is_char_boundary(self.emitted) {
            return String::new();
        }
        let out = full[self.emitted..end].to_string();
        self.emitted = end;
        out
    }
}

#[async_trait::async_trait]
impl<B: Backend> Provider for NativeProvider<B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            provider: self.name.clone(),
            runtime: self.runtime(),
            streaming: true,
            prompt_cache: true,
            images: false,
            per_request_speculation: true,
        }
    }

    fn speculation_status(&self) -> SpeculationStatus {
        let default_mode = mtp_contract::resolve(self.default.as_ref(), None).mode;
        match &self.lane {
            Lane::Ready {
                drafter,
                default_depth,
                output_preserving,
            } => SpeculationStatus {
                lane_loaded: true,
                drafter: Some(drafter.clone()),
                num_draft_tokens: Some(
                    self.default
                        .as_ref()
                        .and_then(|d| d.num_draft_tokens)
                        .unwrap_or(*default_depth),
                ),
                default_mode,
                reason: None,
                message: None,
                output_preserving: *output_preserving,
            },
            Lane::Unavailable { reason, message } => SpeculationStatus {
                lane_loaded: false,
                drafter: self.default.as_ref().and_then(|d| d.drafter.clone()),
                num_draft_tokens: None,
                default_mode,
                reason: Some(*reason),
                message: Some(message.clone()),
                output_preserving: None,
            },
        }
    }

    async fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, ProviderError> {
        let mut stream = self.generate_stream(request).await?;
        while let Some(ev) = stream.next().await {
            if let StreamEvent::Done(resp) = ev? {
                return Ok(*resp);
            }
        }
        Err(ProviderError::Api {
            provider: self.name.clone(),
            model: self.model.clone(),
            status: None,
            message: "generation ended without a final response".into(),
        })
    }

    async fn generate_stream(
        &self,
        request: GenerateRequest,
    ) -> Result<EventStream, ProviderError> {
        request.validate()?;
        if request.has_images() {
            return Err(ProviderError::Unsupported {
                provider: self.name.clone(),
                what: "image input (the vision tower is not loaded by this runtime)".into(),
            });
        }
        let loaded = self.loaded()?;
        let plan = plan(
            self.default.as_ref(),
            request.speculation.as_ref(),
            &request.sampling,
            &self.lane,
        )?;
        if self
            .busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(ProviderError::Busy {
                model: self.model.clone(),
            });
        }
        let guard = BusyGuard(Arc::clone(&self.busy));
        let started = Instant::now();
        let prompt = loaded.backend.render(&request)?;
        let runtime = loaded.backend.runtime();
        let (tx, rx) = mpsc::channel::<Result<StreamEvent, ProviderError>>(64);
        let provider = self.name.clone();
        let model = self.model.clone();
        tokio::task::spawn_blocking(move || {
            let result = run_job(&loaded, &request, &prompt, &plan, &runtime, started, &tx);
            // Release the provider and this job's hold on the weights before the caller sees
            // the final event, so that its next call is never refused as busy and an
            // `unload` right after the call really frees the weights.
            drop(loaded);
            drop(guard);
            let ev = match result {
                Ok(resp) => Ok(StreamEvent::Done(Box::new(resp))),
                Err(ProviderError::Cancelled) => return,
                Err(e) => Err(match e {
                    ProviderError::Api {
                        message, status, ..
                    } => ProviderError::Api {
                        provider,
                        model,
                        status,
                        message,
                    },
                    other => other,
                }),
            };
            let _ = tx.blocking_send(ev);
        });
        Ok(tokio_stream_from(rx))
    }

    fn prompt_cache_clear(&self, key: Option<&str>) -> Result<(), ProviderError> {
        let loaded = self.loaded()?;
        let mut cache = loaded.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = key {
            tracing::warn!(
                key = k,
                "prompt_cache_clear(key) clears the whole shared native prefix cache, not only this key"
            );
        }
        cache.clear();
        Ok(())
    }

    async fn unload(&self) -> Result<(), ProviderError> {
        let mut slot = self.loaded.write().unwrap_or_else(|p| p.into_inner());
        *slot = None;
        Ok(())
    }
}

fn tokio_stream_from(mut rx: mpsc::Receiver<Result<StreamEvent, ProviderError>>) -> EventStream {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

fn run_job<B: Backend>(
    loaded: &Loaded<B>,
    request: &GenerateRequest,
    prompt: &[u32],
    plan: &Plan,
    runtime: &str,
    started: Instant,
    tx: &mpsc::Sender<Result<StreamEvent, ProviderError>>,
) -> Result<GenerateResponse, ProviderError> {
    let backend = &loaded.backend;
    let key = request.prompt_cache_key.as_deref();
    let resume = key.and_then(|k| {
        let mut c = loaded.cache.lock().unwrap_or_else(|p| p.into_inner());
        c.lookup(k, prompt).map(|h| (h.tokens, h.state))
    });
    let depth = match plan {
        Plan::Speculate { depth, .. } => Some(*depth),
        Plan::TargetOnly { .. } => None,
    };
    let max_tokens = request.max_output_tokens.unwrap_or(512) as usize;
    let mut generated: Vec<u32> = Vec::new();
    let mut text = TextStream::default();
    let mut first_token_at: Option<Instant> = None;
    let mut cancelled = false;
    let mut failure: Option<ProviderError> = None;
    let mut on_tokens = |toks: &[u32]| -> bool {
        first_token_at.get_or_insert_with(Instant::now);
        generated.extend_from_slice(toks);
        let full = match backend.detokenize(&generated) {
            Ok(t) => t,
            Err(e) => {
                failure = Some(e);
                return false;
            }
        };
        let delta = text.push(&full, &request.stop);
        let ev = StreamEvent::Delta {
            text: delta,
            token_ids: toks.to_vec(),
        };
        if tx.blocking_send(Ok(ev)).is_err() {
            cancelled = true;
            return false;
        }
        text.stop_at.is_none()
    };
    let out = backend.run(Job {
        prompt,
        resume,
        depth,
        sampling: &request.sampling,
        max_tokens,
        checkpoint: key.is_some(),
        on_tokens: &mut on_tokens,
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if cancelled {
        return Err(ProviderError::Cancelled);
    }
    if let Some(k) = key {
        let mut all = prompt.to_vec();
        all.extend_from_slice(&out.tokens);
        let mut c = loaded.cache.lock().unwrap_or_else(|p| p.into_inner());
        for state in [out.prompt_state, out.final_state].into_iter().flatten() {
            let n = state.tokens().min(all.len());
            c.insert(k, all[..n].to_vec(), state);
        }
    }
    let mut content = backend.detokenize(&out.tokens)?;
    let mut finish = out.finish;
    if let Some(pos) = request
        .stop
        .iter()
        .filter_map(|s| content.find(s.as_str()))
        .min()
    {
        content.truncate(pos);
        finish = FinishReason::Stop;
    }
    let speculation = plan.report(runtime, &out.stats);
    let mut timings = out.timings;
    if let Some(t) = first_token_at {
        timings.time_to_first_token_ms = Some(t.duration_since(started).as_secs_f64() * 1e3);
    }
    Ok(GenerateResponse {
        content,
        token_ids: Some(out.tokens.clone()),
        finish_reason: finish,
        usage: Usage {
            input_tokens: prompt.len() as u64,
            output_tokens: out.tokens.len() as u64,
            cached_input_tokens: prompt.len().saturating_sub(out.computed_prompt_tokens) as u64,
        },
        metadata: Metadata {
            speculation,
            timings,
        },
        partial: false,
    })
}
