#!/usr/bin/env python3
"""Lists the Rust functions longer than a limit, outside tests.

Scans src/ and triage/src/ (skipping `#[cfg(test)]` items and `tests/` directories).
Prints `lines path:line name`, longest first. Exits 1 when any function is over the limit.

    python3 tools/long_fns.py            # over 100 lines
    python3 tools/long_fns.py --max 80
"""
import argparse
import bisect
import os
import re
import sys

ROOTS = ("src", "triage/src")
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")
CFG_TEST = re.compile(r"#\[cfg\(\s*test\s*\)\]")


# What can hide a brace: comments, strings (raw ones too) and char literals.
HIDING = re.compile(
    r"""//[^\n]*|/\*|(?<![A-Za-z0-9_])r(#*)"|"(?:\\.|[^"\\])*"|'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'""",
    re.S,
)
BLOCK = re.compile(r"/\*|\*/")


def blank_code(text):
    """Returns the text with comments, strings and chars replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while True:
        m = HIDING.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i:m.start()])
        tok = m.group(0)
        if tok == "/*":
            # Block comments nest.
            depth, j = 1, m.end()
            while depth:
                b = BLOCK.search(text, j)
                if not b:
                    j = n
                    break
                depth += 1 if b.group(0) == "/*" else -1
                j = b.end()
        elif m.group(1) is not None:
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
        else:
            j = m.end()
        out.append(_keep_newlines(text[m.start():j]))
        i = j
    return "".join(out)


def _keep_newlines(s):
    return re.sub(r"[^\n]", " ", s)


BRACE = re.compile(r"[{}]")


def matching_brace(code, open_at):
    """Returns the index of the brace closing the one at open_at."""
    depth = 0
    for m in BRACE.finditer(code, open_at):
        depth += 1 if m.group(0) == "{" else -1
        if depth == 0:
            return m.start()
    return len(code) - 1


def test_spans(code):
    """Returns (start, end) spans of items under #[cfg(test)]."""
    spans = []
    for m in CFG_TEST.finditer(code):
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue
        spans.append((m.start(), matching_brace(code, brace)))
    return spans


def long_functions(path, limit):
    with open(path, encoding="utf-8") as f:
        code = blank_code(f.read())
    skip = test_spans(code)
    newlines = [i for i, ch in enumerate(code) if ch == "\n"]
    found = []
    for m in FN.finditer(code):
        if any(a <= m.start() <= b for a, b in skip):
            continue
        # The body starts at the first `{` after the signature; a `;` first means no body.
        j = m.end()
        depth = 0
        while j < len(code):
            ch = code[j]
            if ch in "(<[":
                depth += 1
            elif ch in ")>]":
                depth -= 1
            elif ch == ";" and depth <= 0:
                j = -1
                break
            elif ch == "{" and depth <= 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        end = matching_brace(code, j)
        first = bisect.bisect_left(newlines, m.start()) + 1
        last = bisect.bisect_left(newlines, end) + 1
        lines = last - first + 1
        if lines > limit:
            found.append((lines, path, first, m.group(1)))
    return found


def rust_files(root):
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "tests")
        for name in sorted(files):
            if name.endswith(".rs"):
                yield os.path.join(base, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=100, help="longest allowed (lines)")
    parser.add_argument("roots", nargs="*", default=None, help="directories to scan")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots = args.roots or [os.path.join(here, r) for r in ROOTS]
    found = []
    for root in roots:
        for path in rust_files(root):
            for lines, p, line, name in long_functions(path, args.max):
                found.append((lines, os.path.relpath(p, here), line, name))
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    for lines, path, line, name in found:
        print(f"{lines} {path}:{line} {name}")
    if found:
        print(f"{len(found)} function(s) over {args.max} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
