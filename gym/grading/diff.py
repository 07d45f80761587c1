"""What of the agent's diff reaches the grading tree: pure functions over the patch text.

Contract: `split_patch` cuts a `git diff --binary --no-renames` into one `FileChange` per path
(git's C-quoted names included, so a path with spaces or odd bytes is still seen);
`triage(changes, protected)` sorts each change into exactly one of
- dropped: build artefacts (`__pycache__`, `*.pyc`, `*.egg-info`/`*.dist-info`, anything under
  a `site-packages`), and new top-level modules named like the standard library: harmless to
  lose, never graded;
- reverted: test infrastructure the grader owns (test files, test helpers outside tests/:
  `_testing`/`testing` modules and folders, `conftest.py` in any folder, `tests/` folders
  inside a package; the runner's config files `pytest.ini`, `.pytest.ini`, `pytest.toml`,
  `.pytest.toml`, `tox.ini`; the task's test files and whatever the hidden test patch touches);
- tampered, with evidence (`gym.grading.evidence`): a new module at an import root (the
  repository, or src/) named like the runner (`pytest`, `_pytest`, `pluggy`, `py`, `iniconfig`,
  `xdist`) or like a site hook (`sitecustomize`, `usercustomize`), any new `.pth`, a `pytest11`
  entry point: the episode scores 0. A name deeper in the tree (a package's own `py/`
  folder, pytest's own `src/_pytest` at base) shadows nothing and is graded like any file; a
  word in a line is never evidence (what code under test does at run time is the runner's to
  catch, gym/grading/runner);
- kept: everything else, applied to the pristine base for grading.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "xdist"})
SITE_HOOKS = frozenset({"sitecustomize", "usercustomize"})
TEST_CONFIG_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini"})
#: Module names (files or folders) that hold test helpers wherever they are (pandas' `_testing`).
TEST_HELPER_NAMES = frozenset({"_testing", "testing", "tests", "test"})
#: Files whose pytest section (`[tool:pytest]`, `[tool.pytest.ini_options]`) the agent may not change.
SECTIONED_CONFIG_NAMES = frozenset({"setup.cfg", "pyproject.toml"})
_PY_SUFFIXES = (".py", ".pyw", ".pyc", ".pyo", ".so", ".pyd")
_HEADER = re.compile(r"^diff --git (.*)$", re.M)
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


@dataclass(frozen=True)
class FileChange:
    """One path's part of the agent's diff."""

    path: str
    text: str
    """This path's whole chunk, header included; chunks concatenated are a valid patch."""
    new: bool = False
    deleted: bool = False

    def added_lines(self) -> list[str]:
        return [ln[1:] for ln in self.text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]


@dataclass
class Triage:
    """Where each of the agent's changes went."""

    kept: list[FileChange] = field(default_factory=list)
    reverted: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    tampered: list[dict[str, str]] = field(default_factory=list)
    """Evidence per offending path ({"kind", "what", "where"})."""

    def kept_patch(self) -> str:
        return "".join(c.text for c in self.kept)


def _unquote(name: str) -> str:
    """git's C-style quoted path ("a/t\\303\\251st") -> the path as text."""
    if not (name.startswith('"') and name.endswith('"')):
        return name
    out, i, body = bytearray(), 0, name[1:-1]
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567":
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt)))
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _header_path(rest: str) -> str:
    """The path of `diff --git <rest>`; without renames both sides name the same path."""
    if rest.startswith('"'):
        end = rest.index('" ', 1) if '" ' in rest else len(rest)
        return _unquote(rest[:end + 1])[2:]
    half = (len(rest) - 5) // 2  # "a/" + P + " b/" + P
    path = rest[2:2 + half]
    if rest == f"a/{path} b/{path}":
        return path
    raise ValueError(f"cannot read the path of diff header {rest[:200]!r}")


