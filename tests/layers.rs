//! The module graph keeps the shape docs/ENGINE.md and README describe, checked on the source:
//! - each layer of the library imports only layers below it (quant → layout → inflate → gemm →
//!   npu → moe → config → ffi, with the base modules beside the bottom);
//! - within one folder no two files import each other, directly or around a circle (a folder's
//!   `mod.rs` and its children may use each other: that is the parent, not a sibling);
//! - the same for the probe's folders.
//!
//! Imports are read from `crate::`, `super::` and `self::` paths anywhere in the code (not only in
//! `use` lines); `#[cfg(test)] mod tests` blocks and `tests.rs` files are left out: tests may
//! reach across.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's top-level modules, lowest first. A module may import modules of a lower rank;
/// the base modules (rank 0) import only each other.
const LAYERS: &[(&str, u32)] = &[
    ("isa", 0),
    ("sync", 0),
    ("pool", 0),
    ("cpus", 0),
    ("quant", 1),
    ("layout", 2),
    ("inflate", 3),
    ("gemm", 4),
    ("npu", 5),
    ("moe", 6),
    ("config", 7),
    ("ffi", 8),
    // Test data for the tests and the probe (feature `testutil`): above everything it feeds.
    ("testutil", 9),
];

/// A module path from the crate root, e.g. `["moe", "engine"]`.
type ModPath = Vec<String>;

struct Module {
    path: ModPath,
    source: String,
}

fn modules(root: &Path, root_file: &str) -> Vec<Module> {
    let mut out = Vec::new();
    walk(root, &mut Vec::new(), root_file, &mut out);
    out
}

fn walk(dir: &Path, prefix: &mut ModPath, root_file: &str, out: &mut Vec<Module>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if p.is_dir() {
            prefix.push(name);
            walk(&p, prefix, root_file, out);
            prefix.pop();
            continue;
        }
        // `tests.rs` files are `#[cfg(test)] mod tests;`: tests may reach across.
        let Some(stem) = name.strip_suffix(".rs").filter(|s| *s != "tests") else {
            continue;
        };
        let path = if prefix.is_empty() && stem == root_file {
            Vec::new()
        } else if stem == "mod" {
            prefix.clone()
        } else {
            let mut path = prefix.clone();
            path.push(stem.to_string());
            path
        };
        let source = std::fs::read_to_string(&p).unwrap();
        out.push(Module {
            path,
            source: without_tests(&source),
        });
    }
}

/// `source` without its comments, string literals and `#[cfg(test)] mod ... { }` blocks.
fn without_tests(source: &str) -> String {
    let code = strip_comments_and_strings(source);
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod ");
        match (is_mod, trimmed.find(['{', ';'])) {
            (true, Some(i)) if trimmed.as_bytes()[i] == b'{' => {
                let body = &trimmed[i..];
                rest = &body[matching_brace(body)..];
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// The byte after the brace that closes the one `s` starts with.
fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

fn strip_comments_and_strings(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' || b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#") {
            i = skip_string(b, i);
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('{', '\''); lifetimes have no closing quote and stay.
            let mut j = i + 1;
            if b[j] == b'\\' {
                j += 1;
            }
            j += 1;
            while j < b.len() && b[j] != b'\'' {
                j += 1;
            }
            i = j + 1;
            out.push_str("' '");
        } else {
            let c = s[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn skip_string(b: &[u8], mut i: usize) -> usize {
    if b[i] == b'r' {
        i += 1;
        let mut hashes = 0;
        while b[i] == b'#' {
            hashes += 1;
            i += 1;
        }
        if b[i] != b'"' {
            return i; // `r#ident`, not a string
        }
        i += 1;
        loop {
            if i >= b.len() {
                return i;
            }
            if b[i] == b'"'
                && b[i + 1..]
                    .iter()
                    .take(hashes)
                    .filter(|&&c| c == b'#')
                    .count()
                    == hashes
            {
                return i + 1 + hashes;
            }
            i += 1;
        }
    }
    i += 1;
    while i < b.len() && b[i] != b'"' {
        if b[i] == b'\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// Every module path the code names through `crate::`, `super::` or `self::`, resolved from the
/// module `at`, each as far as the code spells it (items included: callers look for the deepest
/// known module along it). Group imports (`use super::{a::X, b::{Y, Z}}`) give each member.
fn references(code: &str, at: &ModPath) -> BTreeSet<ModPath> {
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(pos) = code[from..].find(start) {
            let i = from + pos;
            from = i + start.len();
            let inside_a_path = i > 0
                && (bytes[i - 1].is_ascii_alphanumeric() || matches!(bytes[i - 1], b'_' | b':'));
            if inside_a_path {
                continue;
            }
            let mut base = at.clone();
            let mut rest = &code[i..];
            if let Some(r) = rest.strip_prefix("crate::") {
                base.clear();
                rest = r;
            }
            loop {
                if let Some(r) = rest.strip_prefix("super::") {
                    base = parent(&base);
                    rest = r;
                } else if let Some(r) = rest.strip_prefix("self::") {
                    rest = r;
                } else {
                    break;
                }
            }
            for path in paths(rest) {
                found.insert(base.iter().cloned().chain(path).collect());
            }
        }
    }
    found
}

fn parent(p: &ModPath) -> ModPath {
    p[..p.len().saturating_sub(1)].to_vec()
}

/// The paths a `use` tail or an inline path names, as segments: `a::b::X` gives `[a, b, X]`, a
/// group `{a::X, b::{Y, Z}}` each of its members' paths.
fn paths(rest: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut s = rest.trim_start();
    loop {
        let ident: String = s
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        s = &s[ident.len()..];
        prefix.push(ident);
        match s.strip_prefix("::") {
            Some(r) => s = r.trim_start(),
            None => return vec![prefix],
        }
    }
    if !s.starts_with('{') {
        return if prefix.is_empty() {
            Vec::new()
        } else {
            vec![prefix]
        };
    }
    let body = &s[1..matching_brace(s) - 1];
    let mut out = Vec::new();
    let (mut depth, mut item_start) = (0, 0);
    let item = |text: &str, out: &mut Vec<Vec<String>>| {
        for tail in paths(text) {
            if tail.first().is_some_and(|t| t == "self") {
                out.push(prefix.clone());
            } else {
                out.push(prefix.iter().cloned().chain(tail).collect());
            }
        }
    };
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                item(&body[item_start..i], &mut out);
                item_start = i + 1;
            }
            _ => {}
        }
    }
    item(&body[item_start..], &mut out);
    out.retain(|p| !p.is_empty());
    out
}

/// Sibling edges per folder: `folder → {(from, to)}` between children of one module.
fn sibling_edges(mods: &[Module]) -> BTreeMap<ModPath, BTreeSet<(String, String)>> {
    let known: BTreeSet<&ModPath> = mods.iter().map(|m| &m.path).collect();
    let mut edges: BTreeMap<ModPath, BTreeSet<(String, String)>> = BTreeMap::new();
    for m in mods {
        if m.path.is_empty() {
            continue;
        }
        for r in references(&m.source, &m.path) {
            // The deepest known module the reference names.
            let target = (1..=r.len())
                .rev()
                .map(|n| r[..n].to_vec())
                .find(|p| known.contains(p));
            let Some(target) = target else { continue };
            // The common folder of the two, and the children of it each lies in.
            let common = m
                .path
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= m.path.len() || common >= target.len() {
                continue; // one contains the other: parent and child
            }
            edges
                .entry(m.path[..common].to_vec())
                .or_default()
                .insert((m.path[common].clone(), target[common].clone()));
        }
    }
    edges
}

/// A circle among `edges`, if there is one.
fn circle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    // Depth-first search; `stack` is the path from the start, `done` what has no circle below.
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| *s == n) {
            let mut c: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n);
        for m in next.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n);
        None
    }
    let mut done = BTreeSet::new();
    next.keys()
        .find_map(|n| visit(n, &next, &mut Vec::new(), &mut done))
}

