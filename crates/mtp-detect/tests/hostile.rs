//! Truncated, corrupt and hostile files: a typed error naming the file and what is wrong, no
//! panic, no allocation sized by an untrusted length. Plus a bounded property test over both
//! header parsers.

mod common;

use common::*;
use mtp_detect::gguf::{parse_gguf, GgufErrorKind, GgufParse};
use mtp_detect::st::{header_len, parse_header, parse_index};
use mtp_detect::{probe_local, DetectError};
use proptest::prelude::*;

fn gguf_prelude(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(tensors.to_le_bytes());
    b.extend(kvs.to_le_bytes());
    b
}

fn key(b: &mut Vec<u8>, k: &str, tag: u32) {
    b.extend((k.len() as u64).to_le_bytes());
    b.extend(k.as_bytes());
    b.extend(tag.to_le_bytes());
}

/// (case, file bytes, expected error kind check)
type GgufCase = (&'static str, Vec<u8>, fn(&GgufErrorKind) -> bool);

fn gguf_cases() -> Vec<GgufCase> {
    let mut cases: Vec<GgufCase> = Vec::new();
    cases.push(("wrong magic", b"GGML\x03\0\0\0".to_vec(), |k| {
        matches!(k, GgufErrorKind::BadMagic { .. })
    }));
    cases.push(("version 1", gguf_prelude(1, 0, 0), |k| {
        matches!(k, GgufErrorKind::UnsupportedVersion(1))
    }));
    cases.push(("truncated header", b"GGUF\x03\0\0\0\0\0".to_vec(), |k| {
        matches!(k, GgufErrorKind::Truncated { .. })
    }));
    // absurd metadata count
    cases.push(
        ("absurd metadata count", gguf_prelude(3, 0, u64::MAX), |k| {
            matches!(k, GgufErrorKind::AbsurdCount { .. })
        }),
    );
    // absurd tensor count
    cases.push(("absurd tensor count", gguf_prelude(3, 1 << 40, 0), |k| {
        matches!(k, GgufErrorKind::AbsurdCount { .. })
    }));
    // string length beyond the file
    let mut b = gguf_prelude(3, 0, 1);
    key(&mut b, "general.name", 8);
    b.extend(1_000_000u64.to_le_bytes());
    b.extend(b"short");
    cases.push(("string length beyond the file", b, |k| {
        matches!(k, GgufErrorKind::Truncated { .. })
    }));
    // string length above the cap
    let mut b = gguf_prelude(3, 0, 1);
    key(&mut b, "general.name", 8);
    b.extend(u64::MAX.to_le_bytes());
    cases.push(("string length above the cap", b, |k| {
        matches!(k, GgufErrorKind::TooLong { .. })
    }));
    // absurd array length
    let mut b = gguf_prelude(3, 0, 1);
    key(&mut b, "tokenizer.ggml.tokens", 9);
    b.extend(8u32.to_le_bytes());
    b.extend((u64::MAX / 2).to_le_bytes());
    cases.push(("absurd array length", b, |k| {
        matches!(k, GgufErrorKind::AbsurdCount { .. })
    }));
    // deep nesting: arrays of arrays 100 deep
    let mut b = gguf_prelude(3, 0, 1);
    key(&mut b, "deep", 9);
    for _ in 0..100 {
        b.extend(9u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
    }
    b.extend(0u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    cases.push(("deep nesting", b, |k| {
        matches!(k, GgufErrorKind::TooDeep { .. })
    }));
    // invalid UTF-8 key
    let mut b = gguf_prelude(3, 0, 1);
    b.extend(2u64.to_le_bytes());
    b.extend([0xff, 0xfe]);
    b.extend(4u32.to_le_bytes());
    b.extend(1u32.to_le_bytes());
    cases.push(("invalid UTF-8 key", b, |k| {
        matches!(k, GgufErrorKind::InvalidUtf8 { .. })
    }));
    // unknown value type
    let mut b = gguf_prelude(3, 0, 1);
    key(&mut b, "x", 99);
    b.extend(0u64.to_le_bytes());
    cases.push(("unknown value type", b, |k| {
        matches!(k, GgufErrorKind::UnknownType { tag: 99, .. })
    }));
    // too many dims
    let mut b = gguf_prelude(3, 1, 0);
    b.extend(1u64.to_le_bytes());
    b.extend(b"t");
    b.extend(1000u32.to_le_bytes());
    b.extend([0u8; 64]);
    cases.push(("too many dims", b, |k| {
        matches!(k, GgufErrorKind::TooManyDims { .. })
    }));
    // a valid header cut mid-table (the whole file, so it is truncation, not a short prefix)
    let full = qwen35_gguf("qwen35", 4, 1, true, true).to_bytes();
    let cut = full[..full.len() / 3].to_vec();
    cases.push(("file cut inside the header", cut, |k| {
        matches!(
            k,
            GgufErrorKind::Truncated { .. } | GgufErrorKind::AbsurdCount { .. }
        )
    }));
    cases
}

#[test]
fn hostile_gguf_headers_give_typed_errors_naming_the_file() {
    for (name, bytes, check) in gguf_cases() {
        match parse_gguf(&bytes, bytes.len() as u64) {
            Err(k) => assert!(check(&k), "{name}: wrong error {k:?}"),
            Ok(p) => panic!("{name}: parsed {p:?}"),
        }
        // Through the probe: the error names the file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evil.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let e = probe_local(&path).unwrap_err();
        assert!(matches!(e, DetectError::Gguf { .. }), "{name}: {e:?}");
        let msg = e.to_string();
        assert!(msg.contains("evil.gguf"), "{name}: {msg}");
    }
}

#[test]
fn a_short_prefix_of_a_valid_file_asks_for_more() {
    let full = qwen35_gguf("qwen35", 4, 1, true, true).to_bytes();
    for cut in [10, 30, 100, full.len() / 2] {
        match parse_gguf(&full[..cut], full.len() as u64).unwrap() {
            GgufParse::NeedMore { needed, .. } => assert!(needed > cut as u64),
            GgufParse::Complete(_) => panic!("complete at {cut}"),
        }
    }
}

#[test]
fn hostile_safetensors_give_typed_errors_naming_the_file() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "shorter than 8 bytes",
            b"abc".to_vec(),
            "shorter than the 8-byte",
        ),
        (
            "header length beyond the file",
            {
                let mut b = 1_000u64.to_le_bytes().to_vec();
                b.extend(b"{}");
                b
            },
            "beyond the end",
        ),
        (
            "header length above the cap",
            {
                let mut b = u64::MAX.to_le_bytes().to_vec();
                b.extend(b"{}");
                b
            },
            "above the limit",
        ),
        (
            "invalid UTF-8 header",
            {
                let mut b = 4u64.to_le_bytes().to_vec();
                b.extend([b'{', 0xff, 0xfe, b'}']);
                b
            },
            "not valid UTF-8",
        ),
        (
            "deep nesting",
            {
                let json = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
                let mut b = (json.len() as u64).to_le_bytes().to_vec();
                b.extend(json.as_bytes());
                b
            },
            "not valid JSON",
        ),
        (
            "not an object",
            {
                let mut b = 2u64.to_le_bytes().to_vec();
                b.extend(b"[]");
                b
            },
            "not a JSON object",
        ),
        (
            "data offsets beyond the file",
            {
                let json = br#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16000]}}"#;
                let mut b = (json.len() as u64).to_le_bytes().to_vec();
                b.extend(json);
                b
            },
            "outside the",
        ),
        (
            "absurd rank",
            {
                let json = format!(
                    r#"{{"a":{{"dtype":"F32","shape":[{}],"data_offsets":[0,0]}}}}"#,
                    vec!["1"; 100].join(",")
                );
                let mut b = (json.len() as u64).to_le_bytes().to_vec();
                b.extend(json.as_bytes());
                b
            },
            "rank 100",
        ),
    ];
    for (name, bytes, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evil.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        let e = probe_local(&path).unwrap_err();
        assert!(
            matches!(e, DetectError::Safetensors { .. }),
            "{name}: {e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains("evil.safetensors"), "{name}: {msg}");
        assert!(msg.contains(want), "{name}: {msg}");
    }
}

#[test]
fn non_json_index_and_config_give_typed_errors() {
    let cases: Vec<(&str, &str, &[u8], &str)> = vec![
        (
            "model.safetensors.index.json",
            "non-JSON index",
            b"not json at all",
            "not valid JSON",
        ),
        (
            "model.safetensors.index.json",
            "index without weight_map",
            b"{}",
            "no `weight_map`",
        ),
        (
            "model.safetensors.index.json",
            "index naming ../ shards",
            br#"{"weight_map":{"mtp.fc.weight":"../../etc/passwd"}}"#,
            "unsafe path",
        ),
        (
            "config.json",
            "non-JSON config",
            b"\xff\xfe",
            "not valid UTF-8",
        ),
    ];
    for (file, name, bytes, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &[("a.weight", safetensors::Dtype::F32)],
            None,
        );
        std::fs::write(dir.path().join(file), bytes).unwrap();
        let e = probe_local(dir.path()).unwrap_err();
        assert!(matches!(e, DetectError::Json { .. }), "{name}: {e:?}");
        let msg = e.to_string();
        assert!(msg.contains(file) && msg.contains(want), "{name}: {msg}");
    }
    // A config larger than its cap is refused without reading it.
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[("a.weight", safetensors::Dtype::F32)],
        None,
    );
    let f = std::fs::File::create(dir.path().join("config.json")).unwrap();
    f.set_len(5 * 1024 * 1024).unwrap();
    let e = probe_local(dir.path()).unwrap_err();
    assert!(matches!(e, DetectError::TooLarge { .. }), "{e:?}");
}

