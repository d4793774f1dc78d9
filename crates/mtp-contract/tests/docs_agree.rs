//! `docs/speculation.md` states the block's fields, their defaults and resolution order, the
//! report's keys and the reason codes; this reads the document and the code and checks that
//! they say the same.

use mtp_contract::{
    resolve, DepthSource, DraftStats, Reason, Speculation, SpeculationReport, BUILTIN_DEPTH,
    TESTED_MAX_DRAFT_TOKENS, VALID_KEYS,
};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/speculation.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rows of the first table after `heading`: cells of each body row.
fn table_after(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let at = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}`"));
    doc[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The backquoted words of the paragraph that starts with `start`.
fn listed_after(doc: &str, start: &str) -> Vec<String> {
    let at = doc.find(start).unwrap_or_else(|| panic!("no `{start}`"));
    let para = doc[at + start.len()..]
        .trim_start()
        .split("\n\n")
        .next()
        .unwrap_or_default();
    para.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_block_table_lists_every_field_and_the_depth_default_in_order() {
    let doc = doc();
    let rows = table_after(&doc, "## The request block");
    let fields: Vec<String> = rows
        .iter()
        .map(|r| r[0].trim_matches('`').to_string())
        .collect();
    assert_eq!(fields, VALID_KEYS.map(String::from).to_vec());
    let depth = &rows[2];
    // the documented default: drafter config, then registry, then the built-in depth
    let default = &depth[1];
    let (cfg, reg, builtin) = (
        default.find("drafter config").expect(default),
        default.find("registry").expect(default),
        default.find(&format!("`{BUILTIN_DEPTH}`")).expect(default),
    );
    assert!(cfg < reg && reg < builtin, "{default}");
    assert!(
        depth[2].contains(&format!("1 to {TESTED_MAX_DRAFT_TOKENS} measured")),
        "{depth:?}"
    );
    // the resolution table says the same order
    let res = table_after(&doc, "## Provider default and per-request override");
    let row = res.iter().find(|r| r[0] == "`num_draft_tokens`").unwrap();
    let last = &row[3];
    assert!(
        last.find("drafter's config") < last.find("registry")
            && last.find("registry") < last.find(&format!("`{BUILTIN_DEPTH}`")),
        "{last}"
    );
    // and the depth sources the report names are the ones the document lists
    let sources = [
        DepthSource::Request,
        DepthSource::Provider,
        DepthSource::DrafterConfig,
        DepthSource::Registry,
        DepthSource::BuiltIn,
    ];
    let listed = listed_after(&doc, "The report's `depth_source` says");
    for s in sources {
        let code = serde_json::to_value(s).unwrap();
        let code = code.as_str().unwrap();
        assert!(listed.iter().any(|l| l == code), "{code} not in {listed:?}");
    }
}

#[test]
fn the_report_keys_and_reasons_are_the_documented_ones() {
    let doc = doc();
    let keys = listed_after(
        &doc,
        "Every response carries `metadata.speculation` with all of these keys (unknown values are\n`null`):",
    );
    let rep = SpeculationReport::used(
        &resolve(Some(&Speculation::native_mtp()), None),
        "x",
        "embedded",
        3,
        &DraftStats::default(),
        None,
    );
    let v = serde_json::to_value(rep).unwrap();
    let mut actual: Vec<&String> = v.as_object().unwrap().keys().collect();
    let mut documented: Vec<&String> = keys.iter().collect();
    actual.sort();
    documented.sort();
    assert_eq!(actual, documented);
    let reasons = listed_after(&doc, "When `used` is false, `reason` is one of");
    for r in Reason::ALL {
        assert!(
            reasons.iter().any(|c| c == r.as_str()),
            "{r} not documented"
        );
    }
}
