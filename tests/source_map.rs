//! The source tree's map and its layer order, checked so they cannot go
//! stale.
//!
//! **Every file is on the one map.** Each `.rs` file under `src/` must be
//! named in the module map of `docs/SOURCE-MAP.md` (its first fenced block
//! after `## The module map`), by its path from `src/`, or by its path
//! from the top-level entry it is listed under (`cas.rs` under `store/`,
//! `format/lua.rs` under `id/`); a `mod.rs` by its folder (`store/`,
//! `format/` under `id/`). Files that only tests compile are exempt: a
//! file named `tests.rs` or under a `tests/` folder. Other files under
//! `src/` (the console's page and assets) are named by their folder. The
//! crate doc's `# Layout` (`src/lib.rs`) is a pointer to that map and
//! names no file, so there is one map to keep.
//!
//! **Imports point down.** docs/SOURCE-MAP.md's "Layer order" lists the
//! layers top to bottom; a file may name (`use crate::x`, `crate::x::...`,
//! `super::` out of its own top-level module) only modules of its own
//! layer or below. Comments are not read, so a doc link may point up.
//! `ALLOWED_UP` lists the upward imports that are known and owned by a
//! pending change; it must only shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, top to bottom, and the top-level items of `src/` in each
/// (a crate-root file `x.rs` and a folder `x/` are both `x`).
const LAYERS: &[(&str, &[&str])] = &[
    ("binary", &["main", "cli"]),
    ("node", &["node"]),
    ("server", &["server"]),
    ("config", &["config"]),
    ("cluster", &["cluster"]),
    ("modes", &["modes"]),
    ("error", &["error", "Error"]),
    ("store", &["store"]),
    ("consul", &["consul"]),
    ("metrics", &["metrics"]),
    ("file_watch", &["file_watch"]),
    ("id", &["id"]),
];

/// Crate-root names that are not layers: `proto` re-exports the
/// `idgen-proto` crate, which every layer may use.
const NOT_LAYERS: &[&str] = &["proto"];

