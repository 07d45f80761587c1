"""Problem statements for synthetic tasks, written from the failing tests (no model involved).

Contract: `write(project, hint, mutations, bug_texts, f2p, messages)` returns the issue text.
Every level lists the failing tests (up to `MAX_LISTED`) with the first line of each one's
failure (the assertion message pytest reported) and asks for a fix of the code, not the tests.
`hint="location"` (the easy level) also names the file, the function and the line holding the
wrong expression (for a removed statement: the line after which something is missing);
`hint="tests"` (medium and hard) says nothing about where the bug is.
`hint="fix"` (trivial, `gym.tasks.synth.fixhint`) says what `location` says and also gives the exact
edit: on that line, replace this expression with that one, and the one `sed -i` command that
makes it (`fixhint.sed_command`, the task's gold plan); a ValueError when the mutation has no
such one-line edit. `hint="prose"` says the same edit in words only (file, function, line,
replace this expression with that one) and shows no command: the agent must write the edit
itself with the harness's tools. At the `fix` level a task measures a correct tool call through the harness
(copying a command), not diagnosis: the rung a small model can climb first.
"""
from __future__ import annotations

from harnessrl.gym.tasks.synth.fixhint import fix_edit, sed_command
from harnessrl.gym.tasks.synth.mutate import Mutation

__all__ = ["write", "HINTS", "MAX_LISTED"]

HINTS = ("fix", "prose", "location", "tests")
MAX_LISTED = 6


def _line_at(text: str, offset: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text.count("\n", 0, offset) + 1, text[start:end if end >= 0 else len(text)]


def _location(m: Mutation, bug_text: str) -> str:
    """Where the bug is, as the agent will see the file: `m` is the file's only mutation, so
    its start offset is the same in the mutated text."""
    if m.new == "":  # a removed statement: point at the line before the gap
        line_no, line = _line_at(bug_text, max(m.start - 1, 0))
        return (f"The bug is in `{m.file}`, in `{m.function}`: a statement is missing right after "
                f"line {line_no}:\n\n```python\n{line}\n```\n")
    line_no, line = _line_at(bug_text, m.start)
    if m.operator == "remove_stmt":  # the block's only statement became `pass`
        return (f"The bug is in `{m.file}`, in `{m.function}`, line {line_no}:\n\n```python\n{line}\n```\n\n"
                f"A statement is missing there: this block does nothing.\n")
    wrong = m.new if "\n" not in m.new and len(m.new) <= 80 else line.strip()
    return (f"The bug is in `{m.file}`, in `{m.function}`, line {line_no}:\n\n```python\n{line}\n```\n\n"
            f"The expression `{wrong}` there is wrong.\n")


def _fix(m: Mutation, bug_text: str, command: bool = True) -> str:
    edit = fix_edit(m, bug_text)
    if edit is None:
        raise ValueError(f"{m.file}:{m.line}: this mutation has no one-line copyable fix (hint 'fix' or 'prose')")
    said = (f"The bug is in `{m.file}`, in `{m.function}`, line {edit.line}:\n\n```python\n{edit.source_line}\n```\n\n"
            f"The fix: on line {edit.line} of `{m.file}`, replace `{edit.wrong}` with `{edit.right}`.")
    if not command:
        return said + "\n"
    return said + f" This command makes exactly that edit:\n\n```bash\n{sed_command(m.file, edit)}\n```\n"


def write(project: str, hint: str, mutations: list[Mutation], bug_texts: dict[str, str], f2p: list[str],
          messages: dict[str, str]) -> str:
    if hint not in HINTS:
        raise ValueError(f"hint must be one of {HINTS}, got {hint!r}")
    if not f2p:
        raise ValueError("a statement needs at least one failing test (f2p is empty)")
    first = f2p[0].split("::")[-1]
    if hint in ("fix", "prose", "location"):
        m = mutations[0]
        title = f"`{m.function}` in `{m.file}` is broken"
    else:
        title = f"{project}: `{first}` fails" + (f" (and {len(f2p) - 1} more tests)" if len(f2p) > 1 else "")
    lines = [title, "", "These tests fail:", ""]
    for node in f2p[:MAX_LISTED]:
        msg = messages.get(node, "").strip()
        lines.append(f"- `{node}`" + (f": {msg}" if msg else ""))
    if len(f2p) > MAX_LISTED:
        lines.append(f"- ... and {len(f2p) - MAX_LISTED} more")
    lines.append("")
    if hint in ("fix", "prose"):
        lines.append(_fix(mutations[0], bug_texts[mutations[0].file], command=hint == "fix"))
    elif hint == "location":
        lines.append(_location(mutations[0], bug_texts[mutations[0].file]))
    lines.append("Fix the library code so that these tests pass; the tests that pass now must keep "
                 "passing. Do not change the tests.")
    return "\n".join(lines) + "\n"
