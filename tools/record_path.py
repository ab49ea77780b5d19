#!/usr/bin/env python3
"""The library's files and functions one record passes through, counted by callgrind.

Runs `triage/examples/record_path.rs` (one Lambda invocation of one record, a first delivery
that succeeds) under callgrind, collecting only inside the runtime's `block_on`, and lists
every function of `src/` that ran, grouped by file, with the calls that cross from one file
to another. A debug build, so functions are not inlined away.

    python3 tools/record_path.py            # the summary and the list
    python3 tools/record_path.py --summary  # one line

Needs valgrind. Closures and async bodies count as the function they belong to; a derived
impl (serde, Clone) counts as a function of the file that derives it.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src") + os.sep


def build():
    env = dict(os.environ)
    subprocess.run(
        ["cargo", "build", "--quiet", "-p", "triage", "--example", "record_path"],
        cwd=ROOT, check=True, env=env,
    )
    target = env.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "debug", "examples", "record_path")


def profile(binary):
    out = tempfile.NamedTemporaryFile(suffix=".callgrind", delete=False).name
    subprocess.run(
        [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--collect-atstart=no",
            "--toggle-collect=tokio::runtime::runtime::Runtime::block_on_inner",
            "--compress-strings=no", "--compress-pos=no", binary,
        ],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return out


def short(name):
    """A function's name without closures, recursion marks and argument lists."""
    name = re.sub(r"'\d+$", "", name)
    while name.endswith("::{{closure}}"):
        name = name[: -len("::{{closure}}")]
    return name


def parse(path):
    """(functions by file, cross-file calls) of the library's code that ran."""
    functions = collections.defaultdict(set)
    calls = set()
    fl = cfl = None
    fn = None
    pending_call = None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("fl="):
                fl = line[3:]
            elif line.startswith("fn="):
                fn = short(line[3:])
                cfl = None
                if fl and fl.startswith(SRC):
                    functions[fl].add(fn)
            elif line.startswith(("cfl=", "cfi=")):
                cfl = line[4:]
            elif line.startswith("cfn="):
                pending_call = (cfl or fl, short(line[4:]))
                cfl = None
            elif line.startswith("calls=") and pending_call:
                callee_file, callee = pending_call
                if fl and fl.startswith(SRC) and callee_file.startswith(SRC) and callee_file != fl:
                    calls.add((fl, fn, callee_file, callee))
                pending_call = None
    return functions, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", action="store_true", help="one line")
    ap.add_argument("--profile", help="an existing callgrind file to read instead of running")
    args = ap.parse_args()
    path = args.profile or profile(build())
    functions, calls = parse(path)
    n_fns = sum(len(v) for v in functions.values())
    hops = len(calls)
    summary = f"{len(functions)} files, {n_fns} functions, {hops} calls between files"
    print(summary)
    if args.summary:
        return 0
    for file in sorted(functions):
        rel = os.path.relpath(file, ROOT)
        print(f"\n{rel} ({len(functions[file])})")
        for fn in sorted(functions[file]):
            print(f"  {fn}")
    print("\ncalls between files:")
    for a_file, a, b_file, b in sorted(calls):
        print(f"  {os.path.relpath(a_file, ROOT)}: {a}\n    -> {os.path.relpath(b_file, ROOT)}: {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
