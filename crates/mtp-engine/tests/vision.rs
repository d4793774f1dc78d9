//! Images on the native lane against mlx-vlm 0.7.10 (`tests/fixtures/tiny-vl/golden.json`,
//! written by `tests/fixtures/make_vl.py` with mlx-vlm's own processor, vision tower,
//! `get_rope_index` and generate loops): the vision features of each image within 1e-4, the
//! expanded prompt ids and multimodal position ids equal, first-step logits within 1e-3, and
//! 32 greedy tokens identical with MTP off and at depths 1-3, for 3 images x 2 prompts, two
//! images in one prompt and a text-only prompt; with the weights as stored and in f32.

use std::path::PathBuf;
use std::sync::Arc;

use mtp_engine::{Engine, GenerateOptions, WeightDtype};
use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-vl")
}

fn golden() -> Value {
    let text = std::fs::read_to_string(fixture().join("golden.json")).expect("golden.json");
    serde_json::from_str(&text).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("floats")
        .iter()
        .map(|x| x.as_f64().expect("f") as f32)
        .collect()
}

fn load(dtype: WeightDtype) -> Engine {
    Engine::load(&fixture(), &candle_core::Device::Cpu, dtype).expect("load tiny-vl")
}

fn encode_all(engine: &Engine, g: &Value) -> Vec<mtp_engine::vision::EncodedImage> {
    g["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|img| {
            let file = img["file"].as_str().unwrap();
            let bytes = std::fs::read(fixture().join(file)).expect("image file");
            engine.encode_image(&bytes, file).expect("encode")
        })
        .collect()
}

#[test]
fn vision_features_match_mlx_vlm() {
    let g = golden();
    for dtype in [WeightDtype::Stored, candle_core::DType::F32.into()] {
        let engine = load(dtype);
        let encoded = encode_all(&engine, &g);
        for (img, enc) in g["images"].as_array().unwrap().iter().zip(&encoded) {
            let thw = ids(&img["grid_thw"]);
            let m = 2;
            let want_grid = [thw[0] as usize, thw[1] as usize / m, thw[2] as usize / m];
            assert_eq!(enc.grid, want_grid, "{}", img["file"]);
            assert_eq!(
                enc.num_tokens(),
                img["num_tokens"].as_u64().unwrap() as usize
            );
            let want: Vec<f32> = img["features"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(floats)
                .collect();
            assert_eq!(enc.features.len(), want.len());
            let worst = enc
                .features
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-4, "{}: max |feature delta| {worst}", img["file"]);
            eprintln!(
                "{} ({dtype:?}): max |feature delta| {worst:.2e}",
                img["file"]
            );
        }
    }
}

#[test]
fn prompts_with_images_match_mlx_vlm() {
    let g = golden();
    for dtype in [WeightDtype::Stored, candle_core::DType::F32.into()] {
        let engine = load(dtype);
        let tok = engine.tokenizer().expect("tokenizer");
        let encoded = encode_all(&engine, &g);
        for (ci, case) in g["cases"].as_array().unwrap().iter().enumerate() {
            let which: Vec<usize> = ids(&case["images"]).iter().map(|&i| i as usize).collect();
            let images: Vec<_> = which.iter().map(|&i| encoded[i].clone()).collect();
            let rendered = tok
                .encode(case["prompt"].as_str().unwrap())
                .expect("encode");
            let (prompt, mm) = if images.is_empty() {
                (rendered, None)
            } else {
                let (p, m) = engine.multimodal_prompt(&rendered, &images).expect("place");
                (p, Some(m))
            };
            assert_eq!(
                prompt,
                ids(&case["prompt_ids"]),
                "case {ci}: expanded prompt ids"
            );
            if let Some(m) = &mm {
                let pos = m
                    .position_ids(0, prompt.len())
                    .expect("multimodal positions");
                for axis in 0..3 {
                    let got: Vec<u32> = pos.iter().map(|p| p[axis] as u32).collect();
                    assert_eq!(
                        got,
                        ids(&case["position_ids"][axis]),
                        "case {ci}: position ids, axis {axis}"
                    );
                }
                assert_eq!(m.rope_delta(), case["rope_delta"].as_i64().unwrap());
            }
            let mut opts = GenerateOptions::greedy(32).ignore_eos(true);
            opts.images = mm;
            let logits = engine.prompt_logits_with(&prompt, &opts).expect("logits");
            let want = floats(&case["first_logits"]);
            let worst = logits
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-3,
                "case {ci} {dtype:?}: max |logit delta| {worst}"
            );
            let off = engine.generate(&prompt, &opts, |_| true).expect("generate");
            assert_eq!(
                off.tokens,
                ids(&case["off"]),
                "case {ci} {dtype:?}: target-only"
            );
            for depth in 1..=3 {
                let o = opts.clone().num_draft_tokens(depth);
                let on = engine
                    .generate(&prompt, &o, |_| true)
                    .expect("generate mtp");
                assert!(on.speculation.as_ref().is_some_and(|s| s.used));
                assert_eq!(
                    on.tokens,
                    ids(&case["on"][depth.to_string()]),
                    "case {ci} {dtype:?}: MTP depth {depth}"
                );
                assert_eq!(on.tokens, off.tokens);
            }
        }
    }
}

