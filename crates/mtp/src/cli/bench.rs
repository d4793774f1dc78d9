//! `mtp bench`: what MTP is worth on any provider. One loaded model; each prompt and depth is
//! generated with speculation off and on **per call** (never two differently loaded runtimes),
//! in interleaved A/B order (off-on, on-off, …) after one warm-up of each; medians reported.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cli::args::BenchArgs;
use crate::cli::error::CliError;
use crate::cli::open_provider;
use crate::cli::output::Out;
use crate::{GenerateRequest, GenerateResponse, Provider, ProviderError, Reason, Speculation};

/// The built-in prompts: code, prose and a repetitive table.
pub const DEFAULT_PROMPTS: [(&str, &str); 3] = [
    (
        "code",
        "Write a Rust function that returns the n-th Fibonacci number, with a unit test.",
    ),
    (
        "prose",
        "Explain in one short paragraph why the sky is blue.",
    ),
    (
        "table",
        "Print a markdown table of the numbers 1 to 20 with their squares and cubes.",
    ),
];

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `(name, prompt)` pairs.
    pub prompts: Vec<(String, String)>,
    /// Depths to sweep; `None` is the provider's default depth.
    pub depths: Vec<Option<u32>>,
    /// Interleaved on/off repetitions per prompt and depth (at least 1).
    pub reps: u32,
    /// Tokens per call.
    pub max_tokens: u32,
    /// Send the prompts verbatim (no chat template).
    pub raw: bool,
}

/// One row of the table: one prompt at one depth.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BenchRow {
    /// Prompt name.
    pub prompt: String,
    /// The depth the on-calls reported (or asked for).
    pub depth: Option<u32>,
    /// Median decode tok/s with speculation off.
    pub tok_s_off: f64,
    /// Median decode tok/s with speculation on.
    pub tok_s_on: f64,
    /// `tok_s_on / tok_s_off`.
    pub speedup: f64,
    /// Whether the on-calls really drafted.
    pub used: bool,
    /// Why not, when they did not.
    pub reason: Option<Reason>,
    /// Accepted / drafted over the on-calls.
    pub acceptance: Option<f64>,
    /// Mean accepted proposals per round.
    pub accepted_per_round: Option<f64>,
    /// Mean tokens per round (accepted + the target's own).
    pub tokens_per_round: Option<f64>,
    /// `speedup / tokens_per_round`.
    pub efficiency: Option<f64>,
    /// Every on-call's text equals the off-call's text.
    pub identical: bool,
    /// Measured repetitions of each side.
    pub reps: u32,
}

