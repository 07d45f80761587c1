"""The `fix` hint level: the statement gives the exact one-line edit, the plan is one `sed -i`.

A task family of its own ("apply this exact edit with the harness's tools", difficulty
`trivial`): the statement names the file, the function, the line, the wrong expression and
its replacement, so solving it needs no diagnosis, only a correct tool call. It exists so that
a small model has a path to reward through an unmodified harness; it measures tool use and
copying, not debugging, and is labelled as such.

Contract: `fix_edit(m, bug_text)` returns a `FixEdit` (line number, wrong text, right text)
when the single mutation `m` can be undone by replacing one expression on one line, written
so that `sed -i '<line>s/<wrong>/<right>/' <file>` applies it verbatim: the wrong text is the
smallest AST node on that line that strictly contains the mutated span (or the whole
statement for a `pass`), occurs once on its line, and neither text holds a character that
sed, the single-quoted shell word or the tool call's JSON would need escaped. Otherwise None.
`sed_command(file, edit)` is that command; `apply_sed(text, edit)` applies it the way GNU sed
does (first match on that line, `.` matching any character), so the plan is checked against
the clean text before a task is written.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from harnessrl.gym.tasks.synth.mutate import Mutation, parse

__all__ = ["FixEdit", "fix_edit", "sed_command", "apply_sed"]

#: Characters a sed pattern (BRE) or replacement, a '...' shell word or a JSON string would
#: need escaped; `.` is allowed (it matches itself too, and `apply_sed` checks the first match).
UNSAFE = set("/\\[]*^$&'\"\n\t`")


@dataclass(frozen=True)
class FixEdit:
    line: int
    """1-based line of the bug file holding the wrong text."""
    wrong: str
    """Text on that line now (in the bug file)."""
    right: str
    """What it must become."""
    source_line: str
    """The whole line as the bug file has it."""


def _pattern(wrong: str) -> re.Pattern:
    return re.compile("".join("." if c == "." else re.escape(c) for c in wrong))


def apply_sed(text: str, edit: FixEdit) -> str:
    """`sed -i '<line>s/<wrong>/<right>/'` on `text`; ValueError when the pattern does not match."""
    lines = text.splitlines(keepends=True)
    if not 1 <= edit.line <= len(lines):
        raise ValueError(f"line {edit.line} is past the end ({len(lines)} lines)")
    line = lines[edit.line - 1]
    m = _pattern(edit.wrong).search(line)
    if m is None:
        raise ValueError(f"line {edit.line}: {edit.wrong!r} does not match")
    lines[edit.line - 1] = line[:m.start()] + edit.right + line[m.end():]
    return "".join(lines)


def sed_command(file: str, edit: FixEdit) -> str:
    return f"sed -i '{edit.line}s/{edit.wrong}/{edit.right}/' {file}"


def _nodes_on_line(tree: ast.AST, line: int):
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) == line and getattr(node, "end_lineno", None) == line:
            yield node


def fix_edit(m: Mutation, bug_text: str) -> FixEdit | None:
    """The copyable one-line edit undoing `m` in `bug_text` (the file with `m` applied only), or None."""
    if not m.new or "\n" in m.new or "\n" in m.old:
        return None  # a removed line or a multi-line span: no one-line edit
    start = bug_text.rfind("\n", 0, m.start) + 1
    end = bug_text.find("\n", m.start)
    end = len(bug_text) if end < 0 else end
    line_no = bug_text.count("\n", 0, m.start) + 1
    line = bug_text[start:end]
    a, b = m.start - start, m.start - start + len(m.new)  # the mutated span, as columns of the line
    if b > len(line):
        return None
    line_bytes = line.encode("utf-8")
    spans = []
    for node in _nodes_on_line(parse(bug_text), line_no):
        s = len(line_bytes[:node.col_offset].decode("utf-8", "replace"))
        e = len(line_bytes[:node.end_col_offset].decode("utf-8", "replace"))
        whole = (s, e) == (a, b) and isinstance(node, ast.Pass)
        if s <= a and b <= e and ((e - s) > (b - a) or whole):
            spans.append((e - s, s, e))
    for _, s, e in sorted(set(spans)):
        wrong = line[s:e]
        right = wrong[:a - s] + m.old + wrong[b - s:]
        if UNSAFE & set(wrong + right) or line.count(wrong) != 1 or wrong.strip() != wrong:
            continue
        edit = FixEdit(line_no, wrong, right, line)
        if _pattern(wrong).search(line).start() != s:
            continue  # an earlier `.` match would make sed edit the wrong place
        return edit
    return None