/// The batch scheduler gives a prompt with images the tokens it gets alone.
#[test]
fn batched_prompts_with_images_match_solo() {
    use mtp_engine::batch::Batch;
    let g = golden();
    let engine = load(WeightDtype::Stored);
    let tok = engine.tokenizer().unwrap();
    let encoded = encode_all(&engine, &g);
    let cases = g["cases"].as_array().unwrap();
    let mut batch = Batch::new(&engine);
    let mut want = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let which: Vec<usize> = ids(&case["images"]).iter().map(|&i| i as usize).collect();
        let images: Vec<_> = which.iter().map(|&i| encoded[i].clone()).collect();
        let rendered = tok.encode(case["prompt"].as_str().unwrap()).unwrap();
        let mut opts = GenerateOptions::greedy(16).ignore_eos(true);
        let prompt = if images.is_empty() {
            rendered
        } else {
            let (p, m) = engine.multimodal_prompt(&rendered, &images).unwrap();
            opts.images = Some(m);
            p
        };
        if ci % 2 == 1 {
            opts = opts.num_draft_tokens(2);
        }
        want.push(ids(&case["off"])[..16].to_vec());
        batch.join(ci as u64, &prompt, &opts);
    }
    let mut done = Vec::new();
    while batch.active() > 0 {
        batch.step(&mut |_, _| true);
        done.extend(batch.take_finished());
    }
    done.extend(batch.take_finished());
    assert_eq!(done.len(), cases.len());
    for (id, out) in done {
        assert_eq!(out.expect("batched").tokens, want[id as usize], "case {id}");
    }
}

/// Wrong inputs are typed errors naming what is at fault.
#[test]
fn bad_images_are_refused() {
    let engine = load(WeightDtype::Stored);
    let err = engine
        .encode_image(b"not an image", "junk.png")
        .unwrap_err();
    assert!(err.to_string().contains("junk.png"), "{err}");
    let png = std::fs::read(fixture().join("images/a.png")).unwrap();
    let err = engine
        .encode_image(&png[..png.len() / 2], "half.png")
        .unwrap_err();
    assert!(err.to_string().contains("half.png"), "{err}");
    let img = engine.encode_image(&png, "a.png").unwrap();
    // placeholders and images must agree
    let tok = engine.tokenizer().unwrap();
    let two = tok
        .encode("<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>x")
        .unwrap();
    assert!(engine
        .multimodal_prompt(&two, std::slice::from_ref(&img))
        .is_err());
    // images given for another prompt
    let (p, m) = engine
        .multimodal_prompt(&two, &[img.clone(), img.clone()])
        .unwrap();
    let mut opts = GenerateOptions::greedy(2);
    opts.images = Some(m);
    assert!(engine.generate(&p[1..], &opts, |_| true).is_err());
    // a text-only checkpoint says it has no vision tower
    let text = Engine::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-mlx"),
        &candle_core::Device::Cpu,
        WeightDtype::Stored,
    )
    .unwrap();
    let err = text.encode_image(&png, "a.png").unwrap_err();
    assert!(err.to_string().contains("vision tower"), "{err}");
    assert!(text.check_images(1).is_err() && text.check_images(0).is_ok());
}

