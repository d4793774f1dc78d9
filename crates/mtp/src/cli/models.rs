//! `mtp models download|list|verify`.
//!
//! A download is one job: the model and its MTP companion (from `--drafter`, else the
//! `mtp-detect` registry's drafter for a listed target), through the one Hub client
//! (`mtp_detect::hub`) into the standard Hugging Face cache. The companion comes first and
//! each repo's `refs/` is written only when all its files are there, so a model never counts
//! as installed without its companion. Which companion belongs to which model is mtp's own
//! record (`companions.json` in mtp's folder), not a file in the shared cache.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::cli::args::{DownloadArgs, ListArgs, ModelsArgs, ModelsCommand, VerifyArgs};
use crate::cli::error::CliError;
use crate::cli::hub::{self, Companions};
use crate::cli::output::{speculation_phrase, Out};
use crate::{GenerateRequest, ProviderOptions, Sampling, Speculation};
use mtp_contract::ProviderKind;
use mtp_detect::cache::{cached_repo, scan, CachedRepo};
use mtp_detect::hub::{download_snapshot, parse_repo, HubClient, HubConfig, HubError};
use mtp_detect::RepoId;

pub(crate) fn run(
    a: ModelsArgs,
    rt: &tokio::runtime::Runtime,
    out: &mut Out,
) -> Result<(), CliError> {
    match a.command {
        ModelsCommand::Download(d) => rt.block_on(download(d, out)),
        ModelsCommand::List(l) => list(l, out),
        ModelsCommand::Verify(v) => rt.block_on(verify(v, out)),
    }
}

/// The Hub configuration from the environment, with `--token` over `HF_TOKEN` and the
/// token file.
fn hub_config(token: Option<&str>) -> HubConfig {
    let cfg = HubConfig::from_env();
    match token {
        Some(t) if !t.trim().is_empty() => cfg.with_token(Some(t.to_string())),
        _ => cfg,
    }
}

async fn download(a: DownloadArgs, out: &mut Out) -> Result<(), CliError> {
    let repo = parse_repo(&a.repo)?;
    let drafter = a.drafter.as_deref().map(parse_repo).transpose()?;
    mtp_detect::hub::check_revision(&a.revision)?;
    let cache = hub::cache_dir(a.cache_dir.as_deref());
    let cfg = hub_config(a.token.as_deref());
    let client = HubClient::new(cfg.clone())?;
    let companion = match drafter {
        Some(d) => Some(d),
        None => probe_companion(&a, &cache, &cfg, out).await?,
    };
    let mut jobs = Vec::new();
    // The companion first: the model's ref, written last, is what makes the pair installed.
    if let Some(d) = &companion {
        jobs.push((d.clone(), "main".to_string()));
    }
    jobs.push((repo.clone(), a.revision.clone()));
    let started = Instant::now();
    let mut total = 0u64;
    for (r, rev) in &jobs {
        let bars = out.download_bars();
        let result = download_snapshot(&client, &cache, r, rev, &bars).await;
        for n in bars.finish() {
            out.note(&n)?;
        }
        let snap = result?;
        total += snap.downloaded;
        out.note(&format!(
            "{} @ {} ({} files, {} bytes downloaded)",
            snap.repo,
            &snap.commit[..snap.commit.len().min(12)],
            snap.files.len(),
            snap.downloaded
        ))?;
    }
    if let Some(d) = &companion {
        Companions::load()?.set(repo.as_str(), d.as_str())?;
    }
    out.line(&format!(
        "installed {}{} in {} ({} bytes in {:.1} s)",
        a.repo,
        companion
            .as_ref()
            .map(|d| format!(" with its MTP companion {d}"))
            .unwrap_or_default(),
        cache.display(),
        total,
        started.elapsed().as_secs_f64()
    ))?;
    Ok(())
}

/// One line of `mtp models list`.
#[derive(Debug, Serialize)]
struct Row {
    repo: String,
    installed: bool,
    mtp_head: String,
    companion: Option<String>,
    companion_installed: Option<bool>,
    /// The installed models that fetched this repo as their MTP companion.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    drafter_for: Vec<String>,
    path: Option<PathBuf>,
    /// `installed`, or why not.
    state: String,
}

