//! `mtp chat`: the REPL. The whole history goes with every turn under one
//! `prompt_cache_key`, so a runtime with a prefix cache reuses it. `/speculation off` skips the
//! drafter per call on the same loaded weights; Ctrl-C stops the current answer only.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use rustyline::error::ReadlineError;

use crate::cli::args::{ChatArgs, ThinkingMode};
use crate::cli::error::CliError;
use crate::cli::open_provider;
use crate::cli::output::{
    speculation_phrase, status_report, summary_line, LiveAnswer, Out, PerCall,
};
use crate::cli::tools::{choice_phrase, Tools};
use crate::{
    DraftDepth, DraftStats, GenerateRequest, GenerateResponse, Message, Provider, ProviderError,
    Role, Speculation, StreamEvent, ToolCall,
};

const HELP: &str = "\
commands:
  /speculation          what is loaded: lane, drafter, depth, per-call state
  /speculation off      skip the drafter for the next calls (the lane stays loaded)
  /speculation on       use the drafter again (only if a lane was loaded at startup)
  /depth N|auto         draft N tokens per round, or choose each round (auto), for the next calls (/depth default resets)
  /thinking [on|off|hide|default]
                        a thinking model's reasoning: shown, off, done but hidden, template default
  /system [TEXT|clear]  show, set or remove the system prompt (the history stays)
  /image PATH           attach an image (PNG, JPEG, WebP; path, file:// or data: URL) to the
                        next message (repeatable; /image lists them, /image clear drops them)
  /tools [auto|none|required|NAME]
                        the tools offered (--tools FILE) and the tool choice, or set the
                        choice for the next turns
  /tool [ID] RESULT     answer a tool call of the last answer with RESULT (the call ID, or
                        the first call still waiting); once every call has its result, the
                        model answers
  /stats                this session's tokens, tok/s and acceptance
  /reset, /clear        forget the history and clear the prompt cache
  /help                 this list
  /quit                 leave (Ctrl-D too); Ctrl-C stops the current answer";

enum Lines {
    Editor(Box<rustyline::DefaultEditor>),
    Script(VecDeque<String>),
}

enum Read {
    Line(String),
    Interrupted,
    Eof,
}

impl Lines {
    fn read(&mut self, out: &mut Out) -> Result<Read, CliError> {
        match self {
            Lines::Editor(ed) => match ed.readline("> ") {
                Ok(l) => {
                    if !l.trim().is_empty() {
                        let _ = ed.add_history_entry(l.as_str());
                    }
                    Ok(Read::Line(l))
                }
                Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(ReadlineError::Eof) => Ok(Read::Eof),
                Err(e) => Err(CliError::Readline(e.to_string())),
            },
            Lines::Script(q) => match q.pop_front() {
                Some(l) => {
                    out.line(&format!("> {l}"))?;
                    Ok(Read::Line(l))
                }
                None => Ok(Read::Eof),
            },
        }
    }
}

#[derive(Default)]
struct Stats {
    turns: u64,
    stopped: u64,
    tokens: u64,
    seconds: f64,
    speculated_turns: u64,
    /// Speculated turns stopped with Ctrl-C: they ran with the drafter, but the runtime's
    /// report (drafted/accepted) never came, so their drafts are not in `draft`.
    speculated_stopped: u64,
    draft: DraftStats,
    last: Option<String>,
}

struct Session {
    llm: Arc<dyn Provider>,
    args: ChatArgs,
    sampling: crate::Sampling,
    system: Option<String>,
    thinking: Option<ThinkingMode>,
    /// Every answer's constraint (`--json-schema` etc.).
    format: Option<crate::ResponseFormat>,
    /// `--prompted-fallback`: a runtime that cannot enforce `format` asks for it instead.
    prompted_fallback: bool,
    history: Vec<Message>,
    /// `--tools`: offered every turn (`/tools` changes the choice).
    tools: Option<Tools>,
    /// The last answer's tool calls that have no result yet (`/tool` answers them).
    pending: Vec<ToolCall>,
    /// Images attached to the next message (`/image`): as typed, and as sent.
    images: Vec<(String, String)>,
    key: String,
    per_call: PerCall,
    stats: Stats,
}

pub(crate) fn run(
    args: ChatArgs,
    rt: &tokio::runtime::Runtime,
    out: &mut Out,
    input: Option<Vec<String>>,
) -> Result<(), CliError> {
    // a bad constraint or tools flag is an error before the model loads
    let format = crate::cli::generate::response_format(&args.constraint)?;
    let tools = Tools::from_args(&args.tools)?;
    if let Some(t) = &tools {
        let mut probe = t.apply(GenerateRequest::new("?"));
        probe.response_format = format.clone();
        probe
            .validate()
            .map_err(|source| CliError::BadRequest { source })?;
    }
    let (llm, model) = rt.block_on(open_provider(&args.model, out))?;
    let mut lines = match input {
        Some(v) => Lines::Script(v.into()),
        None => Lines::Editor(Box::new(
            rustyline::DefaultEditor::new().map_err(|e| CliError::Readline(e.to_string()))?,
        )),
    };
    let st = llm.speculation_status();
    out.line(&format!(
        "mtp chat · {} · {} · {}",
        llm.name(),
        model,
        if st.lane_loaded {
            format!(
                "MTP lane loaded (drafter {}, depth {})",
                st.drafter.as_deref().unwrap_or("?"),
                st.depth_phrase().unwrap_or_else(|| "?".into())
            )
        } else {
            format!(
                "no MTP lane{}",
                st.reason.map(|r| format!(" ({r})")).unwrap_or_default()
            )
        }
    ))?;
    let chosen = args.sampling.choose(llm.as_ref());
    if let Some(note) = &chosen.note {
        out.line(&format!(
            "sampling: {note}; set --temperature etc. to choose"
        ))?;
    }
    if let Some(t) = &tools {
        out.line(&format!(
            "tools: {} · tool choice {}",
            t.names().join(", "),
            choice_phrase(&t.choice)
        ))?;
    }
    out.line("/help lists the commands; /quit or Ctrl-D leaves; Ctrl-C stops an answer.")?;
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let mut s = Session {
        llm,
        sampling: chosen.sampling,
        system: args.system.clone(),
        thinking: args.thinking,
        format,
        prompted_fallback: args.constraint.prompted_fallback,
        args,
        history: Vec::new(),
        tools,
        pending: Vec::new(),
        images: Vec::new(),
        key: format!("mtp-chat-{}-{stamp}", std::process::id()),
        per_call: PerCall::default(),
        stats: Stats::default(),
    };
    loop {
        let line = match lines.read(out)? {
            Read::Line(l) => l,
            Read::Interrupted => {
                out.line("(Ctrl-C: nothing to stop; /quit or Ctrl-D leaves)")?;
                continue;
            }
            Read::Eof => break,
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if let Some(cmd) = text.strip_prefix('/') {
            match command(&mut s, cmd, out)? {
                Next::Read => {}
                Next::Quit => break,
                Next::Answer => rt.block_on(turn(&mut s, None, out))?,
            }
            continue;
        }
        rt.block_on(turn(&mut s, Some(text.to_string()), out))?;
    }
    Ok(())
}

/// What the REPL does after a `/command`.
enum Next {
    /// Read the next line.
    Read,
    /// Leave.
    Quit,
    /// Generate the next answer from the history (every tool call has its result).
    Answer,
}

/// Handles a `/command`.
fn command(s: &mut Session, cmd: &str, out: &mut Out) -> Result<Next, CliError> {
    let cmd = cmd.trim();
    let (name, rest) = cmd
        .split_once(char::is_whitespace)
        .map_or((cmd, ""), |(n, r)| (n, r.trim()));
    let arg = rest.split_whitespace().next();
    match (name, arg) {
        ("quit" | "exit" | "q", _) => return Ok(Next::Quit),
        ("help" | "?", _) => out.line(HELP)?,
        ("speculation", None) => {
            out.line(&status_report(&s.llm.speculation_status(), s.per_call))?
        }
        ("speculation", Some("off" | "false")) => {
            let st = s.llm.speculation_status();
            if st.lane_loaded {
                s.per_call.off = true;
                out.line("speculation off for the next calls: the lane stays loaded; the drafter is skipped.")?;
            } else {
                out.line("speculation is already off: no MTP lane is loaded.")?;
            }
        }
        ("speculation", Some("on" | "true" | "native_mtp")) => {
            let st = s.llm.speculation_status();
            if st.lane_loaded {
                s.per_call.off = false;
                out.line("speculation on: the drafter runs again from the next call.")?;
            } else {
                let why = match (st.reason, &st.message) {
                    (Some(r), Some(m)) => format!(" ({r}: {m})"),
                    (Some(r), None) => format!(" ({r})"),
                    (None, Some(m)) => format!(" ({m})"),
                    (None, None) => String::new(),
                };
                out.line(&format!(
                    "cannot turn speculation on: no MTP lane was loaded at startup{why}. \
                     --speculation is a startup flag; restart with `mtp chat --speculation native_mtp` \
                     once the drafter is available."
                ))?;
            }
        }
        ("speculation", Some(other)) => out.line(&format!(
            "unknown /speculation argument `{other}`; use /speculation, /speculation on or /speculation off"
        ))?,
        ("depth", None) => out.line(&format!(
            "draft tokens: {}",
            match (s.per_call.depth, s.llm.speculation_status().depth_phrase()) {
                (Some(d), _) => format!("{d} (set with /depth)"),
                (None, Some(d)) => format!("{d} (provider default)"),
                (None, None) => "provider default (not reported)".into(),
            }
        ))?,
        ("depth", Some("default")) => {
            s.per_call.depth = None;
            out.line("draft tokens: back to the provider default.")?;
        }
        ("depth", Some(n)) => match DraftDepth::parse(n) {
            Ok(d) => {
                s.per_call.depth = Some(d);
                let note = if s.llm.speculation_status().lane_loaded {
                    ""
                } else {
                    " (no MTP lane is loaded, so nothing is drafted)"
                };
                out.line(&match d {
                    DraftDepth::Auto => format!(
                        "draft tokens: chosen each round (0 to {}) for the next calls{note}.",
                        crate::AUTO_MAX_DRAFT_TOKENS
                    ),
                    d => format!("draft tokens: {d} per round for the next calls{note}."),
                })?;
            }
            Err(e) => out.line(&format!("invalid /depth `{n}`: {e}"))?,
        },
        ("image", None) => out.line(&if s.images.is_empty() {
            "no image attached to the next message (/image PATH attaches one).".to_string()
        } else {
            let shown: Vec<&str> = s.images.iter().map(|(shown, _)| shown.as_str()).collect();
            format!("attached to the next message: {}", shown.join(", "))
        })?,
        ("image", Some("clear" | "none")) if rest.split_whitespace().count() == 1 => {
            s.images.clear();
            out.line("images dropped; the next message goes without them.")?;
        }
        ("image", Some(_)) => {
            let caps = s.llm.capabilities();
            let local = match mtp_contract::ImageRef::of(rest) {
                mtp_contract::ImageRef::File(p) => Some(p),
                _ => None,
            };
            if !caps.images {
                out.line(&format!(
                    "{} on {} takes no images (no vision tower); the image is not attached.",
                    s.llm.model(),
                    s.llm.name()
                ))?;
            } else if local.is_some_and(|p| !std::path::Path::new(p).is_file()) {
                out.line(&format!("no such image file: {rest}"))?;
            } else {
                let n = s.images.len();
                match crate::cli::generate::image_for(s.llm.as_ref(), rest, n) {
                    Ok(img) => s.images.push((rest.to_string(), img)),
                    Err(e) => {
                        out.line(&format!("cannot attach {rest}: {e}"))?;
                        return Ok(Next::Read);
                    }
                }
                out.line(&format!(
                    "image {} attached to the next message: {rest}",
                    s.images.len()
                ))?;
            }
        }
        ("tools", None) => out.line(&tools_text(s))?,
        ("tools", Some(_)) => match &mut s.tools {
            None => out.line("no tools are offered: start the chat with --tools FILE.")?,
            Some(t) => match crate::cli::tools::choice(rest, &t.list, "the tools") {
                Ok(choice) => {
                    out.line(&format!(
                        "tool choice {} for the next turns.",
                        choice_phrase(&choice)
                    ))?;
                    t.choice = choice;
                }
                Err(e) => out.line(&format!("invalid /tools `{rest}`: {e}"))?,
            },
        },
        ("tool", _) => return tool_result(s, rest, out),
        ("stats", _) => out.line(&stats_text(&s.stats))?,
        ("system", None) => out.line(&match &s.system {
            Some(p) => format!("system prompt: {p}"),
            None => "no system prompt (the chat template's default, if it has one).".into(),
        })?,
        ("system", Some("clear" | "off" | "none")) if rest.split_whitespace().count() == 1 => {
            s.system = None;
            out.line("system prompt removed for the next turns.")?;
        }
        ("system", Some(_)) => {
            s.system = Some(rest.to_string());
            out.line("system prompt set for the next turns (the history stays; /reset starts over).")?;
        }
        ("thinking", None) => out.line(&format!(
            "thinking: {}",
            match s.thinking {
                Some(ThinkingMode::On) => "on (reasoning shown, dimmed)",
                Some(ThinkingMode::Off) => "off (the model answers directly)",
                Some(ThinkingMode::Hide) => "hidden (the model reasons; only the answer is shown)",
                None => "the chat template's default (reasoning shown when there is any)",
            }
        ))?,
        ("thinking", Some(v)) => {
            let mode = match v {
                "on" | "true" => Some(Some(ThinkingMode::On)),
                "off" | "false" => Some(Some(ThinkingMode::Off)),
                "hide" => Some(Some(ThinkingMode::Hide)),
                "default" => Some(None),
                _ => None,
            };
            match mode {
                Some(m) => {
                    s.thinking = m;
                    out.line(&format!("thinking {v} for the next turns."))?;
                }
                None => out.line(&format!(
                    "unknown /thinking argument `{v}`; use on, off, hide or default"
                ))?,
            }
        }
        ("clear" | "reset", _) => {
            s.history.clear();
            s.pending.clear();
            match s.llm.prompt_cache_clear(Some(&s.key)) {
                Ok(()) => out.line("history cleared; the prompt cache was cleared too.")?,
                Err(ProviderError::Unsupported { .. }) => {
                    out.line("history cleared (this runtime keeps no prompt cache).")?
                }
                Err(e) => out.line(&format!("history cleared; clearing the prompt cache failed: {e}"))?,
            }
        }
        _ => out.line(&format!("unknown command /{name}; /help lists the commands"))?,
    }
    Ok(Next::Read)
}

/// `/tools`: what is offered, the choice, and the calls waiting for a result.
fn tools_text(s: &Session) -> String {
    let Some(t) = &s.tools else {
        return "no tools are offered: start the chat with --tools FILE.".into();
    };
    let mut text = format!(
        "tools: {}\ntool choice: {}\nparallel tool calls: {}",
        t.names().join(", "),
        choice_phrase(&t.choice),
        if t.parallel == Some(false) {
            "at most one call per answer"
        } else {
            "as many as the model makes"
        }
    );
    if !s.pending.is_empty() {
        text.push_str(&format!(
            "\nwaiting for results: {}",
            pending_list(&s.pending)
        ));
    }
    text
}

/// `call_1 (get_weather), call_2 (now)`.
fn pending_list(calls: &[ToolCall]) -> String {
    calls
        .iter()
        .map(|c| match &c.id {
            Some(id) => format!("{id} ({})", c.function.name),
            None => c.function.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `/tool [ID] RESULT`: the `tool` message answering one of the last answer's calls (the one
/// whose id is the first word, else the first waiting); the next answer is generated once no
/// call waits.
fn tool_result(s: &mut Session, rest: &str, out: &mut Out) -> Result<Next, CliError> {
    const USAGE: &str = "usage: /tool [ID] RESULT (the call ID, or the first call still waiting)";
    if s.pending.is_empty() {
        out.line("no tool call is waiting for a result (the last answer made none).")?;
        return Ok(Next::Read);
    }
    let (first, after) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(a, b)| (a, b.trim()));
    let (at, result) = match s
        .pending
        .iter()
        .position(|c| c.id.as_deref() == Some(first))
    {
        Some(i) => (i, after),
        None => (0, rest),
    };
    if result.is_empty() {
        out.line(USAGE)?;
        return Ok(Next::Read);
    }
    let call = s.pending.remove(at);
    let mut m = Message::new(Role::Tool, result);
    m.tool_call_id = call.id.clone();
    m.name = Some(call.function.name.clone());
    s.history.push(m);
    if s.pending.is_empty() {
        return Ok(Next::Answer);
    }
    out.line(&format!(
        "result of {} kept; waiting for: {}",
        pending_list(std::slice::from_ref(&call)),
        pending_list(&s.pending)
    ))?;
    Ok(Next::Read)
}

fn stats_text(st: &Stats) -> String {
    let rate = if st.seconds > 0.0 {
        format!("{:.1} tok/s", st.tokens as f64 / st.seconds)
    } else {
        "no answers yet".into()
    };
    let mut s = format!(
        "turns {} ({} stopped) · {} tokens · {rate}\nspeculated turns {}",
        st.turns, st.stopped, st.tokens, st.speculated_turns
    );
    if st.speculated_stopped > 0 {
        s.push_str(&format!(
            " ({} stopped before reporting; the draft figures below leave them out)",
            st.speculated_stopped
        ));
    }
    if let Some(rate) = st.draft.acceptance_rate() {
        s.push_str(&format!(
            " · drafted {} · accepted {} · acceptance {:.0}% · {:.2} accepted per round",
            st.draft.drafted,
            st.draft.accepted,
            rate * 100.0,
            if st.draft.rounds > 0 {
                st.draft.accepted as f64 / st.draft.rounds as f64
            } else {
                0.0
            }
        ));
    }
    let per_position: Vec<String> = st
        .draft
        .accepted_per_position
        .iter()
        .zip(&st.draft.drafted_per_position)
        .enumerate()
        .filter(|(_, (_, d))| **d > 0)
        .map(|(i, (a, d))| format!("{}: {:.0}%", i + 1, 100.0 * *a as f64 / *d as f64))
        .collect();
    if !per_position.is_empty() {
        s.push_str(&format!(
            "\nacceptance by draft position: {}",
            per_position.join(", ")
        ));
    }
    if let Some(l) = &st.last {
        s.push_str(&format!("\nlast answer: {l}"));
    }
    s
}

enum Outcome {
    Done(Box<GenerateResponse>, Duration),
    Stopped(String, u64, Duration),
}

/// One answer: to the user's `prompt`, or (`None`) to the tool results just given.
async fn turn(s: &mut Session, prompt: Option<String>, out: &mut Out) -> Result<(), CliError> {
    // images go with the user's next message, not with tool results
    let images: Vec<String> = if prompt.is_some() {
        std::mem::take(&mut s.images)
            .into_iter()
            .map(|(_, sent)| sent)
            .collect()
    } else {
        Vec::new()
    };
    if prompt.is_some() && !s.pending.is_empty() {
        out.line(&format!(
            "(the last answer's tool calls go unanswered: {})",
            pending_list(&s.pending)
        ))?;
    }
    let mut req = GenerateRequest::new(prompt.clone().unwrap_or_default())
        .messages(s.history.clone())
        .prompt_cache_key(s.key.clone())
        .max_output_tokens(s.args.max_tokens)
        .sampling(s.sampling.clone());
    if let Some(sys) = &s.system {
        req = req.system_prompt(sys.clone());
    }
    if let Some(t) = s.thinking {
        req = req.thinking(t.request_value());
    }
    if let Some(f) = &s.format {
        req = req
            .response_format(f.clone())
            .prompted_fallback(s.prompted_fallback);
    }
    if let Some(t) = &s.tools {
        req = t.apply(req);
    }
    req.images = images.clone();
    // the user's message, for the history (none after tool results)
    let user_turn = prompt.map(|prompt| {
        let mut m = Message::user(prompt);
        m.images = images;
        m
    });
    let show_reasoning = s.thinking != Some(ThinkingMode::Hide);
    if s.per_call.off {
        req = req.speculation(Speculation::off());
    } else if let Some(d) = s.per_call.depth {
        req = req.speculation(Speculation::default().with_num_draft_tokens(d)?);
    }
    match stream_answer(&s.llm, req, show_reasoning, out).await {
        Ok(Outcome::Done(r, wall)) => {
            out.note(&summary_line(&r, wall))?;
            s.stats.turns += 1;
            s.stats.tokens += r.usage.output_tokens;
            s.stats.seconds += wall.as_secs_f64();
            let rep = &r.metadata.speculation;
            if rep.used {
                s.stats.speculated_turns += 1;
                let mut d = DraftStats {
                    drafted: rep.drafted.unwrap_or(0),
                    accepted: rep.accepted.unwrap_or(0),
                    rounds: rep.rounds.unwrap_or(0),
                    ..Default::default()
                };
                if let Some(p) = &rep.accepted_per_position {
                    d.accepted_per_position = p.clone();
                    match &rep.rounds_per_depth {
                        // position i was proposed by every round deeper than i
                        Some(per) if !per.is_empty() => {
                            d.drafted_per_position = (0..per.len().saturating_sub(1))
                                .map(|i| per[i + 1..].iter().sum())
                                .collect();
                        }
                        // a fixed depth: every round proposed each of its positions
                        _ => {
                            let depth = rep
                                .num_draft_tokens
                                .map_or(p.len(), |k| k as usize)
                                .max(p.len());
                            d.drafted_per_position = vec![d.rounds; depth];
                        }
                    }
                    let n = d.drafted_per_position.len().max(p.len());
                    d.accepted_per_position.resize(n, 0);
                    d.drafted_per_position.resize(n, 0);
                }
                s.stats.draft.merge(&d);
            }
            s.stats.last = Some(speculation_phrase(rep));
            s.history.extend(user_turn);
            let mut answer =
                Message::assistant(r.content.clone()).with_tool_calls(r.tool_calls.clone());
            answer.reasoning_content = r.reasoning_content.clone();
            s.history.push(answer);
            s.pending = r.tool_calls.clone();
            if !s.pending.is_empty() {
                out.line("(answer with /tool RESULT, or /tool ID RESULT for one call)")?;
            }
        }
        Ok(Outcome::Stopped(text, tokens, wall)) => {
            out.note(&format!("[stopped after {tokens} tokens]"))?;
            s.stats.turns += 1;
            s.stats.stopped += 1;
            // it ran with the drafter when a lane is loaded and this call did not skip it
            if s.llm.speculation_status().lane_loaded && !s.per_call.off {
                s.stats.speculated_turns += 1;
                s.stats.speculated_stopped += 1;
                s.stats.last =
                    Some("stopped with Ctrl-C before the runtime's speculation report".into());
            }
            s.stats.tokens += tokens;
            s.stats.seconds += wall.as_secs_f64();
            s.history.extend(user_turn);
            s.history.push(Message::assistant(text));
            s.pending.clear();
        }
        Err(e) => {
            // A failed turn is reported; the session goes on.
            let e = CliError::Provider {
                context: "this answer failed".into(),
                source: e,
            };
            out.error(&e);
        }
    }
    Ok(())
}

async fn stream_answer(
    llm: &Arc<dyn Provider>,
    req: GenerateRequest,
    show_reasoning: bool,
    out: &mut Out,
) -> Result<Outcome, ProviderError> {
    let started = Instant::now();
    // Listen before the call: a runtime may prefill inside `generate_stream`.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut stream = tokio::select! {
        biased;
        _ = &mut ctrl_c => return Ok(Outcome::Stopped(String::new(), 0, started.elapsed())),
        s = llm.generate_stream(req) => s?,
    };
    let mut live = LiveAnswer::start(out, show_reasoning);
    loop {
        tokio::select! {
            biased;
            _ = &mut ctrl_c => {
                drop(stream); // cancels generation
                let tokens = live.tokens();
                let text = live.finish(out).map_err(io_err)?;
                return Ok(Outcome::Stopped(text, tokens, started.elapsed()));
            }
            ev = stream.next() => match ev {
                Some(Ok(StreamEvent::Delta { text, token_ids, reasoning, .. })) => {
                    // runtimes that send no token ids: one token per piece of text
                    let n = if token_ids.is_empty() && !(text.is_empty() && reasoning.is_empty()) {
                        1
                    } else {
                        token_ids.len() as u64
                    };
                    live.push_reasoning(out, &reasoning).map_err(io_err)?;
                    live.push(out, &text, n).map_err(io_err)?;
                }
                // the calls are shown whole from the final response
                Some(Ok(StreamEvent::ToolCall(_))) => {}
                Some(Ok(StreamEvent::PromptProgress(p))) => {
                    out.prompt_progress(&p).map_err(io_err)?;
                }
                Some(Ok(StreamEvent::Done(r))) => {
                    let streamed = !live.text.is_empty();
                    live.finish(out).map_err(io_err)?;
                    if !streamed && !r.content.is_empty() {
                        out.line(&r.content).map_err(io_err)?;
                    }
                    for c in &r.tool_calls {
                        let args = match &c.function.arguments {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        let id = c.id.as_ref().map(|id| format!(" · id {id}")).unwrap_or_default();
                        out.line(&format!("tool call: {}({args}){id}", c.function.name))
                            .map_err(io_err)?;
                    }
                    return Ok(Outcome::Done(r, started.elapsed()));
                }
                Some(Err(e)) => {
                    let _ = live.finish(out);
                    return Err(e);
                }
                None => {
                    let _ = live.finish(out);
                    return Err(ProviderError::Api {
                        provider: llm.name().to_string(),
                        model: llm.model().to_string(),
                        status: None,
                        message: "the stream ended without its final report".into(),
                    });
                }
            }
        }
    }
}

fn io_err(e: std::io::Error) -> ProviderError {
    ProviderError::Api {
        provider: "mtp chat".into(),
        model: String::new(),
        status: None,
        message: format!("cannot write the answer: {e}"),
    }
}
