//! No dead link in the docs: every relative link of every Markdown file of
//! the repository (but `target/`, `node_modules/`, `data/` and hidden
//! folders) must name a file or folder that exists, and its `#anchor` a
//! heading of that page, as GitHub renders it (its slug rules below).
//! The test fails once, naming every dead link with its file and line.
//! And every page of `docs/` is linked from its index, `docs/README.md`,
//! and stays about 600 lines at most.
//!
//! Pages moved, split and merged over time (the README's sections became
//! `docs/` pages): a link that still points at the old place is the
//! mistake this catches. What it reads: inline links and images
//! (`[text](dest)`, `![alt](dest)`) and reference definitions
//! (`[label]: dest`), outside fenced code blocks and code spans. Links
//! with a scheme (`https:`, `mailto:`) are not fetched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Folders never read: build output, installed packages, local data.
const SKIPPED_DIRS: [&str; 3] = ["target", "node_modules", "data"];

/// Every `.md` file under `root`, as paths from `root`, sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && !SKIPPED_DIRS.contains(&name.as_str()) {
                    dirs.push(path);
                }
            } else if name.ends_with(".md") {
                found.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
            }
        }
    }
    found.sort();
    found
}

/// The fence a line opens or closes (its character and length), if any.
fn fence_of(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    let first = trimmed.chars().next()?;
    if first != '`' && first != '~' {
        return None;
    }
    let count = trimmed.chars().take_while(|&c| c == first).count();
    (count >= 3).then_some((first, count))
}

/// `text`'s lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut open: Option<(char, usize)> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match (open, fence_of(line)) {
            (None, Some(fence)) => open = Some(fence),
            (Some((c, n)), Some((c2, n2))) if c == c2 && n2 >= n && is_bare_fence(line) => {
                open = None;
            }
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// A closing fence carries no info string.
fn is_bare_fence(line: &str) -> bool {
    line.trim().chars().all(|c| c == '`' || c == '~')
}

/// `line` with its code spans blanked out (a link inside backticks is
/// not a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        let closer = "`".repeat(ticks);
        match after.find(&closer) {
            Some(end) => {
                out.push_str(&rest[..start]);
                out.push(' ');
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link destinations of one prose line: inline links and images,
/// and a reference definition.
fn destinations(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut found = Vec::new();
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix('[') {
        if let Some((label, dest)) = rest.split_once("]:") {
            if !label.contains(']') {
                if let Some(dest) = dest.split_whitespace().next() {
                    found.push(dest.trim_matches(['<', '>']).to_string());
                }
            }
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find([')', ' ']).unwrap_or(after.len());
        let dest = after[..end].trim_matches(['<', '>']);
        if !dest.is_empty() {
            found.push(dest.to_string());
        }
        rest = &after[end..];
    }
    found
}

/// A heading's anchor as GitHub makes it: the rendered text lowercased,
/// every character that is not a letter, digit, `-`, `_` or space
/// dropped, each space turned into `-`.
fn slug(heading: &str) -> String {
    let mut text = heading.trim().to_string();
    // A link in a heading renders as its text.
    while let (Some(open), Some(mid)) = (text.find('['), text.find("](")) {
        match text[mid..].find(')') {
            Some(close) if open < mid => {
                let label = text[open + 1..mid].to_string();
                text.replace_range(open..mid + close + 1, &label);
            }
            _ => break,
        }
    }
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a page: its ATX headings' slugs (the second of two
/// equal ones gets `-1`, the third `-2`, ...) and explicit `<a name>` or
/// `id` anchors.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes)
            && line.len() - trimmed.len() <= 3
            && trimmed[hashes..].starts_with([' ', '\t'])
        {
            let title = trimmed[hashes..].trim().trim_end_matches('#').trim();
            let base = slug(title);
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for marker in ["name=\"", "id=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(marker) {
                let after = &rest[at + marker.len()..];
                let end = after.find('"').unwrap_or(after.len());
                out.insert(after[..end].to_string());
                rest = &after[end..];
            }
        }
    }
    out
}

/// `path` with `.` and `..` resolved, without touching the disk.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `%20` and friends in a destination, decoded (other bytes kept).
fn percent_decoded(dest: &str) -> String {
    let bytes = dest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every dead link of the Markdown files under `root`, as
/// `file:line: dest (why)`.
fn dead_links(root: &Path) -> Vec<String> {
    let mut anchor_cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut dead = Vec::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(root.join(&file))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        for (line_no, line) in prose_lines(&text) {
            for dest in destinations(line) {
                if let Some(why) = check(root, &file, &dest, &mut anchor_cache) {
                    dead.push(format!("{}:{line_no}: {dest} ({why})", file.display()));
                }
            }
        }
    }
    dead
}

/// Why `dest`, a link in `file`, is dead; `None` when it is alive or is
/// not a relative link.
fn check(
    root: &Path,
    file: &Path,
    dest: &str,
    cache: &mut BTreeMap<PathBuf, BTreeSet<String>>,
) -> Option<String> {
    let scheme = dest
        .split_once(':')
        .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()));
    if scheme || dest.starts_with("//") {
        return None;
    }
    let (path, anchor) = match dest.split_once('#') {
        Some((path, anchor)) => (percent_decoded(path), Some(percent_decoded(anchor))),
        None => (percent_decoded(dest), None),
    };
    let target = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        normalize(Path::new(from_root))
    } else {
        normalize(&file.parent().unwrap_or(Path::new("")).join(&path))
    };
    if !root.join(&target).exists() {
        return Some(format!("no file {}", target.display()));
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if target.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let known = cache.entry(target.clone()).or_insert_with(|| {
        anchors(&std::fs::read_to_string(root.join(&target)).unwrap_or_default())
    });
    (!known.contains(&anchor)).then(|| format!("no heading #{anchor} in {}", target.display()))
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo();
    let files = markdown_files(&root);
    assert!(
        files.len() >= 15 && files.iter().any(|f| f == Path::new("docs/README.md")),
        "the link check found too few Markdown files: {files:?}"
    );
    let dead = dead_links(&root);
    assert!(
        dead.is_empty(),
        "{} dead link(s); fix the path or the #anchor (GitHub's heading slug: \
         lowercase, punctuation dropped, spaces as -):\n{}",
        dead.len(),
        dead.join("\n")
    );
}