/// A cached repo's state in words.
fn state_of(c: &CachedRepo, companion: Option<(&str, bool)>) -> String {
    if c.snapshot.is_none() {
        return "incomplete (download interrupted)".into();
    }
    if c.incomplete > 0 {
        return format!(
            "incomplete ({} download{} to resume)",
            c.incomplete,
            if c.incomplete == 1 { "" } else { "s" }
        );
    }
    if let Some(f) = c.missing.first() {
        return format!("incomplete (blob of {f} missing)");
    }
    match companion {
        Some((_, false)) => "incomplete (companion missing)".into(),
        _ => "installed".into(),
    }
}

/// The companion to fetch with a model, decided by evidence: `mtp-detect` probes the repo on
/// the Hub (headers only); a model whose weights carry the head needs none, otherwise the
/// registry's companion is fetched with it. A probe that fails is a note, not an error.
async fn probe_companion(
    a: &DownloadArgs,
    cache: &Path,
    cfg: &HubConfig,
    out: &mut Out,
) -> Result<Option<RepoId>, CliError> {
    let mut opts = mtp_detect::ProbeOptions::offline(mtp_detect::CacheConfig::new(cache));
    opts.hub = Some(cfg.clone());
    let spec = if a.revision == "main" {
        a.repo.clone()
    } else {
        format!("{}@{}", a.repo, a.revision)
    };
    let note = match mtp_detect::probe_async(spec, opts).await {
        Ok(r) if r.mtp_head => format!("{}: MTP head embedded in the weights; no companion needed", a.repo),
        Ok(r) if r.role == mtp_detect::Role::Drafter => format!("{} is itself a companion drafter", a.repo),
        Ok(r) => match r.companion {
            Some(c) => {
                let id = parse_repo(&c.repo)?;
                out.note(&format!(
                    "{}: no MTP head in the weights; fetching the registry's companion {}",
                    a.repo, c.repo
                ))?;
                return Ok(Some(id));
            }
            None => format!(
                "{}: no MTP head in the weights and no companion in the registry; pass --drafter REPO if one exists",
                a.repo
            ),
        },
        Err(e) => format!(
            "note: could not probe {} for its MTP head ({e}); pass --drafter REPO if its head ships separately",
            a.repo
        ),
    };
    out.note(&note)?;
    Ok(None)
}

/// The MTP head as the artifact proves it (`mtp-detect`), or the companion recorded at download.
/// `drafter_of` lists the installed models that recorded this repo as their companion.
fn head_status(snapshot: &Path, companion: Option<(&str, bool)>, drafter_of: &[&str]) -> String {
    let report = mtp_detect::probe_local(snapshot);
    let layers = |r: &mtp_detect::ProbeReport| {
        format!(
            "{} layer{}, {} tensors",
            r.mtp_layers,
            if r.mtp_layers == 1 { "" } else { "s" },
            r.mtp_tensor_count
        )
    };
    match (&report, companion) {
        // A drafter is all head; say what it is before what it holds.
        (Ok(r), _) if r.role == mtp_detect::Role::Drafter => {
            let of = if drafter_of.is_empty() {
                String::new()
            } else {
                format!(" for {}", drafter_of.join(", "))
            };
            format!("this is a companion drafter{of} ({})", layers(r))
        }
        (Ok(r), _) if r.mtp_head => format!("embedded ({})", layers(r)),
        (_, Some((c, true))) => format!("companion {c}"),
        (_, Some((c, false))) => format!("companion {c} MISSING"),
        (Ok(r), None) => match &r.companion {
            Some(c) if c.cached => format!("companion {} (registry)", c.repo),
            Some(c) => format!("none here; registry companion {} not cached", c.repo),
            None => "none in the weights".into(),
        },
        (Err(e), None) => format!("unknown ({e})"),
    }
}

