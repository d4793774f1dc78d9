//! `mtp generate`: one answer, streamed, then a summary line; or the whole response as JSON.
//!
//! The answer goes to stdout; a thinking model's reasoning (unless `--thinking hide`) goes to
//! stderr, dimmed on a terminal, so that `mtp generate … > answer.txt` keeps only the answer.

use std::time::Instant;

use futures::StreamExt;

use crate::cli::args::{GenerateArgs, ThinkingMode};
use crate::cli::error::CliError;
use crate::cli::open_provider;
use crate::cli::output::{compare_line, summary_line, Out, Reasoning};
use crate::cli::tools::Tools;
use crate::{GenerateRequest, StreamEvent};

/// The prompt the flags give: `--prompt-file FILE` (`-`: stdin), `-p TEXT`, or the positional
/// argument (`-`: stdin); empty with only `--messages`.
fn prompt_text(a: &GenerateArgs) -> Result<String, CliError> {
    let read = |path: &std::path::Path, flag: &'static str| -> Result<String, CliError> {
        crate::cli::messages::read_text(path)
            .map_err(|message| CliError::InvalidFlag { flag, message })
    };
    if let Some(f) = &a.prompt_file {
        return read(f, "--prompt-file");
    }
    match (a.prompt_flag.as_ref(), a.prompt.as_deref()) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some("-")) => read(std::path::Path::new("-"), "PROMPT"),
        (None, Some(p)) => Ok(p.to_string()),
        (None, None) => Ok(String::new()),
    }
}

/// The reply's constraint the flags give (`--json-schema`, `--json-object`, `--regex`,
/// `--grammar`).
pub(crate) fn response_format(
    a: &crate::cli::args::ConstraintArgs,
) -> Result<Option<crate::ResponseFormat>, CliError> {
    use crate::ResponseFormat;
    let read = |path: &std::path::Path, flag: &'static str| -> Result<String, CliError> {
        crate::cli::messages::read_text(path)
            .map_err(|message| CliError::InvalidFlag { flag, message })
    };
    let flexible_whitespace = a.flexible_whitespace;
    if let Some(path) = &a.json_schema {
        let text = read(path, "--json-schema")?;
        let schema: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| CliError::InvalidFlag {
                flag: "--json-schema",
                message: format!("{} is not JSON: {e}", path.display()),
            })?;
        return Ok(Some(ResponseFormat::JsonSchema {
            json_schema: crate::JsonSchemaFormat {
                name: None,
                schema,
                strict: None,
            },
            flexible_whitespace,
        }));
    }
    if a.json_object {
        return Ok(Some(ResponseFormat::JsonObject {
            flexible_whitespace,
        }));
    }
    if a.flexible_whitespace {
        return Err(CliError::InvalidFlag {
            flag: "--flexible-whitespace",
            message: "goes with --json-schema or --json-object".into(),
        });
    }
    if let Some(rx) = &a.regex {
        return Ok(Some(ResponseFormat::regex(rx.clone())));
    }
    if let Some(path) = &a.grammar {
        return Ok(Some(ResponseFormat::grammar(read(path, "--grammar")?)));
    }
    if a.prompted_fallback {
        return Err(CliError::InvalidFlag {
            flag: "--prompted-fallback",
            message: "goes with --json-schema, --json-object, --regex or --grammar".into(),
        });
    }
    Ok(None)
}

