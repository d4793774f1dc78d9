//! The blocking generation loops on llama.cpp (through `llama-cpp-2`): target-only, and MTP
//! speculation with `MtpSpeculative` in the order llama.cpp's own `speculative-simple` example
//! uses (prefill all but the last prompt token → `process` → `begin`; per round `draft` → clear
//! the draft cache from `n_past` → decode `[last, drafts…]` with logits on every row →
//! `process` → sample/compare → `accept` → clear both caches from the new `n_past`).
//!
//! A constrained reply (`response_format`) is drawn under the workspace's one grammar
//! ([`mtp_grammar::Constraint`], over the GGUF's vocabulary): each sampled row is masked with
//! the grammar state after the tokens before it, so the verify rows see exactly what single
//! steps would, and greedy output is the same with and without MTP. llama.cpp's drafts are
//! not drawn under the grammar, so they are cut at the first token it refuses (those rows
//! could never be accepted; the masks computed on the way are kept for the verify rows). The
//! reply ends when the grammar is complete, as on the native lane.

use std::num::NonZeroU32;
use std::time::Instant;

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams, LlamaContextType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::speculative::{MtpSpeculative, MtpSpeculativeParams};
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;
use mtp_chat::toolcall::ToolCallFormat;
use mtp_chat::{ReasoningStart, ReplyText, Split};
use mtp_contract::{DraftStats, FinishReason, GenerateRequest, KvType, Sampling, ToolCall};
use mtp_grammar::Constraint;

/// What one call asks of the loop.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The prompt, tokenized.
    pub tokens: Vec<LlamaToken>,
    /// Generation bound.
    pub max_new: usize,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// How to split reasoning from the reply (chat prompts of thinking templates).
    pub reasoning: Option<ReasoningStart>,
    /// The tool-call markup the reply is read in (the chat template's), when tools are offered.
    pub tool_format: Option<ToolCallFormat>,
    /// The request's tools, `tool_choice` and `parallel_tool_calls` (the rest left default),
    /// for [`ReplyText::with_tool_calls`].
    pub tool_request: GenerateRequest,
    /// Sampling controls.
    pub sampling: Sampling,
    /// `Some(depth)` to speculate.
    pub depth: Option<u32>,
    /// Context size.
    pub n_ctx: u32,
    /// CPU threads.
    pub threads: i32,
    /// The KV cache's type (llama.cpp's default when not given).
    pub cache_type: Option<KvType>,
    /// The request's cancellation: checked before the prompt's decode and after every step.
    pub cancel: mtp_contract::Cancel,
}

/// What the loop produced.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome {
    pub text: String,
    pub reasoning: Option<String>,
    pub ids: Vec<u32>,
    pub finish: Option<FinishReason>,
    pub stats: DraftStats,
    pub prefill_ms: f64,
    pub first_token_ms: f64,
    pub decode_ms: f64,
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub rollback_ms: f64,
    /// Milliseconds spent computing grammar masks (constrained replies).
    pub constraint_ms: Option<f64>,
    /// The tool calls read from the reply.
    pub tool_calls: Vec<ToolCall>,
    /// What reading them noticed.
    pub tool_warnings: Vec<String>,
}

/// Receives text and tool-call pieces as they are accepted; returns false to cancel.
pub(crate) trait Sink {
    fn delta(&mut self, text: Split, ids: &[u32]) -> bool;
    /// How far the prompt is: when its decode starts and when it is done (llama.cpp decodes
    /// it in one batch, so there is nothing between).
    fn prompt(&mut self, progress: mtp_contract::PromptProgress) {
        let _ = progress;
    }
}

/// The prompt's progress: `processed` of `job`'s tokens in, `started` milliseconds ago.
fn prompt_progress(job: &Job, processed: usize, started: Instant) -> mtp_contract::PromptProgress {
    mtp_contract::PromptProgress {
        total: job.tokens.len(),
        cache: 0,
        processed,
        time_ms: started.elapsed().as_millis() as u64,
    }
}

/// Turns accepted tokens into text: complete UTF-8 only (a character split across tokens comes
/// out whole), cut at stop strings and split into reasoning and answer by the shared
/// [`ReplyText`] (which holds back what could still start a stop string or a tag).
struct Text<'a> {
    model: &'a LlamaModel,
    bytes: Vec<u8>,
    reply: ReplyText,
    pending: Split,
    ids: Vec<u32>,
    pending_ids: Vec<u32>,
    max_new: usize,
    /// The token limit ended the reply.
    cut: bool,
}

