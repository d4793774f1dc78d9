//! Reading artifacts into a report: safetensors headers and index, `config.json`, GGUF
//! headers (split files included).

use super::*;

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
fn read_st_header(
    reader: &dyn Reader,
    file: &str,
    files_read: &mut Vec<String>,
) -> Result<crate::st::StHeader, DetectError> {
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

fn read_config(
    reader: &dyn Reader,
    files_read: &mut Vec<String>,
) -> Result<Option<ConfigInfo>, DetectError> {
    match reader.read_small("config.json", MAX_CONFIG_LEN)? {
        Some(b) => {
            files_read.push("config.json".into());
            Ok(Some(parse_config(&b, &reader.describe("config.json"))?))
        }
        None => Ok(None),
    }
}

pub(super) fn probe_safetensors(
    reader: &dyn Reader,
    files: &[FileEntry],
    chosen: Option<&FileEntry>,
    opts: &ProbeOptions,
    files_read: &mut Vec<String>,
) -> Result<ProbeReport, DetectError> {
    let mut r = empty_report(Format::Safetensors);
    let cfg = read_config(reader, files_read)?;
    let reg = opts.registry();
    if let Some(c) = &cfg {
        r.model_type = c.model_type.clone();
        r.arch = c.model_type.clone();
        r.hidden_size = c.hidden_size;
        r.vocab_size = c.vocab_size;
        r.base_layers = c.num_hidden_layers;
        if let Some((k, n)) = &c.mtp_claim {
            r.config_claim = Some(format!("{k} = {n}"));
        }
        r.config_claims_mtp = c.claims_mtp();
        let mt = c.model_type.as_deref().unwrap_or_default();
        if reg.runtimes.is_drafter_type(mt) {
            r.role = Role::Drafter;
        }
    }
    let base = r.base_layers;
    let only = chosen.map(|f| f.path.as_str());
    let (mut names, index) = read_weight_names(reader, files, only, files_read)?;
    let pairs = |names: &[(String, Option<String>)]| -> MtpTensorSummary {
        let it = names.iter().map(|(n, d)| (n.as_str(), d.as_deref()));
        match r.role {
            Role::Drafter => MtpTensorSummary::from_drafter_names(it),
            Role::Target => MtpTensorSummary::from_names(it, base),
        }
    };
    let mut summary = pairs(&names);
    if let Some(wm) = index.filter(|_| !summary.is_empty()) {
        // The index gives names only: read the headers of the shards that hold the head,
        // for its dtypes.
        let mut shards: Vec<&String> = summary.tensors.iter().filter_map(|t| wm.get(t)).collect();
        shards.sort();
        shards.dedup();
        let mut dtypes: BTreeMap<String, String> = BTreeMap::new();
        for shard in shards.into_iter().take(MAX_HEADERS) {
            let h = read_st_header(reader, shard, files_read)?;
            dtypes.extend(h.tensors.into_iter().map(|t| (t.name, t.dtype)));
        }
        for (n, d) in names.iter_mut() {
            if let Some(dt) = dtypes.get(n) {
                *d = Some(dt.clone());
            }
        }
        summary = pairs(&names);
    }
    apply_summary(&mut r, &summary);
    if let Some((n, _)) = names
        .iter()
        .find(|(n, _)| crate::tensors::vision_tensor_key(n).is_some())
    {
        r.vision = true;
        r.vision_evidence = Some(n.clone());
    }
    r.mlx_quantized_weights = cfg.as_ref().is_some_and(|c| c.quant_bits.is_some())
        || names
            .iter()
            .any(|(n, _)| crate::tensors::is_mlx_quant_tensor(n));
    if r.role == Role::Drafter {
        // A drafter without its core tensors is no head at all.
        let keys: Vec<&str> = summary
            .tensors
            .iter()
            .filter_map(|n| crate::tensors::drafter_tensor_key(n))
            .collect();
        let has_core = keys
            .iter()
            .any(|k| k.starts_with("fc.") || k.starts_with("eh_proj."))
            && !summary.layers.is_empty();
        if !has_core {
            r.mtp_head = false;
            r.warnings.push(format!(
                "config.json declares drafter type `{}` but the weights lack its core tensors (fc/eh_proj and layers.N.*)",
                r.model_type.as_deref().unwrap_or_default()
            ));
        }
    }
    if let Some(c) = &cfg {
        let claim = c.mtp_claim.clone();
        match (&claim, r.mtp_head) {
            (Some((k, n)), false) if *n > 0 && r.role == Role::Target => r.warnings.push(format!(
                "config.json claims {n} MTP layer(s) (`{k}`) but the weights carry no MTP tensors; the claim is ignored (MLX quantizations that drop the head keep this key)"
            )),
            (Some((k, n)), true) if *n != r.mtp_layers && r.role == Role::Target => {
                r.warnings.push(format!(
                    "config.json claims {n} MTP layer(s) (`{k}`) but the weights carry {}",
                    r.mtp_layers
                ))
            }
            (None, true) if r.role == Role::Target => r.warnings.push(
                "the weights carry MTP tensors that config.json does not declare; loaders that read only the config will ignore the head".into(),
            ),
            _ => {}
        }
        if c.quant_bits.is_some() {
            r.mlx_affine_quantized |= r.mtp_head && summary.mlx_affine_quantized;
        }
        if r.role == Role::Target
            && r.mtp_head
            && summary.styles.contains(&MtpStyle::MtpPrefix)
            && (c.quant_bits.is_some() || summary.mlx_affine_quantized)
        {
            r.warnings.push(
                "an MLX checkpoint that keeps mtp.* tensors: released mlx-lm (0.31.3 and earlier) mis-loads it without an error; load it through mlx-vlm".into(),
            );
        }
    } else {
        r.warnings
            .push("no config.json: architecture and base depth unknown; NextN layers are recognised by their eh_proj/enorm/hnorm tensors only".into());
    }
    if r.mtp_head && !r.mtp_dtypes.is_empty() {
        r.evidence.truncate(EVIDENCE_NAMES + 1);
    }
    Ok(r)
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
                        kind: gguf::GgufErrorKind::Truncated {
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

/// `(stem, index, count)` of a split GGUF name `…-00001-of-00003.gguf`.
pub(crate) fn split_parts(name: &str) -> Option<(&str, u32, u32)> {
    let base = name.strip_suffix(".gguf")?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, idx) = rest.rsplit_once('-')?;
    if idx.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((stem, idx.parse().ok()?, count.parse().ok()?))
}

/// Whether `name` (a file name or repo-relative path) is a GGUF one loads as a model: a
/// `.gguf` that is not a vision projector (`mmproj*`) and, of a split model, the first shard
/// (llama.cpp finds the others from it).
pub fn is_gguf_model_file(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l.ends_with(".gguf")
        && !l.rsplit('/').next().unwrap_or(&l).starts_with("mmproj")
        && split_parts(name).is_none_or(|(_, i, _)| i == 1)
}

fn choose_gguf<'a>(
    files: &'a [FileEntry],
    style: CommandStyle,
    warnings: &mut Vec<String>,
) -> Option<&'a FileEntry> {
    let candidates: Vec<&FileEntry> = files
        .iter()
        .filter(|f| is_gguf_model_file(&f.path))
        .collect();
    let pick = candidates
        .iter()
        .find(|f| f.path.to_ascii_uppercase().contains("Q4_K_M"))
        .or_else(|| candidates.first())
        .copied();
    if let Some(p) = pick {
        if candidates.len() > 1 {
            let how = match style {
                CommandStyle::Cli => "pass --file NAME to choose another",
                CommandStyle::Library => "set ProbeOptions::file to choose another",
            };
            warnings.push(format!(
                "{} GGUF files; probed {} ({how})",
                candidates.len(),
                p.path
            ));
        }
    }
    pick
}