/// Known upward imports, as (file under `src/`, the module it names),
/// each removed by a pending change of issue 21. The list must only
/// shrink: a new upward import fails the test.
const ALLOWED_UP: &[(&str, &str)] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every file under `dir`, as paths from `src/` with `/` separators.
fn files_under(dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_under(&path, out);
        } else {
            let rel = path.strip_prefix(src_dir()).expect("under src/");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

fn rust_files() -> Vec<String> {
    let mut all = Vec::new();
    files_under(&src_dir(), &mut all);
    all.retain(|f| f.ends_with(".rs"));
    all
}

/// Only tests compile it.
fn test_only(file: &str) -> bool {
    file == "tests.rs" || file.ends_with("/tests.rs") || file.contains("/tests/")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `needle` occurs in `hay` with neither an identifier character nor one
/// of `left_stop` just before it, and no identifier character (or `.rs`
/// continuing a name) just after it. `crate::` and `src/` before a path
/// are allowed.
fn names(hay: &str, needle: &str, left_stop: &[char]) -> bool {
    let mut from = 0;
    while let Some(at) = hay[from..].find(needle) {
        let start = from + at;
        let end = start + needle.len();
        let before = &hay[..start];
        let left_ok = before.ends_with("crate::")
            || before.ends_with("src/")
            || before
                .chars()
                .next_back()
                .is_none_or(|c| !is_ident(c) && !left_stop.contains(&c));
        let right_ok = hay[end..]
            .chars()
            .next()
            .is_none_or(|c| !(is_ident(c) || (needle.ends_with('/') && c == '/')));
        if left_ok && right_ok {
            return true;
        }
        from = start + 1;
    }
    false
}

/// A file's module path from `src/`: `store/strict/mod.rs` ->
/// `store::strict`.
fn module_path(file: &str) -> String {
    let stem = file.trim_end_matches(".rs");
    let stem = stem.strip_suffix("/mod").unwrap_or(stem);
    stem.replace('/', "::")
}

/// What a `mod.rs` is named by: its folder, `store/`; anything else by its
/// own path.
fn map_name(file: &str) -> String {
    match file.strip_suffix("mod.rs") {
        Some(folder) => folder.to_string(),
        None => file.to_string(),
    }
}

/// The `//!` lines of `src/lib.rs` from `# Layout` to the next heading.
fn crate_doc_layout() -> String {
    let lib = fs::read_to_string(src_dir().join("lib.rs")).expect("read src/lib.rs");
    let doc: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(str::trim)
        .collect();
    let start = doc
        .iter()
        .position(|l| *l == "# Layout")
        .expect("src/lib.rs has a `# Layout` section");
    let rest = &doc[start + 1..];
    let end = rest
        .iter()
        .position(|l| l.starts_with("# "))
        .unwrap_or(rest.len());
    rest[..end].join("\n")
}

/// The one map of the code.
const MAP: &str = "docs/SOURCE-MAP.md";

/// docs/SOURCE-MAP.md's module map, as (top-level entry, its text).
fn module_map() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MAP);
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {MAP}: {e}"));
    let after = text
        .split_once("## The module map")
        .unwrap_or_else(|| panic!("{MAP} has `## The module map`"))
        .1;
    let block = after
        .split("```")
        .nth(1)
        .expect("the module map is a fenced block");
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut in_src = false;
    for line in block.lines() {
        if line.starts_with("src/") {
            in_src = true;
            continue;
        }
        if !line.starts_with(' ') && !line.trim().is_empty() {
            in_src = false;
        }
        if !in_src {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if indent == 2 {
            let (entry, text) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
            entries.push((entry.to_string(), text.to_string()));
        } else if let Some(last) = entries.last_mut() {
            last.1.push('\n');
            last.1.push_str(trimmed);
        }
    }
    assert!(!entries.is_empty(), "the module map lists src/'s entries");
    entries
}

fn named_in_map(map: &[(String, String)], file: &str) -> bool {
    let whole = map_name(file);
    map.iter().any(|(entry, text)| {
        if *entry == whole || *entry == file {
            return true;
        }
        if names(text, &whole, &['/', ':']) {
            return true;
        }
        match whole.strip_prefix(entry.as_str()) {
            Some(rel) if entry.ends_with('/') && !rel.is_empty() => names(text, rel, &['/', ':']),
            _ => false,
        }
    })
}

/// The files of `files` (paths from `src/`) that `map` does not name,
/// each with what to write.
fn missing_from_map(map: &[(String, String)], files: &[String]) -> Vec<String> {
    files
        .iter()
        .filter(|f| !test_only(f) && !named_in_map(map, f))
        .map(|f| {
            format!(
                "src/{f}: not in {MAP}'s module map (name it `{}` under its folder)",
                map_name(f)
            )
        })
        .collect()
}

#[test]
fn every_src_file_is_named_in_the_module_map() {
    let missing = missing_from_map(&module_map(), &rust_files());
    assert!(
        missing.is_empty(),
        "files missing from the map:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_file_missing_from_the_map_is_named() {
    // The map as it stands, and one src/ file more that it does not name.
    let mut files = rust_files();
    files.push("store/not_on_the_map.rs".to_string());
    let missing = missing_from_map(&module_map(), &files);
    assert_eq!(
        missing,
        [format!(
            "src/store/not_on_the_map.rs: not in {MAP}'s module map (name it `store/not_on_the_map.rs` under its folder)"
        )]
    );
}

#[test]
fn the_crate_doc_points_to_the_one_map_and_names_no_file() {
    let doc = crate_doc_layout();
    assert!(
        doc.contains(MAP),
        "src/lib.rs's `# Layout` must point to {MAP}:\n{doc}"
    );
    let named: Vec<String> = rust_files()
        .into_iter()
        .filter(|f| !test_only(f) && f != "lib.rs" && f != "main.rs")
        .filter(|f| names(&doc, f, &['/', ':']))
        .collect();
    assert!(
        named.is_empty(),
        "src/lib.rs's `# Layout` names files, a second map to keep; name them in {MAP} only: {named:?}"
    );
}

#[test]
fn the_map_rules_see_what_they_should() {
    // A sibling's longer name does not count, nor a longer path.
    assert!(!names("store/cascade.rs", "store/cas.rs", &['/', ':']));
    assert!(!names("[`store::cascade`]", "store::cas", &['/', ':']));
    assert!(!names("modes/lease.rs", "lease.rs", &['/', ':']));
    assert!(names("[`store::cas::CasLoop`]", "store::cas", &['/', ':']));
    assert!(names("see src/store/cas.rs.", "store/cas.rs", &['/', ':']));
    assert!(names("[`crate::store::cas`]", "store::cas", &['/', ':']));
    assert_eq!(map_name("id/format/mod.rs"), "id/format/");
    assert!(test_only("config/tests.rs"));
    assert!(test_only("id/format/lua/validate/tests.rs"));
    assert!(!test_only("store/regression.rs"));
}

// ---- the layer order ----

/// The layer of a top-level name, as its index in `LAYERS` (0 = top).
fn layer_of(top: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, items)| items.contains(&top))
}

