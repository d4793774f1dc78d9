//! The preprocessing pipeline against Pillow's and mlx-vlm's goldens.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::decode::{exif_orientation, xmp_orientation};
use super::*;

use proptest::prelude::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vision-resize")
}

fn read(rel: &str) -> Vec<u8> {
    let path = fixtures().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn manifest() -> Value {
    serde_json::from_slice(&read("manifest.json")).expect("manifest.json")
}

fn usize_of(v: &Value) -> usize {
    v.as_u64().expect("an integer") as usize
}

fn decode_file(rel: &str) -> Result<RgbImage, ImageError> {
    decode_image(&read(rel), rel, &ImageLimits::default())
}

/// (max |diff|, mean |diff|) of two equally long byte buffers.
fn diff(a: &[u8], b: &[u8]) -> (u8, f64) {
    let mut max = 0;
    let mut sum = 0u64;
    for (&x, &y) in a.iter().zip(b) {
        let d = x.abs_diff(y);
        max = max.max(d);
        sum += u64::from(d);
    }
    (max, sum as f64 / a.len().max(1) as f64)
}

/// Bounds on the zune-jpeg vs libjpeg-turbo difference (and image-webp vs libwebp for lossy
/// WebP), with some room over what the fixtures measure (README there): JPEG at most 3
/// levels, mean 0.35 with 4:2:0 chroma (upsampling differs), 0.04 with 4:4:4 (the IDCT);
/// lossy WebP identical.
const LOSSY_MAX_DIFF: u8 = 4;
const LOSSY_MEAN_DIFF: f64 = 0.5;

#[test]
fn decode_matches_pillow() {
    let m = manifest();
    let mut lossy = Vec::new();
    for case in m["decode"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let img = decode_file(file).unwrap_or_else(|e| panic!("{e}"));
        let want = read(case["rgb"].as_str().unwrap());
        assert_eq!(
            (img.width, img.height),
            (usize_of(&case["width"]), usize_of(&case["height"])),
            "{file}: size"
        );
        if case["exact"].as_bool().unwrap() {
            assert!(
                img.data == want,
                "{file}: not Pillow's bytes ({:?})",
                diff(&img.data, &want)
            );
        } else {
            let (max, mean) = diff(&img.data, &want);
            lossy.push(format!("{file}: max {max}, mean {mean:.3}"));
            assert!(
                max <= LOSSY_MAX_DIFF && mean <= LOSSY_MEAN_DIFF,
                "{file}: max |diff| {max}, mean {mean:.3} vs Pillow"
            );
        }
    }
    assert!(!lossy.is_empty());
    eprintln!("lossy decoders vs Pillow:\n  {}", lossy.join("\n  "));
}

/// `image_size` reads from the header what `decode_image` gives, orientation included.
#[test]
fn sizes_from_headers_match_the_decoded_images() {
    let mut n = 0;
    for e in std::fs::read_dir(fixtures().join("images")).unwrap() {
        let path = e.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let name = path.display().to_string();
        let limits = ImageLimits::default();
        match (
            decode_image(&bytes, &name, &limits),
            image_size(&bytes, &name, &limits),
        ) {
            (Ok(img), Ok(size)) => {
                assert_eq!((img.width, img.height), size, "{name}");
                n += 1;
            }
            (Err(_), _) => {}
            (Ok(_), Err(e)) => panic!("{name}: decodes but its size does not read: {e}"),
        }
    }
    assert!(n > 20, "{n} images compared");
}

#[test]
fn decode_errors() {
    // found by `cargo xtask fuzz --target image`: a 2.7 KB WebP whose metadata chunk
    // claims more bytes than the file holds made image-webp reserve 2.5 GB
    let hostile = "hostile/webp_chunk_claims_2gb.webp";
    let bytes = std::fs::read(fixtures().join(hostile)).unwrap();
    let err = decode_image(&bytes, hostile, &ImageLimits::default()).unwrap_err();
    assert!(
        matches!(&err, ImageError::Decode { message, .. } if message.contains("past the end")),
        "{err}"
    );
    let m = manifest();
    for case in m["decode_errors"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let err = decode_file(file).expect_err(file);
        assert!(err.to_string().contains(file), "{file}: {err}");
        match case.get("error").and_then(Value::as_str) {
            Some("TooLarge") => {
                assert!(matches!(err, ImageError::TooLarge { .. }), "{file}: {err}")
            }
            _ => assert!(
                matches!(err, ImageError::Decode { .. } | ImageError::Empty { .. }),
                "{file}: {err}"
            ),
        }
    }
    let limits = ImageLimits::default();
    let garbage = decode_image(b"definitely not an image", "image 2", &limits).unwrap_err();
    assert!(
        matches!(
            garbage,
            ImageError::UnsupportedFormat { detected: None, .. }
        ),
        "{garbage}"
    );
    assert!(garbage.to_string().starts_with("image 2: "), "{garbage}");
    let gif = decode_image(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "a.gif", &limits).unwrap_err();
    assert!(
        matches!(
            gif,
            ImageError::UnsupportedFormat {
                detected: Some(_),
                ..
            }
        ),
        "{gif}"
    );
    assert!(decode_image(b"", "empty", &limits).is_err());
    // A PNG signature followed by garbage, and every prefix of a small PNG and a JPEG: a
    // typed error each, never a panic.
    let bad = decode_image(b"\x89PNG\r\n\x1a\nnonsense-nonsense", "bad.png", &limits).unwrap_err();
    assert!(matches!(bad, ImageError::Decode { .. }), "{bad}");
    // Pillow still decodes a PNG that lacks its IEND chunk and the IDAT's CRC (the last 20
    // bytes here); JPEG and WebP fail it at any cut.
    for (file, keep) in [
        ("images/orient1_5x3.png", 24),
        ("images/jpeg_q90_420_96x64.jpg", 1),
        ("images/webp_lossless_exif3_37x23.webp", 1),
    ] {
        let bytes = read(file);
        for cut in (0..=bytes.len() - keep).step_by(3) {
            assert!(
                decode_image(&bytes[..cut], file, &limits).is_err(),
                "{file} cut at {cut}"
            );
        }
    }
    // The file-size limit.
    let small = ImageLimits {
        max_bytes: 100,
        ..limits
    };
    let err = decode_image(&read("images/rgb_37x23.png"), "big", &small).unwrap_err();
    assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
    // The pixel limit, just under and at the image's size.
    let bytes = read("images/rgb_37x23.png");
    let tight = ImageLimits {
        max_pixels: 37 * 23 - 1,
        ..limits
    };
    assert!(matches!(
        decode_image(&bytes, "x", &tight),
        Err(ImageError::TooLarge { .. })
    ));
    let exact = ImageLimits {
        max_pixels: 37 * 23,
        ..limits
    };
    assert!(decode_image(&bytes, "x", &exact).is_ok());
}

#[test]
fn resize_matches_pillow() {
    let m = manifest();
    let cases = m["resize"].as_array().unwrap();
    assert!(cases.len() >= 30);
    for case in cases {
        let src = read(case["src"].as_str().unwrap());
        let (w, h, c) = (
            usize_of(&case["width"]),
            usize_of(&case["height"]),
            usize_of(&case["channels"]),
        );
        let (nw, nh) = (usize_of(&case["new_width"]), usize_of(&case["new_height"]));
        let want = read(case["out"].as_str().unwrap());
        let got = resize_bicubic(&src, w, h, c, nw, nh);
        assert!(
            got == want,
            "{} {w}x{h} -> {nw}x{nh}: not Pillow's bytes ({:?})",
            case["mode"],
            diff(&got, &want)
        );
    }
}

fn size_config(m: &Value, name: &str) -> ImageProcessorConfig {
    let c = &m["size_configs"][name];
    ImageProcessorConfig {
        patch_size: usize_of(&c["patch_size"]),
        temporal_patch_size: usize_of(&c["temporal_patch_size"]),
        merge_size: usize_of(&c["merge_size"]),
        min_pixels: usize_of(&c["min_pixels"]),
        max_pixels: usize_of(&c["max_pixels"]),
        ..Default::default()
    }
}

#[test]
fn smart_resize_matches_mlx_vlm() {
    let m = manifest();
    let cases = m["smart_resize"].as_array().unwrap();
    assert!(cases.len() > 500);
    let mut halves = 0;
    for case in cases {
        let cfg = size_config(&m, case["config"].as_str().unwrap());
        let (h, w) = (usize_of(&case["height"]), usize_of(&case["width"]));
        let got = cfg.resized_size(h, w);
        let tokens = cfg.num_image_tokens(h, w);
        if let Some(err) = case.get("error").and_then(Value::as_str) {
            let got = got.expect_err(err);
            if err.starts_with("ValueError: absolute aspect ratio") {
                assert!(
                    matches!(got, ImageError::AspectRatio { .. }),
                    "{h}x{w}: {got}"
                );
            } else {
                assert!(matches!(got, ImageError::Empty { .. }), "{h}x{w}: {got}");
            }
            assert!(tokens.is_err());
            continue;
        }
        let want = case["resized"].as_array().unwrap();
        let got = got.unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, (usize_of(&want[0]), usize_of(&want[1])), "{case}");
        assert_eq!(
            tokens.unwrap(),
            usize_of(&case["num_image_tokens"]),
            "{case}"
        );
        let factor = usize_of(&case["factor"]);
        if (2 * h) % factor == 0 && (2 * h / factor) % 2 == 1 {
            halves += 1;
        }
    }
    assert!(halves >= 40, "only {halves} round-half cases");
    // Round half to even, by hand: 80 / 32 = 2.5 -> 2, 112 / 32 = 3.5 -> 4.
    let cfg = ImageProcessorConfig::default();
    assert_eq!(cfg.resized_size(80, 112).unwrap(), (64, 128));
    let err = cfg.resized_size(1, 300).unwrap_err();
    assert!(matches!(err, ImageError::AspectRatio { .. }), "{err}");
    assert!(err.to_string().contains("300x1"), "{err}");
    let zero_min = ImageProcessorConfig {
        min_pixels: 0,
        ..cfg.clone()
    };
    assert!(matches!(
        zero_min.resized_size(10, 10),
        Err(ImageError::ResizeToZero { .. })
    ));
}