enum Step {
    Go,
    Stop(FinishReason),
}

impl<'a> Text<'a> {
    fn new(model: &'a LlamaModel, job: &Job) -> Self {
        Text {
            model,
            bytes: Vec::new(),
            reply: ReplyText::new(job.stop.clone(), job.reasoning.clone())
                .with_tool_calls(job.tool_format, &job.tool_request),
            pending: Split::default(),
            ids: Vec::new(),
            pending_ids: Vec::new(),
            max_new: job.max_new,
            cut: false,
        }
    }

    fn add(&mut self, s: Split) {
        self.pending.content.push_str(&s.content);
        self.pending.reasoning.push_str(&s.reasoning);
        self.pending.tool_calls.extend(s.tool_calls);
    }

    /// Adds one accepted token. Returns whether generation ends with it.
    fn push(&mut self, tok: LlamaToken) -> Step {
        let vocab = self.model.vocab();
        if vocab.is_eog(tok) {
            return Step::Stop(FinishReason::Stop);
        }
        let id = u32::try_from(tok.0).unwrap_or(0);
        self.ids.push(id);
        self.pending_ids.push(id);
        self.bytes
            .extend_from_slice(&vocab.token_to_piece(tok, false, None));
        let piece = match std::str::from_utf8(&self.bytes) {
            Ok(s) => {
                let s = s.to_string();
                self.bytes.clear();
                s
            }
            Err(e) => {
                let good = e.valid_up_to();
                if e.error_len().is_some() {
                    // Invalid bytes: pass them on as replacement characters.
                    let s = String::from_utf8_lossy(&self.bytes).into_owned();
                    self.bytes.clear();
                    s
                } else {
                    // An incomplete character at the end waits for the next token.
                    let rest = self.bytes.split_off(good);
                    let s = String::from_utf8_lossy(&self.bytes).into_owned();
                    self.bytes = rest;
                    s
                }
            }
        };
        let split = self.reply.push(&piece);
        self.add(split);
        if self.reply.stopped() {
            return Step::Stop(FinishReason::Stop);
        }
        if self.ids.len() >= self.max_new {
            return Step::Stop(FinishReason::Length);
        }
        Step::Go
    }

    /// Ends the call: the held-back text goes out (unless cancelled) and the outcome gets the
    /// text and ids.
    fn finish(mut self, mut out: Outcome, sink: &mut dyn Sink) -> Outcome {
        if out.finish != Some(FinishReason::Cancelled) {
            self.cut = out.finish == Some(FinishReason::Length);
            self.flush(sink, true);
        }
        out.text = self.reply.content().to_string();
        out.reasoning = self.reply.reasoning().map(str::to_string);
        out.tool_calls = self.reply.tool_calls().to_vec();
        out.tool_warnings = self.reply.tool_call_warnings().to_vec();
        out.ids = self.ids;
        out
    }

    /// Sends the text that can be shown now (everything when `all`).
    fn flush(&mut self, sink: &mut dyn Sink, all: bool) -> bool {
        if all {
            let tail = String::from_utf8_lossy(&std::mem::take(&mut self.bytes)).into_owned();
            let a = self.reply.push(&tail);
            self.add(a);
            // a tool call the token limit cut is incomplete (see `ReplyText::finish_cut`)
            let b = if self.cut {
                self.reply.finish_cut()
            } else {
                self.reply.finish()
            };
            self.add(b);
        }
        let has_text = !self.pending.content.is_empty()
            || !self.pending.reasoning.is_empty()
            || !self.pending.tool_calls.is_empty();
        if has_text || (all && !self.pending_ids.is_empty()) {
            let split = std::mem::take(&mut self.pending);
            let ids = std::mem::take(&mut self.pending_ids);
            return sink.delta(split, &ids);
        }
        true
    }
}