/// The top-level name a file belongs to (`store/cas.rs` -> `store`,
/// `error.rs` -> `error`).
fn top_of(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or(file);
    first.trim_end_matches(".rs")
}

/// Source with comments blanked out (line, doc and block comments), and
/// string literals blanked, keeping line breaks so line numbers hold.
fn code_only(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal such as '\'' or '\"'.
            let close = chars[i + 3..].iter().position(|&c| c == '\'');
            i += 4 + close.unwrap_or(0);
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            // A char literal such as '"' or '{' (not a lifetime).
            i += 3;
        } else if c == '"' {
            i = skip_string(&chars, i, &mut out);
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !prev_ident(&chars, i) {
            i = skip_raw_string(&chars, i, &mut out);
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev_ident(chars: &[char], i: usize) -> bool {
    i > 0 && is_ident(chars[i - 1])
}

/// Skips a `"..."` literal starting at `i`, keeping its line breaks.
fn skip_string(chars: &[char], mut i: usize, out: &mut String) -> usize {
    out.push('"');
    i += 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => {
                out.push('"');
                return i + 1;
            }
            '\n' => {
                out.push('\n');
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

/// Skips a raw string `r#"..."#` starting at `i` (or returns past the
/// `r` when it is not one).
fn skip_raw_string(chars: &[char], i: usize, out: &mut String) -> usize {
    let mut j = i + 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        out.push('r');
        return i + 1;
    }
    j += 1;
    out.push('"');
    while j < chars.len() {
        if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
            out.push('"');
            return j + 1 + hashes;
        }
        if chars[j] == '\n' {
            out.push('\n');
        }
        j += 1;
    }
    j
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
    &s[..end]
}

/// The crate-root names a file refers to, with their line numbers:
/// `crate::x`, `crate::{x, y::z}`, and `super::` chains that climb out of
/// the file's top-level module.
fn crate_refs(file: &str, code: &str) -> Vec<(usize, String)> {
    // How many `super::` reach the crate root from this file.
    let depth = {
        let parts: Vec<&str> = file.split('/').collect();
        let mut d = parts.len() - 1;
        if !file.ends_with("mod.rs") && !file.ends_with("lib.rs") && !file.ends_with("main.rs") {
            d += 1;
        }
        d
    };
    let mut refs = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line_no = n + 1;
        let mut from = 0;
        while let Some(at) = line[from..].find("crate::") {
            let start = from + at;
            from = start + "crate::".len();
            if line[..start].chars().next_back().is_some_and(is_ident) {
                continue; // e.g. `idgen_crate::`
            }
            let rest = &line[from..];
            if let Some(group) = rest.strip_prefix('{') {
                refs.extend(group_heads(group).into_iter().map(|h| (line_no, h)));
            } else {
                refs.push((line_no, ident_at(rest).to_string()));
            }
        }
        let mut from = 0;
        while let Some(at) = line[from..].find("super::") {
            let start = from + at;
            from = start + 1;
            if line[..start]
                .chars()
                .next_back()
                .is_some_and(|c| is_ident(c) || c == ':')
            {
                continue; // counted with the chain's first `super::`
            }
            let mut rest = &line[start..];
            let mut count = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                count += 1;
                rest = r;
            }
            if count >= depth && depth > 0 {
                refs.push((line_no, ident_at(rest).to_string()));
            }
        }
    }
    refs.retain(|(_, name)| !name.is_empty() && name != "self");
    refs
}

