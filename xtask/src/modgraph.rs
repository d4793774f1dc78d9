//! The module map without circles (issue 64): within a crate, the top-level modules (the files
//! and folders directly under `src/`) must import each other in one direction only, so that
//! each can be read knowing only what lies below it.
//!
//! The check reads each crate's `src/**/*.rs`, finds every path into the crate itself
//! (`crate::a::…`, `$crate::a::…`, `super::…` resolved against the file's module and any inline
//! `mod x { … }` around it, `use` groups `crate::{a::x, b}` included; comments and string
//! literals skipped), reduces them to edges between top-level modules, and reports each
//! strongly connected set of modules with one circle through it and a file:line per step.
//! `crate::Name` for a name `lib.rs` re-exports counts as a path into the module it comes from.
//! `lib.rs` itself is the root, not a module, and has no edges.
//!
//! It reads text, not a compiled crate: a path built by a macro from pieces is not seen.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The crates `cargo xtask deps` holds to an acyclic module graph.
pub const ACYCLIC_CRATES: &[&str] = &[
    "crates/mtp-contract",
    "crates/mtp-openai",
    "crates/mtp-chat",
    "crates/mtp-grammar",
    "crates/mtp-detect",
    "crates/mtp-engine",
    "crates/mtp-native",
    "crates/mtp-runtimes",
    "crates/mtp-server",
    "crates/mtp-fuzz",
    "crates/mtp-fakehub",
    "crates/mtp",
];

/// Crates whose module graph still has a circle being removed (none today). Move a crate from
/// here to [`ACYCLIC_CRATES`] once `cargo xtask deps` finds no circle in it.
pub const CRATES_WITH_KNOWN_CYCLES: &[&str] = &[];

/// One edge between top-level modules and where it was seen first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `src/…` relative path and 1-based line.
    pub at: String,
}

/// The graph: module → (module it imports → the first place it does).
pub type Graph = BTreeMap<String, BTreeMap<String, Seen>>;

/// Runs the check on [`ACYCLIC_CRATES`] (paths relative to the workspace root).
pub fn run(root: &Path) -> Result<()> {
    let mut failures = Vec::new();
    for krate in ACYCLIC_CRATES {
        let graph = crate_graph(&root.join(krate).join("src"))?;
        let cycles = cycles(&graph);
        if cycles.is_empty() {
            println!(
                "xtask: {krate}: {} top-level modules, no import cycle",
                graph.len()
            );
        }
        for c in cycles {
            failures.push(format!("{krate}: {}", describe(&graph, &c)));
        }
    }
    for krate in CRATES_WITH_KNOWN_CYCLES {
        println!("xtask: {krate}: module cycles not checked yet (CRATES_WITH_KNOWN_CYCLES)");
    }
    if !failures.is_empty() {
        bail!(
            "module import cycles (see docs/ARCHITECTURE.md):\n  {}",
            failures.join("\n  ")
        );
    }
    Ok(())
}

/// Says a cycle: its modules, then one circle through them with where each step is written.
pub fn describe(graph: &Graph, scc: &[String]) -> String {
    let path = circle(graph, scc);
    let steps: Vec<String> = path
        .windows(2)
        .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]].at))
        .collect();
    format!("cycle among {{{}}}: {}", scc.join(", "), steps.join("; "))
}

/// The graph of the crate whose source folder is `src`.
pub fn crate_graph(src: &Path) -> Result<Graph> {
    let mut files = Vec::new();
    walk(src, &mut files)?;
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(src, f).into_iter().next())
        .collect();
    let lib = src.join("lib.rs");
    let reexports = match std::fs::read_to_string(&lib) {
        Ok(text) => root_reexports(&text, &tops),
        Err(_) => BTreeMap::new(),
    };
    let mut graph: Graph = tops.iter().map(|t| (t.clone(), BTreeMap::new())).collect();
    for f in &files {
        let module = module_path(src, f);
        let Some(from) = module.first() else { continue };
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let rel = f.strip_prefix(src.parent().unwrap_or(src)).unwrap_or(f);
        for (path, line) in references(&text, &module) {
            let Some(first) = path.first() else { continue };
            let to = if tops.contains(first) {
                first
            } else if let Some(m) = reexports.get(first) {
                m
            } else {
                continue;
            };
            if to != from {
                graph
                    .get_mut(from)
                    .expect("every file's module is a node")
                    .entry(to.clone())
                    .or_insert_with(|| Seen {
                        at: format!("{}:{line}", rel.display()),
                    });
            }
        }
    }
    Ok(graph)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// The module a file is: `src/a.rs` and `src/a/mod.rs` are `[a]`, `src/a/b.rs` is `[a, b]`,
/// `src/lib.rs` and `src/main.rs` are the root `[]`.
pub fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
        let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
        if stem != "mod" && !is_root {
            parts.push(stem);
        }
    }
    parts
}

