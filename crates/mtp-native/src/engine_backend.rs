//! [`Backend`] over the candle engine (`mtp-engine`).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use std::collections::VecDeque;
use std::sync::Mutex;

use mtp_contract::{GenerateRequest, ProviderError, TokenLogprob, TokenizerInfo, Vocabulary};
use mtp_engine::{Engine, GenerateOptions, LogprobSink, TextTokenizer};

use super::backend::{Backend, DrafterLane, Job, RenderedPrompt, RunOutput, TextDecoder};
use super::prefix_cache::CacheState;

/// The candle engine with the name of the drafter it loaded.
pub struct EngineBackend {
    engine: Arc<Engine>,
    /// The continuous-batching thread, started by the first batched job (its `max_batch` is
    /// that job's provider's).
    scheduler: OnceLock<mtp_engine::scheduler::Scheduler>,
    drafter: Option<DrafterLane>,
    runtime: String,
    weight_bytes: usize,
    /// Prompt tokens a batch step computes for each joining prompt.
    prefill_chunk: usize,
    /// Special-token strings in client text become special tokens (`parse_special`); by
    /// default they are read as plain text.
    parse_special: bool,
}

/// The engine's vocabulary as the contract's [`Vocabulary`].
struct EngineVocab(Arc<Engine>);

impl EngineVocab {
    fn tok(&self) -> Result<&TextTokenizer, ProviderError> {
        self.0
            .tokenizer()
            .ok_or_else(|| ProviderError::Unsupported {
                provider: mtp_contract::ProviderKind::Native.name().into(),
                what: "tokenizing without the checkpoint's tokenizer.json".into(),
            })
    }

    /// The engine's log probability with its token texts.
    fn logprob(&self, lp: &mtp_engine::TokenLogprob) -> TokenLogprob {
        let (token, bytes) = self.token_text(lp.id);
        TokenLogprob {
            id: lp.id,
            token,
            bytes,
            logprob: Some(lp.logprob),
            top: lp
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let (token, bytes) = self.token_text(id);
                    mtp_contract::TopLogprob {
                        id,
                        token,
                        bytes,
                        logprob,
                    }
                })
                .collect(),
        }
    }
}

impl Vocabulary for EngineVocab {
    fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, ProviderError> {
        self.tok()?
            .encode_with(text, add_special, parse_special)
            .map_err(api)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, ProviderError> {
        let tok = self.tok()?;
        let n = tok.vocab_size();
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= n) {
            return Err(ProviderError::InvalidRequest {
                field: "tokens",
                message: format!("token id {bad} is outside the vocabulary ({n} ids)"),
            });
        }
        tok.decode_all(ids).map_err(api)
    }

    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.tok().ok()?.token_bytes(id).map(<[u8]>::to_vec)
    }

    fn info(&self) -> TokenizerInfo {
        let Ok(tok) = self.tok() else {
            return TokenizerInfo::default();
        };
        let templates = tok.templates().ok();
        // a special token is a string, or an added-token object with its `content`
        let special = |k: &str| {
            let v = templates?.special_tokens().get(k)?;
            v.as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))
                .map(str::to_string)
        };
        TokenizerInfo {
            tokenizer_class: None,
            eos_token: special("eos_token").or_else(|| tok.eos_token().map(str::to_string)),
            bos_token: special("bos_token"),
            pad_token: special("pad_token"),
            chat_template: templates
                .and_then(|t| t.select(false))
                .map(|t| t.source().to_string()),
            vocab_size: tok.vocab_size(),
            model_max_length: self.0.model().config().text.max_position_embeddings,
        }
    }
}

/// Log probabilities on their way from the engine's sink to the job's callback: the sink
/// queues each chunk's just before the chunk's tokens reach the callback (same thread solo;
/// before the scheduler sends the chunk, batched), which takes as many as it has tokens.
#[derive(Clone, Default)]
struct LogprobQueue(Arc<Mutex<VecDeque<mtp_engine::TokenLogprob>>>);

impl LogprobQueue {
    fn sink(&self) -> LogprobSink {
        let q = Arc::clone(&self.0);
        LogprobSink::new(move |lps| {
            q.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(lps.iter().cloned())
        })
    }