def split_patch(patch: str) -> list[FileChange]:
    """One FileChange per `diff --git` chunk, in order."""
    starts = [m.start() for m in _HEADER.finditer(patch)]
    changes = []
    for i, start in enumerate(starts):
        chunk = patch[start:starts[i + 1] if i + 1 < len(starts) else len(patch)]
        head, _, body = chunk.partition("\n")
        meta = body.split("\n", 3)[:3]
        changes.append(FileChange(_header_path(head[len("diff --git "):]), chunk,
                                  new=any(m.startswith("new file mode") for m in meta),
                                  deleted=any(m.startswith("deleted file mode") for m in meta)))
    return changes


def is_test_path(path: str) -> bool:
    """Files that decide how tests run or what they assert: agents may not change them."""
    parts = path.split("/")
    name = parts[-1]
    stem = name[:-3] if name.endswith(".py") else None
    return (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py") \
        or name in TEST_CONFIG_NAMES or stem in TEST_HELPER_NAMES \
        or any(p in TEST_HELPER_NAMES for p in parts[:-1])


def _module_names(path: str) -> list[str]:
    """Importable names along a Python-ish path: its directories and its file's module name."""
    parts = path.split("/")
    name = parts[-1]
    if not name.endswith(_PY_SUFFIXES):
        return []
    return [*parts[:-1], name.split(".", 1)[0]]


def _import_root_names(path: str) -> list[str]:
    """The top-level module name `path` would be imported as from an import root (the
    repository, or src/), or [] when it sits deeper or is not Python."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 1:
        parts = parts[1:]
    return _module_names("/".join(parts))[:1]


def _why_tampered(change: FileChange) -> dict[str, str] | None:
    """Evidence that this change alone tampers with the runner (paths, not contents), or None."""
    from harnessrl.gym.grading import evidence
    top = _import_root_names(change.path) if change.new else []
    if top and top[0] in RUNNER_MODULES:
        return evidence("runner_shadow", f"shadows the test runner ({top[0]}): a new module at an import root",
                        change.path)
    if top and top[0] in SITE_HOOKS:
        return evidence("runner_shadow", f"is a site hook ({top[0]}): a new module at an import root", change.path)
    if change.path.endswith(".pth") and not change.deleted:
        return evidence("runner_shadow", "is a .pth site hook", change.path)
    if change.path.split("/")[-1] == "entry_points.txt" and any("pytest11" in ln for ln in change.added_lines()):
        return evidence("runner_shadow", "declares a pytest11 plugin entry point", change.path)
    return None


def _is_artefact(path: str) -> bool:
    parts = path.split("/")
    return path.endswith((".pyc", ".pyo")) or "__pycache__" in parts \
        or any(p.endswith((".egg-info", ".dist-info")) or p in ("site-packages", "dist-packages") for p in parts[:-1])


def _shadows_stdlib(change: FileChange) -> bool:
    """A new module at the top of an import root (the repository, or src/) named like the stdlib."""
    parts = change.path.split("/")
    if parts[0] == "src":
        parts = parts[1:]
    names = _module_names("/".join(parts))
    return change.new and bool(names) and names[0] in sys.stdlib_module_names


def triage(changes: list[FileChange], protected: set[str] | frozenset[str] = frozenset()) -> Triage:
    """Sort the agent's changes (see the module docstring); `protected`: paths the grader owns."""
    out = Triage()
    for change in changes:
        why = _why_tampered(change)
        if _is_artefact(change.path) and not (why and "pytest11" in why["what"]):
            out.dropped.append(change.path)  # off every import path in grading: harmless to lose
        elif why:
            out.tampered.append(why)
        elif change.path in protected or is_test_path(change.path):
            out.reverted.append(change.path)
        elif _shadows_stdlib(change):
            out.dropped.append(change.path)
        else:
            out.kept.append(change)
    return out


def pytest_section(name: str, text: str) -> str:
    """The pytest configuration a setup.cfg / pyproject.toml holds, normalised for comparison."""
    if name.endswith(".toml"):
        import tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            return f"<unreadable: {e}>"
        return repr(data.get("tool", {}).get("pytest", {}))
    import configparser
    parser = configparser.RawConfigParser()
    try:
        parser.read_string(text)
    except configparser.Error as e:
        return f"<unreadable: {e}>"
    return repr({s: dict(parser[s]) for s in parser.sections() if s in ("tool:pytest", "pytest")})