/// The first name of each item of a `{a, b::c, d::{e}}` group (the text
/// after the `{`), stopping at its closing brace; a group spanning lines
/// is read on its first line only, which `cargo fmt` keeps for short
/// groups (long ones put each item on its own line, and are read by the
/// multi-line pass in `multi_line_groups`).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect = true;
    let mut i = 0;
    let bytes: Vec<char> = group.chars().collect();
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => expect = true,
            c if expect && depth == 0 && is_ident(c) => {
                let s: String = bytes[i..].iter().take_while(|c| is_ident(**c)).collect();
                i += s.len();
                heads.push(s);
                expect = false;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    heads
}

/// `use crate::{` groups that `cargo fmt` spread over several lines: each
/// item's first name with its line.
fn multi_line_groups(code: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    let lines: Vec<&str> = code.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        if l.ends_with("crate::{") {
            let mut depth = 0;
            i += 1;
            while i < lines.len() {
                let item = lines[i].trim();
                if depth == 0 && item.starts_with('}') {
                    break;
                }
                if depth == 0 {
                    let head = ident_at(item);
                    if !head.is_empty() && head != "self" {
                        refs.push((i + 1, head.to_string()));
                    }
                }
                depth += item.matches('{').count() as i32;
                depth -= item.matches('}').count() as i32;
                i += 1;
            }
        }
        i += 1;
    }
    refs
}

/// Every import that runs up the layer order, as (file, line, the
/// module named, the file's layer, that module's layer).
fn upward_imports() -> Vec<(String, usize, String, usize, usize)> {
    let mut found = Vec::new();
    for file in rust_files() {
        if file == "lib.rs" {
            continue;
        }
        let top = top_of(&file);
        let Some(own) = layer_of(top) else {
            panic!("src/{file}: `{top}` is in no layer of LAYERS (add it where it belongs)");
        };
        let src = fs::read_to_string(src_dir().join(&file)).expect("read a src file");
        let code = code_only(&src);
        let mut refs = crate_refs(&file, &code);
        refs.extend(multi_line_groups(&code));
        for (line, name) in refs {
            if NOT_LAYERS.contains(&name.as_str()) || name == top {
                continue;
            }
            let Some(theirs) = layer_of(&name) else {
                panic!("src/{file}:{line}: `crate::{name}` is in no layer of LAYERS");
            };
            if theirs < own {
                found.push((file.clone(), line, name, own, theirs));
            }
        }
    }
    found
}

#[test]
fn imports_point_down_the_layer_order() {
    let mut bad = Vec::new();
    let mut allowed_seen = BTreeSet::new();
    for (file, line, name, own, theirs) in upward_imports() {
        if ALLOWED_UP.contains(&(file.as_str(), name.as_str())) {
            allowed_seen.insert((file, name));
            continue;
        }
        bad.push(format!(
            "src/{file}:{line}: `{name}` ({} layer) is above this file's {} layer",
            LAYERS[theirs].0, LAYERS[own].0
        ));
    }
    assert!(
        bad.is_empty(),
        "imports that run up the layer order (docs/SOURCE-MAP.md, \"Layer order\"):\n{}",
        bad.join("\n")
    );
    let stale: Vec<_> = ALLOWED_UP
        .iter()
        .filter(|(f, n)| !allowed_seen.contains(&(f.to_string(), n.to_string())))
        .collect();
    assert!(
        stale.is_empty(),
        "ALLOWED_UP entries no longer needed (remove them): {stale:?}"
    );
}