fn processor_config(c: &Value) -> ImageProcessorConfig {
    let mut cfg = ImageProcessorConfig::default();
    let obj = c.as_object().unwrap();
    for (k, v) in obj {
        match k.as_str() {
            "patch_size" => cfg.patch_size = usize_of(v),
            "temporal_patch_size" => cfg.temporal_patch_size = usize_of(v),
            "merge_size" => cfg.merge_size = usize_of(v),
            "min_pixels" => cfg.min_pixels = usize_of(v),
            "max_pixels" => cfg.max_pixels = usize_of(v),
            "do_rescale" => cfg.do_rescale = v.as_bool().unwrap(),
            "do_normalize" => cfg.do_normalize = v.as_bool().unwrap(),
            "image_mean" | "image_std" => {
                let a: Vec<f32> = v
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                let a = [a[0], a[1], a[2]];
                if k == "image_mean" {
                    cfg.image_mean = a;
                } else {
                    cfg.image_std = a;
                }
            }
            other => panic!("processor case key {other}"),
        }
    }
    cfg
}

#[test]
fn prepare_matches_mlx_vlm() {
    let m = manifest();
    for case in m["processor"].as_array().unwrap() {
        let label = case["label"].as_str().unwrap();
        let cfg = processor_config(&case["config"]);
        let file = case["image"].as_str().unwrap();
        let img = decode_file(file).unwrap();
        let got = prepare(&img, &cfg, file).unwrap();
        let thw: Vec<usize> = case["grid_thw"]
            .as_array()
            .unwrap()
            .iter()
            .map(usize_of)
            .collect();
        assert_eq!(got.grid_thw.to_vec(), thw, "{label}");
        assert_eq!(got.row_len(), usize_of(&case["row_len"]), "{label}");
        assert_eq!(
            got.num_tokens(cfg.merge_size),
            usize_of(&case["num_image_tokens"]),
            "{label}"
        );
        assert_eq!(
            cfg.num_image_tokens(img.height, img.width).unwrap(),
            usize_of(&case["num_image_tokens"]),
            "{label}"
        );
        let want: Vec<u32> = read(case["pixel_values"].as_str().unwrap())
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(got.pixel_values.len(), want.len(), "{label}");
        let mismatches = got
            .pixel_values
            .iter()
            .zip(&want)
            .filter(|(g, w)| g.to_bits() != **w)
            .count();
        assert_eq!(
            mismatches, 0,
            "{label}: {mismatches} floats differ from mlx-vlm's"
        );
    }
}