    fn take(&self, n: usize) -> Vec<mtp_engine::TokenLogprob> {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = n.min(q.len());
        q.drain(..n).collect()
    }
}

/// Decoding state snapshots of the candle engine (for the prefix cache; shared with the
/// scheduler thread when a batched call resumes one).
pub struct EngineState(Arc<mtp_engine::PromptState>);

impl EngineState {
    fn new(s: mtp_engine::PromptState) -> Arc<Self> {
        Arc::new(EngineState(Arc::new(s)))
    }
}

impl CacheState for EngineState {
    fn bytes(&self) -> usize {
        self.0.bytes()
    }
    fn tokens(&self) -> usize {
        self.0.tokens()
    }
    fn to_bytes(&self) -> Option<Vec<u8>> {
        Some(self.0.to_bytes())
    }
}

fn api(e: mtp_engine::Error) -> ProviderError {
    match e {
        // a constraint that does not compile is the request's fault, named by its field
        mtp_engine::Error::Constraint { .. } => {
            return ProviderError::InvalidRequest {
                field: "response_format",
                message: e.to_string(),
            }
        }
        mtp_engine::Error::Unsupported(what) => {
            return ProviderError::Unsupported {
                provider: mtp_contract::ProviderKind::Native.name().into(),
                what,
            }
        }
        mtp_engine::Error::Cancelled => return ProviderError::Cancelled,
        // what the engine refuses in a request is the request's fault
        mtp_engine::Error::InvalidRequest(message) => {
            return ProviderError::InvalidRequest {
                field: "request",
                message,
            }
        }
        _ => {}
    }
    ProviderError::Api {
        provider: mtp_contract::ProviderKind::Native.name().into(),
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
            engine: Arc::new(engine),
            scheduler: OnceLock::new(),
            drafter,
            runtime,
            weight_bytes,
            prefill_chunk: mtp_engine::batch::DEFAULT_PREFILL_CHUNK,
            parse_special: false,
        }
    }

    /// Parses special tokens written in client text (`parse_special`): a message holding
    /// `<|im_end|>` then gets the special token, as the template's markup does. Off by default,
    /// when client text is read as plain text and only the template's markup is special
    /// (`TextTokenizer::render_guarded`). Raw prompts are parsed either way.
    pub fn with_parse_special(mut self, on: bool) -> Self {
        self.parse_special = on;
        self
    }

    /// Sets the prompt tokens a batch step computes for each joining prompt (chunked prefill,
    /// so a long prompt does not stall the sequences decoding).
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
    }
}

struct Decoder<'a>(mtp_engine::TokenDecoder<'a>);

impl TextDecoder for Decoder<'_> {
    fn step(&mut self, id: u32) -> Result<Option<String>, ProviderError> {
        self.0.step(id).map_err(api)
    }
    fn finish(&mut self) -> Result<String, ProviderError> {
        self.0.finish().map_err(api)
    }
}

impl EngineBackend {
    fn tokenizer(&self) -> Result<&TextTokenizer, ProviderError> {
        self.engine
            .tokenizer()
            .ok_or_else(|| ProviderError::ModelLoad {
                model: self.engine.dir().display().to_string(),
                message: "the checkpoint has no tokenizer.json, so text cannot be encoded or \
                          decoded"
                    .into(),
            })
    }
}

/// An image that cannot be read or decoded: the request's fault, named by its field.
fn image_error(e: mtp_engine::Error) -> ProviderError {
    match e {
        mtp_engine::Error::Unsupported(_) => api(e),
        other => ProviderError::InvalidRequest {
            field: "images",
            message: other.to_string(),
        },
    }
}

