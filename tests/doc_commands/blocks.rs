//! The shell blocks of a Markdown document and their `doc-test` markers
//! (docs/CONTRIBUTING.md, "Docs are tested").
//!
//! A fenced block whose info string is `sh`, `bash`, `console` or `shell`
//! is a shell block. It may be indented (inside a list item): the fence's
//! indentation is taken off every line of the block. The line right before
//! the fence may be one marker comment, `<!-- doc-test: ... -->`, holding
//! `skip: REASON` or a comma-separated list of `node`, `consul`,
//! `expect-fail`, `background`.

/// The shell languages whose fenced blocks are run.
const SHELL_LANGS: [&str; 4] = ["sh", "bash", "console", "shell"];

/// What a block's marker asks of the runner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marker {
    /// `skip: REASON`: not run; the reason is required.
    pub skip: Option<String>,
    /// `node`: the README's development node (`idgen serve --config
    /// config/dev.toml`) runs while the block does.
    pub node: bool,
    /// `consul`: the Consul emulator runs on 127.0.0.1:8500 with ACLs on.
    pub consul: bool,
    /// `expect-fail`: the block must exit non-zero.
    pub expect_fail: bool,
    /// `background`: the block is started and left running (a server)
    /// until the document is done; later blocks wait for it themselves.
    pub background: bool,
}

/// One shell block of a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    /// The info string's first word (`sh`, `console`, ...).
    pub lang: String,
    /// The block's text, its fence's indentation taken off.
    pub text: String,
    /// Its marker (all defaults when there is none).
    pub marker: Marker,
}

impl Block {
    /// The script bash runs: the text itself, or for a `console` block
    /// only its `$ ` lines (with their `\` continuation lines); the other
    /// lines of a `console` block are sample output and are not compared.
    pub fn script(&self) -> String {
        if self.lang != "console" {
            return self.text.clone();
        }
        let mut script = String::new();
        let mut continued = false;
        for line in self.text.lines() {
            let command = match line.strip_prefix("$ ") {
                Some(command) => Some(command),
                None if continued => Some(line),
                None => None,
            };
            if let Some(command) = command {
                script.push_str(command);
                script.push('\n');
                continued = command.trim_end().ends_with('\\');
            } else {
                continued = false;
            }
        }
        script
    }
}

/// Parses a marker comment's body (what is between `doc-test:` and `-->`).
pub fn parse_marker(body: &str) -> Result<Marker, String> {
    let body = body.trim();
    let mut marker = Marker::default();
    if let Some(reason) = body.strip_prefix("skip:") {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err("`skip:` needs a reason, e.g. `skip: needs a real Consul`".into());
        }
        marker.skip = Some(reason.to_string());
        return Ok(marker);
    }
    for word in body.split(',').map(str::trim) {
        match word {
            "node" => marker.node = true,
            "consul" => marker.consul = true,
            "expect-fail" => marker.expect_fail = true,
            "background" => marker.background = true,
            other => {
                return Err(format!(
                    "unknown doc-test marker {other:?}: use `skip: REASON` or any of \
                     node, consul, expect-fail, background (docs/CONTRIBUTING.md)"
                ))
            }
        }
    }
    Ok(marker)
}

/// The marker on `line` (the line before a fence), if it is one.
fn marker_on(line: &str) -> Option<Result<Marker, String>> {
    let body = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix("doc-test:")?;
    Some(parse_marker(body))
}

/// An opening or closing fence: its indentation, backtick count and info
/// string.
fn fence(line: &str) -> Option<(usize, usize, &str)> {
    let trimmed = line.trim_start();
    let indent = line.len() - trimmed.len();
    let ticks = trimmed.chars().take_while(|&c| c == '`').count();
    (ticks >= 3).then_some((indent, ticks, trimmed[ticks..].trim()))
}

