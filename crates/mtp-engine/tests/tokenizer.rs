//! The tokenizer's stream decoding: text comes out piece by piece as tokens arrive, a character
//! split across byte-level tokens comes out whole, and the pieces add up to the whole decode.

use std::path::PathBuf;

use mtp_engine::TextTokenizer;

fn tiny() -> TextTokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-hf");
    TextTokenizer::from_dir(&dir).expect("fixture tokenizer")
}

#[test]
fn stream_decoding_matches_whole_decoding() {
    let tok = tiny();
    let text = "fn main() {\n    println!(\"héllo, 日本 🎉\");\n}\n";
    let ids = tok.encode(text).unwrap();
    assert!(ids.len() > text.chars().count(), "byte-level ids");
    let mut d = tok.decoder();
    let mut pieces = Vec::new();
    for &id in &ids {
        if let Some(p) = d.step(id).unwrap() {
            pieces.push(p);
        }
    }
    pieces.push(d.finish().unwrap());
    assert_eq!(pieces.concat(), tok.decode(&ids).unwrap());
    assert_eq!(pieces.concat(), text);
    // no piece holds half a character
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
}

#[test]
fn split_characters_come_out_whole() {
    let tok = tiny();
    let ids = tok.encode("é🎉").unwrap();
    assert_eq!(ids.len(), 6, "2 + 4 UTF-8 bytes, one token each");
    let mut d = tok.decoder();
    assert_eq!(d.step(ids[0]).unwrap(), None);
    assert_eq!(d.step(ids[1]).unwrap().as_deref(), Some("é"));
    for &id in &ids[2..5] {
        assert_eq!(d.step(id).unwrap(), None);
    }
    assert_eq!(d.step(ids[5]).unwrap().as_deref(), Some("🎉"));
    assert_eq!(d.finish().unwrap(), "");
    // a reply that ends inside a character ends with U+FFFD, as a whole decode gives it
    let mut d = tok.decoder();
    assert_eq!(d.step(ids[2]).unwrap(), None);
    assert_eq!(d.finish().unwrap(), tok.decode(&ids[2..3]).unwrap());
}