fn sampler(model: &LlamaModel, s: &Sampling) -> LlamaSampler {
    let mut chain = Vec::new();
    let n_vocab = model.n_vocab();
    if !s.target_only_controls().is_empty() {
        chain.push(LlamaSampler::penalties(
            n_vocab,
            64,
            s.repetition_penalty.unwrap_or(1.0),
            s.frequency_penalty.unwrap_or(0.0),
            s.presence_penalty.unwrap_or(0.0),
        ));
        if !s.logit_bias.is_empty() {
            let biases: Vec<LlamaLogitBias> = s
                .logit_bias
                .iter()
                .filter_map(|(t, b)| {
                    Some(LlamaLogitBias::new(LlamaToken(i32::try_from(*t).ok()?), *b))
                })
                .collect();
            chain.push(LlamaSampler::logit_bias(n_vocab, &biases));
        }
    }
    let temp = s.temperature.unwrap_or(0.0);
    if temp <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        if let Some(k) = s.top_k.filter(|k| *k > 0) {
            chain.push(LlamaSampler::top_k(i32::try_from(k).unwrap_or(i32::MAX)));
        }
        if let Some(p) = s.top_p.filter(|p| *p < 1.0) {
            chain.push(LlamaSampler::top_p(p, 1));
        }
        if let Some(p) = s.min_p.filter(|p| *p > 0.0) {
            chain.push(LlamaSampler::min_p(p, 1));
        }
        chain.push(LlamaSampler::temp(temp));
        let seed = s
            .seed
            .map(|v| (v & 0xffff_ffff) as u32)
            .unwrap_or_else(rand_seed);
        chain.push(LlamaSampler::dist(seed));
    }
    LlamaSampler::chain_simple(chain)
}

/// Samples row `idx` of the context's last decode and feeds the token to the sampler chain
/// (and to the grammar, under a constraint). Without one it is llama.cpp's own
/// `llama_sampler_sample`; with one, only the tokens the grammar allows are candidates (the
/// same draw as with the others at `-inf`, on a shorter array).
fn pick(
    smpl: &mut LlamaSampler,
    ctx: &LlamaContext<'_>,
    idx: i32,
    constraint: Option<&mut Constraint>,
) -> Result<LlamaToken, String> {
    let Some(c) = constraint else {
        return Ok(smpl.sample(ctx, idx));
    };
    let allowed = c
        .candidates(ctx.get_logits_ith(idx))
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter_map(|(i, l)| {
            Some(LlamaTokenData::new(
                LlamaToken(i32::try_from(i).ok()?),
                l,
                0.0,
            ))
        });
    let mut cands = LlamaTokenDataArray::from_iter(allowed, false);
    smpl.apply(&mut cands);
    let tok = cands
        .selected_token()
        .ok_or_else(|| "the sampler chain selected no token".to_string())?;
    smpl.accept(tok);
    c.advance(token_id(tok)).map_err(|e| e.to_string())?;
    Ok(tok)
}

/// The constraint, if any, with the tokens after which its next mask is wanted, for
/// [`mtp_grammar::beside`].
fn ahead<'a>(
    c: Option<&'a mut Constraint>,
    toks: &'a [u32],
) -> Vec<(&'a mut Constraint, &'a [u32])> {
    c.map(|c| (c, toks)).into_iter().collect()
}

/// A llama.cpp token as the grammar's id (llama.cpp's ids are never negative).
fn token_id(t: LlamaToken) -> u32 {
    u32::try_from(t.0).unwrap_or(u32::MAX)
}

fn rand_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() & 0xffff_ffff) as u32
}

