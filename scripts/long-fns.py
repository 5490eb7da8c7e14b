#!/usr/bin/env python3
"""List Rust functions whose bodies are longer than N lines.

    scripts/long-fns.py [--max N] [--test-max T] [--top K] [PATH ...]

PATH defaults to the whole workspace's Rust: the files git tracks (or,
outside a checkout, every *.rs below the repository root, `target/` and
`node_modules/` skipped); given PATHs are files or directories (*.rs
under directories). A body's length is the number of lines strictly
between the line with its opening brace and the line with its closing
brace, so a one-line body counts 1 and `fn f() {}` counts 0. Functions are
named `Type::name` inside an `impl` (the type after `for`, if any) and
`name` elsewhere.

Two limits: --max (default 80) for code, --test-max (default 150) for
test code, which is a function marked `#[test]` or `#[<path>::test]`
(e.g. `#[tokio::test]`), anything inside an item marked `#[cfg(test)]`
(a `mod tests { .. }`), and every function in a file under a `tests/`
directory or named `tests.rs` (a `#[cfg(test)] mod tests;` file).

Prints `LINES  FILE:LINE  NAME` (`NAME [test]` for test code), longest
first, for every function over its limit; with --top K, the K longest
whatever their length. Exits 1 when a function is over its limit (so CI
can run it), 0 otherwise. The scanner skips comments, strings, raw
strings and char literals, which is all brace and attribute matching
needs; it does not parse Rust.
"""

import argparse
import os
import re
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {"target", "node_modules", ".git"}

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def tokens(text):
    """Yields (kind, value, line) for identifiers and the punctuation that
    matters ({ } ( ) ;), skipping comments and literals."""
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += text[i] == "\n"
                    i += 1
        elif re.match(r"b?r#*\"", text[i:i + 40]) and not (
            i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            m = re.match(r"b?r(#*)\"", text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            line += text.count("\n", i, j)
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i)):
            i += 2 if c == "b" else 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                line += text[i] == "\n"
                i += 1
            i += 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.match(r"'(\\[^']*|[^'\\])'", text[i:])
            if m:
                i += m.end()
            else:
                i += 1
        elif c.isalpha() or c == "_":
            m = IDENT.match(text, i)
            yield ("id", m.group(0), line)
            i = m.end()
        elif c in "{}();#[]":
            yield ("p", c, line)
            i += 1
        else:
            i += 1


def is_test_attribute(words):
    """`#[test]`, `#[tokio::test(..)]`, `#[cfg(test)]`, `#[cfg(all(test, ..))]`:
    `words` are the attribute's identifiers in order."""
    if not words:
        return False
    if words[0] == "cfg":
        return "test" in words and "not" not in words
    return words[-1] == "test" or (len(words) > 1 and words[1] == "test" and words[0] == "tokio")


def functions(text, all_test=False):
    """Yields (name, start_line, body_lines, is_test) for every fn with a
    body; `all_test`: the whole file is test code."""
    # One entry per open brace: ("fn", name, line, test) / ("impl", type, test)
    # / ("block", test). An entry's `test` is inherited by what it holds.
    stack = []
    pending = None  # ("fn", name) or ("impl", words) awaiting its brace
    parens = 0
    attr = None  # the identifiers of the attribute being read, or None
    attr_depth = 0
    marked = False  # a test attribute applies to the next item
    prev = None
    for kind, value, line in tokens(text):
        if attr is not None:
            if kind == "id":
                attr.append(value)
            elif value == "[":
                attr_depth += 1
            elif value == "]":
                attr_depth -= 1
                if attr_depth == 0:
                    marked = marked or is_test_attribute(attr)
                    attr = None
            continue
        if value == "[" and prev == "#":
            attr, attr_depth = [], 1
            prev = value
            continue
        prev = value
        inside_test = all_test or bool(stack and stack[-1] and stack[-1][-1])
        if kind == "id":
            if value == "fn":
                pending = ("fn", None)
            elif pending and pending[0] == "fn" and pending[1] is None:
                pending = ("fn", value)
            elif value == "impl" and parens == 0 and pending is None:
                pending = ("impl", [])
            elif pending and pending[0] == "impl":
                pending[1].append(value)
            continue
        if pending == ("fn", None):
            pending = None  # `fn(..)`: a function pointer type, not an item
        test = inside_test or marked
        if value == "(":
            parens += 1
        elif value == ")":
            parens -= 1
        elif value == ";" and parens == 0:
            pending = None  # a declaration without a body
            marked = False
        elif value == "{":
            if pending and pending[0] == "fn" and pending[1] and parens == 0:
                owner = next((e[1] for e in reversed(stack) if e and e[0] == "impl"), None)
                name = f"{owner}::{pending[1]}" if owner else pending[1]
                stack.append(("fn", name, line, test))
            elif pending and pending[0] == "impl":
                words = [w for w in pending[1] if w not in ("where", "dyn", "mut", "const")]
                if "for" in words:
                    words = words[words.index("for") + 1:]
                stack.append(("impl", words[0] if words else "?", test))
            else:
                stack.append(("block", test))
            pending = None
            marked = False
        elif value == "}":
            if stack:
                entry = stack.pop()
                if entry[0] == "fn":
                    yield entry[1], entry[2], line - entry[2] - 1, entry[3]


def is_test_file(path):
    parts = os.path.normpath(path).split(os.sep)
    return "tests" in parts[:-1] or parts[-1] == "tests.rs"


def workspace_files():
    """The Rust files git tracks under the repository root, else every
    *.rs below it; paths relative to the current directory."""
    try:
        out = subprocess.run(
            ["git", "-C", ROOT, "ls-files", "-z", "--", "*.rs"],
            capture_output=True, check=True,
        ).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = None
    if files is None:
        files = []
        for root, dirs, names in os.walk(ROOT):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            files += [os.path.relpath(os.path.join(root, f), ROOT) for f in sorted(names) if f.endswith(".rs")]
    return sorted(os.path.relpath(os.path.join(ROOT, f)) for f in files)


def rust_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(root, f)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=80, help="longest allowed body of code (lines)")
    ap.add_argument("--test-max", type=int, default=150, help="longest allowed body of test code (lines)")
    ap.add_argument("--top", type=int, default=0, help="also list the K longest")
    ap.add_argument("paths", nargs="*", help="files or directories (default: the workspace)")
    a = ap.parse_args()
    found = []
    files = rust_files(a.paths) if a.paths else workspace_files()
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name, line, length, test in functions(text, is_test_file(path)):
            limit = a.test_max if test else a.max
            label = f"{name} [test]" if test else name
            found.append((length, f"{path}:{line}", label, length > limit))
    found.sort(key=lambda x: (-x[0], x[1]))
    over = [f for f in found if f[3]]
    shown = over if len(over) >= a.top else found[: a.top]
    for length, where, name, _ in shown:
        print(f"{length:5}  {where}  {name}")
    if over:
        print(
            f"{len(over)} function(s) over {a.max} lines (test code: {a.test_max})",
            file=sys.stderr,
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
