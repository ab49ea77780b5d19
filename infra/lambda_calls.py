"""The AWS operations the triage-lambda binary can call, derived from the crate's source.

    python3 infra/lambda_calls.py [REPO_ROOT]     prints them, with where each one is called

How: starting from `triage/src/bin/triage-lambda.rs`, the modules it uses (`use` paths and
inline `crate::` / `super::` / `sqs_triage::` / `triage::` paths, private `mod x;` declarations,
and public ones whose `x::` is used), in the library (`src/`) and the operator tool
(`triage/src/`),
are collected, file by file. In those files every `fn` is cut out (test modules and
`#[cfg(test)]` items removed, comments and strings blanked); a function reaches every function
of the same name that it calls or names (`name(`, `.name(`, `Path::name`), which over-approximates
methods and trait dispatch rather than missing any. From `main`, the reachable functions' SDK
calls are the fluent builders of the SQS and DynamoDB clients (`.get_item()`, `.send_message_batch()`,
...: every operation of both SDKs is listed below), mapped to IAM actions (`batch_get_item` ->
`dynamodb:BatchGetItem`; SQS's `*_batch` operations are authorized by the single action;
`batch_execute_statement` by the PartiQL actions of the statements the ledger issues).

A reachable function that sends an SDK request (`.send()`) whose operation is not recognised,
or an operation whose IAM action cannot be derived from its name, is an error: the check cannot
vouch for the role then.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ENTRY = "triage/src/bin/triage-lambda.rs"
# Each crate's name and source folder: the library, and the operator tool that holds the binary.
CRATES = {"sqs_triage": "src", "triage": "triage/src"}

# Every operation of aws-sdk-sqs 1.x and aws-sdk-dynamodb 1.x (their `src/operation/` folders).
SQS_OPS = """add_permission cancel_message_move_task change_message_visibility
change_message_visibility_batch create_queue delete_message delete_message_batch delete_queue
get_queue_attributes get_queue_url list_dead_letter_source_queues list_message_move_tasks
list_queue_tags list_queues purge_queue receive_message remove_permission send_message
send_message_batch set_queue_attributes start_message_move_task tag_queue untag_queue""".split()
DYNAMODB_OPS = """batch_execute_statement batch_get_item batch_write_item create_backup
create_global_table create_table delete_backup delete_item delete_resource_policy delete_table
describe_backup describe_continuous_backups describe_contributor_insights describe_endpoints
describe_export describe_global_table describe_global_table_settings describe_import
describe_kinesis_streaming_destination describe_limits describe_table
describe_table_replica_auto_scaling describe_time_to_live disable_kinesis_streaming_destination
enable_kinesis_streaming_destination execute_statement execute_transaction
export_table_to_point_in_time get_item get_resource_policy import_table list_backups
list_contributor_insights list_exports list_global_tables list_imports list_tables
list_tags_of_resource put_item put_resource_policy query restore_table_from_backup
restore_table_to_point_in_time scan tag_resource transact_get_items transact_write_items
untag_resource update_continuous_backups update_contributor_insights update_global_table
update_global_table_settings update_item update_kinesis_streaming_destination update_table
update_table_replica_auto_scaling update_time_to_live""".split()

# Operations whose IAM authorization is not the action of the same name: PartiQL and
# transactions are authorized per statement / per item; these need a hand-written mapping.
NOT_BY_NAME = {
    "batch_execute_statement", "execute_statement", "execute_transaction",
    "transact_get_items", "transact_write_items", "describe_endpoints",
}
SQS_BATCH_ACTION = {
    "send_message_batch": "sqs:SendMessage",
    "delete_message_batch": "sqs:DeleteMessage",
    "change_message_visibility_batch": "sqs:ChangeMessageVisibility",
}


def pascal(snake: str) -> str:
    return "".join(p.capitalize() for p in snake.split("_"))


# PartiQL is authorized per statement kind. The ledger's batched writes
# (AttemptLedger::write_batch in src/effects/ledger.rs) issue INSERT, UPDATE and DELETE
# statements; a new kind of statement there must be added here.
PARTIQL_ACTIONS = {
    "batch_execute_statement": ["dynamodb:PartiQLInsert", "dynamodb:PartiQLUpdate", "dynamodb:PartiQLDelete"],
}


def iam_actions(op: str) -> list[str]:
    if op in PARTIQL_ACTIONS:
        return PARTIQL_ACTIONS[op]
    return [iam_action(op)]


def iam_action(op: str) -> str:
    if op in NOT_BY_NAME:
        raise ValueError(f"{op}: its IAM actions are not derived from its name; map it by hand")
    if op in SQS_BATCH_ACTION:
        return SQS_BATCH_ACTION[op]
    if op in SQS_OPS:
        return "sqs:" + pascal(op)
    if op in DYNAMODB_OPS:
        return "dynamodb:" + pascal(op)
    raise ValueError(f"{op}: not an SQS or DynamoDB operation")


# --------------------------------------------------------------------------- source cleaning

def blank_comments_and_strings(text: str) -> str:
    """Comments removed, string and char literals emptied (braces inside them would mislead)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
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
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and (m := re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\])'", text[i:])):
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def drop_test_items(text: str) -> str:
    """Removes `#[cfg(test)]` items (test modules, test-only functions)."""
    while (m := re.search(r"#\[cfg\(test\)\]", text)):
        start = m.start()
        brace = text.find("{", m.end())
        semi = text.find(";", m.end())
        if semi >= 0 and (brace < 0 or semi < brace):  # `#[cfg(test)] mod tests;` or a `use`
            text = text[:start] + text[semi + 1:]
        else:
            text = text[:start] + text[matching_brace(text, brace) + 1:]
    return text