fn rate(r: &GenerateResponse, wall: Duration) -> f64 {
    r.metadata.timings.decode_tokens_per_s.unwrap_or_else(|| {
        let s = wall.as_secs_f64();
        if s > 0.0 {
            r.usage.output_tokens as f64 / s
        } else {
            0.0
        }
    })
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

async fn timed(
    llm: &dyn Provider,
    prompt: &str,
    opts: &BenchOptions,
    spec: Speculation,
) -> Result<(GenerateResponse, f64), ProviderError> {
    let mut req = GenerateRequest::new(prompt)
        .max_output_tokens(opts.max_tokens)
        .speculation(spec);
    if opts.raw {
        req = req.raw();
    }
    let t = Instant::now();
    let r = llm.generate(req).await?;
    let tps = rate(&r, t.elapsed());
    Ok((r, tps))
}

/// Runs the interleaved A/B benchmark over any provider (greedy decoding).
pub async fn bench_rows(
    llm: &dyn Provider,
    opts: &BenchOptions,
) -> Result<Vec<BenchRow>, ProviderError> {
    let reps = opts.reps.max(1);
    let mut rows = Vec::new();
    for (name, prompt) in &opts.prompts {
        for depth in &opts.depths {
            let on_spec = match depth {
                Some(d) => Speculation::native_mtp().with_num_draft_tokens(*d)?,
                None => Speculation::native_mtp(),
            };
            // Warm-up, not measured.
            timed(llm, prompt, opts, Speculation::off()).await?;
            timed(llm, prompt, opts, on_spec.clone()).await?;
            let (mut off, mut on) = (Vec::new(), Vec::new());
            let (mut off_texts, mut on_texts) = (Vec::new(), Vec::new());
            let mut reports = Vec::new();
            for rep in 0..reps {
                let order = if rep % 2 == 0 {
                    [false, true]
                } else {
                    [true, false]
                };
                for speculate in order {
                    if speculate {
                        let (r, tps) = timed(llm, prompt, opts, on_spec.clone()).await?;
                        on.push(tps);
                        on_texts.push(r.content.clone());
                        reports.push(r.metadata.speculation);
                    } else {
                        let (r, tps) = timed(llm, prompt, opts, Speculation::off()).await?;
                        off.push(tps);
                        off_texts.push(r.content);
                    }
                }
            }
            let used = reports.iter().all(|r| r.used);
            let reason = reports.iter().find_map(|r| r.reason);
            let (mut drafted, mut accepted, mut rounds, mut known) = (0u64, 0u64, 0u64, true);
            for r in &reports {
                match (r.drafted, r.accepted, r.rounds) {
                    (Some(d), Some(a), Some(n)) => {
                        drafted += d;
                        accepted += a;
                        rounds += n;
                    }
                    _ => known = false,
                }
            }
            let known = known && used && rounds > 0;
            let tok_s_off = median(&mut off);
            let tok_s_on = median(&mut on);
            let speedup = if tok_s_off > 0.0 {
                tok_s_on / tok_s_off
            } else {
                0.0
            };
            let tokens_per_round = known.then(|| (accepted + rounds) as f64 / rounds as f64);
            let reference = off_texts.first().cloned().unwrap_or_default();
            rows.push(BenchRow {
                prompt: name.clone(),
                depth: reports.first().and_then(|r| r.num_draft_tokens).or(*depth),
                tok_s_off,
                tok_s_on,
                speedup,
                used,
                reason,
                acceptance: (known && drafted > 0).then(|| accepted as f64 / drafted as f64),
                accepted_per_round: known.then(|| accepted as f64 / rounds as f64),
                tokens_per_round,
                efficiency: tokens_per_round.map(|t| speedup / t),
                identical: off_texts
                    .iter()
                    .chain(on_texts.iter())
                    .all(|t| *t == reference),
                reps,
            });
        }
    }
    Ok(rows)
}

/// The rows as a markdown table.
pub fn markdown_table(rows: &[BenchRow]) -> String {
    let mut s = String::from(
        "| prompt | depth | tok/s off | tok/s on | speedup | acceptance | accepted/round | efficiency | identical |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |\n",
    );
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map(f).unwrap_or_else(|| "–".into());
    for r in rows {
        let acceptance = if r.used {
            opt(r.acceptance, &|a| format!("{:.0}%", a * 100.0))
        } else {
            format!(
                "not used ({})",
                r.reason
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "unknown".into())
            )
        };
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.2}× | {} | {} | {} | {} |\n",
            r.prompt,
            r.depth
                .map(|d| d.to_string())
                .unwrap_or_else(|| "default".into()),
            r.tok_s_off,
            r.tok_s_on,
            r.speedup,
            acceptance,
            opt(r.accepted_per_round, &|a| format!("{a:.2}")),
            opt(r.efficiency, &|e| format!("{e:.2}")),
            if r.identical { "yes" } else { "no" },
        ));
    }
    s
}

pub(crate) async fn run(a: BenchArgs, out: &mut Out) -> Result<(), CliError> {
    let (llm, model) = open_provider(&a.model, out).await?;
    if a.reps == 0 {
        return Err(CliError::InvalidFlag {
            flag: "--reps",
            message: "must be at least 1".into(),
        });
    }
    let st = llm.speculation_status();
    if !st.lane_loaded {
        return Err(CliError::Bench {
            provider: llm.name().to_string(),
            model,
            message: format!(
                "no MTP lane is loaded{}, so there is nothing to compare{}",
                st.reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                st.message.map(|m| format!(": {m}")).unwrap_or_default()
            ),
        });
    }
    for d in &a.depths {
        Speculation::depth(*d)?;
    }
    let prompts = if a.prompts.is_empty() {
        DEFAULT_PROMPTS
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect()
    } else {
        a.prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("prompt {}", i + 1), p.clone()))
            .collect()
    };
    let depths = if a.depths.is_empty() {
        vec![None]
    } else {
        a.depths.iter().map(|d| Some(*d)).collect()
    };
    let opts = BenchOptions {
        prompts,
        depths,
        reps: a.reps,
        max_tokens: a.max_tokens,
        raw: a.raw,
    };
    out.note(&format!(
        "bench: {} on {} · {} prompt(s) × {} depth(s) × {} interleaved rep(s) of off/on · {} tokens each",
        model,
        llm.name(),
        opts.prompts.len(),
        opts.depths.len(),
        opts.reps,
        opts.max_tokens
    ))?;
    let rows = bench_rows(llm.as_ref(), &opts)
        .await
        .map_err(|source| CliError::Provider {
            context: format!("benchmark of {model} failed"),
            source,
        })?;
    if a.json {
        let v = serde_json::to_string_pretty(&rows).map_err(|e| CliError::InvalidFlag {
            flag: "--json",
            message: e.to_string(),
        })?;
        out.line(&v)?;
    } else {
        out.text(&markdown_table(&rows))?;
    }
    Ok(())
}
