//! The thread that owns a [`Batch`] and takes requests from any thread: requests join
//! between steps, up to `max_batch` at once (the rest wait in order).

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use crate::batch::{Batch, DEFAULT_PREFILL_CHUNK};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::request::{GenerateOptions, GenerationOutput};

/// What a [`Scheduler`] sends back for one request.
#[derive(Debug)]
pub enum BatchEvent {
    /// Newly accepted tokens.
    Tokens(Vec<u32>),
    /// The end: the output (with the prefix-cache states kept, when asked for), or why it
    /// failed.
    Done(Box<Result<GenerationOutput>>),
}

struct Job {
    id: u64,
    prompt: Vec<u32>,
    opts: GenerateOptions,
    paced: bool,
    events: mpsc::Sender<BatchEvent>,
}

/// What the scheduler thread receives.
enum Msg {
    Job(Box<Job>),
    /// A paced request's answer to its last chunk (see [`Batch::answer`]).
    Answer {
        id: u64,
        go: bool,
    },
}

/// How long the scheduler waits, before a step, for the answers still due from paced
/// requests' callers (usually microseconds away): a sequence whose answer comes later sits out
/// that step, so a slow caller never holds the others up by more than this.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// The thread that owns a [`Batch`]: requests from any thread join between steps, up to
/// `max_batch` at once (the rest wait in order). Dropping a request's receiver cancels it at
/// the next token. The thread ends when the scheduler is dropped and its sequences are done.
pub struct Scheduler {
    tx: Option<mpsc::Sender<Msg>>,
    next_id: std::sync::atomic::AtomicU64,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A request whose caller answers each chunk of tokens ([`Scheduler::submit_paced`]): after
/// each [`BatchEvent::Tokens`], [`Paced::answer`] says whether its sequence goes on.
/// Dropping it cancels the request.
pub struct Paced {
    id: u64,
    events: mpsc::Receiver<BatchEvent>,
    answers: mpsc::Sender<Msg>,
}

impl Paced {
    /// The next event: a chunk of tokens (answer it), or the end.
    pub fn recv(&self) -> std::result::Result<BatchEvent, mpsc::RecvError> {
        self.events.recv()
    }

    /// The answer to the last chunk: true goes on, false ends the sequence there, as a
    /// callback returning false ends a solo call (its output, draft statistics, timings and
    /// states still come, in [`BatchEvent::Done`]).
    pub fn answer(&self, go: bool) {
        let _ = self.answers.send(Msg::Answer { id: self.id, go });
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        // (after the end, an answer for a sequence that is gone does nothing)
        let _ = self.answers.send(Msg::Answer {
            id: self.id,
            go: false,
        });
    }
}

/// How a [`Scheduler`] batches.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Sequences decoded at once (at least 1); the rest wait in order.
    pub max_batch: usize,
    /// Prompt tokens a step computes for each joining sequence (see
    /// [`Batch::with_prefill_chunk`]).
    pub prefill_chunk: usize,
}

impl SchedulerConfig {
    /// Up to `max_batch` sequences at once, prompts computed [`DEFAULT_PREFILL_CHUNK`] tokens
    /// per step.
    pub fn new(max_batch: usize) -> Self {
        SchedulerConfig {
            max_batch,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
        }
    }

    /// Sets the prompt tokens a step computes for each joining sequence.
    pub fn prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens;
        self
    }
}

impl Scheduler {
    /// Starts the thread.
    pub fn spawn(engine: Arc<Engine>, config: SchedulerConfig) -> Scheduler {
        let (tx, rx) = mpsc::channel::<Msg>();
        let max_batch = config.max_batch.max(1);
        let chunk = config.prefill_chunk;
        let thread = std::thread::Builder::new()
            .name("mtp-scheduler".into())
            .spawn(move || run_scheduler(&engine, rx, max_batch, chunk))
            .ok();
        Scheduler {
            tx: Some(tx),
            next_id: std::sync::atomic::AtomicU64::new(0),
            thread,
        }
    }

