//! Reading artifacts into a report: safetensors headers and index, `config.json`, GGUF
//! headers (split files included).

use super::*;
use crate::tensors::{drafter_tensor_key, is_mlx_quant_tensor, vision_tensor_key};
use crate::weights::WeightNames;

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
    if let Some(c) = &cfg {
        apply_config(&mut r, c, opts.registry());
    }
    let only = chosen.map(|f| f.path.as_str());
    let (mut names, index) = read_weight_names(reader, files, only, files_read)?;
    let mut summary = summarise(&names, r.role, r.base_layers);
    if let Some(wm) = index.filter(|_| !summary.is_empty()) {
        // The index gives names only: read the headers of the shards that hold the head,
        // for its dtypes.
        read_head_dtypes(reader, &wm, &summary, &mut names, files_read)?;
        summary = summarise(&names, r.role, r.base_layers);
    }
    apply_summary(&mut r, &summary);
    if let Some((n, _)) = names.iter().find(|(n, _)| vision_tensor_key(n).is_some()) {
        r.vision = true;
        r.vision_evidence = Some(n.clone());
    }
    r.mlx_quantized_weights = cfg.as_ref().is_some_and(|c| c.quant_bits.is_some())
        || names.iter().any(|(n, _)| is_mlx_quant_tensor(n));
    if r.role == Role::Drafter {
        check_drafter_core(&mut r, &summary);
    }
    match &cfg {
        Some(c) => config_warnings(&mut r, c, &summary),
        None => r.warnings.push(
            "no config.json: architecture and base depth unknown; NextN layers are recognised by their eh_proj/enorm/hnorm tensors only".into(),
        ),
    }
    if r.mtp_head && !r.mtp_dtypes.is_empty() {
        r.evidence.truncate(EVIDENCE_NAMES + 1);
    }
    Ok(r)
}

/// What `config.json` says goes into the report as it is: type, sizes, base depth, the MTP
/// claim, and whether the checkpoint is a companion drafter.
fn apply_config(r: &mut ProbeReport, c: &ConfigInfo, reg: &Registry) {
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

/// The head among `names`, by the rules of the artifact's role.
fn summarise(names: &WeightNames, role: Role, base: Option<u64>) -> MtpTensorSummary {
    let it = names.iter().map(|(n, d)| (n.as_str(), d.as_deref()));
    match role {
        Role::Drafter => MtpTensorSummary::from_drafter_names(it),
        Role::Target => MtpTensorSummary::from_names(it, base),
    }
}

/// Fills in the dtypes of the head's tensors from the headers of the shards that hold them
/// (`wm`, the index's weight map), at most [`MAX_HEADERS`] of them.
fn read_head_dtypes(
    reader: &dyn Reader,
    wm: &BTreeMap<String, String>,
    summary: &MtpTensorSummary,
    names: &mut WeightNames,
    files_read: &mut Vec<String>,
) -> Result<(), DetectError> {
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
    Ok(())
}

/// A drafter without its core tensors (fc or eh_proj, and layers.N.*) is no head at all.
fn check_drafter_core(r: &mut ProbeReport, summary: &MtpTensorSummary) {
    let keys: Vec<&str> = summary
        .tensors
        .iter()
        .filter_map(|n| drafter_tensor_key(n))
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

/// Where the config's claim and the weights disagree, and what MLX quantization means for the
/// head: warnings, and the head's quantization flag.
fn config_warnings(r: &mut ProbeReport, c: &ConfigInfo, summary: &MtpTensorSummary) {
    let target = r.role == Role::Target;
    match (&c.mtp_claim, r.mtp_head) {
        (Some((k, n)), false) if *n > 0 && target => r.warnings.push(format!(
            "config.json claims {n} MTP layer(s) (`{k}`) but the weights carry no MTP tensors; the claim is ignored (MLX quantizations that drop the head keep this key)"
        )),
        (Some((k, n)), true) if *n != r.mtp_layers && target => r.warnings.push(format!(
            "config.json claims {n} MTP layer(s) (`{k}`) but the weights carry {}",
            r.mtp_layers
        )),
        (None, true) if target => r.warnings.push(
            "the weights carry MTP tensors that config.json does not declare; loaders that read only the config will ignore the head".into(),
        ),
        _ => {}
    }
    if c.quant_bits.is_some() {
        r.mlx_affine_quantized |= r.mtp_head && summary.mlx_affine_quantized;
    }
    if target
        && r.mtp_head
        && summary.styles.contains(&MtpStyle::MtpPrefix)
        && (c.quant_bits.is_some() || summary.mlx_affine_quantized)
    {
        r.warnings.push(
            "an MLX checkpoint that keeps mtp.* tensors: released mlx-lm (0.31.3 and earlier) mis-loads it without an error; load it through mlx-vlm".into(),
        );
    }
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