fn circles(root: &Path, root_file: &str) -> Vec<String> {
    let mods = modules(root, root_file);
    sibling_edges(&mods)
        .iter()
        .filter_map(|(folder, e)| {
            circle(e).map(|c| format!("{}/: {}", folder.join("/"), c.join(" → ")))
        })
        .collect()
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_two_files_of_a_folder_of_the_library_import_each_other() {
    let found = circles(&manifest().join("src"), "lib");
    assert!(
        found.is_empty(),
        "import circles in src/:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_two_files_of_a_folder_of_the_probe_import_each_other() {
    let found = circles(&manifest().join("probe/src"), "main");
    assert!(
        found.is_empty(),
        "import circles in probe/src/:\n{}",
        found.join("\n")
    );
}

#[test]
fn each_layer_imports_only_layers_below_it() {
    let rank = |name: &str| LAYERS.iter().find(|(n, _)| *n == name).map(|&(_, r)| r);
    let mods = modules(&manifest().join("src"), "lib");
    let mut wrong = Vec::new();
    for m in mods.iter().filter(|m| !m.path.is_empty()) {
        let top = &m.path[0];
        let own = rank(top).unwrap_or_else(|| panic!("src/{top}: a module LAYERS does not place"));
        for r in references(&m.source, &m.path) {
            let Some(other) = r.first().filter(|o| *o != top) else {
                continue;
            };
            let Some(theirs) = rank(other) else { continue };
            if theirs > own {
                wrong.push(format!("{} imports {}", m.path.join("::"), r.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports of a layer above:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reader_sees_group_imports_and_relative_paths() {
    let at: ModPath = vec!["moe".into(), "engine".into()];
    let code = "use super::{call::{A, B}, plan::Plan};\nuse crate::npu::Device;\nfn f() { super::super::isa::x(); }";
    let refs = references(code, &at);
    let want: BTreeSet<ModPath> = [
        vec!["moe", "call", "A"],
        vec!["moe", "call", "B"],
        vec!["moe", "plan", "Plan"],
        vec!["npu", "Device"],
        vec!["isa", "x"],
    ]
    .iter()
    .map(|p| p.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(refs, want);
    let tests_left_out =
        without_tests("use crate::a::B;\n#[cfg(test)]\nmod tests {\n use crate::c::D;\n}\n");
    assert!(!tests_left_out.contains("crate::c"));
    let e: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(x, y)| (x.to_string(), y.to_string()))
        .collect();
    assert!(circle(&e).is_some());
    // A path through the parent into a sibling is an edge between the two siblings.
    let mods = [
        Module {
            path: vec!["npu".into(), "emu".into()],
            source: "use crate::npu::{self, error::Error};".into(),
        },
        Module {
            path: vec!["npu".into(), "error".into()],
            source: "fn f() { super::emu::g(); }".into(),
        },
    ];
    let edges = sibling_edges(&mods);
    assert!(
        circle(&edges[&vec!["npu".to_string()]]).is_some(),
        "{edges:?}"
    );
}