# --------------------------------------------------------------------------- modules

def crate_src(root: Path, path: Path) -> Path:
    """The source folder of the crate `path` belongs to."""
    for src in sorted(CRATES.values(), key=len, reverse=True):
        if (root / src) in path.parents:
            return root / src
    raise ValueError(f"{path} is in no crate's source folder")


def module_file(root: Path, parts: list[str]) -> Path | None:
    """`root` here is a crate's source folder."""
    base = root / Path(*parts) if parts else root / "lib.rs"
    if not parts:
        return base
    for cand in (base.with_suffix(".rs"), base / "mod.rs"):
        if cand.is_file():
            return cand
    return None


def module_parts_of(src: Path, path: Path) -> list[str]:
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts and parts[-1] == "mod":
        parts = parts[:-1]
    if parts == ["lib"]:
        parts = []
    return parts


def referenced_modules(root: Path, path: Path, text: str) -> set[Path]:
    """The module files a file names: its `use` trees, inline paths and used `mod x;`."""
    src = crate_src(root, path)
    here = [] if path.parts[-2] == "bin" else module_parts_of(src, path)
    # The parent module, from which `super::` starts (a mod.rs file is its own folder's module).
    parent = here[:-1] if here else []
    found: set[Path] = set()

    def resolve(at: tuple[Path, list[str]]) -> None:
        # Longest prefix that is a module file; the rest are items in it.
        crate, parts = at
        for k in range(len(parts), -1, -1):
            f = module_file(crate, parts[:k])
            if f is not None:
                found.add(f)
                return

    def expand(prefix: tuple[Path, list[str]], tree: str) -> None:
        tree = tree.strip()
        if tree.startswith("{") and tree.endswith("}"):
            depth, cur, items = 0, "", []
            for ch in tree[1:-1]:
                if ch == "," and depth == 0:
                    items.append(cur)
                    cur = ""
                    continue
                depth += ch == "{"
                depth -= ch == "}"
                cur += ch
            items.append(cur)
            for it in items:
                if it.strip():
                    expand(prefix, it)
            return
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:::\s*(.*))?$", tree, re.S)
        if not m:
            return
        head, rest = m.group(1), m.group(2)
        if head == "self" and rest is None:
            resolve(prefix)
            return
        if rest is None:
            resolve((prefix[0], prefix[1] + [head]))
        else:
            expand((prefix[0], prefix[1] + [head]), rest)

    def start(head: str) -> tuple[Path, list[str]]:
        if head in CRATES:
            return root / CRATES[head], []
        if head == "super":
            return src, parent
        if head == "self":
            return src, here
        return src, []  # crate

    heads = "|".join(["crate", "super", "self", *CRATES])
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        tree = m.group(1)
        h = re.match(r"\s*(%s)\s*::\s*(.*)$" % heads, tree, re.S)
        if h:
            expand(start(h.group(1)), h.group(2))
    inline = "|".join(["crate", "super", *CRATES])
    for m in re.finditer(r"\b(%s)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)" % inline, text):
        parts = [p.strip() for p in m.group(2).split("::") if p.strip()]
        crate, prefix = start(m.group(1))
        resolve((crate, prefix + parts))
    for m in re.finditer(r"(?m)^[ \t]*(pub\b(?:\([^)]*\))?\s*)?mod\s+([a-z_][a-z0-9_]*)\s*;", text):
        name = m.group(2)
        # A private `mod x;` is part of its parent (it may hold an `impl` of the parent's
        # types, called as methods, never named by path); a public one counts when used.
        if m.group(1) is None or re.search(r"\b%s\s*::" % name, text):
            resolve((src, here + [name]))
    if here or path.parts[-2] != "bin":
        found.add(path)
    # Every module's parents hold its `use super::` targets and `pub use` re-exports.
    return {f for f in found if f.is_file()}


