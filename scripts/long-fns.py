#!/usr/bin/env python3
"""List Rust functions whose bodies are longer than N lines.

    scripts/long-fns.py [--max N] [--top K] [PATH ...]

PATH defaults to src/ (files or directories; *.rs under directories).
A body's length is the number of lines strictly between the line with its
opening brace and the line with its closing brace, so a one-line body
counts 1 and `fn f() {}` counts 0. Functions are named
`Type::name` inside an `impl` (the type after `for`, if any) and `name`
elsewhere; `#[cfg(test)]` code is included (tests are code too).

Prints `LINES  FILE:LINE  NAME`, longest first, for every function over
--max (default 80); with --top K, the K longest whatever their length.
Exits 1 when a function is over --max (so CI can run it), 0 otherwise.
The scanner skips comments, strings, raw strings and char literals, which
is all brace matching needs; it does not parse Rust.
"""

import argparse
import os
import re
import signal
import sys

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
        elif c in "{}();":
            yield ("p", c, line)
            i += 1
        else:
            i += 1


def functions(text):
    """Yields (name, start_line, body_lines) for every fn with a body."""
    stack = []  # one entry per open brace: ("fn", name, line) / ("impl", type) / None
    pending = None  # ("fn", name) or ("impl", words) awaiting its brace
    parens = 0
    for kind, value, line in tokens(text):
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
        if value == "(":
            parens += 1
        elif value == ")":
            parens -= 1
        elif value == ";" and parens == 0:
            pending = None  # a declaration without a body
        elif value == "{":
            if pending and pending[0] == "fn" and pending[1] and parens == 0:
                owner = next((e[1] for e in reversed(stack) if e and e[0] == "impl"), None)
                name = f"{owner}::{pending[1]}" if owner else pending[1]
                stack.append(("fn", name, line))
            elif pending and pending[0] == "impl":
                words = [w for w in pending[1] if w not in ("where", "dyn", "mut", "const")]
                if "for" in words:
                    words = words[words.index("for") + 1:]
                stack.append(("impl", words[0] if words else "?"))
            else:
                stack.append(None)
            pending = None
        elif value == "}":
            if stack:
                entry = stack.pop()
                if entry and entry[0] == "fn":
                    yield entry[1], entry[2], line - entry[2] - 1


def rust_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "target")
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(root, f)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=80, help="longest allowed body (lines)")
    ap.add_argument("--top", type=int, default=0, help="also list the K longest")
    ap.add_argument("paths", nargs="*", default=["src"])
    a = ap.parse_args()
    found = []
    for path in rust_files(a.paths):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name, line, length in functions(text):
            found.append((length, f"{path}:{line}", name))
    found.sort(key=lambda x: (-x[0], x[1]))
    over = [f for f in found if f[0] > a.max]
    shown = over if len(over) >= a.top else found[: a.top]
    for length, where, name in shown:
        print(f"{length:5}  {where}  {name}")
    if over:
        print(f"{len(over)} function(s) over {a.max} lines", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
