//! Images through the native provider (`tests/fixtures/tiny-vl`, a tiny Qwen3.5 with a vision
//! tower, and mlx-vlm 0.7.10's goldens for it): a request with a picture renders the published
//! Qwen3.5 chat template, expands the image's tokens and answers the tokens mlx-vlm gives for
//! the same prompt and image, with MTP on and off; bad images are typed errors naming them.

use std::path::PathBuf;

use base64::Engine as _;
use mtp::{create_llm, GenerateRequest, Message, ProviderError, ProviderOptions, Speculation};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
        .canonicalize()
        .unwrap()
}

fn golden() -> Value {
    let text = std::fs::read_to_string(fixture("tiny-vl").join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn image(file: &str) -> String {
    fixture("tiny-vl").join(file).display().to_string()
}

#[tokio::test]
async fn a_picture_in_the_prompt_answers_as_mlx_vlm() {
    std::env::set_var("HF_HUB_CACHE", tempfile::tempdir().unwrap().path());
    let g = golden();
    let dir = fixture("tiny-vl").display().to_string();
    let llm = create_llm(
        "native",
        &dir,
        ProviderOptions::default()
            .speculation(Speculation::native_mtp().with_num_draft_tokens(2).unwrap()),
    )
    .unwrap();
    assert!(llm.capabilities().images);
    for case in g["cases"].as_array().unwrap() {
        let which = ids(&case["images"]);
        let text = case["messages"][0]["content"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "text")
            .map(|p| p["text"].as_str().unwrap().to_string())
            .unwrap();
        let mut req = GenerateRequest::new(text)
            .max_output_tokens(8)
            .thinking(false);
        for &i in &which {
            req = req.image(image(g["images"][i as usize]["file"].as_str().unwrap()));
        }
        let want = &ids(&case["off"])[..8];
        // the golden ignores the end token: stop before it could matter
        if want.contains(&0) {
            continue;
        }
        for spec in [Speculation::off(), Speculation::depth(2).unwrap()] {
            let r = llm
                .generate(req.clone().speculation(spec.clone()))
                .await
                .unwrap();
            assert_eq!(
                r.token_ids.as_deref(),
                Some(want),
                "images {which:?}, {spec:?}"
            );
            assert_eq!(
                r.usage.input_tokens as usize,
                case["prompt_ids"].as_array().unwrap().len(),
                "the prompt's tokens include the image's"
            );
        }
    }
    // the same image as a data URL, in a history message
    let bytes = std::fs::read(image("images/a.png")).unwrap();
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&bytes)
    );
    let mut m = Message::user("Describe the image.");
    m.images.push(url);
    let r = llm
        .generate(
            GenerateRequest::new("")
                .messages(vec![m])
                .max_output_tokens(4)
                .thinking(false),
        )
        .await
        .unwrap();
    assert_eq!(
        r.token_ids.as_deref(),
        Some(&ids(&g["cases"][0]["off"])[..4])
    );
}

#[tokio::test]
async fn bad_images_are_typed_errors() {
    std::env::set_var("HF_HUB_CACHE", tempfile::tempdir().unwrap().path());
    let dir = fixture("tiny-vl").display().to_string();
    let llm = create_llm("native", &dir, ProviderOptions::default()).unwrap();
    let d = tempfile::tempdir().unwrap();
    let junk = d.path().join("junk.png");
    std::fs::write(&junk, b"this is no picture").unwrap();
    let err = llm
        .generate(GenerateRequest::new("x").image(junk.display().to_string()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidRequest { field: "images", message } if message.contains("junk.png")),
        "{err:?}"
    );
    let err = llm
        .generate(GenerateRequest::new("x").image("https://example.invalid/a.png"))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Unsupported { .. }), "{err:?}");
    let missing = d.path().join("missing.png").display().to_string();
    let err = llm
        .generate(GenerateRequest::new("x").image(missing.clone()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("missing.png"), "{err}");
    // a text-only checkpoint refuses images, naming why
    let text = create_llm(
        "native",
        &fixture("tiny-trained").display().to_string(),
        ProviderOptions::default(),
    )
    .unwrap();
    assert!(!text.capabilities().images);
    let err = text
        .generate(GenerateRequest::new("x").image(image("images/a.png")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::Unsupported { what, .. } if what.contains("vision tower")),
        "{err:?}"
    );
}

/// A chat's second turn resumes the first turn's state when its history holds the same
/// picture, and never when a different picture sits where the first one was; either way the
/// answer is the one a fresh model gives.
#[tokio::test]
async fn the_prefix_cache_keys_on_the_pictures() {
    std::env::set_var("HF_HUB_CACHE", tempfile::tempdir().unwrap().path());
    let dir = fixture("tiny-vl").display().to_string();
    let llm = create_llm("native", &dir, ProviderOptions::default()).unwrap();
    let turn = |img: &str, history: Vec<Message>, text: &str| {
        let mut r = GenerateRequest::new(text)
            .messages(history)
            .max_output_tokens(6)
            .thinking(false);
        if !img.is_empty() {
            r = r.image(image(img));
        }
        r
    };
    let first = llm
        .generate(turn("images/a.png", vec![], "Describe the image.").prompt_cache_key("k"))
        .await
        .unwrap();
    let mut asked = Message::user("Describe the image.");
    asked.images.push(image("images/a.png"));
    let history = vec![asked, Message::assistant(first.content.clone())];
    let second = turn("", history.clone(), "And the colours?");
    let cached = llm
        .generate(second.clone().prompt_cache_key("k"))
        .await
        .unwrap();
    assert!(
        cached.usage.cached_input_tokens > 0,
        "the second turn resumed: {:?}",
        cached.usage
    );
    let fresh = llm.generate(second).await.unwrap();
    assert_eq!(cached.token_ids, fresh.token_ids);
    // another picture in the same place: same token ids, other digests, no resume past it
    let other = turn("images/c.png", vec![], "Describe the image.");
    let r = llm
        .generate(other.clone().prompt_cache_key("k"))
        .await
        .unwrap();
    let fresh = llm.generate(other).await.unwrap();
    assert_eq!(r.token_ids, fresh.token_ids);
    let before_image = 4; // `<|im_start|>user\n<|vision_start|>` at most
    assert!(r.usage.cached_input_tokens <= before_image, "{:?}", r.usage);
}