/// The names `lib.rs` re-exports from a top-level module (`pub use probe::{probe, …}`), mapped
/// to that module, so that `crate::probe_local` counts as a path into `probe`.
fn root_reexports(lib: &str, tops: &BTreeSet<String>) -> BTreeMap<String, String> {
    let toks = tokens(lib);
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text == "use" {
            let mut paths = Vec::new();
            let end = use_tree(&toks, i + 1, &mut Vec::new(), &mut paths);
            for p in paths {
                match (p.first(), p.last()) {
                    (Some(first), Some(leaf)) if tops.contains(first) && leaf != "*" => {
                        out.insert(leaf.clone(), first.clone());
                    }
                    _ => {}
                }
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Every path into the crate that `text` (a file of module `module`) writes, made absolute
/// (from the crate root), with its line.
pub fn references(text: &str, module: &[String]) -> Vec<(Vec<String>, usize)> {
    let toks = tokens(text);
    let mut out = Vec::new();
    // inline modules around the current token: (name, brace depth inside it)
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if toks.get(i + 2).is_some_and(|b| b.text == "{") => {
                inline.push((toks[i + 1].text.clone(), depth + 1));
            }
            _ => {}
        }
        let here = || {
            let mut m = module.to_vec();
            m.extend(inline.iter().map(|(n, _)| n.clone()));
            m
        };
        let after_colons = |j: usize| toks.get(j).is_some_and(|c| c.text == "::");
        // a path segment, not the tail of `a::crate` or `a::super`
        let starts_path = i == 0 || toks[i - 1].text != "::";
        if starts_path && (t.text == "crate" || t.text == "$crate") && after_colons(i + 1) {
            let mut paths = Vec::new();
            let end = use_tree(&toks, i + 2, &mut Vec::new(), &mut paths);
            out.extend(paths.into_iter().map(|p| (p, t.line)));
            i = end.max(i + 1);
            continue;
        }
        if starts_path && t.text == "super" && after_colons(i + 1) {
            let mut base = here();
            let mut j = i;
            while toks.get(j).is_some_and(|s| s.text == "super") && after_colons(j + 1) {
                base.pop();
                j += 2;
            }
            let mut paths = Vec::new();
            let end = use_tree(&toks, j, &mut base.clone(), &mut paths);
            out.extend(paths.into_iter().map(|p| (p, t.line)));
            i = end.max(i + 1);
            continue;
        }
        i += 1;
    }
    out
}

/// Parses a use tree (or a plain path) from `toks[i]`: `a::b`, `a::{b, c::d}`, `a::*`,
/// `a as b`. Each leaf path, prefixed by `prefix`, goes to `out`. Returns the index after it.
fn use_tree(
    toks: &[Tok],
    mut i: usize,
    prefix: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let depth0 = prefix.len();
    loop {
        match toks.get(i).map(|t| t.text.as_str()) {
            Some("{") => {
                i += 1;
                loop {
                    match toks.get(i).map(|t| t.text.as_str()) {
                        Some("}") => {
                            i += 1;
                            break;
                        }
                        Some(",") => i += 1,
                        None => break,
                        _ => {
                            let before = i;
                            i = use_tree(toks, i, prefix, out);
                            if i == before {
                                i += 1; // not a path: skip it
                            }
                        }
                    }
                }
                prefix.truncate(depth0);
                return i;
            }
            Some(s) if s == "*" || is_ident(s) => {
                prefix.push(s.to_string());
                i += 1;
                if s != "*" && toks.get(i).is_some_and(|t| t.text == "::") {
                    i += 1;
                    continue;
                }
                if toks.get(i).is_some_and(|t| t.text == "as") {
                    i += 2;
                }
                out.push(prefix.clone());
                prefix.truncate(depth0);
                return i;
            }
            _ => {
                prefix.truncate(depth0);
                return i;
            }
        }
    }
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
}

struct Tok {
    text: String,
    line: usize,
}

/// The tokens that matter here: identifiers (with `$` for `$crate`), `::`, and single
/// punctuation. Comments, strings, and character literals are dropped; lifetimes are kept as
/// `'` then an identifier, which is harmless.
fn tokens(src: &str) -> Vec<Tok> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let count_lines = |s: &[char]| s.iter().filter(|&&c| c == '\n').count();
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // block comments nest in Rust
            let (mut d, start) = (0usize, i);
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    d += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    d -= 1;
                    i += 2;
                    if d == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(&b[start..i.min(b.len())]);
        } else if c == '"' || ((c == 'r' || c == 'b') && raw_or_byte_string(&b, i)) {
            let start = i;
            i = skip_string(&b, i);
            line += count_lines(&b[start..i.min(b.len())]);
        } else if c == '\'' {
            // a char literal ('x', '\n', '\u{..}') or a lifetime ('a)
            match (next, b.get(i + 2)) {
                (Some('\\'), _) => {
                    i += 2;
                    while i < b.len() && b[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                }
                (Some(_), Some('\'')) => i += 3,
                _ => i += 1,
            }
        } else if c.is_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '$') {
                i += 1;
            }
            out.push(Tok {
                text: b[start..i].iter().collect(),
                line,
            });
        } else if c == ':' && next == Some(':') {
            out.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Tok {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

/// Whether `b[i..]` starts `r"`, `r#"`, `b"`, `br"`, `br#"` (and the byte is not the end of an
/// identifier such as `for"`… which Rust does not allow anyway).
fn raw_or_byte_string(b: &[char], i: usize) -> bool {
    if i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_') {
        return false;
    }
    let mut j = i;
    if b[j] == 'b' {
        j += 1;
    }
    if b.get(j) == Some(&'r') {
        j += 1;
        while b.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && b.get(j) == Some(&'"')
}

/// The index after the string literal at `b[i]` (plain, byte or raw).
fn skip_string(b: &[char], mut i: usize) -> usize {
    if b[i] == 'b' {
        i += 1;
    }
    if b[i] == 'r' {
        i += 1;
        let mut hashes = 0;
        while b.get(i) == Some(&'#') {
            hashes += 1;
            i += 1;
        }
        i += 1; // the opening quote
        while i < b.len() {
            if b[i] == '"' && (1..=hashes).all(|k| b.get(i + k) == Some(&'#')) {
                return i + 1 + hashes;
            }
            i += 1;
        }
        return i;
    }
    i += 1;
    while i < b.len() {
        match b[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The strongly connected sets of more than one module (Tarjan's algorithm), each sorted, in
/// order of their first module.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// One shortest circle through the first module of `scc`, inside it: `[a, b, …, a]`.
fn circle(graph: &Graph, scc: &[String]) -> Vec<String> {
    let inside: BTreeSet<&str> = scc.iter().map(String::as_str).collect();
    let start = scc[0].as_str();
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph[v].keys().map(String::as_str) {
            if !inside.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![start.to_string()];
                let mut at = v;
                while at != start {
                    path.push(at.to_string());
                    at = prev[at];
                }
                path.push(start.to_string());
                path.reverse();
                return path;
            }
            if !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    vec![start.to_string()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(b.to_string()).or_default();
            g.entry(a.to_string()).or_default().insert(
                b.to_string(),
                Seen {
                    at: format!("src/{a}.rs:1"),
                },
            );
        }
        g
    }

    #[test]
    fn the_cycle_finder_names_each_circle_and_nothing_else() {
        // a -> b -> c -> a is one circle; d -> e -> d another; f hangs below both, and
        // g -> a leads into a circle without being in it
        let g = graph(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "f"),
            ("d", "e"),
            ("e", "d"),
            ("e", "f"),
            ("g", "a"),
        ]);
        assert_eq!(cycles(&g), vec![vec!["a", "b", "c"], vec!["d", "e"]]);
        let scc: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(circle(&g, &scc), ["a", "b", "c", "a"]);
        assert_eq!(
            describe(&g, &scc),
            "cycle among {a, b, c}: a -> b (src/a.rs:1); b -> c (src/b.rs:1); c -> a (src/c.rs:1)"
        );
        // a chain and a diamond have none
        assert!(cycles(&graph(&[("a", "b"), ("b", "c"), ("a", "c"), ("d", "c")])).is_empty());
    }

    #[test]
    fn references_resolve_crate_super_groups_and_inline_modules() {
        let text = r#"
            use crate::hub::{self, HubError};
            use crate::{cache::RepoFolder, error::DetectError as E};
            use super::report::*;
            // crate::comment is not a reference
            const S: &str = "crate::string is not one either";
            fn f() { let _ = crate::gguf::parse(); let c = '{'; }
            mod tests {
                use super::*;
                use super::super::render;
            }
        "#;
        let m = vec!["probe".to_string(), "formats".to_string()];
        let firsts: Vec<(String, usize)> = references(text, &m)
            .into_iter()
            .map(|(p, l)| (p.join("::"), l))
            .collect();
        assert_eq!(
            firsts,
            vec![
                ("hub::self".to_string(), 2),
                ("hub::HubError".to_string(), 2),
                ("cache::RepoFolder".to_string(), 3),
                ("error::DetectError".to_string(), 3),
                ("probe::report::*".to_string(), 4),
                ("gguf::parse".to_string(), 7),
                ("probe::formats::*".to_string(), 9),
                ("probe::render".to_string(), 10),
            ]
        );
    }

    /// Both lists name crates that exist, and none is in both.
    #[test]
    fn the_listed_crates_exist() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for k in ACYCLIC_CRATES.iter().chain(CRATES_WITH_KNOWN_CYCLES) {
            assert!(root.join(k).join("src").is_dir(), "{k}");
        }
        assert!(!ACYCLIC_CRATES
            .iter()
            .any(|k| CRATES_WITH_KNOWN_CYCLES.contains(k)));
    }

    #[test]
    fn files_map_to_modules() {
        let src = Path::new("/x/src");
        let m = |p: &str| module_path(src, &src.join(p)).join("::");
        assert_eq!(m("lib.rs"), "");
        assert_eq!(m("hub/mod.rs"), "hub");
        assert_eq!(m("hub/cache.rs"), "hub::cache");
        assert_eq!(m("qwen3_5/attn.rs"), "qwen3_5::attn");
        assert_eq!(m("engine.rs"), "engine");
    }
}