#[test]
fn prepare_errors() {
    let cfg = ImageProcessorConfig::default();
    let wide = RgbImage {
        width: 300,
        height: 1,
        data: vec![7; 900],
    };
    let err = prepare(&wide, &cfg, "wide.png").unwrap_err();
    assert!(matches!(err, ImageError::AspectRatio { .. }), "{err}");
    assert!(err.to_string().starts_with("wide.png: "), "{err}");
    let empty = RgbImage {
        width: 0,
        height: 5,
        data: vec![],
    };
    assert!(matches!(
        prepare(&empty, &cfg, "e"),
        Err(ImageError::Empty { .. })
    ));
    let short = RgbImage {
        width: 4,
        height: 4,
        data: vec![0; 47],
    };
    assert!(matches!(
        prepare(&short, &cfg, "s"),
        Err(ImageError::InvalidImage { .. })
    ));
    let bad = ImageProcessorConfig {
        patch_size: 0,
        ..cfg.clone()
    };
    let ok = RgbImage {
        width: 4,
        height: 4,
        data: vec![0; 48],
    };
    assert!(matches!(
        prepare(&ok, &bad, "ok"),
        Err(ImageError::InvalidConfig { .. })
    ));
    let huge = ImageProcessorConfig {
        min_pixels: usize::MAX / 4,
        ..cfg
    };
    assert!(matches!(
        prepare(&ok, &huge, "ok"),
        Err(ImageError::TooLarge { .. })
    ));
}