#[test]
fn empty_dir_and_missing_path_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = probe_local(dir.path()).unwrap_err();
    assert!(matches!(e, DetectError::NoWeights { .. }), "{e:?}");
    let e = probe_local(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(e, DetectError::NotFound { .. }), "{e:?}");
}

fn valid_gguf() -> Vec<u8> {
    let mut w = qwen35_gguf("qwen35", 2, 1, true, true);
    w.kv.push((
        "nested".into(),
        V::Arr(
            9,
            vec![
                V::Arr(4, vec![V::U32(1), V::U32(2)]),
                V::Arr(8, vec![V::s("x")]),
            ],
        ),
    ));
    w.kv.push(("f".into(), V::F64(1.5)));
    w.kv.push(("b".into(), V::Bool(true)));
    w.kv.push(("i".into(), V::I16(-3)));
    w.data_len = 0;
    w.to_bytes()
}

fn valid_st() -> Vec<u8> {
    let json = br#"{"__metadata__":{"format":"pt"},"mtp.fc.weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}"#;
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend(json);
    b.extend([0u8; 8]);
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, max_shrink_iters: 200, .. ProptestConfig::default() })]

    /// Random bytes, and random mutations and cuts of a valid header: the GGUF parser returns
    /// a result or a typed error, never panics, for any prefix length.
    #[test]
    fn gguf_parser_never_panics(
        noise in proptest::collection::vec(any::<u8>(), 0..512),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        prefix in any::<prop::sample::Index>(),
    ) {
        let _ = parse_gguf(&noise, noise.len() as u64);
        let mut b = valid_gguf();
        for (i, v) in flips {
            let at = i.index(b.len());
            b[at] = v;
        }
        let end = cut.index(b.len() + 1);
        let b = &b[..end];
        let _ = parse_gguf(b, b.len() as u64);
        let p = prefix.index(b.len() + 1);
        if let Ok(GgufParse::NeedMore { needed, .. }) = parse_gguf(&b[..p], b.len() as u64) {
            prop_assert!(needed > p as u64 && needed <= b.len() as u64);
        }
    }

    /// The same for the safetensors header and index parsers.
    #[test]
    fn safetensors_parsers_never_panic(
        noise in proptest::collection::vec(any::<u8>(), 0..512),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let _ = header_len(&noise, noise.len() as u64, "noise");
        let _ = parse_header(&noise, noise.len() as u64, "noise");
        let _ = parse_index(&noise, "noise");
        let mut b = valid_st();
        for (i, v) in flips {
            let at = i.index(b.len());
            b[at] = v;
        }
        let end = cut.index(b.len() + 1);
        let b = &b[..end];
        if let Ok(n) = header_len(b, b.len() as u64, "m") {
            prop_assert!(n + 8 <= b.len() as u64);
            let _ = parse_header(&b[8..8 + n as usize], b.len() as u64, "m");
        }
    }
}