/// A state taken after a prompt with one picture resumes a longer prompt with the same picture
/// (and gives the tokens of a fresh run), and is not used for a prompt whose picture differs
/// though its token ids are the same; with MTP on and off, and after the state was written
/// as bytes and read back.
#[test]
fn resumed_states_hold_their_pictures() {
    let g = golden();
    let engine = load(WeightDtype::Stored);
    let tok = engine.tokenizer().unwrap();
    let png = std::fs::read(fixture().join("images/a.png")).unwrap();
    let a = engine.encode_image(&png, "a.png").unwrap();
    // the same grid, other features: another picture of the same size
    let mut other = a.clone();
    other.features = a.features.iter().map(|v| -v).collect::<Vec<_>>().into();
    other.digest[0] ^= 1;
    let rendered = tok
        .encode(g["cases"][0]["prompt"].as_str().unwrap())
        .unwrap();
    let (prompt, mm) = engine
        .multimodal_prompt(&rendered, std::slice::from_ref(&a))
        .unwrap();
    let (_, mm_other) = engine.multimodal_prompt(&rendered, &[other]).unwrap();
    let longer: Vec<u32> = prompt
        .iter()
        .copied()
        .chain(tok.encode("ok").unwrap())
        .collect();
    for depth in [0, 2] {
        let mut opts = GenerateOptions::greedy(6)
            .ignore_eos(true)
            .num_draft_tokens(depth);
        opts.images = Some(mm.clone());
        let first = engine
            .generate(&prompt, &opts.clone().checkpoint(true), |_| true)
            .unwrap();
        let taken = first.states.after_prompt.expect("a state after the prompt");
        // also written as bytes and read back (a prefix cache on disk): it keeps its pictures
        let bytes = taken.to_bytes();
        let read = engine.state_from_bytes(&bytes).unwrap();
        assert_eq!(read.to_bytes(), bytes);
        for state in [taken, read].map(Arc::new) {
            opts.images = Some(mm.clone());
            let fresh = engine.generate(&longer, &opts, |_| true).unwrap();
            let resumed = engine
                .generate(
                    &longer,
                    &opts.clone().resume_from(Arc::clone(&state)),
                    |_| true,
                )
                .unwrap();
            assert_eq!(resumed.computed_prompt_tokens, longer.len() - prompt.len());
            assert_eq!(resumed.tokens, fresh.tokens, "depth {depth}");
            // the other picture: the state is not used
            opts.images = Some(mm_other.clone());
            let fresh = engine.generate(&longer, &opts, |_| true).unwrap();
            let refused = engine
                .generate(
                    &longer,
                    &opts.clone().resume_from(Arc::clone(&state)),
                    |_| true,
                )
                .unwrap();
            assert_eq!(
                refused.computed_prompt_tokens,
                longer.len(),
                "depth {depth}"
            );
            assert_eq!(refused.tokens, fresh.tokens, "depth {depth}");
        }
    }
}

/// A picture sent again is not encoded again (the same features come back), and another
/// picture is encoded on its own.
#[test]
fn encoded_images_are_kept_by_digest() {
    let engine = load(WeightDtype::Stored);
    let a = std::fs::read(fixture().join("images/a.png")).unwrap();
    let c = std::fs::read(fixture().join("images/c.png")).unwrap();
    let first = engine.encode_image(&a, "a.png").unwrap();
    let other = engine.encode_image(&c, "c.png").unwrap();
    let again = engine.encode_image(&a, "a-again.png").unwrap();
    assert!(std::sync::Arc::ptr_eq(&first.features, &again.features));
    assert!(!std::sync::Arc::ptr_eq(&first.features, &other.features));
    assert_eq!(first.digest, again.digest);
    assert_ne!(first.digest, other.digest);
    // a changed byte is another picture
    let mut b = a.clone();
    let last = b.len() - 1;
    b[last] ^= 1;
    let changed = engine.encode_image(&b, "changed.png");
    if let Ok(ch) = changed {
        assert_ne!(ch.digest, first.digest);
    }
}