pub(crate) async fn run(a: GenerateArgs, out: &mut Out) -> Result<(), CliError> {
    let history = match &a.messages {
        Some(path) => Some(crate::cli::messages::read(path)?),
        None => None,
    };
    let prompt = prompt_text(&a)?;
    // a bad tools file is an error before the model loads
    let tools = Tools::from_args(&a.tools)?;
    if tools.is_some() && a.raw {
        return Err(CliError::InvalidFlag {
            flag: "--tools",
            message: "the chat template shows the model its tools, and --raw sends the prompt \
                      without it; drop one of them"
                .into(),
        });
    }
    let (llm, model) = open_provider(&a.model, out).await?;
    let chosen = a.sampling.choose(llm.as_ref());
    let mut req = GenerateRequest::new(prompt)
        .max_output_tokens(a.max_tokens)
        .sampling(chosen.sampling);
    for s in &a.stops {
        req = req.stop(s.clone());
    }
    if let Some(h) = history {
        req = req.messages(h);
    }
    if let Some(s) = &a.system {
        req = req.system_prompt(s.clone());
    }
    if let Some(t) = a.thinking {
        req = req.thinking(t.request_value());
    }
    if a.raw {
        req = req.raw();
    }
    for (k, i) in a.images.iter().enumerate() {
        req = req.image(image_for(llm.as_ref(), i, k)?);
    }
    if let Some(f) = response_format(&a.constraint)? {
        req = req
            .response_format(f)
            .prompted_fallback(a.constraint.prompted_fallback);
    }
    if let Some(t) = &tools {
        req = t.apply(req);
    }
    let show_reasoning = a.thinking != Some(ThinkingMode::Hide);
    let ctx = || format!("generation with {} on {} failed", model, llm.name());
    req.validate()
        .map_err(|source| CliError::BadRequest { source })?;
    // `--compare`: the same request again, speculation off for this call only
    let compare = a
        .compare
        .then(|| req.clone().speculation(crate::Speculation::off()));
    let started = Instant::now();
    if a.json {
        let mut r = llm
            .generate(req)
            .await
            .map_err(|source| CliError::Provider {
                context: ctx(),
                source,
            })?;
        if !show_reasoning {
            r.reasoning_content = None;
        }
        let v = serde_json::to_string_pretty(&r).map_err(|e| CliError::InvalidFlag {
            flag: "--json",
            message: e.to_string(),
        })?;
        out.line(&v)?;
        return Ok(());
    }
    // listen before the call: a runtime may prefill inside `generate_stream`
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut stream = llm
        .generate_stream(req)
        .await
        .map_err(|source| CliError::Provider {
            context: ctx(),
            source,
        })?;
    let mut wrote_any = false;
    let mut ended_newline = true;
    let mut reasoning = Reasoning::new(out, show_reasoning);
    let mut tokens = 0u64;
    loop {
        let ev = tokio::select! {
            biased;
            _ = &mut ctrl_c => {
                drop(stream); // cancels generation
                reasoning.end(out)?;
                if wrote_any && !ended_newline {
                    out.text("\n")?;
                }
                let secs = started.elapsed().as_secs_f64();
                out.note(&format!(
                    "[stopped (Ctrl-C) after {tokens} tokens in {secs:.2} s]"
                ))?;
                return Err(CliError::Interrupted);
            }
            ev = stream.next() => match ev {
                Some(ev) => ev,
                None => break,
            },
        };
        match ev.map_err(|source| CliError::Provider {
            context: ctx(),
            source,
        })? {
            StreamEvent::Delta {
                text,
                reasoning: thought,
                token_ids,
                ..
            } => {
                tokens += token_ids.len() as u64;
                reasoning.push(out, &thought)?;
                if !text.is_empty() {
                    reasoning.end(out)?;
                    wrote_any = true;
                    ended_newline = text.ends_with('\n');
                }
                out.text(&text)?;
            }
            // the calls are printed whole from the final response
            StreamEvent::ToolCall(_) => {}
            StreamEvent::PromptProgress(p) => out.prompt_progress(&p)?,
            StreamEvent::Done(r) => {
                reasoning.end(out)?;
                if wrote_any && !ended_newline {
                    out.text("\n")?;
                }
                if !wrote_any && !r.content.is_empty() {
                    // A runtime that streams nothing but the final response.
                    out.line(&r.content)?;
                }
                // each tool call as one line of OpenAI's JSON
                for c in &r.tool_calls {
                    let line = serde_json::to_string(c).map_err(|e| CliError::Io(e.into()))?;
                    out.line(&line)?;
                }
                let mut summary = summary_line(&r, started.elapsed());
                if let Some(n) = &chosen.note {
                    summary.insert_str(summary.len() - 1, &format!(" · {n}"));
                }
                out.note(&summary)?;
                for w in &r.warnings {
                    out.note(&format!("mtp: note: {w}"))?;
                }
                if let Some(off_req) = compare {
                    drop(stream);
                    let off = llm
                        .generate(off_req)
                        .await
                        .map_err(|source| CliError::Provider {
                            context: format!("{} (speculation off, for --compare)", ctx()),
                            source,
                        })?;
                    out.note(&compare_line(&r, &off))?;
                }
                return Ok(());
            }
        }
    }
    Err(CliError::Provider {
        context: ctx(),
        source: crate::ProviderError::Api {
            provider: llm.name().to_string(),
            model: model.clone(),
            status: None,
            message: "the stream ended without its final report".into(),
        },
    })
}

/// An image as `provider` takes it: in-process runtimes read the file themselves (and name it
/// in their errors); an HTTP runtime is sent the file inline, as a `data:` URL (a server cannot
/// read this machine's files). URLs go as they are.
pub(crate) fn image_for(
    provider: &dyn crate::Provider,
    spec: &str,
    index: usize,
) -> Result<String, CliError> {
    let file = matches!(
        mtp_contract::ImageRef::of(spec),
        mtp_contract::ImageRef::File(_)
    );
    if !file || matches!(provider.name(), "native" | "mlx" | "gguf") {
        return Ok(spec.to_string());
    }
    let img = mtp_engine::vision::read_image(spec, index).map_err(|e| CliError::InvalidFlag {
        flag: "--image",
        message: e.to_string(),
    })?;
    let mime = mtp_engine::vision::preprocess::media_type(&img.bytes);
    use base64::Engine as _;
    Ok(format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&img.bytes)
    ))
}