pub(super) fn probe_gguf(
    reader: &dyn Reader,
    files: &[FileEntry],
    chosen: Option<&FileEntry>,
    opts: &ProbeOptions,
    files_read: &mut Vec<String>,
) -> Result<ProbeReport, DetectError> {
    let mut r = empty_report(Format::Gguf);
    let file = match chosen {
        Some(f) => f,
        None => choose_gguf(files, opts.style, &mut r.warnings).ok_or_else(|| {
            DetectError::NoWeights {
                place: reader.place(),
            }
        })?,
    };
    r.file = Some(file.path.clone());
    // llama.cpp's vision lane is a separate projector file (mtmd's `--mmproj`)
    if let Some(m) = files.iter().find(|f| {
        let l = f.path.to_ascii_lowercase();
        let base = l.rsplit('/').next().unwrap_or(&l);
        base.starts_with("mmproj") && base.ends_with(".gguf")
    }) {
        r.vision = true;
        r.vision_evidence = Some(m.path.clone());
    }
    let (h, complete) = read_gguf_header(reader, &file.path, opts.gguf_prefix, opts.gguf_cap)?;
    files_read.push(file.path.clone());
    let arch = h.architecture().map(String::from);
    let key_layers = h.nextn_predict_layers();
    let block_count = h.block_count();
    r.arch = arch.clone();
    r.base_layers = match (block_count, key_layers) {
        (Some(b), Some(n)) => b.checked_sub(n),
        (Some(b), None) => Some(b),
        _ => None,
    };
    let mut tensors: Vec<(String, String)> = h
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.type_name()))
        .collect();
    let mut all_complete = complete;
    // Split GGUF: the NextN blocks are usually in the last shard.
    if let Some((stem, 1, count)) = split_parts(&file.path) {
        for i in 2..=count.min(256) {
            let name = format!("{stem}-{i:05}-of-{count:05}.gguf");
            if !files.iter().any(|f| f.path == name) {
                r.warnings
                    .push(format!("split GGUF shard {name} is missing"));
                continue;
            }
            let (sh, c) = read_gguf_header(reader, &name, SHARD_PREFIX, opts.gguf_cap)?;
            files_read.push(name);
            all_complete &= c;
            tensors.extend(sh.tensors.iter().map(|t| (t.name.clone(), t.type_name())));
        }
    }
    let summary = MtpTensorSummary::from_names(
        tensors.iter().map(|(n, d)| (n.as_str(), Some(d.as_str()))),
        r.base_layers,
    );
    apply_summary(&mut r, &summary);
    let key = arch.as_deref().map(|a| format!("{a}.nextn_predict_layers"));
    match (key_layers, r.mtp_head, all_complete) {
        (Some(n), true, _) => {
            if let Some(k) = &key {
                r.evidence.insert(0, format!("{k} = {n}"));
            }
        }
        (Some(n), false, false) if n > 0 => {
            r.mtp_head = true;
            r.mtp_layers = n;
            r.mtp_style = Some(MtpStyle::GgufNextN);
            if let Some(k) = &key {
                r.evidence.push(format!("{k} = {n}"));
            }
            r.warnings.push(format!(
                "the tensor table lies beyond the {}-byte read cap; the head is inferred from the header key alone",
                opts.gguf_cap
            ));
        }
        (Some(n), false, true) if n > 0 => r.warnings.push(format!(
            "the header declares {n} NextN layer(s) ({}) but no blk.N.nextn.* tensor exists; no head",
            key.clone().unwrap_or_default()
        )),
        (None, true, _) => r.warnings.push(format!(
            "blk.N.nextn.* tensors without a `{}` key; llama.cpp will not load them as a head",
            key.clone().unwrap_or_default()
        )),
        _ => {}
    }
    Ok(r)
}