    /// Queues a request; its tokens and its end come on the returned receiver. It resumes
    /// from and keeps prefix-cache states as `opts` asks ([`GenerateOptions::resume`],
    /// [`GenerateOptions::checkpoint`]).
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        opts: GenerateOptions,
    ) -> Result<mpsc::Receiver<BatchEvent>> {
        let (_, events) = self.queue(prompt, opts, false)?;
        Ok(events)
    }

    /// [`Scheduler::submit`] for a caller that decides after each chunk whether the sequence
    /// goes on (a stop string): the sequence waits for each answer ([`Paced::answer`]; see
    /// [`Batch::join_paced`]), so one its caller stops ends with what it gets alone when its
    /// callback stops it.
    pub fn submit_paced(&self, prompt: Vec<u32>, opts: GenerateOptions) -> Result<Paced> {
        let (id, events) = self.queue(prompt, opts, true)?;
        let answers = self
            .tx
            .clone()
            .ok_or_else(|| Error::Batch("the scheduler thread has stopped".into()))?;
        Ok(Paced {
            id,
            events,
            answers,
        })
    }

    fn queue(
        &self,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        paced: bool,
    ) -> Result<(u64, mpsc::Receiver<BatchEvent>)> {
        let (events, rx) = mpsc::channel();
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let job = Job {
            id,
            prompt,
            opts,
            paced,
            events,
        };
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(Msg::Job(Box::new(job))).ok())
            .ok_or_else(|| Error::Batch("the scheduler thread has stopped".into()))?;
        Ok((id, rx))
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A message for the scheduler thread: a request queues, an answer goes to its sequence (a
/// request that has not joined yet and whose caller went away leaves the queue).
fn receive(msg: Msg, batch: &mut Batch<'_>, waiting: &mut VecDeque<Box<Job>>) {
    match msg {
        Msg::Job(job) => waiting.push_back(job),
        Msg::Answer { id, go } => {
            if !go {
                waiting.retain(|j| j.id != id);
            }
            batch.answer(id, go);
        }
    }
}

/// Requests with the same prompt waiting together (the choices of one request, `n` > 1) compute
/// it once: the first keeps the state before the prompt's last token
/// ([`GenerateOptions::checkpoint_at`]), and the others resume from it
/// ([`GenerateOptions::resume`]), computing that one token; they wait in the queue while it is
/// being computed. Outputs are the same as each computing its own prompt (a resumed state
/// gives the tokens a whole prompt gives).
#[derive(Default)]
struct Forks {
    /// Prompts being computed by a sequence that keeps the state to share, and its id.
    sources: Vec<(Vec<u32>, u64)>,
    /// The shared states, by prompt, while a request waiting for one is queued.
    states: BTreeMap<Vec<u32>, Arc<crate::PromptState>>,
    /// Sources that keep a state only to share it: their outputs go without states they did
    /// not ask for.
    lent: std::collections::BTreeSet<u64>,
}

impl Forks {
    /// A request that may share (or lend) its prompt's computation: no state of its own to
    /// resume or keep, no images, a prompt of two tokens or more.
    fn forkable(job: &Job) -> bool {
        job.opts.resume.is_none()
            && job.opts.images.is_none()
            && !job.opts.checkpoint
            && job.prompt.len() >= 2
    }

    /// The states of sources whose prompts are computed now (a source that ended without one
    /// frees its followers to compute their own).
    fn collect(&mut self, batch: &Batch<'_>) {
        let states = &mut self.states;
        self.sources
            .retain(|(p, id)| match batch.kept_history(*id) {
                Some(st) => {
                    states.insert(p.clone(), Arc::new(st));
                    false
                }
                None => batch.holds(*id),
            });
    }

    /// Readies `job` to join: resumes from a shared state, lends its own when others wait
    /// with the same prompt, or says to wait (`false`) for a state being computed.
    fn prepare(&mut self, job: &mut Job, waiting: &VecDeque<Box<Job>>) -> bool {
        if !Forks::forkable(job) {
            return true;
        }
        if let Some(st) = self.states.get(&job.prompt) {
            job.opts.resume = Some(Arc::clone(st));
            return true;
        }
        if self.sources.iter().any(|(p, _)| *p == job.prompt) {
            return false;
        }
        if waiting
            .iter()
            .any(|w| Forks::forkable(w) && w.prompt == job.prompt)
        {
            job.opts.checkpoint = true;
            job.opts.checkpoint_at = Some(job.prompt.len() - 1);
            self.lent.insert(job.id);
            self.sources.push((job.prompt.clone(), job.id));
        }
        true
    }

    /// Drops the states no queued request needs.
    fn prune(&mut self, waiting: &VecDeque<Box<Job>>) {
        self.states
            .retain(|p, _| waiting.iter().any(|w| &w.prompt == p));
    }

    /// A finished sequence's output, without the states it kept only to lend.
    fn finished(&mut self, id: u64, mut out: Result<GenerationOutput>) -> Result<GenerationOutput> {
        if self.lent.remove(&id) {
            if let Ok(o) = &mut out {
                o.states = crate::KeptStates::default();
            }
        }
        out
    }
}

fn run_scheduler(engine: &Engine, rx: mpsc::Receiver<Msg>, max_batch: usize, chunk: usize) {
    let mut batch = Batch::new(engine).with_prefill_chunk(chunk);
    let mut waiting: VecDeque<Box<Job>> = VecDeque::new();
    let mut senders: BTreeMap<u64, mpsc::Sender<BatchEvent>> = BTreeMap::new();
    let mut forks = Forks::default();
    let mut open = true;
    loop {
        // take what arrived; block only when there is nothing to do (every sequence waits for
        // its caller's answer, and nothing can join)
        let idle = batch.active() == batch.answers_due()
            && (waiting.is_empty() || batch.active() >= max_batch);
        if idle {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(m) => receive(m, &mut batch, &mut waiting),
                Err(_) => open = false,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(m) => receive(m, &mut batch, &mut waiting),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        // the answers still due are usually a moment away: wait for them (not long), so that
        // their sequences take this step
        let until = Instant::now() + ANSWER_WAIT;
        while open && batch.answers_due() > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match rx.recv_timeout(left) {
                Ok(m) => receive(m, &mut batch, &mut waiting),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        }
        forks.collect(&batch);
        let mut later: Vec<Box<Job>> = Vec::new();
        while batch.active() < max_batch {
            let Some(mut job) = waiting.pop_front() else {
                break;
            };
            if !forks.prepare(&mut job, &waiting) {
                later.push(job);
                continue;
            }
            let id = job.id;
            senders.insert(id, job.events);
            if job.paced {
                batch.join_paced(id, &job.prompt, &job.opts);
            } else {
                batch.join(id, &job.prompt, &job.opts);
            }
            forks.collect(&batch);
        }
        // those waiting for a shared state keep their places
        for job in later.into_iter().rev() {
            waiting.push_front(job);
        }
        forks.prune(&waiting);
        if batch.active() > batch.answers_due() {
            let s = &senders;
            batch.step(&mut |id, t| forward(s, id, t));
        }
        for (id, out) in batch.take_finished() {
            let out = forks.finished(id, out);
            if let Some(tx) = senders.remove(&id) {
                let _ = tx.send(BatchEvent::Done(Box::new(out)));
            }
        }
        if !open && batch.active() == 0 && waiting.is_empty() {
            return;
        }
    }
}

/// Sends a sequence's tokens to its requester; false (cancel) when the requester is gone.
fn forward(senders: &BTreeMap<u64, mpsc::Sender<BatchEvent>>, id: u64, t: &[u32]) -> bool {
    senders
        .get(&id)
        .is_some_and(|tx| tx.send(BatchEvent::Tokens(t.to_vec())).is_ok())
}