/// The most lines a docs page may have: "about 600", with room for a
/// rule or a runbook section before the page must be split.
const MAX_PAGE_LINES: usize = 640;

/// The pages of `root`'s docs/ that docs/README.md does not link, and
/// those longer than [`MAX_PAGE_LINES`], each with what to do.
fn index_problems(root: &Path) -> Vec<String> {
    let docs = root.join("docs");
    let index_text = std::fs::read_to_string(docs.join("README.md"))
        .unwrap_or_else(|e| panic!("docs/README.md, the index: {e}"));
    let linked: BTreeSet<String> = prose_lines(&index_text)
        .into_iter()
        .flat_map(|(_, line)| destinations(line))
        .map(|d| d.split('#').next().unwrap_or_default().to_string())
        .collect();
    let mut problems = Vec::new();
    for file in markdown_files(&docs) {
        let name = file.display().to_string();
        let text = std::fs::read_to_string(docs.join(&file)).unwrap_or_default();
        if name != "README.md" && !linked.contains(&name) {
            problems.push(format!(
                "docs/{name}: not linked from docs/README.md (the index)"
            ));
        }
        let lines = text.lines().count();
        if lines > MAX_PAGE_LINES {
            problems.push(format!(
                "docs/{name}: {lines} lines, over {MAX_PAGE_LINES}: split it by topic"
            ));
        }
    }
    problems
}

#[test]
fn every_docs_page_is_in_the_index_and_about_600_lines_at_most() {
    let problems = index_problems(&repo());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_page_left_out_of_the_index_or_too_long_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).expect("docs/");
    std::fs::write(docs.join("README.md"), "# Index\n\n- [A](A.md#top)\n").expect("index");
    std::fs::write(docs.join("A.md"), "# Top\n").expect("A");
    std::fs::write(docs.join("B.md"), "# B\n".repeat(MAX_PAGE_LINES + 1)).expect("B");
    assert_eq!(
        index_problems(dir.path()),
        [
            "docs/B.md: not linked from docs/README.md (the index)".to_string(),
            format!(
                "docs/B.md: {} lines, over {MAX_PAGE_LINES}: split it by topic",
                MAX_PAGE_LINES + 1
            ),
        ]
    );
}

#[test]
fn a_planted_dead_link_or_anchor_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs")).expect("docs/");
    std::fs::create_dir_all(root.join("target")).expect("target/");
    std::fs::write(
        root.join("docs/PAGE.md"),
        "# A page\n\n## Why `hide = true` hides, 2 ways\n\n## Why `hide = true` hides, 2 ways\n",
    )
    .expect("page");
    std::fs::write(
        root.join("README.md"),
        "# Front\n\n\
         [ok](docs/PAGE.md#why-hide--true-hides-2-ways) [ok too](docs/PAGE.md#why-hide--true-hides-2-ways-1)\n\
         [ok, a folder](docs/) [self](#front) [web](https://example.com/x.md#y)\n\
         `[in code](docs/GONE.md)`\n\
         ```sh\n[in a fence](docs/GONE.md)\n```\n\
         [gone](docs/GONE.md) ![gone too](img/logo.png)\n\
         [bad anchor](docs/PAGE.md#no-such-heading) [bad self](#nowhere)\n\
         [ref]: docs/ALSO-GONE.md\n",
    )
    .expect("readme");
    // A file under target/ is never read, dead links and all.
    std::fs::write(root.join("target/x.md"), "[x](nowhere.md)\n").expect("target file");
    let dead = dead_links(root);
    assert_eq!(
        dead,
        [
            "README.md:9: docs/GONE.md (no file docs/GONE.md)",
            "README.md:9: img/logo.png (no file img/logo.png)",
            "README.md:10: docs/PAGE.md#no-such-heading (no heading #no-such-heading in docs/PAGE.md)",
            "README.md:10: #nowhere (no heading #nowhere in README.md)",
            "README.md:11: docs/ALSO-GONE.md (no file docs/ALSO-GONE.md)",
        ],
        "{dead:#?}"
    );
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(
        slug("A secure cluster end to end (ACLs and mTLS)"),
        "a-secure-cluster-end-to-end-acls-and-mtls"
    );
    assert_eq!(
        slug("22. `hide = true` hides every counter of a format, frozen with it"),
        "22-hide--true-hides-every-counter-of-a-format-frozen-with-it"
    );
    assert_eq!(slug("Client (Rust)"), "client-rust");
    assert_eq!(slug("[Linked](x.md) title"), "linked-title");
    assert_eq!(slug("snake_case and dash-es"), "snake_case-and-dash-es");
}