/// Every shell block of `doc`, or the first marker error (with its line).
pub fn shell_blocks(doc: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((indent, ticks, info)) = fence(lines[i]) else {
            if let Some(Err(e)) = marker_on(lines[i]) {
                return Err(format!("line {}: {e}", i + 1));
            }
            i += 1;
            continue;
        };
        let lang = info.split([' ', ',', '{']).next().unwrap_or("").to_string();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() {
            if let Some((_, close, rest)) = fence(lines[i]) {
                if close >= ticks && rest.is_empty() {
                    break;
                }
            }
            let line = lines[i];
            let cut = line.len() - line.trim_start().len();
            body.push(&line[cut.min(indent)..]);
            i += 1;
        }
        i += 1;
        let marker = match start.checked_sub(1).and_then(|p| marker_on(lines[p])) {
            Some(Ok(marker)) => marker,
            Some(Err(e)) => return Err(format!("line {start}: {e}")),
            None => Marker::default(),
        };
        if SHELL_LANGS.contains(&lang.as_str()) {
            let mut text = body.join("\n");
            text.push('\n');
            blocks.push(Block {
                line: start + 1,
                lang,
                text,
                marker,
            });
        } else if (lang.is_empty() || lang == "text") && body.iter().any(|l| l.starts_with("$ ")) {
            return Err(format!(
                "line {}: a block without a shell language holds `$ ` command lines, which \
                 would never run: make it ```console (or mark it skip with a reason)",
                start + 1
            ));
        } else if marker != Marker::default() {
            return Err(format!(
                "line {start}: a doc-test marker before a `{info}` block, which is never run: \
                 markers go before sh, bash, console or shell blocks"
            ));
        }
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_blocks_are_found_with_their_markers_and_indentation() {
        let doc = "text\n```sh\nidgen gen\n```\n\n<!-- doc-test: skip: needs kubectl -->\n\
                   ```bash\nkubectl apply\n```\n```toml\n[a]\n```\n1. step\n\n   \
                   <!-- doc-test: node, expect-fail -->\n   ```sh\n   idgen gen \\\n     -n 2\n   ```\n";
        let blocks = shell_blocks(doc).unwrap();
        assert_eq!(blocks.len(), 3, "{blocks:?}");
        assert_eq!(
            (blocks[0].line, blocks[0].text.as_str()),
            (2, "idgen gen\n")
        );
        assert_eq!(blocks[1].marker.skip.as_deref(), Some("needs kubectl"));
        assert_eq!(blocks[2].text, "idgen gen \\\n  -n 2\n");
        assert!(blocks[2].marker.node && blocks[2].marker.expect_fail);
        assert!(!blocks[2].marker.consul);
    }

    #[test]
    fn console_blocks_run_only_their_dollar_lines() {
        let block = Block {
            line: 1,
            lang: "console".into(),
            text: "$ idgen gen \\\n    -n 2\n1\n2\n$ idgen decode 1\nid 1\n".into(),
            marker: Marker::default(),
        };
        assert_eq!(block.script(), "idgen gen \\\n    -n 2\nidgen decode 1\n");
    }

    #[test]
    fn bad_markers_are_errors_naming_the_line() {
        let no_reason = shell_blocks("<!-- doc-test: skip: -->\n```sh\nx\n```\n").unwrap_err();
        assert!(
            no_reason.contains("line 1") && no_reason.contains("reason"),
            "{no_reason}"
        );
        let unknown = shell_blocks("<!-- doc-test: nodes -->\n```sh\nx\n```\n").unwrap_err();
        assert!(unknown.contains("\"nodes\""), "{unknown}");
        let stray = shell_blocks("<!-- doc-test: node -->\n```toml\nx\n```\n").unwrap_err();
        assert!(stray.contains("never run"), "{stray}");
        let dangling = shell_blocks("<!-- doc-test: nod -->\n\ntext\n").unwrap_err();
        assert!(dangling.contains("line 1"), "{dangling}");
        let hidden = shell_blocks("text\n\n```\n$ idgen gen\n1\n```\n").unwrap_err();
        assert!(
            hidden.contains("line 3") && hidden.contains("console"),
            "{hidden}"
        );
        assert!(shell_blocks("```text\nid 1\n```\n").unwrap().is_empty());
    }
}
