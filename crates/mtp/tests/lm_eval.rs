//! lm-evaluation-harness (`lm_eval`, `local-completions` with `tokenizer_backend=remote`) on
//! two small inline tasks against the real `mtp serve` on the bundled demo model: a
//! multiple-choice task (loglikelihood: `echo`, integer `logprobs`, token-id prompts, the
//! tokenizer routes) and a generate_until task, at lm-eval's default batching. Each choice's
//! log-likelihood lm-eval computed from the server's answers is checked against an independent
//! computation: the engine's logits for each prefix through its public API in this process,
//! log-softmaxed here, over the tokens lm-eval's own `_encode_pair` gives.
//!
//! Needs `lm_eval` (`MTP_LM_EVAL_PYTHON`: an interpreter with `lm-eval[api]`; `cargo xtask
//! test` prepares it).

#[allow(dead_code)]
mod common;

use common::{demo_model, Killed};

use std::path::Path;
use std::process::Stdio;

use candle_core::Device;
use mtp_engine::{Engine, TextTokenizer, WeightDtype};
use serde_json::Value;

/// The sum of the log probabilities of `continuation` after `context`, tokenized as
/// lm-evaluation-harness's `_encode_pair` does (trailing spaces of the context moved to the
/// continuation; the whole encoded, the context's tokens cut off).
fn loglikelihood(engine: &Engine, tok: &TextTokenizer, context: &str, continuation: &str) -> f64 {
    let trimmed = context.trim_end();
    let (context, continuation) = (
        trimmed,
        format!("{}{continuation}", &context[trimmed.len()..]),
    );
    let whole = tok
        .encode_with(&format!("{context}{continuation}"), false, true)
        .unwrap();
    let ctx = tok.encode_with(context, false, true).unwrap();
    let mut sum = 0.0;
    for i in ctx.len()..whole.len() {
        let row = engine.prompt_logits(&whole[..i]).unwrap();
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        sum += row[whole[i] as usize] as f64 - z;
    }
    sum
}

/// The samples file lm-eval wrote for `task` under `out`.
fn samples(out: &Path, task: &str) -> Vec<Value> {
    let mut found = Vec::new();
    let mut stack = vec![out.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("samples_{task}_")))
            {
                found.extend(
                    std::fs::read_to_string(&p)
                        .unwrap()
                        .lines()
                        .map(|l| serde_json::from_str::<Value>(l).unwrap()),
                );
            }
        }
    }
    found
}

#[test]
#[ignore = "needs lm-evaluation-harness (MTP_LM_EVAL_PYTHON); cargo xtask test prepares it"]
fn lm_eval_local_completions_scores_what_the_engine_computes() {
    let python = std::env::var_os("MTP_LM_EVAL_PYTHON")
        .expect("MTP_LM_EVAL_PYTHON: cargo xtask test prepares lm-evaluation-harness");
    let srv = Killed(common::spawn_serve(
        demo_model().to_str().unwrap(),
        &["--num-draft-tokens", "3"],
        Stdio::inherit(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lm_eval");
    let st = std::process::Command::new(&python)
        .arg(here.join("tasks.py"))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    let out = dir.path().join("out");
    let run = std::process::Command::new(&python)
        .args([
            "-m",
            "lm_eval",
            "run",
            "--model",
            "local-completions",
            "--model_args",
        ])
        .arg(format!(
            "model=tiny-code,base_url={}/v1/completions,tokenizer_backend=remote,\
             num_concurrent=1,max_retries=1",
            srv.0.base
        ))
        .args(["--tasks", "mtp_mc,mtp_gen", "--include_path"])
        .arg(dir.path())
        .arg("--output_path")
        .arg(&out)
        .arg("--log_samples")
        // nothing is downloaded: the data is local, the tokenizer the server's
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", dir.path().join("hf"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "lm_eval failed:\n{err}");

    let engine = Engine::load(&demo_model(), &Device::Cpu, WeightDtype::default()).unwrap();
    let tok = TextTokenizer::from_dir(&demo_model()).unwrap();
    let mc = samples(&out, "mtp_mc");
    assert_eq!(mc.len(), 3, "{mc:?}");
    for s in &mc {
        // `{"gen_args_N": {"arg_0": context, "arg_1": continuation}}`, one per choice
        let resps = s["resps"].as_array().unwrap();
        assert!(resps.len() >= 2, "one response per choice: {s}");
        for (i, r) in resps.iter().enumerate() {
            let a = &s["arguments"][format!("gen_args_{i}")];
            let (ctx, cont) = (a["arg_0"].as_str().unwrap(), a["arg_1"].as_str().unwrap());
            let got: f64 = r[0][0]
                .as_f64()
                .or_else(|| r[0][0].as_str().and_then(|x| x.parse().ok()))
                .unwrap();
            let want = loglikelihood(&engine, &tok, ctx, cont);
            assert!(
                (got - want).abs() < 1e-3 * (1.0 + want.abs()),
                "{ctx:?} + {cont:?}: lm-eval {got} vs engine {want}"
            );
        }
    }
    let gen = samples(&out, "mtp_gen");
    assert_eq!(gen.len(), 3);
    for s in &gen {
        // a generation came back (the greedy text, at most 8 tokens)
        assert!(s["resps"][0][0].is_string(), "{s}");
    }
}
