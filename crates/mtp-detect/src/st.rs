//! Safetensors headers and `model.safetensors.index.json`: the tensor names, dtypes and
//! shapes, read without touching tensor data.
//!
//! A safetensors file starts with an 8-byte little-endian header length `n`, then `n` bytes
//! of JSON. [`header_len`] reads the first, [`parse_header`] the second; a probe fetches
//! exactly those bytes.
//!
//! ```
//! use mtp_detect::st::{header_len, parse_header};
//! let json = br#"{"mtp.fc.weight":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]}}"#;
//! let mut file = (json.len() as u64).to_le_bytes().to_vec();
//! file.extend_from_slice(json);
//! file.extend_from_slice(&[0u8; 16]);
//! let n = header_len(&file[..8], file.len() as u64, "m.safetensors").unwrap();
//! let h = parse_header(&file[8..8 + n as usize], file.len() as u64, "m.safetensors").unwrap();
//! assert_eq!(h.tensors[0].name, "mtp.fc.weight");
//! ```

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::DetectError;

/// The largest safetensors header accepted (the `safetensors` crate's own limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// The largest `model.safetensors.index.json` accepted.
pub const MAX_INDEX_LEN: u64 = 64 * 1024 * 1024;
/// The most dimensions per tensor accepted.
pub const MAX_RANK: usize = 16;

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StTensor {
    /// Its name.
    pub name: String,
    /// Its dtype (`BF16`, `F32`, `U32`, …).
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<u64>,
}

/// A parsed safetensors header.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StHeader {
    /// The tensors, sorted by name.
    pub tensors: Vec<StTensor>,
    /// The `__metadata__` map (e.g. `{"format": "mlx"}`).
    pub metadata: BTreeMap<String, String>,
}

fn bad(file: &str, message: impl Into<String>) -> DetectError {
    DetectError::Safetensors {
        file: file.to_string(),
        message: message.into(),
    }
}

/// Reads the 8-byte header length and checks it against the cap and the file's length.
pub fn header_len(first8: &[u8], file_len: u64, file: &str) -> Result<u64, DetectError> {
    let Some(b) = first8.get(..8) else {
        return Err(bad(
            file,
            format!(
                "file is {} bytes, shorter than the 8-byte header length",
                first8.len()
            ),
        ));
    };
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    let n = u64::from_le_bytes(a);
    if n > MAX_HEADER_LEN {
        return Err(bad(
            file,
            format!("header length {n} is above the limit of {MAX_HEADER_LEN} bytes"),
        ));
    }
    if n.saturating_add(8) > file_len {
        return Err(bad(
            file,
            format!("header length {n} runs beyond the end of the {file_len}-byte file"),
        ));
    }
    if n < 2 {
        return Err(bad(
            file,
            format!("header length {n} is too short for JSON"),
        ));
    }
    Ok(n)
}

/// Parses the JSON header (the `n` bytes after the length) of a file of `file_len` bytes.
pub fn parse_header(json: &[u8], file_len: u64, file: &str) -> Result<StHeader, DetectError> {
    let text = std::str::from_utf8(json)
        .map_err(|e| bad(file, format!("header is not valid UTF-8 ({e})")))?;
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| bad(file, format!("header is not valid JSON ({e})")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(bad(file, "header is not a JSON object"));
    };
    let data_len = file_len.saturating_sub(8 + json.len() as u64);
    let mut h = StHeader::default();
    for (name, v) in map {
        if name == "__metadata__" {
            let serde_json::Value::Object(m) = v else {
                return Err(bad(file, "`__metadata__` is not an object"));
            };
            for (k, v) in m {
                let serde_json::Value::String(s) = v else {
                    return Err(bad(file, format!("`__metadata__.{k}` is not a string")));
                };
                h.metadata.insert(k, s);
            }
            continue;
        }
        let t = tensor_entry(&name, &v, data_len).map_err(|m| bad(file, m))?;
        h.tensors.push(t);
    }
    h.tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(h)
}

fn tensor_entry(name: &str, v: &serde_json::Value, data_len: u64) -> Result<StTensor, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("tensor `{name}` is not an object"))?;
    let dtype = obj
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| format!("tensor `{name}` has no string `dtype`"))?;
    let shape_v = obj
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or_else(|| format!("tensor `{name}` has no `shape` array"))?;
    if shape_v.len() > MAX_RANK {
        return Err(format!(
            "tensor `{name}` has rank {}, above {MAX_RANK}",
            shape_v.len()
        ));
    }
    let shape = shape_v
        .iter()
        .map(|d| d.as_u64())
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| format!("tensor `{name}` has a non-integer dimension"))?;
    let offs = obj
        .get("data_offsets")
        .and_then(|o| o.as_array())
        .filter(|o| o.len() == 2)
        .and_then(|o| Some((o[0].as_u64()?, o[1].as_u64()?)))
        .ok_or_else(|| format!("tensor `{name}` has no `data_offsets` pair"))?;
    if offs.0 > offs.1 || offs.1 > data_len {
        return Err(format!(
            "tensor `{name}` data [{}, {}) lies outside the {data_len}-byte data section",
            offs.0, offs.1
        ));
    }
    Ok(StTensor {
        name: name.to_string(),
        dtype: dtype.to_string(),
        shape,
    })
}

/// Parses `model.safetensors.index.json`: its `weight_map` (tensor name → shard file).
/// Shard names must be plain relative paths (no `..`, no leading `/`).
pub fn parse_index(bytes: &[u8], file: &str) -> Result<BTreeMap<String, String>, DetectError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| DetectError::json(file, format!("index is not valid UTF-8 ({e})")))?;
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| DetectError::json(file, format!("index is not valid JSON ({e})")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| DetectError::json(file, "index has no `weight_map` object"))?;
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let shard = v.as_str().ok_or_else(|| {
            DetectError::json(file, format!("`weight_map.{k}` is not a file name"))
        })?;
        if !crate::names::is_safe_relative(shard) {
            return Err(DetectError::json(
                file,
                format!(
                    "`weight_map.{}` names an unsafe path `{}`",
                    crate::names::shown_name(k),
                    crate::names::shown_name(shard)
                ),
            ));
        }
        out.insert(k.clone(), shard.to_string());
    }
    Ok(out)
}