/// Bytes of the safetensors files of a checkpoint (what loading maps into memory).
/// The engine's options for a job: its budget, sampling and depth, and its images encoded by
/// the vision tower.
fn engine_options(
    engine: &Engine,
    job: &Job<'_, EngineState>,
) -> Result<GenerateOptions, ProviderError> {
    let mut opts = GenerateOptions::greedy(job.max_tokens).sampling(job.sampling.clone());
    opts.response_format = job.response_format.cloned();
    opts.constraint = job.constraint.clone();
    if !job.images.is_empty() {
        let encoded = job
            .images
            .iter()
            .map(|i| engine.encode_image(&i.bytes, &i.name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(image_error)?;
        opts.images = Some(engine.place_images(job.prompt, &encoded).map_err(api)?);
    }
    Ok(match job.depth {
        Some(d) if job.auto_depth => opts.auto_depth(d as usize),
        Some(d) => opts.num_draft_tokens(d as usize),
        None => opts,
    })
}

/// A job's options with its prefix-cache part: the state it resumes from and the states it
/// keeps.
fn job_options(
    engine: &mtp_engine::Engine,
    job: &Job<'_, EngineState>,
) -> Result<mtp_engine::GenerateOptions, ProviderError> {
    let mut opts = engine_options(engine, job)?.checkpoint(job.checkpoint);
    opts.checkpoint_at = job.checkpoint_at;
    opts.on_prompt_progress = job.on_prompt_progress.clone();
    opts.cancel = Some(job.cancel.clone());
    opts.logprobs = job.logprobs.map(|n| n as usize);
    if let Some((_, s)) = &job.resume {
        opts = opts.resume_from(Arc::clone(&s.0));
    }
    Ok(opts)
}

/// The draft statistics of a generation that speculated (empty otherwise).
fn draft_stats(out: &mtp_engine::GenerationOutput) -> mtp_contract::DraftStats {
    out.speculation
        .as_ref()
        .filter(|s| s.used)
        .map(|s| s.stats.clone())
        .unwrap_or_default()
}

/// A finished generation as the provider takes it, solo or batched.
fn run_output(out: mtp_engine::GenerationOutput) -> RunOutput<EngineState> {
    let stats = draft_stats(&out);
    let states = out.states;
    RunOutput {
        tokens: out.tokens,
        finish: out.finish_reason,
        stats,
        timings: out.timings,
        computed_prompt_tokens: out.computed_prompt_tokens,
        prompt_state: states.after_prompt.map(EngineState::new),
        final_state: states.after_reply.map(EngineState::new),
        history_state: states.after_history.map(EngineState::new),
    }
}

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

    fn render(&self, request: &GenerateRequest) -> Result<RenderedPrompt, ProviderError> {
        // a prompt of token ids is the model's input as sent
        if let Some(ids) = &request.prompt_token_ids {
            return Ok(RenderedPrompt {
                ids: ids.clone(),
                reasoning: None,
                history_len: None,
                images: Vec::new(),
                cache_ids: None,
            });
        }
        let model = self.engine.dir().display().to_string();
        let tok = self.tokenizer()?;
        // Special-token strings in the client's text are read as plain text unless
        // `parse_special`; a raw prompt (`/v1/completions`) is the client's own markup, and its
        // special tokens are parsed. The history (where a later turn of the same conversation
        // can resume) is only worth a second render and encode when the caller keeps a prefix
        // cache.
        let guarded = tok
            .render_guarded(
                request,
                self.parse_special,
                request.prompt_cache_key.is_some(),
            )
            .map_err(|e| e.into_provider_error(&model))?;
        request.cancel.check()?;
        let mut ids = tok
            .encode_guarded(&guarded.prompt.text, &guarded.literals)
            .map_err(api)?;
        if ids.is_empty() {
            return Err(ProviderError::InvalidRequest {
                field: "prompt",
                message: "the rendered prompt has no tokens".into(),
            });
        }
        let sources = request.all_images();
        let mut images = Vec::with_capacity(sources.len());
        let mut counts = Vec::with_capacity(sources.len());
        let mut pad = None;
        if !sources.is_empty() {
            let p = self.engine.image_token_id().ok_or_else(|| {
                api(self
                    .engine
                    .check_images(sources.len())
                    .err()
                    .unwrap_or_else(|| mtp_engine::Error::Unsupported("image input".into())))
            })?;
            pad = Some(p);
            for (i, s) in sources.iter().enumerate() {
                // decoding a picture takes time in its size: a cancelled request stops here
                request.cancel.check()?;
                let img = mtp_engine::vision::read_image(s, i).map_err(image_error)?;
                counts.push(self.engine.image_token_count(&img).map_err(image_error)?);
                images.push(img);
            }
            ids = mtp_engine::vision::expand_image_tokens(&ids, p, &counts).map_err(|e| {
                ProviderError::InvalidRequest {
                    field: "messages",
                    message: format!("{e} (does the chat template show images?)"),
                }
            })?;
        }
        // The history's ids hold its images' runs of tokens too (its images are the first),
        // and are tokenized as the prompt is, literals included, so that they line up.
        let expand = |h: Vec<u32>| -> Option<Vec<u32>> {
            let Some(p) = pad else { return Some(h) };
            let n = h.iter().filter(|&&t| t == p).count();
            mtp_engine::vision::expand_image_tokens(&h, p, counts.get(..n)?).ok()
        };
        let history_len = guarded
            .history_len
            .and_then(|n| {
                tok.encode_guarded(&guarded.prompt.text[..n], guarded.literals_before(n))
                    .ok()
            })
            .and_then(expand)
            .filter(|h| !h.is_empty() && h.len() < ids.len() && ids.starts_with(h))
            .map(|h| h.len());
        // (only worth hashing the pictures when the caller keeps a prefix cache)
        let cache_ids = pad.filter(|_| request.prompt_cache_key.is_some()).map(|p| {
            let digests: Vec<[u8; 32]> = images
                .iter()
                .map(|i| mtp_engine::vision::prompt::image_digest(&i.bytes))
                .collect();
            let mut key = ids.clone();
            let mut k = 0;
            let mut i = 0;
            while i < key.len() {
                if key[i] == p && k < digests.len() {
                    for (j, t) in key.iter_mut().skip(i).take(counts[k]).enumerate() {
                        let w = (j % 8) * 4;
                        let d = &digests[k][w..w + 4];
                        *t = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
                    }
                    i += counts[k];
                    k += 1;
                } else {
                    i += 1;
                }
            }
            key
        });
        Ok(RenderedPrompt {
            ids,
            reasoning: guarded.prompt.reasoning,
            history_len,
            images,
            cache_ids,
        })
    }

    fn compile_constraint(
        &self,
        format: &mtp_contract::ResponseFormat,
    ) -> Result<Option<mtp_engine::constraint::Constraint>, ProviderError> {
        let opts = GenerateOptions::default().response_format(format.clone());
        self.engine.constraint(&opts).map_err(api)
    }

    fn accepts_images(&self) -> Result<(), String> {
        match self.engine.images_refused() {
            Some(m) => Err(m.to_string()),
            None => Ok(()),
        }
    }

    fn decoder(&self) -> Result<Box<dyn TextDecoder + '_>, ProviderError> {
        Ok(Box::new(Decoder(self.tokenizer()?.decoder())))
    }

    fn run(&self, job: Job<'_, EngineState>) -> Result<RunOutput<EngineState>, ProviderError> {
        let mut opts = job_options(&self.engine, &job)?;
        let queue = LogprobQueue::default();
        if opts.logprobs.is_some() {
            opts.on_logprobs = Some(queue.sink());
        }
        let vocab = EngineVocab(Arc::clone(&self.engine));
        let on = job.on_tokens;
        let out = self
            .engine
            .generate(job.prompt, &opts, |t| {
                let lps = queue
                    .take(t.len())
                    .iter()
                    .map(|l| vocab.logprob(l))
                    .collect();
                on(t, lps)
            })
            .map_err(api)?;
        Ok(run_output(out))
    }

    fn run_batched(
        &self,
        max_batch: usize,
        job: Job<'_, EngineState>,
    ) -> Result<RunOutput<EngineState>, ProviderError> {
        use mtp_engine::scheduler::{BatchEvent, Scheduler, SchedulerConfig};
        let mut opts = job_options(&self.engine, &job)?;
        let queue = LogprobQueue::default();
        if opts.logprobs.is_some() {
            opts.on_logprobs = Some(queue.sink());
        }
        let vocab = EngineVocab(Arc::clone(&self.engine));
        let scheduler = self.scheduler.get_or_init(|| {
            let config = SchedulerConfig::new(max_batch).prefill_chunk(self.prefill_chunk);
            Scheduler::spawn(Arc::clone(&self.engine), config)
        });
        // paced: the sequence waits for each chunk's answer, so a stop (a stop string, or the
        // client gone) ends it where a solo call ends, with its report and checkpoints
        let request = scheduler
            .submit_paced(job.prompt.to_vec(), opts)
            .map_err(api)?;
        let out = loop {
            match request.recv() {
                Ok(BatchEvent::Tokens(t)) => {
                    let lps = queue
                        .take(t.len())
                        .iter()
                        .map(|l| vocab.logprob(l))
                        .collect();
                    request.answer((job.on_tokens)(&t, lps))
                }
                Ok(BatchEvent::Done(out)) => break (*out).map_err(api)?,
                Err(_) => {
                    return Err(api(mtp_engine::Error::Batch(
                        "the scheduler thread stopped".into(),
                    )))
                }
            }
        };
        Ok(run_output(out))
    }

    fn state_from_bytes(&self, bytes: &[u8]) -> Result<EngineState, String> {
        self.engine
            .state_from_bytes(bytes)
            .map(|s| EngineState(Arc::new(s)))
            .map_err(|e| e.to_string())
    }

    fn state_identity(&self) -> Result<Option<String>, String> {
        self.engine
            .state_identity()
            .map(|id| Some(id.to_string()))
            .map_err(|e| e.to_string())
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn context_length(&self) -> Option<usize> {
        self.engine.model().config().text.max_position_embeddings
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.engine.model().vocab_size())
    }

    fn vocabulary(&self) -> Option<Arc<dyn Vocabulary>> {
        self.engine.tokenizer()?;
        Some(Arc::new(EngineVocab(Arc::clone(&self.engine))))
    }

    fn prompt_logprobs(
        &self,
        prompt: &[u32],
        top: u32,
        images: &[mtp_engine::vision::ImageInput],
        cancel: &mtp_contract::Cancel,
    ) -> Result<Vec<TokenLogprob>, ProviderError> {
        let mut opts = GenerateOptions {
            cancel: Some(cancel.clone()),
            ..GenerateOptions::default()
        };
        if !images.is_empty() {
            let encoded = images
                .iter()
                .map(|i| self.engine.encode_image(&i.bytes, &i.name))
                .collect::<Result<Vec<_>, _>>()
                .map_err(image_error)?;
            opts.images = Some(self.engine.place_images(prompt, &encoded).map_err(api)?);
        }
        let lps = self
            .engine
            .prompt_logprobs(prompt, top as usize, &opts)
            .map_err(api)?;
        let vocab = EngineVocab(Arc::clone(&self.engine));
        Ok(prompt
            .iter()
            .zip(lps)
            .map(|(&id, lp)| match lp {
                Some(lp) => vocab.logprob(&lp),
                None => TokenLogprob::unscored(id, vocab.token_text(id)),
            })
            .collect())
    }

    fn max_depth(&self) -> Option<u32> {
        Some(mtp_engine::MAX_VERIFY_DEPTH as u32)
    }

    fn tool_calls(
        &self,
        request: &GenerateRequest,
        reasoning: Option<&mtp_chat::ReasoningStart>,
    ) -> Result<mtp_chat::ToolDecoding, ProviderError> {
        let model = self.engine.dir().display().to_string();
        mtp_chat::tool_decoding(self.tokenizer()?.templates(), request, reasoning, &model)
    }

    fn recommended_sampling(&self) -> Option<mtp_contract::Sampling> {
        // transformers' rule: `do_sample` decides; without it generation is greedy, whatever
        // temperature the file also names
        let g = self.engine.generation_config();
        let any = g.temperature.is_some() || g.top_p.is_some() || g.top_k.is_some();
        match g.do_sample {
            Some(true) => {}
            Some(false) => return Some(mtp_contract::Sampling::greedy()),
            None if any => return Some(mtp_contract::Sampling::greedy()),
            None => return None,
        }
        Some(mtp_contract::Sampling {
            // transformers' defaults where a sampling config leaves one out
            temperature: Some(g.temperature.unwrap_or(1.0)),
            top_p: g.top_p,
            top_k: g.top_k,
            min_p: g.min_p,
            ..Default::default()
        })
    }
}