/// The import graph between top-level modules, and its cycles (printed
/// with `--nocapture`; the test checks that the layer order leaves none
/// outside `ALLOWED_UP`).
#[test]
fn top_level_import_cycles_are_only_the_allowed_ones() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut allowed_graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files() {
        if file == "lib.rs" {
            continue;
        }
        let top = top_of(&file).to_string();
        let src = fs::read_to_string(src_dir().join(&file)).expect("read a src file");
        let code = code_only(&src);
        let mut refs = crate_refs(&file, &code);
        refs.extend(multi_line_groups(&code));
        for (_, name) in refs {
            let allowed = ALLOWED_UP.contains(&(file.as_str(), name.as_str()));
            let name = if name == "Error" {
                "error".to_string()
            } else {
                name
            };
            if NOT_LAYERS.contains(&name.as_str()) || name == top {
                continue;
            }
            let target = if allowed {
                &mut allowed_graph
            } else {
                &mut graph
            };
            target.entry(top.clone()).or_default().insert(name);
        }
    }
    let all = {
        let mut g = graph.clone();
        for (k, v) in &allowed_graph {
            g.entry(k.clone()).or_default().extend(v.iter().cloned());
        }
        g
    };
    let cycles_all = cycles(&all);
    println!("top-level import cycles today: {}", cycles_all.len());
    for c in &cycles_all {
        println!("  {}", c.join(" -> "));
    }
    let remaining = cycles(&graph);
    assert!(
        remaining.is_empty(),
        "import cycles between top-level modules outside ALLOWED_UP: {remaining:?}"
    );
}

/// The simple cycles of length 2 and 3 between top-level modules (the
/// ones a newcomer trips on), each listed once from its smallest name.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let edge = |a: &str, b: &str| g.get(a).is_some_and(|s| s.contains(b));
    let nodes: Vec<&String> = g.keys().collect();
    let mut out = Vec::new();
    for a in &nodes {
        for b in g.get(*a).into_iter().flatten() {
            if b > *a && edge(b, a) {
                out.push(vec![a.to_string(), b.clone(), a.to_string()]);
            }
            for c in g.get(b).into_iter().flatten() {
                if b > *a && c > *a && c != b && edge(c, a) {
                    out.push(vec![a.to_string(), b.clone(), c.clone(), a.to_string()]);
                }
            }
        }
    }
    out
}

#[test]
fn the_import_reader_sees_what_it_should() {
    let code = code_only(
        "use crate::store::x; // crate::server is a comment\n\
         let s = \"crate::cli in a string\"; let q = '\"'; let e = '\\'';\n\
         use crate::{config::A, metrics};\n\
         use super::super::modes::Issuer;\n",
    );
    let refs: Vec<String> = crate_refs("store/a/b.rs", &code)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(refs, ["store", "config", "metrics"]);
    let refs: Vec<String> = crate_refs("store/b.rs", &code)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(refs, ["store", "config", "metrics", "modes"]);
    let multi = multi_line_groups("use crate::{\n    cluster::X,\n    store::{a, b},\n};\n");
    assert_eq!(
        multi,
        [(2, "cluster".to_string()), (3, "store".to_string())]
    );
    assert!(layer_of("server") < layer_of("store"));
}

// ---- no import circle inside a folder ----

/// A token of code that the path reader needs.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Sep,
    Open,
    Close,
    Comma,
    Star,
    Other(char),
}

/// `code` (comments and strings already blanked) as tokens, each with
/// its line number.
fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if is_ident(c) {
            let s: String = chars[i..].iter().take_while(|c| is_ident(**c)).collect();
            i += s.len();
            out.push((line, Tok::Ident(s)));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((line, Tok::Sep));
            i += 2;
        } else {
            let t = match c {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                '*' => Tok::Star,
                c => Tok::Other(c),
            };
            out.push((line, t));
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&(usize, Tok)>) -> Option<&str> {
    match t {
        Some((_, Tok::Ident(s))) => Some(s),
        _ => None,
    }
}

