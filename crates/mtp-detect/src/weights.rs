//! Reading the names of an artifact's weights through a [`Reader`]: the safetensors index or
//! the 8-byte length and JSON header of each file, and a GGUF header from a growing prefix.
//! Used by the probe and by the companion-drafter check alike, so it sits below both.

use std::collections::BTreeMap;

use crate::error::DetectError;
use crate::gguf::{parse_gguf, GgufErrorKind, GgufHeader, GgufParse};
use crate::source::{FileEntry, Reader};
use crate::st::{header_len, parse_header, parse_index, StHeader, MAX_INDEX_LEN};

/// The index file of a sharded safetensors checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The most safetensors headers read for one probe.
pub(crate) const MAX_HEADERS: usize = 64;

/// Tensor names with their dtype when a header gave one.
pub(crate) type WeightNames = Vec<(String, Option<String>)>;

/// Reads every tensor name of a safetensors artifact listed in `files`: from the index when
/// there is one (names only; the weight map is returned too), else from each file's header.
pub(crate) fn read_weight_names(
    reader: &dyn Reader,
    files: &[FileEntry],
    only: Option<&str>,
    files_read: &mut Vec<String>,
) -> Result<(WeightNames, Option<BTreeMap<String, String>>), DetectError> {
    if only.is_none() && files.iter().any(|f| f.path == INDEX_FILE) {
        if let Some(b) = reader.read_small(INDEX_FILE, MAX_INDEX_LEN)? {
            files_read.push(INDEX_FILE.to_string());
            let wm = parse_index(&b, &reader.describe(INDEX_FILE))?;
            let names = wm.keys().map(|k| (k.clone(), None)).collect();
            return Ok((names, Some(wm)));
        }
    }
    let mut out = Vec::new();
    let st: Vec<&FileEntry> = files
        .iter()
        .filter(|f| match only {
            Some(o) => f.path == o,
            None => f.path.to_ascii_lowercase().ends_with(".safetensors"),
        })
        .take(MAX_HEADERS)
        .collect();
    for f in st {
        let h = read_st_header(reader, &f.path, files_read)?;
        out.extend(h.tensors.into_iter().map(|t| (t.name, Some(t.dtype))));
    }
    Ok((out, None))
}

/// Reads exactly the 8-byte length and the JSON header of one safetensors file.
pub(crate) fn read_st_header(
    reader: &dyn Reader,
    file: &str,
    files_read: &mut Vec<String>,
) -> Result<StHeader, DetectError> {
    let desc = reader.describe(file);
    let (first, total) = reader.read_range(file, 0, 8)?;
    let n = header_len(&first, total, &desc)?;
    let (json, _) = reader.read_range(file, 8, n)?;
    if (json.len() as u64) < n {
        return Err(DetectError::Safetensors {
            file: desc,
            message: format!("header of {n} bytes was cut at {} bytes", json.len()),
        });
    }
    files_read.push(file.to_string());
    parse_header(&json, total, &desc)
}

/// Reads a GGUF header through `reader`, growing the prefix from `first` up to `cap` when
/// the metadata is longer. Returns the header and whether it is complete.
pub fn read_gguf_header(
    reader: &dyn Reader,
    file: &str,
    first: u64,
    cap: u64,
) -> Result<(GgufHeader, bool), DetectError> {
    let desc = reader.describe(file);
    let (mut buf, total) = reader.read_range(file, 0, first.min(cap).max(8))?;
    loop {
        match parse_gguf(&buf, total) {
            Ok(GgufParse::Complete(h)) => return Ok((h, true)),
            Ok(GgufParse::NeedMore { needed, partial }) => {
                let limit = cap.min(total);
                let have = buf.len() as u64;
                if have >= limit {
                    return Ok((partial, false));
                }
                let want = needed.max(have.saturating_mul(2)).min(limit);
                let (more, _) = reader.read_range(file, have, want - have)?;
                if more.is_empty() {
                    return Err(DetectError::Gguf {
                        file: desc,
                        kind: GgufErrorKind::Truncated {
                            what: "header".into(),
                            at: have,
                            needed: want - have,
                            file_len: have,
                        },
                    });
                }
                buf.extend_from_slice(&more);
            }
            Err(kind) => return Err(DetectError::Gguf { file: desc, kind }),
        }
    }
}
