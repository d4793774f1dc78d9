//! `mtp generate`: one answer, streamed, then a summary line; or the whole response as JSON.

use std::time::Instant;

use futures::StreamExt;

use crate::cli::args::GenerateArgs;
use crate::cli::error::CliError;
use crate::cli::open_provider;
use crate::cli::output::{summary_line, Out};
use crate::{GenerateRequest, StreamEvent};

pub(crate) async fn run(a: GenerateArgs, out: &mut Out) -> Result<(), CliError> {
    let (llm, model) = open_provider(&a.model)?;
    let mut req = GenerateRequest::new(a.prompt)
        .max_output_tokens(a.max_tokens)
        .sampling(a.sampling.to_sampling());
    if a.raw {
        req = req.raw();
    }
    let ctx = || format!("generation with {} on {} failed", model, llm.name());
    req.validate().map_err(|source| CliError::Provider {
        context: "invalid flags".into(),
        source,
    })?;
    let started = Instant::now();
    if a.json {
        let r = llm
            .generate(req)
            .await
            .map_err(|source| CliError::Provider {
                context: ctx(),
                source,
            })?;
        let v = serde_json::to_string_pretty(&r).map_err(|e| CliError::InvalidFlag {
            flag: "--json",
            message: e.to_string(),
        })?;
        out.line(&v)?;
        return Ok(());
    }
    let mut stream = llm
        .generate_stream(req)
        .await
        .map_err(|source| CliError::Provider {
            context: ctx(),
            source,
        })?;
    let mut wrote_any = false;
    let mut ended_newline = true;
    while let Some(ev) = stream.next().await {
        match ev.map_err(|source| CliError::Provider {
            context: ctx(),
            source,
        })? {
            StreamEvent::Delta { text, .. } => {
                if !text.is_empty() {
                    wrote_any = true;
                    ended_newline = text.ends_with('\n');
                }
                out.text(&text)?;
            }
            StreamEvent::Done(r) => {
                if wrote_any && !ended_newline {
                    out.text("\n")?;
                }
                if !wrote_any && !r.content.is_empty() {
                    // A runtime that streams nothing but the final response.
                    out.line(&r.content)?;
                }
                out.note(&summary_line(&r, started.elapsed()))?;
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