/// Reads one use tree at `i` (`a::b`, `a::{b, c::d}`, `a::*`,
/// `a as b`) with `prefix` before it; pushes each path it names, with
/// the name it binds (its alias or last segment), and returns the index
/// after it.
fn use_tree(
    toks: &[(usize, Tok)],
    mut i: usize,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) -> usize {
    match toks.get(i).map(|t| &t.1) {
        Some(Tok::Open) => {
            i += 1;
            while !matches!(toks.get(i).map(|t| &t.1), None | Some(Tok::Close)) {
                let before = i;
                i = use_tree(toks, i, prefix, out);
                if matches!(toks.get(i).map(|t| &t.1), Some(Tok::Comma)) {
                    i += 1;
                } else if i == before {
                    i += 1; // not a use tree: step over it
                }
            }
            i + 1
        }
        Some(Tok::Star) => {
            out.push((prefix.clone(), "*".to_string()));
            i + 1
        }
        Some(Tok::Ident(name)) => {
            let depth = prefix.len();
            prefix.push(name.clone());
            i += 1;
            if matches!(toks.get(i).map(|t| &t.1), Some(Tok::Sep)) {
                i = use_tree(toks, i + 1, prefix, out);
            } else {
                let mut bound = name.clone();
                if ident(toks.get(i)) == Some("as") {
                    bound = ident(toks.get(i + 1)).unwrap_or("_").to_string();
                    i += 2;
                }
                out.push((prefix.clone(), bound));
            }
            prefix.truncate(depth);
            i
        }
        _ => i,
    }
}

/// One file's imports as read for the circle check.
struct FileImports {
    /// Each path named (`crate::`, `self::`, `super::` anywhere, and every
    /// `use` path), resolved to segments from the crate root, with its line.
    paths: Vec<(usize, Vec<String>)>,
    /// Names a `use` brings into a module's scope, by module path:
    /// (module path, bound name) -> the path it stands for.
    bound: Vec<(Vec<String>, String, Vec<String>)>,
}

/// `path` as written in module `module`, from the crate root: `crate::`
/// from the root, `self::` and `super::` from `module`, anything else
/// from `module` (a child module; a path into another crate resolves to
/// no file and is dropped later).
fn absolute(module: &[String], path: &[String]) -> Vec<String> {
    match path.first().map(String::as_str) {
        Some("crate") => path[1..].to_vec(),
        Some("self") => [module, &path[1..]].concat(),
        Some("super") => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = &module[..module.len().saturating_sub(ups)];
            [base, &path[ups..]].concat()
        }
        _ => [module, path].concat(),
    }
}