fn ctx_params(job: &Job) -> LlamaContextParams {
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(job.n_ctx))
        .with_n_batch(job.n_ctx)
        .with_n_threads(job.threads)
        .with_n_threads_batch(job.threads);
    match job.cache_type {
        None => params,
        Some(kv) => {
            let t = match kv {
                KvType::F32 => KvCacheType::F32,
                KvType::F16 => KvCacheType::F16,
                KvType::Bf16 => KvCacheType::BF16,
            };
            params.with_type_k(t).with_type_v(t)
        }
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Runs one call, under `constraint` when the reply's shape is constrained. Errors are
/// sentences for `ProviderError::Api`.
pub(crate) fn run(
    backend: &LlamaBackend,
    model: &LlamaModel,
    job: &Job,
    mut constraint: Option<Constraint>,
    sink: &mut dyn Sink,
) -> Result<Outcome, String> {
    if job.tokens.is_empty() {
        return Err("the prompt tokenized to nothing".into());
    }
    let mut out = match job.depth {
        Some(depth) => run_mtp(backend, model, job, depth, constraint.as_mut(), sink),
        None => run_plain(backend, model, job, constraint.as_mut(), sink),
    }?;
    out.constraint_ms = constraint.map(|c| c.mask_cost().0);
    Ok(out)
}

fn run_plain(
    backend: &LlamaBackend,
    model: &LlamaModel,
    job: &Job,
    mut constraint: Option<&mut Constraint>,
    sink: &mut dyn Sink,
) -> Result<Outcome, String> {
    let started = Instant::now();
    let mut ctx = model
        .new_context(backend, ctx_params(job))
        .map_err(|e| err("creating the llama.cpp context", e))?;
    let mut smpl = sampler(model, &job.sampling);
    let mut out = Outcome::default();
    let mut text = Text::new(model, job);

    sink.prompt(prompt_progress(job, 0, started));
    if job.cancel.is_cancelled() {
        out.finish = Some(FinishReason::Cancelled);
        return Ok(text.finish(out, sink));
    }
    let mut batch = LlamaBatch::new(job.tokens.len().max(1), 1);
    let last = job.tokens.len() - 1;
    for (i, t) in job.tokens.iter().enumerate() {
        batch
            .add(*t, i as i32, &[0], i == last)
            .map_err(|e| err("filling the prompt batch", e))?;
    }
    ctx.decode(&mut batch)
        .map_err(|e| err("prompt decode", e))?;
    out.prefill_ms = ms(started);
    sink.prompt(prompt_progress(job, job.tokens.len(), started));
    let mut n_past = job.tokens.len() as i32;
    let mut idx = batch.n_tokens() - 1;
    let decode_start = Instant::now();
    loop {
        let tok = pick(&mut smpl, &ctx, idx, constraint.as_deref_mut())?;
        if out.first_token_ms == 0.0 {
            out.first_token_ms = ms(started);
        }
        let step = text.push(tok);
        if let Step::Stop(f) = step {
            out.finish = Some(f);
            break;
        }
        if constraint.as_ref().is_some_and(|c| c.is_complete()) {
            out.finish = Some(FinishReason::Stop);
            break;
        }
        if job.cancel.is_cancelled() || !text.flush(sink, false) {
            out.finish = Some(FinishReason::Cancelled);
            break;
        }
        batch.clear();
        batch
            .add(tok, n_past, &[0], true)
            .map_err(|e| err("filling the batch", e))?;
        // the grammar computes the next pick's mask while llama.cpp decodes
        mtp_grammar::beside(
            ahead(constraint.as_deref_mut(), &[]),
            job.threads.max(1) as usize,
            || ctx.decode(&mut batch),
        )
        .map_err(|e| err("decode", e))?;
        n_past += 1;
        idx = 0;
    }
    out.decode_ms = ms(decode_start);
    Ok(text.finish(out, sink))
}

fn run_mtp(
    backend: &LlamaBackend,
    model: &LlamaModel,
    job: &Job,
    depth: u32,
    mut constraint: Option<&mut Constraint>,
    sink: &mut dyn Sink,
) -> Result<Outcome, String> {
    let started = Instant::now();
    let n_max = i32::try_from(depth.max(1)).map_err(|e| err("draft depth", e))?;
    let target: LlamaContext<'_> = model
        .new_context(
            backend,
            ctx_params(job).with_n_rs_seq(u32::try_from(n_max).unwrap_or(1) + 1),
        )
        .map_err(|e| err("creating the target context", e))?;
    let draft: LlamaContext<'_> = model
        .new_context(
            backend,
            ctx_params(job).with_context_type(LlamaContextType::Mtp),
        )
        .map_err(|e| err("creating the MTP draft context", e))?;
    let mut spec = MtpSpeculative::new(
        target,
        draft,
        MtpSpeculativeParams {
            n_max,
            n_min: 0,
            p_min: 0.0,
        },
    )
    .map_err(|e| err("initialising MTP speculation", e))?;
    let mut smpl = sampler(model, &job.sampling);
    let mut out = Outcome::default();
    let mut text = Text::new(model, job);

    // Prefill all but the last prompt token (which the first round computes).
    sink.prompt(prompt_progress(job, 0, started));
    if job.cancel.is_cancelled() {
        out.finish = Some(FinishReason::Cancelled);
        return Ok(text.finish(out, sink));
    }
    let (head, last) = job.tokens.split_at(job.tokens.len() - 1);
    let mut batch = LlamaBatch::new(job.tokens.len().max(n_max as usize + 1), 1);
    if !head.is_empty() {
        for (i, t) in head.iter().enumerate() {
            batch
                .add(*t, i as i32, &[0], false)
                .map_err(|e| err("filling the prompt batch", e))?;
        }
        spec.target_context_mut()
            .decode(&mut batch)
            .map_err(|e| err("prompt decode", e))?;
        spec.process(&batch)
            .map_err(|e| err("MTP process (prompt)", e))?;
        sink.prompt(prompt_progress(job, head.len(), started));
    }
    let mut prompt_tgt: Vec<LlamaToken> = head.to_vec();
    spec.begin(&prompt_tgt).map_err(|e| err("MTP begin", e))?;
    out.prefill_ms = ms(started);
    let mut id_last = last[0];
    let mut n_past = head.len() as i32;
    let decode_start = Instant::now();

    'gen: loop {
        let t = Instant::now();
        // the mask at this position (the first draft's and row 0's) is computed meanwhile
        let mut drafts = mtp_grammar::beside(
            ahead(constraint.as_deref_mut(), &[]),
            job.threads.max(1) as usize,
            || spec.draft(n_past, id_last, &prompt_tgt),
        )
        .map_err(|e| err("MTP draft", e))?;
        let n_drafted = drafts.len();
        // Never verify more than the budget can take (the rest would be thrown away).
        let room = job.max_new.saturating_sub(text.ids.len()).saturating_sub(1);
        drafts.truncate(room);
        // the drafts as the grammar's ids, once (the walk below and the mask computed ahead)
        let mut draft_ids: Vec<u32> = drafts.iter().map(|d| token_id(*d)).collect();
        if let Some(c) = constraint.as_deref_mut() {
            let allowed = c.allowed_prefix(&draft_ids).map_err(|e| e.to_string())?;
            drafts.truncate(allowed);
            draft_ids.truncate(allowed);
        }
        spec.draft_context_mut()
            .clear_kv_cache_seq(Some(0), Some(n_past as u32), None)
            .map_err(|e| err("clearing the draft cache", e))?;
        out.draft_ms += ms(t);

        let t = Instant::now();
        batch.clear();
        batch
            .add(id_last, n_past, &[0], true)
            .map_err(|e| err("filling the verify batch", e))?;
        for (i, d) in drafts.iter().enumerate() {
            batch
                .add(*d, n_past + 1 + i as i32, &[0], true)
                .map_err(|e| err("filling the verify batch", e))?;
        }
        // and the mask of the row after the last draft while the verify runs
        mtp_grammar::beside(
            ahead(constraint.as_deref_mut(), &draft_ids),
            job.threads.max(1) as usize,
            || {
                spec.target_context_mut()
                    .decode(&mut batch)
                    .map_err(|e| err("verify decode", e))?;
                spec.process(&batch).map_err(|e| err("MTP process", e))
            },
        )?;

        // Sample each row; accept drafts while the target samples the same token. A complete
        // grammar ends the reply at once (no row after it is sampled).
        let mut ids = Vec::with_capacity(drafts.len() + 1);
        let mut complete = false;
        for i in 0..=drafts.len() {
            let tok = pick(
                &mut smpl,
                spec.target_context(),
                i as i32,
                constraint.as_deref_mut(),
            )?;
            ids.push(tok);
            complete = constraint.as_ref().is_some_and(|c| c.is_complete());
            if complete || (i < drafts.len() && tok != drafts[i]) {
                break;
            }
        }
        let accepted = ids.iter().zip(&drafts).take_while(|(a, b)| a == b).count();
        out.verify_ms += ms(t);
        if n_drafted > 0 {
            spec.accept(u16::try_from(accepted).unwrap_or(u16::MAX))
                .map_err(|e| err("MTP accept", e))?;
            if !drafts.is_empty() {
                out.stats.record_round(drafts.len(), accepted);
            }
        }
        if out.first_token_ms == 0.0 {
            out.first_token_ms = ms(started);
        }
        if complete {
            for tok in ids {
                if let Step::Stop(f) = text.push(tok) {
                    out.finish = Some(f);
                    break 'gen;
                }
            }
            out.finish = Some(FinishReason::Stop);
            break;
        }

        let t = Instant::now();
        n_past += 1 + accepted as i32;
        prompt_tgt.push(id_last);
        prompt_tgt.extend_from_slice(&ids[..accepted]);
        id_last = ids[accepted];
        spec.target_context_mut()
            .clear_kv_cache_seq(Some(0), Some(n_past as u32), None)
            .map_err(|e| err("rolling the target cache back", e))?;
        spec.draft_context_mut()
            .clear_kv_cache_seq(Some(0), Some(n_past as u32), None)
            .map_err(|e| err("rolling the draft cache back", e))?;
        out.rollback_ms += ms(t);

        for tok in ids {
            if let Step::Stop(f) = text.push(tok) {
                out.finish = Some(f);
                break 'gen;
            }
        }
        if job.cancel.is_cancelled() || !text.flush(sink, false) {
            out.finish = Some(FinishReason::Cancelled);
            break;
        }
        if n_past as u32 + n_max as u32 + 2 >= job.n_ctx {
            out.finish = Some(FinishReason::Length);
            break;
        }
    }
    out.decode_ms = ms(decode_start);
    Ok(text.finish(out, sink))
}