#[test]
fn config_loading_matches_mlx_vlm() {
    let m = manifest();
    for case in m["configs"].as_array().unwrap() {
        let dir = fixtures().join(case["dir"].as_str().unwrap());
        let got = ImageProcessorConfig::load(&dir);
        if let Some(bad) = case.get("bad_file").and_then(Value::as_str) {
            let err = got.expect_err(bad);
            match &err {
                ImageError::Config { path, .. } => assert!(path.ends_with(bad), "{err}"),
                other => panic!("{}: {other}", dir.display()),
            }
            assert!(err.to_string().contains(bad), "{err}");
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{e}"));
        let e = &case["expected"];
        let channels = |v: &Value| -> [f32; 3] {
            let a: Vec<f32> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            if a.len() == 1 {
                [a[0]; 3]
            } else {
                [a[0], a[1], a[2]]
            }
        };
        // Python keeps `None` for a null flag; `if None` is false.
        let flag = |v: &Value| v.as_bool().unwrap_or(false);
        let want = ImageProcessorConfig {
            patch_size: usize_of(&e["patch_size"]),
            temporal_patch_size: usize_of(&e["temporal_patch_size"]),
            merge_size: usize_of(&e["merge_size"]),
            min_pixels: usize_of(&e["min_pixels"]),
            max_pixels: usize_of(&e["max_pixels"]),
            image_mean: channels(&e["image_mean"]),
            image_std: channels(&e["image_std"]),
            rescale_factor: e["rescale_factor"].as_f64().unwrap() as f32,
            do_rescale: flag(&e["do_rescale"]),
            do_normalize: flag(&e["do_normalize"]),
            do_convert_rgb: flag(&e["do_convert_rgb"]),
        };
        assert_eq!(got, want, "{}", dir.display());
    }
    // A missing folder is all defaults; a wrongly typed value names its file.
    let missing = ImageProcessorConfig::load(Path::new("/nonexistent/checkpoint")).unwrap();
    assert_eq!(missing, ImageProcessorConfig::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("preprocessor_config.json"),
        r#"{"patch_size": "16"}"#,
    )
    .unwrap();
    let err = ImageProcessorConfig::load(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("preprocessor_config.json"),
        "{err}"
    );
    assert!(err.to_string().contains("patch_size"), "{err}");
    std::fs::write(
        dir.path().join("processor_config.json"),
        r#"{"image_processor": {"size": {"longest_edge": -5}}}"#,
    )
    .unwrap();
    let err = ImageProcessorConfig::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("processor_config.json"), "{err}");
}