/// Reads a file's paths. Inline modules move the `self`/`super` base;
/// `#[cfg(test)]` items are skipped (tests are not part of the layout).
fn read_imports(file: &str, code: &str) -> FileImports {
    let toks = tokens(code);
    let base: Vec<String> = module_path(file)
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let mut found = FileImports {
        paths: Vec::new(),
        bound: Vec::new(),
    };
    // Inline modules open: (name, brace depth at its `{`).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let module: Vec<String> = base
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        let t = &toks[i].1;
        if is_cfg_test(&toks, i) {
            i = skip_item(&toks, i);
            continue;
        }
        match t {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some(name), Some((_, Tok::Open))) =
                    (ident(toks.get(i + 1)), toks.get(i + 2))
                {
                    inline.push((name.to_string(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(w) if w == "use" => {
                let mut named = Vec::new();
                let next = use_tree(&toks, i + 1, &mut Vec::new(), &mut named);
                for (path, bound) in named {
                    let abs = absolute(&module, &path);
                    found.paths.push((toks[i].0, abs.clone()));
                    if bound != "*" {
                        found.bound.push((module.clone(), bound, abs));
                    }
                }
                i = next.max(i + 1);
                continue;
            }
            Tok::Ident(w)
                if (w == "crate" || w == "self" || w == "super")
                    && matches!(toks.get(i + 1).map(|t| &t.1), Some(Tok::Sep))
                    && !matches!(i.checked_sub(1).map(|p| &toks[p].1), Some(Tok::Sep)) =>
            {
                let mut named = Vec::new();
                let next = use_tree(&toks, i, &mut Vec::new(), &mut named);
                for (path, _) in named {
                    found.paths.push((toks[i].0, absolute(&module, &path)));
                }
                i = next.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// `#[cfg(test)]` starts at `i`.
fn is_cfg_test(toks: &[(usize, Tok)], i: usize) -> bool {
    let want = [
        Tok::Other('#'),
        Tok::Other('['),
        Tok::Ident("cfg".into()),
        Tok::Other('('),
        Tok::Ident("test".into()),
        Tok::Other(')'),
        Tok::Other(']'),
    ];
    toks.len() >= i + want.len() && toks[i..i + want.len()].iter().map(|t| &t.1).eq(want.iter())
}

/// The index after the item that starts at `i` (its attributes, then up
/// to its `;` or its closing brace).
fn skip_item(toks: &[(usize, Tok)], mut i: usize) -> usize {
    let mut depth = 0;
    while i < toks.len() {
        match &toks[i].1 {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            Tok::Other(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// The sibling import graph of every folder: folder -> (sibling, sibling)
/// -> where the first names the second (`file:line path`). A sibling is a
/// file of the folder or a folder in it (all of whose files count as it);
/// the folder's `mod.rs` is the folder itself, not a sibling.
type FolderGraphs = BTreeMap<Vec<String>, BTreeMap<(String, String), BTreeSet<String>>>;

fn folder_graphs(files: &[(String, String)]) -> FolderGraphs {
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|(f, _)| {
            let m = module_path(f);
            (
                m.split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
                f.clone(),
            )
        })
        .collect();
    let read: Vec<(String, FileImports)> = files
        .iter()
        .map(|(f, src)| (f.clone(), read_imports(f, &code_only(src))))
        .collect();
    let mut bound: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
    for (_, imports) in &read {
        for (module, name, path) in &imports.bound {
            bound.insert((module.clone(), name.clone()), path.clone());
        }
    }
    let mut graphs = FolderGraphs::new();
    for (file, imports) in &read {
        let from = module_path(file);
        let from: Vec<String> = from
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        for (line, path) in &imports.paths {
            let Some(to) = defining_module(&modules, &bound, path, 0) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common >= from.len() || common >= to.len() {
                continue; // a module and its own parent or child
            }
            let is_file = |m: &[String]| {
                let file = format!("{}.rs", m.join("/"));
                modules.get(m).is_some_and(|f| *f == file)
            };
            if !is_file(&from[..=common]) || !is_file(&to[..=common]) {
                continue; // a sibling folder (its `mod.rs`) is looked into on its own
            }
            graphs
                .entry(from[..common].to_vec())
                .or_default()
                .entry((from[common].clone(), to[common].clone()))
                .or_default()
                .insert(format!("src/{file}:{line} {}", path.join("::")));
        }
    }
    graphs
}

/// The module whose file defines what `path` names: the longest module
/// prefix of the path, followed through a `use` there that binds the next
/// name (a re-export), up to a few hops.
fn defining_module(
    modules: &BTreeMap<Vec<String>, String>,
    bound: &BTreeMap<(Vec<String>, String), Vec<String>>,
    path: &[String],
    hops: usize,
) -> Option<Vec<String>> {
    let k = (1..=path.len())
        .rev()
        .find(|k| modules.contains_key(&path[..*k]))?;
    let (module, rest) = path.split_at(k);
    if let Some(name) = rest.first() {
        if let Some(target) = bound.get(&(module.to_vec(), name.clone())) {
            if hops < 8 && target.as_slice() != path {
                let further = [target.as_slice(), &rest[1..]].concat();
                if let Some(m) = defining_module(modules, bound, &further, hops + 1) {
                    return Some(m);
                }
            }
        }
    }
    Some(module.to_vec())
}

/// The strongly connected groups of more than one node (Tarjan).
fn circles_of(edges: &BTreeMap<(String, String), BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    struct Walk<'a> {
        next: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let n = w.index.len();
        w.index.insert(v, n);
        w.low.insert(v, n);
        w.stack.push(v);
        let nexts = w.next[v].clone();
        for u in nexts {
            if !w.index.contains_key(u) {
                visit(w, u);
                let l = w.low[u].min(w.low[v]);
                w.low.insert(v, l);
            } else if w.stack.contains(&u) {
                let l = w.index[u].min(w.low[v]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let at = w.stack.iter().rposition(|x| *x == v).expect("on the stack");
            let group: Vec<String> = w.stack.drain(at..).map(String::from).collect();
            if group.len() > 1 {
                w.out.push(group);
            }
        }
    }
    let mut w = Walk {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in next.keys() {
        if !w.index.contains_key(v) {
            visit(&mut w, v);
        }
    }
    for group in &mut w.out {
        group.sort();
    }
    w.out.sort();
    w.out
}

/// Every import circle inside a folder, each as a report naming its files
/// and the imports that tie them.
fn folder_circles(files: &[(String, String)]) -> Vec<String> {
    let names: BTreeSet<&str> = files.iter().map(|(f, _)| f.as_str()).collect();
    let mut reports = Vec::new();
    for (folder, edges) in folder_graphs(files) {
        let dir = folder.join("/");
        let shown = |node: &str| {
            let path = if dir.is_empty() {
                node.to_string()
            } else {
                format!("{dir}/{node}")
            };
            if names.contains(format!("{path}.rs").as_str()) {
                format!("src/{path}.rs")
            } else {
                format!("src/{path}/")
            }
        };
        for group in circles_of(&edges) {
            let mut report = format!(
                "circle in src/{dir}/: {}",
                group
                    .iter()
                    .map(|n| shown(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for ((a, b), wheres) in &edges {
                if group.contains(a) && group.contains(b) {
                    let first = wheres.iter().next().map(String::as_str).unwrap_or("");
                    report.push_str(&format!("\n    {} -> {}: {first}", shown(a), shown(b)));
                }
            }
            reports.push(report);
        }
    }
    reports
}

fn src_files_with_text() -> Vec<(String, String)> {
    rust_files()
        .into_iter()
        .filter(|f| !test_only(f))
        .map(|f| {
            let src = fs::read_to_string(src_dir().join(&f)).expect("read a src file");
            (f, src)
        })
        .collect()
}

/// Files of one folder never import each other in a loop: a shared piece
/// lives in a leaf module or in the lower of the two files, so each folder
/// reads bottom up.
#[test]
fn no_import_circle_inside_a_folder() {
    let circles = folder_circles(&src_files_with_text());
    assert!(
        circles.is_empty(),
        "{} import circle(s) inside a folder (move the shared piece to a leaf module \
         or to the lower file; see docs/ARCHITECTURE.md, \"Layer order\"):\n{}",
        circles.len(),
        circles.join("\n")
    );
}

#[test]
fn the_circle_reader_finds_a_planted_circle() {
    let file = |f: &str, src: &str| (f.to_string(), src.to_string());
    let files = [
        file(
            "store/mod.rs",
            "pub mod a;\npub mod b;\npub mod c;\npub mod d;\npub use c::Gamma;\n",
        ),
        // a -> b through a `super::` group, b -> c through the parent's
        // re-export, c -> a through a full `crate::` path in code.
        file("store/a.rs", "use super::{b::Beta, c};\n"),
        file("store/b.rs", "use super::Gamma;\n"),
        file(
            "store/c.rs",
            "fn f() { crate::store::a::alpha(); }\n\
             #[cfg(test)]\nmod tests { use super::super::b; }\n",
        ),
        // A folder as one sibling, and a comment and a string that name b.
        file("store/d/mod.rs", "pub mod e;\n"),
        file(
            "store/d/e.rs",
            "// use crate::store::b;\nconst S: &str = \"crate::store::b\";\n",
        ),
    ];
    let circles = folder_circles(&files);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0]
            .starts_with("circle in src/store/: src/store/a.rs, src/store/b.rs, src/store/c.rs"),
        "{}",
        circles[0]
    );
    // A sibling folder is looked into on its own: b <-> d/e.rs is no
    // circle of src/store/'s files, while e.rs <-> f.rs inside d/ is one.
    let with_folder = [
        file("store/mod.rs", "pub mod b;\npub mod d;\n"),
        file("store/b.rs", "use super::d::e::E;\n"),
        file("store/d/mod.rs", "pub mod e;\npub mod f;\n"),
        file(
            "store/d/e.rs",
            "use crate::store::b::B;\nuse super::f::F;\n",
        ),
        file("store/d/f.rs", "pub(crate) use super::e::E as Mine;\n"),
    ];
    let circles = folder_circles(&with_folder);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].starts_with("circle in src/store/d/: src/store/d/e.rs, src/store/d/f.rs"),
        "{}",
        circles[0]
    );
}