fn list(a: ListArgs, out: &mut Out) -> Result<(), CliError> {
    let cache = hub::cache_dir(a.cache_dir.as_deref());
    let all = scan(&cache)?;
    let companions = Companions::load()?;
    let complete = |id: &str| {
        RepoId::parse(id)
            .ok()
            .and_then(|r| cached_repo(&cache, &r))
            .is_some_and(|c| c.is_complete())
    };
    let mut rows = Vec::new();
    for i in &all {
        let id = i.repo.as_str();
        let drafter_of: Vec<&str> = all
            .iter()
            .filter(|t| companions.get(t.repo.as_str()) == Some(id))
            .map(|t| t.repo.as_str())
            .collect();
        let companion = companions.get(id);
        let comp = companion.map(|c| (c, complete(c)));
        let installed = i.is_complete() && comp.is_none_or(|(_, ok)| ok);
        rows.push(Row {
            repo: id.to_string(),
            installed,
            mtp_head: match &i.snapshot {
                Some(s) if i.is_complete() => head_status(s, comp, &drafter_of),
                _ => "–".into(),
            },
            companion: companion.map(str::to_string),
            companion_installed: comp.map(|(_, ok)| ok),
            drafter_for: drafter_of.iter().map(|s| s.to_string()).collect(),
            path: i.snapshot.clone(),
            state: state_of(i, comp),
        });
    }
    if a.json {
        let v = serde_json::to_string_pretty(&rows).map_err(|e| CliError::InvalidFlag {
            flag: "--json",
            message: e.to_string(),
        })?;
        out.line(&v)?;
        return Ok(());
    }
    if rows.is_empty() {
        out.line(&format!("no models in {}", cache.display()))?;
        return Ok(());
    }
    out.line(&format!("models in {}:", cache.display()))?;
    let w = rows.iter().map(|r| r.repo.len()).max().unwrap_or(0);
    for r in &rows {
        out.line(&format!(
            "  {:w$}  {:34}  MTP head: {}",
            r.repo, r.state, r.mtp_head
        ))?;
    }
    Ok(())
}

/// The fixed prompts of `models verify`, each a plain-text continuation (no chat template, so
/// a thinking model answers too) with the word any working language model continues it with.
/// A garbled or mis-converted checkpoint still produces text; it does not produce these.
pub const VERIFY_PROMPTS: [(&str, &str); 3] = [
    ("The capital of France is", "Paris"),
    ("Monday, Tuesday, Wednesday,", "Thursday"),
    ("def fibonacci(n):\n", "return"),
];

/// Why greedy output looks broken, or `None` when it looks sane.
pub fn degenerate(text: &str, token_ids: Option<&[u32]>) -> Option<String> {
    if text.trim().is_empty() {
        return Some("the output is empty".into());
    }
    if text.contains('\u{FFFD}') {
        return Some(
            "the output does not decode to valid UTF-8 (U+FFFD replacement characters)".into(),
        );
    }
    let chars: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    if chars.len() >= 8 {
        let mut distinct = chars.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() <= 2 {
            return Some(format!(
                "the output repeats {} character(s) only",
                distinct.len()
            ));
        }
        // A short unit repeated over the whole tail.
        let tail = &chars[chars.len().saturating_sub(32)..];
        if tail.len() >= 16 {
            for unit in 1..=4 {
                if tail.iter().enumerate().all(|(i, c)| *c == tail[i % unit]) {
                    return Some(format!(
                        "the output ends in a repetition of a {unit}-character unit"
                    ));
                }
            }
        }
    }
    if let Some(ids) = token_ids {
        if ids.len() >= 12 {
            let mut counts = std::collections::HashMap::new();
            for id in ids {
                *counts.entry(*id).or_insert(0usize) += 1;
            }
            let top = counts.values().copied().max().unwrap_or(0);
            if top * 10 > ids.len() * 6 {
                return Some(format!(
                    "one token makes up {top} of {} output tokens",
                    ids.len()
                ));
            }
        }
    }
    None
}

/// The provider and model path `verify` loads: GGUF weights go to the `gguf` provider (the
/// file named by `--file`, else the one model file the folder holds), the rest to `native`,
/// unless `--provider` says otherwise.
fn verify_route(a: &VerifyArgs, model: String) -> Result<(String, String), CliError> {
    let dir = Path::new(&model);
    let file = match &a.file {
        Some(f) => {
            if !mtp_detect::is_safe_relative(f) {
                return Err(CliError::InvalidFlag {
                    flag: "--file",
                    message: format!("`{f}` is not a file name inside the repo"),
                });
            }
            let p = dir.join(f);
            if !p.is_file() {
                return Err(CliError::InvalidFlag {
                    flag: "--file",
                    message: format!("{} does not exist", p.display()),
                });
            }
            Some(p)
        }
        None => None,
    };
    let gguf = match &file {
        Some(p) => mtp_detect::is_gguf_model_file(&p.to_string_lossy()),
        None => {
            dir.is_dir()
                && mtp_detect::probe_local(dir).is_ok_and(|r| r.format == mtp_detect::Format::Gguf)
        }
    };
    let provider = a.provider.clone().unwrap_or_else(|| {
        if gguf || mtp_detect::is_gguf_model_file(&model) {
            ProviderKind::Gguf.name().to_string()
        } else {
            ProviderKind::Native.name().to_string()
        }
    });
    let model = match file {
        Some(p) => p.to_string_lossy().into_owned(),
        None => model,
    };
    Ok((provider, model))
}

