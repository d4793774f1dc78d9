//! The tensor-name rules as a table.

use mtp_detect::{classify_tensor, drafter_tensor_key, is_mtp_tensor, mtp_layer_index, MtpStyle};

/// name, base layers, expected style, expected MTP layer index
type Row = (&'static str, Option<u64>, Option<MtpStyle>, Option<u64>);

#[test]
fn tensor_name_table() {
    let table: &[Row] = &[
        ("mtp.fc.weight", None, Some(MtpStyle::MtpPrefix), None),
        (
            "mtp.pre_fc_norm_embedding.weight",
            None,
            Some(MtpStyle::MtpPrefix),
            None,
        ),
        (
            "mtp.pre_fc_norm_hidden.weight",
            None,
            Some(MtpStyle::MtpPrefix),
            None,
        ),
        ("mtp.norm.weight", None, Some(MtpStyle::MtpPrefix), None),
        (
            "mtp.layers.0.self_attn.q_proj.weight",
            None,
            Some(MtpStyle::MtpPrefix),
            Some(0),
        ),
        (
            "mtp.layers.2.mlp.experts.gate_up_proj",
            None,
            Some(MtpStyle::MtpPrefix),
            Some(2),
        ),
        ("mtp.fc.scales", None, Some(MtpStyle::MtpPrefix), None),
        (
            "model.mtp.layers.1.mlp.up_proj.weight",
            None,
            Some(MtpStyle::MtpPrefix),
            Some(1),
        ),
        (
            "language_model.mtp.fc.weight",
            None,
            Some(MtpStyle::MtpPrefix),
            None,
        ),
        (
            "model.mtp_layers.0.eh_proj.weight",
            None,
            Some(MtpStyle::MtpPrefix),
            Some(0),
        ),
        (
            "model.layers.61.eh_proj.weight",
            None,
            Some(MtpStyle::NextN),
            None,
        ),
        (
            "model.layers.61.eh_proj.weight",
            Some(61),
            Some(MtpStyle::NextN),
            Some(0),
        ),
        (
            "model.layers.62.enorm.weight",
            Some(61),
            Some(MtpStyle::NextN),
            Some(1),
        ),
        (
            "model.layers.61.hnorm.weight",
            None,
            Some(MtpStyle::NextN),
            None,
        ),
        (
            "model.layers.61.shared_head.head.weight",
            None,
            Some(MtpStyle::NextN),
            None,
        ),
        ("model.layers.61.self_attn.q_proj.weight", None, None, None),
        (
            "model.layers.61.self_attn.q_proj.weight",
            Some(61),
            Some(MtpStyle::NextN),
            Some(0),
        ),
        (
            "model.layers.60.self_attn.q_proj.weight",
            Some(61),
            None,
            None,
        ),
        (
            "model.language_model.layers.46.eh_proj.weight",
            Some(46),
            Some(MtpStyle::NextN),
            Some(0),
        ),
        (
            "blk.64.nextn.eh_proj.weight",
            None,
            Some(MtpStyle::GgufNextN),
            None,
        ),
        (
            "blk.64.nextn.eh_proj.weight",
            Some(64),
            Some(MtpStyle::GgufNextN),
            Some(0),
        ),
        (
            "blk.64.attn_norm.weight",
            Some(64),
            Some(MtpStyle::GgufNextN),
            Some(0),
        ),
        ("blk.64.attn_norm.weight", None, None, None),
        ("blk.63.attn_norm.weight", Some(64), None, None),
        (
            "model.language_model.layers.0.mlp.up_proj.weight",
            None,
            None,
            None,
        ),
        // ERNIE-4.5 (baidu/ERNIE-4.5-*-PT): numbered `model.mtp_*` modules, the layer counted
        // within the head whatever the base depth
        (
            "model.mtp_linear_proj.0.weight",
            None,
            Some(MtpStyle::Ernie),
            Some(0),
        ),
        (
            "model.mtp_emb_norm.0.weight",
            Some(28),
            Some(MtpStyle::Ernie),
            Some(0),
        ),
        (
            "model.mtp_hidden_norm.1.weight",
            None,
            Some(MtpStyle::Ernie),
            Some(1),
        ),
        (
            "model.mtp_block.0.self_attn.q_proj.weight",
            Some(28),
            Some(MtpStyle::Ernie),
            Some(0),
        ),
        ("model.mtp_block.weight", None, None, None),
        ("model.mtp_linear_proj.0", None, None, None),
        ("model.mtp_other.0.weight", None, None, None),
        ("mtp_block.0.self_attn.q_proj.weight", None, None, None),
        ("model.language_model.embed_tokens.weight", None, None, None),
        ("lm_head.weight", None, None, None),
        ("mtp.", None, None, None),
        ("model.layers.x.eh_proj.weight", None, None, None),
        ("blk..nextn.x", None, None, None),
        ("mtpx.fc.weight", None, None, None),
        ("token_embd.weight", None, None, None),
    ];
    for (name, base, style, layer) in table {
        let got = classify_tensor(name, *base);
        assert_eq!(
            got.as_ref().map(|t| t.style),
            *style,
            "{name} base {base:?}"
        );
        assert_eq!(mtp_layer_index(name, *base), *layer, "{name} base {base:?}");
        if base.is_none() {
            assert_eq!(is_mtp_tensor(name), style.is_some(), "{name}");
        }
    }
}

#[test]
fn drafter_key_table() {
    let table = [
        ("fc.weight", Some("fc.weight")),
        ("mtp.fc.weight", Some("fc.weight")),
        (
            "layers.0.mlp.up_proj.biases",
            Some("layers.0.mlp.up_proj.biases"),
        ),
        ("norm.weight", Some("norm.weight")),
        (
            "pre_fc_norm_hidden.weight",
            Some("pre_fc_norm_hidden.weight"),
        ),
        ("eh_proj.weight", Some("eh_proj.weight")),
        ("lm_head.weight", None),
        ("embed_tokens.weight", None),
        ("model.norm.weight", None),
    ];
    for (name, want) in table {
        assert_eq!(drafter_tensor_key(name), want, "{name}");
    }
}