#[test]
fn orientation_metadata() {
    // Big- and little-endian EXIF, with and without the JPEG "Exif\0\0" prefix.
    let be = b"MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0\0\0\0\0";
    assert_eq!(exif_orientation(be), Some(6));
    let mut prefixed = b"Exif\0\0".to_vec();
    prefixed.extend_from_slice(b"II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x08\0\0\0\0\0\0\0");
    assert_eq!(exif_orientation(&prefixed), Some(8));
    assert_eq!(exif_orientation(b"MM\0*\0\0\0\x08\0\0"), None);
    assert_eq!(exif_orientation(b"MM\0*\xff\xff\xff\xff"), None);
    assert_eq!(xmp_orientation(br#"<x tiff:Orientation="3"/>"#), Some(3));
    assert_eq!(
        xmp_orientation(b"<tiff:Orientation>5</tiff:Orientation>"),
        Some(5)
    );
    assert_eq!(
        xmp_orientation(b"tiff:Orientation=x tiff:Orientation>7"),
        Some(7)
    );
    assert_eq!(xmp_orientation(b"tiff:Orientation"), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn resize_never_panics(
        w in 0usize..40, h in 0usize..40, c in 1usize..5,
        nw in 0usize..70, nh in 0usize..70, seed in any::<u64>(),
    ) {
        let mut state = seed;
        let src: Vec<u8> = (0..w * h * c).map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 56) as u8
        }).collect();
        let out = resize_bicubic(&src, w, h, c, nw, nh);
        prop_assert_eq!(out.len(), nw * nh * c);
        // A constant image stays constant (the taps of each output sum to 1).
        if w > 0 && h > 0 {
            let flat = vec![src.first().copied().unwrap_or(0); w * h * c];
            let out = resize_bicubic(&flat, w, h, c, nw, nh);
            prop_assert!(out.iter().all(|&v| v == flat[0]));
        }
    }

    #[test]
    fn smart_resize_is_a_multiple_of_factor(h in 1usize..20000, w in 1usize..20000) {
        let cfg = ImageProcessorConfig::default();
        match cfg.resized_size(h, w) {
            Ok((rh, rw)) => {
                prop_assert!(rh > 0 && rw > 0 && rh % 32 == 0 && rw % 32 == 0);
                prop_assert!(rh * rw <= cfg.max_pixels.max(32 * 32));
            }
            Err(ImageError::AspectRatio { .. }) => prop_assert!(h.max(w) > 200 * h.min(w)),
            Err(e) => prop_assert!(false, "{}", e),
        }
    }
}