async fn verify(a: VerifyArgs, out: &mut Out) -> Result<(), CliError> {
    let path = Path::new(&a.repo);
    let model = if path.exists() {
        a.repo.clone()
    } else {
        let repo = parse_repo(&a.repo)?;
        let cache = hub::cache_dir(a.cache_dir.as_deref());
        let not_installed = |why: String| HubError::NotInstalled {
            repo: a.repo.clone(),
            cache: cache.clone(),
            why,
        };
        let i = cached_repo(&cache, &repo)
            .ok_or_else(|| not_installed("it is not in the cache".into()))?;
        let snap = match (&i.snapshot, i.is_complete()) {
            (Some(s), true) => s.clone(),
            _ => return Err(not_installed("its download did not finish".into()).into()),
        };
        if let Some(c) = Companions::load()?.get(&a.repo) {
            let ok = RepoId::parse(c)
                .ok()
                .and_then(|r| cached_repo(&cache, &r))
                .is_some_and(|x| x.is_complete());
            if !ok {
                return Err(not_installed(format!("its MTP companion {c} is missing")).into());
            }
        }
        snap.to_string_lossy().into_owned()
    };
    let (provider, model) = verify_route(&a, model)?;
    let llm = crate::create_llm(
        &provider,
        &model,
        ProviderOptions::default().speculation(Speculation::native_mtp()),
    )
    .map_err(|source| CliError::Start {
        provider: provider.clone(),
        model: model.clone(),
        source,
    })?;
    let mut failures = Vec::new();
    let mut mtp_checked = false;
    for (prompt, answer) in VERIFY_PROMPTS {
        let req = GenerateRequest::new(prompt)
            .raw()
            .max_output_tokens(a.max_tokens)
            .sampling(Sampling::greedy());
        let repo = a.repo.as_str();
        let generate = |req: GenerateRequest| {
            let llm = llm.clone();
            async move {
                llm.generate(req)
                    .await
                    .map_err(|source| CliError::Provider {
                        context: format!("verifying {repo} on prompt {prompt:?}"),
                        source,
                    })
            }
        };
        let r = generate(req.clone()).await?;
        let excerpt: String = r
            .content
            .chars()
            .take(60)
            .collect::<String>()
            .replace('\n', "⏎");
        let mut why = degenerate(&r.content, r.token_ids.as_deref());
        if why.is_none() && !r.content.contains(answer) {
            why = Some(format!(
                "the greedy continuation does not contain `{answer}`"
            ));
        }
        // With MTP on, greedy output must be the target's own: run it again without drafting.
        let rep = &r.metadata.speculation;
        if why.is_none() && rep.used {
            let plain = generate(req.speculation(Speculation::off())).await?;
            mtp_checked |= plain.content == r.content;
            if plain.content != r.content {
                let at = common_prefix_chars(&plain.content, &r.content);
                let message = format!(
                    "MTP changed the greedy output (it differs from the target-only output after \
                     {at} characters)"
                );
                if rep.output_preserving == Some(true) {
                    why = Some(message);
                } else {
                    out.note(&format!(
                        "{message}; {} does not promise identical output",
                        rep.runtime
                    ))?;
                }
            }
        }
        match why {
            None => out.line(&format!(
                "ok    {prompt:?} → {excerpt:?} · {}",
                speculation_phrase(rep)
            ))?,
            Some(why) => {
                out.line(&format!("FAIL  {prompt:?} → {excerpt:?} · {why}"))?;
                failures.push(format!("{why} on prompt {prompt:?}"));
            }
        }
    }
    if let Some(first) = failures.first() {
        return Err(CliError::Verify {
            model: a.repo,
            message: format!(
                "{} of {} prompts failed; first: {first}",
                failures.len(),
                VERIFY_PROMPTS.len()
            ),
        });
    }
    out.line(&format!(
        "{} passed: {} known-answer prompts answered, greedy output well-formed{}",
        a.repo,
        VERIFY_PROMPTS.len(),
        if mtp_checked {
            " and identical with MTP on and off"
        } else {
            " (MTP was not used, so not checked)"
        }
    ))?;
    Ok(())
}

/// Characters two strings share from the start.
fn common_prefix_chars(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}
