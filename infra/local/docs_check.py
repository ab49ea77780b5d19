#!/usr/bin/env python3
"""Checks the README and docs/: relative links resolve, and prose stays short.

    python3 infra/local/docs_check.py [FILE.md ...]

For each page it prints lines, words and the average words per sentence, of the whole page
and of its opening summary (the text before its first `##` heading). Prose only: code blocks,
tables, headings and images are not sentences. It exits 1 when a relative link names a file
or a heading that does not exist, or when the README or an opening summary averages more than
22 words per sentence.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMIT = 22.0


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to dashes."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    """A page's heading anchors; a repeated heading gets `-1`, `-2`, ... as on GitHub."""
    out, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            s = slug(line.lstrip("#"))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(f"{s}-{n}" if n else s)
    return out


def prose(lines):
    """The page's prose lines: no code, tables, headings or images."""
    out, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
            continue
        s = line.strip()
        if fenced or not s or s.startswith(("|", "#", "![")):
            out.append("")  # a paragraph break
            continue
        out.append(s)
    return out


def sentences(lines):
    """Sentences of the prose: a list item or a paragraph ends one, as `.`, `!` or `?` do."""
    text, parts = "", []
    for s in prose(lines):
        if not s or re.match(r"^([-*]|\d+\.) ", s):
            parts.append(text)
            text = re.sub(r"^([-*]|\d+\.) ", "", s)
        else:
            text += " " + s
    parts.append(text)
    out = []
    for p in parts:
        # `code` may hold dots; it counts as one word. A bold lead-in (**Word.**) is counted
        # with the sentence it opens, which keeps the average on the long side.
        p = re.sub(r"`[^`]*`", "CODE", p)
        p = re.sub(r"\]\([^)]*\)", "]", p)
        for sent in re.split(r"(?<=[.!?])\s+(?=[A-Z*\[`(\"0-9])", p):
            words = re.findall(r"[\w\-–×→/%.,'’]+", sent)
            if words:
                out.append(len(words))
    return out


def stats(lines):
    sent = sentences(lines)
    words = sum(sent)
    return len(lines), words, len(sent), (words / len(sent) if sent else 0.0)


def opening(lines):
    for i, line in enumerate(lines[1:], 1):
        if line.startswith("## "):
            return lines[:i]
    return lines


def check_links(path):
    bad, fenced = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.relative_to(ROOT)}:{n}: no file {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{path.relative_to(ROOT)}:{n}: no heading #{anchor} in {file or path.name}")
    return bad


def main(args):
    pages = [pathlib.Path(a).resolve() for a in args] or [ROOT / "README.md"] + sorted(
        (ROOT / "docs").glob("*.md")
    )
    failed = False
    print("| page | lines | words | sentences | words/sentence | opening: lines | words | words/sentence |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for page in pages:
        lines = page.read_text().splitlines()
        n, w, s, avg = stats(lines)
        on, ow, _, oavg = stats(opening(lines))
        print(f"| {page.relative_to(ROOT)} | {n} | {w} | {s} | {avg:.1f} | {on} | {ow} | {oavg:.1f} |")
        if oavg > LIMIT or (page.name == "README.md" and avg > LIMIT):
            print(f"too long: {page.relative_to(ROOT)} averages more than {LIMIT} words a sentence")
            failed = True
        for b in check_links(page):
            print(b)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