def lambda_files(root: Path) -> list[Path]:
    seen: set[Path] = set()
    todo = [root / ENTRY]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        text = drop_test_items(blank_comments_and_strings(f.read_text()))
        todo.extend(referenced_modules(root, f, text) - seen)
    return sorted(seen)


# --------------------------------------------------------------------------- functions

@dataclass
class Fn:
    name: str
    file: Path
    line: int
    body: str
    calls: set[str] = field(default_factory=set)
    ops: set[str] = field(default_factory=set)
    sends: int = 0


KEYWORDS = {"if", "while", "for", "match", "loop", "return", "fn", "move", "async", "await",
            "Some", "Ok", "Err", "None", "let", "in", "as", "impl", "where", "self", "Self"}
ALL_OPS = set(SQS_OPS) | set(DYNAMODB_OPS)


def functions(root: Path, files: list[Path]) -> list[Fn]:
    fns = []
    for f in files:
        text = drop_test_items(blank_comments_and_strings(f.read_text()))
        for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", text):
            brace = text.find("{", m.end())
            semi = text.find(";", m.end())
            if brace < 0 or (0 <= semi < brace):
                continue  # a declaration without a body
            body = text[brace:matching_brace(text, brace) + 1]
            fn = Fn(m.group(1), f.relative_to(root), text.count("\n", 0, m.start()) + 1, body)
            for c in re.finditer(r"(?:\.|::|\b)([a-z_][a-z0-9_]*)\s*(?:::\s*<[^;{}]*?>\s*)?\(", body):
                fn.calls.add(c.group(1))
            for c in re.finditer(r"::\s*([a-z_][a-z0-9_]*)\b(?!\s*::)", body):
                fn.calls.add(c.group(1))
            fn.calls -= KEYWORDS
            fn.ops = {o for o in re.findall(r"\.\s*([a-z_][a-z0-9_]*)\s*\(\s*\)", body) if o in ALL_OPS}
            fn.sends = len(re.findall(r"\.\s*send\s*\(\s*\)", body))
            fns.append(fn)
    return fns


@dataclass
class Call:
    op: str
    action: str
    fn: str
    file: str
    line: int


def lambda_calls(root: Path) -> tuple[list[Call], list[str]]:
    """The SDK calls reachable from triage-lambda's `main`, and any problem found."""
    files = lambda_files(root)
    fns = functions(root, files)
    by_name: dict[str, list[Fn]] = {}
    for fn in fns:
        by_name.setdefault(fn.name, []).append(fn)
    entry = [fn for fn in fns if fn.name == "main" and str(fn.file) == ENTRY]
    problems = [] if entry else [f"no fn main in {ENTRY}"]
    reached, todo = set(), list(entry)
    while todo:
        fn = todo.pop()
        if id(fn) in reached:
            continue
        reached.add(id(fn))
        for name in fn.calls:
            todo.extend(g for g in by_name.get(name, []) if id(g) not in reached)
    calls = []
    for fn in fns:
        if id(fn) not in reached:
            continue
        if fn.sends and not fn.ops:
            problems.append(f"{fn.file}:{fn.line} fn {fn.name} sends an SDK request whose operation is not recognised")
        for op in sorted(fn.ops):
            try:
                calls.extend(Call(op, a, fn.name, str(fn.file), fn.line) for a in iam_actions(op))
            except ValueError as e:
                problems.append(f"{fn.file}:{fn.line} fn {fn.name}: {e}")
    return calls, problems


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print("files on triage-lambda's path:")
    for f in lambda_files(root):
        print(f"  {f.relative_to(root)}")
    calls, problems = lambda_calls(root)
    print("SDK calls reachable from main:")
    for c in sorted(calls, key=lambda c: (c.action, c.file, c.line)):
        print(f"  {c.action:36} {c.op:34} {c.file}:{c.line} fn {c.fn}")
    for p in problems:
        print(f"PROBLEM {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
