"""Task files -> Task objects, in the layouts public SWE datasets ship, plus the registries of
task sources: `LAYOUTS` (row layouts), `FOLDERS` (task formats that come as folders: Harbor),
`SUITES` (named suites and loaders), each a short name -> "module:function", resolved lazily.

Layouts (one row = one task; JSONL or Parquet):
  harnessrl  our own rows: SWE-bench fields plus ours (source, gold_plan...); strict.
  swebench   SWE-bench / SWE-bench Verified, SWE-Gym and SWE-rebench style rows: the field
             names are ours already; FAIL_TO_PASS may be a JSON-encoded string.
  swesmith   SWE-smith: instance_id, repo, patch, FAIL_TO_PASS, PASS_TO_PASS, image_name,
             problem_statement. Its `patch` *introduces* the bug (the instance's branch,
             named after instance_id, carries it), so the gold fix is that patch reversed.
  r2e        R2E-Gym: repo_name, docker_image, commit_hash, parsed_commit_content (JSON:
             old_commit_hash, file_diffs), execution_result_content (JSON: hidden test files
             and the old/new commits' pytest logs). Tests ids come from those logs.
"auto" picks per row; each layout is a row mapper registered in `LAYOUTS`. A bad row raises
TaskFileError naming the file, the line (JSONL) or row (Parquet), the task and the field.
External rows name no repository on this machine: pass `source_root` (`--source-root`), a
folder holding `owner__name` or `name` checkouts, or .bundle / .tar.gz files of those names; `require_sources` says, one line per task, which
tasks still have none. A SWE-bench row keeps its layout whatever extra columns it carries
(`image_name` / `docker_image` become `Task.image`; a `source` column that names no path
is the dataset's own label and is dropped; a dropped column that is a near-typo of a Task
field is an error).
"""
from __future__ import annotations

import difflib
import inspect
import json
import re
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from harnessrl.gym.grading.diff import is_test_path
from harnessrl.gym.tasks import Task, TaskFileError
from harnessrl.registry import check, resolve

#: Row layouts of task files: name -> "module:function" mapping one row to Task keyword
#: arguments (a full "module:function" works too; "auto" picks per row, `detect_layout`).
#: A row's task is of the "hidden_tests" format (graded by FAIL_TO_PASS/PASS_TO_PASS) unless
#: one of our rows names another (`Task.format`: a canary's).
LAYOUTS: dict[str, str] = {
    "harnessrl": "harnessrl.gym.tasks.loaders:map_harnessrl",
    "swebench": "harnessrl.gym.tasks.loaders:map_swebench",
    "swegym": "harnessrl.gym.tasks.loaders:map_swebench",
    "swesmith": "harnessrl.gym.tasks.loaders:map_swesmith",
    "r2e": "harnessrl.gym.tasks.loaders:map_r2e",
}

#: Task formats that come as folders: format -> "module:function" loading a folder as
#: list[Task] (`load_suite` of a folder; the first format whose loader claims it, in order).
FOLDERS: dict[str, str] = {
    "harbor": "harnessrl.gym.tasks.harbor.loader:load_dir",
}

#: Suite name -> "module:function" returning list[Task] (imported lazily). A path to a
#: .jsonl/.parquet file or a full "module:function" works as a name too.
SUITES: dict[str, str] = {
    "builtin": "harnessrl.gym.tasks.suites.builtin:load",
    "fix-train": "harnessrl.gym.tasks.suites.fixlevel:train",
    "fix-heldout": "harnessrl.gym.tasks.suites.fixlevel:heldout",
}

_REPO_SUFFIXES = (".bundle", ".tar.gz", ".tgz", ".tar", ".git")
_OURS_ONLY = {"source", "gold_plan", "setup_commands", "test_command", "workdir", "format", "reward"}


# --- patches ---------------------------------------------------------------------------------

def reverse_patch(patch: str) -> str:
    """The inverse of a git diff (what `git apply -R` would apply), as a forward patch."""
    out: list[str] = []
    in_hunk = False
    swaps = {"new file mode ": "deleted file mode ", "deleted file mode ": "new file mode ",
             "old mode ": "new mode ", "new mode ": "old mode ", "rename from ": "rename to ",
             "rename to ": "rename from ", "copy from ": "copy to ", "copy to ": "copy from "}
    lines = patch.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            in_hunk = False
            m = re.match(r"diff --git a/(\S+) b/(\S+)$", line)
            out.append(f"diff --git a/{m.group(2)} b/{m.group(1)}" if m else line)
        elif not in_hunk and line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:], lines[i + 1][4:]
            out.append("--- " + ("/dev/null" if new == "/dev/null" else "a/" + new.removeprefix("b/")))
            out.append("+++ " + ("/dev/null" if old == "/dev/null" else "b/" + old.removeprefix("a/")))
            i += 1
        elif line.startswith("@@ "):
            in_hunk = True
            out.append(re.sub(r"^@@ -(\S+) \+(\S+) @@", r"@@ -\2 +\1 @@", line))
        elif in_hunk and line[:1] in ("+", "-"):
            out.append(("-" if line[0] == "+" else "+") + line[1:])
        elif not in_hunk and line.startswith("index "):
            m = re.match(r"index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)$", line)
            out.append(f"index {m.group(2)}..{m.group(1)}{m.group(3)}" if m else line)
        elif not in_hunk and line.startswith("GIT binary patch"):
            raise ValueError("cannot reverse a binary patch")
        else:
            prefix = next((p for p in swaps if not in_hunk and line.startswith(p)), None)
            out.append(swaps[prefix] + line[len(prefix):] if prefix else line)
        i += 1
    return "\n".join(out)


def _new_file_diff(path: str, text: str) -> str:
    lines = text.split("\n")
    no_newline = not text.endswith("\n")
    if not no_newline:
        lines = lines[:-1]
    body = "".join(f"+{line}\n" for line in lines) + ("\\ No newline at end of file\n" if no_newline else "")
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def _r2e_file_diff(fd: dict[str, Any]) -> tuple[str, str]:
    """(path, git diff text) of one R2E `file_diffs` entry."""
    path = fd["header"]["file"]["path"]
    parts = [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}"]
    prefixes = {"context": " ", "added": "+", "deleted": "-"}
    for hunk in fd["hunks"]:
        d = hunk["descriptor"]
        o, n = d["old_range"], d["new_range"]
        section = (d.get("section") or "").strip()
        parts.append(f"@@ -{o['start']},{o.get('length', 1)} +{n['start']},{n.get('length', 1)} @@"
                     + (f" {section}" if section else ""))
        for line in hunk["line_group"]["all_lines"]:
            if line.get("type") == "note":
                parts.append("\\ No newline at end of file")
            else:
                parts.append(prefixes[line["type"]] + line["content"])
    return path, "\n".join(parts) + "\n"


_LOG_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+::\S+)", re.M)


def _pytest_statuses(log: str) -> dict[str, str]:
    """node id -> status from a `pytest -rA` short summary."""
    return {node: status for status, node in _LOG_LINE.findall(log or "")}


# --- row mapping -----------------------------------------------------------------------------

def detect_layout(row: dict[str, Any]) -> str:
    if "parsed_commit_content" in row or ("repo_name" in row and "docker_image" in row):
        return "r2e"
    if "image_name" in row and not row.get("test_patch") and not (_OURS_ONLY & row.keys()):
        return "swesmith"
    # Ours only with a column no dataset has: a SWE-bench row that carries extra columns
    # (`source`, `image_name`, `difficulty`, `meta`...) keeps the SWE-bench layout.
    if (_OURS_ONLY - {"source"}) & row.keys():
        return "harnessrl"
    return "swebench"


def _json_field(row: dict[str, Any], field: str) -> Any:
    value = row.get(field)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise _FieldError(field, f"not valid JSON: {e.msg}") from None
    if value is None:
        raise _FieldError(field, "is missing")
    return value


class _FieldError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def map_swesmith(row: dict[str, Any]) -> dict[str, Any]:
    bug = row.get("patch") or ""
    try:
        gold = reverse_patch(bug) if bug else ""
    except ValueError as e:
        raise _FieldError("patch", str(e)) from None
    out = {k: row[k] for k in ("instance_id", "repo", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS",
                               "hints_text", "created_at", "version") if k in row}
    out.update(patch=gold, image=row.get("image_name"),
               # SWE-smith keeps each instance's buggy state on a branch named after it.
               base_commit=row.get("base_commit") or row.get("instance_id"))
    return out


def map_r2e(row: dict[str, Any]) -> dict[str, Any]:
    parsed = _json_field(row, "parsed_commit_content")
    execution = _json_field(row, "execution_result_content")
    try:
        diffs = [_r2e_file_diff(fd) for fd in parsed.get("file_diffs", [])]
    except (KeyError, TypeError) as e:
        raise _FieldError("parsed_commit_content", f"malformed file_diffs entry ({e!r})") from None
    hidden = []
    for name, code in zip(execution.get("test_file_names") or [], execution.get("test_file_codes") or []):
        hidden.append(_new_file_diff(name if "/" in name else f"r2e_tests/{name}", code))
    old = _pytest_statuses(execution.get("old_commit_res_stdout", ""))
    new = _pytest_statuses(execution.get("new_commit_res_stdout", ""))
    if not new:
        raise _FieldError("execution_result_content", "new_commit_res_stdout has no pytest -rA summary lines")
    commit = row.get("commit_hash") or parsed.get("new_commit_hash", "")
    return {
        "instance_id": row.get("instance_id") or f"r2e__{row.get('repo_name')}-{commit[:12]}",
        "repo": row.get("repo_name"), "base_commit": parsed.get("old_commit_hash") or f"{commit}^",
        "problem_statement": row.get("problem_statement"),
        "patch": "".join(d for p, d in diffs if not is_test_path(p)), "test_patch": "".join(hidden),
        "FAIL_TO_PASS": sorted(n for n, s in new.items() if s == "PASSED" and old.get(n) != "PASSED"),
        "PASS_TO_PASS": sorted(n for n, s in new.items() if s == "PASSED" and old.get(n) == "PASSED"),
        "image": row.get("docker_image"), "environment_setup_commit": commit,
    }


def map_harnessrl(row: dict[str, Any]) -> dict[str, Any]:
    """Our own rows: the Task's fields as they are (the Task refuses unknown ones)."""
    return dict(row)


def map_swebench(row: dict[str, Any]) -> dict[str, Any]:
    """SWE-bench / SWE-Gym / SWE-rebench rows: our names already; the datasets' own columns
    (meta, text...) are dropped. `source` is kept (used only when it names a path, see
    _resolve_source); `image_name` / `docker_image` name the task's Docker image."""
    out = {k: v for k, v in row.items() if k in Task.model_fields and k not in _OURS_ONLY - {"source"}}
    for k in row.keys() - Task.model_fields.keys():  # a dropped column that is a typo of ours is loud
        close = difflib.get_close_matches(k, list(Task.model_fields), n=1, cutoff=0.85)
        if close:
            raise _FieldError(k, f"Extra inputs are not permitted (did you mean {close[0]!r}?)")
    image = row.get("image") or row.get("image_name") or row.get("docker_image")
    if image:
        out["image"] = image
    return out


def map_row(row: dict[str, Any], layout: str = "auto") -> dict[str, Any]:
    """Task keyword arguments for one row of the given layout (a `LAYOUTS` name, "auto" or a
    "module:function" path)."""
    check(LAYOUTS, layout, "task layout", extra=("auto",))
    if layout == "auto":
        layout = detect_layout(row)
    return resolve(LAYOUTS, layout, "task layout")(row)


def source_candidates(repo: str, source_root: Path) -> list[Path]:
    """Where a task of `repo` ("owner/name") may live under `source_root`, in the order tried:
    `owner__name`, then `name`, each as a checkout, a .bundle or an archive."""
    out = []
    for stem in dict.fromkeys((repo.replace("/", "__"), repo.split("/")[-1])):
        out += [source_root / f"{stem}{suffix}" for suffix in ("", ".bundle", ".tar.gz", ".tgz", ".tar")]
    return out


def _resolve_source(fields: dict[str, Any], base_dir: Path, source_root: Path | None, layout: str) -> None:
    source = fields.get("source")
    if source:
        path = Path(source).expanduser()
        path = path if path.is_absolute() else (base_dir / path).resolve()
        if layout == "harnessrl" or path.exists() or path.name.endswith(_REPO_SUFFIXES):
            fields["source"] = str(path)
            return
        del fields["source"]  # a dataset's own `source` column (its origin label), not a path
    if source_root is None or not fields.get("repo"):
        return
    candidates = source_candidates(str(fields["repo"]), source_root)
    found = next((c for c in candidates if c.exists()), None)
    if found is None:
        raise _FieldError("repo", f"no repository for {fields['repo']!r} under {source_root}: put a checkout, "
                                  f"a .bundle or a .tar.gz there named {', '.join(c.name for c in candidates[::5])} "
                                  f"(or one of {', '.join(c.name for c in candidates if c.suffix)})")
    fields["source"] = str(found)


def require_sources(tasks: list[Task]) -> None:
    """Raise TaskFileError, one line per task, for tasks that name no repository on this machine."""
    missing = [t for t in tasks if not t.source]
    if missing:
        raise TaskFileError("\n".join(
            f"task {t.instance_id!r}: no repository for {t.repo!r}; fix: pass --source-root DIR (config: "
            f"source_root) with {t.repo.replace('/', '__')}, {t.repo.split('/')[-1]} or "
            f"{t.repo.split('/')[-1]}.bundle in it (a checkout, .bundle or .tar.gz), or set `source` in the task file"
            for t in missing))


def _task(row: Any, where: str, layout: str, base_dir: Path, source_root: Path | None) -> Task:
    if not isinstance(row, dict):
        raise TaskFileError(f"{where}: a task must be a JSON object, got {type(row).__name__}")
    task = f" (task {row['instance_id']!r})" if row.get("instance_id") else ""
    try:
        used = detect_layout(row) if layout == "auto" else layout
        fields = map_row(row, used)
        _resolve_source(fields, base_dir, source_root, used)
        return Task(**fields)
    except _FieldError as e:
        raise TaskFileError(f"{where}: field {e.field!r}: {e.message}{task}") from None
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "?"
        more = f" (and {len(e.errors()) - 1} more problems)" if len(e.errors()) > 1 else ""
        raise TaskFileError(f"{where}: field {field!r}: {err['msg']}{more}{task}") from None


def load_jsonl(path: str | Path, layout: str = "auto", source_root: str | Path | None = None) -> list[Task]:
    """Tasks from a JSONL file, one object per line (blank lines skipped)."""
    path = Path(path)
    root = Path(source_root).expanduser().resolve() if source_root else None
    tasks = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFileError(f"{path}:{number}: invalid JSON: {e.msg} (column {e.colno})") from None
            tasks.append(_task(row, f"{path}:{number}", layout, path.parent.resolve(), root))
    return _unique(tasks, path)


def load_parquet(path: str | Path, layout: str = "auto", source_root: str | Path | None = None) -> list[Task]:
    """Tasks from a Parquet file, one row per task."""
    import pyarrow.parquet as pq

    path = Path(path)
    root = Path(source_root).expanduser().resolve() if source_root else None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:
        raise TaskFileError(f"{path}: not a readable Parquet file: {e}") from None
    tasks = [_task(row, f"{path} row {i}", layout, path.parent.resolve(), root) for i, row in enumerate(rows)]
    return _unique(tasks, path)


def _unique(tasks: list[Task], path: Path) -> list[Task]:
    seen: set[str] = set()
    for t in tasks:
        if t.instance_id in seen:
            raise TaskFileError(f"{path}: duplicate instance_id {t.instance_id!r}")
        seen.add(t.instance_id)
    return tasks


def load_tasks(path: str | Path, layout: str = "auto", source_root: str | Path | None = None) -> list[Task]:
    """Load a .jsonl or .parquet task file."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return load_jsonl(path, layout, source_root)
    if suffix in (".parquet", ".pq"):
        return load_parquet(path, layout, source_root)
    raise TaskFileError(f"{path}: unknown task file type {suffix!r} (use .jsonl or .parquet)")


def load_suite(name: str, source_root: str | Path | None = None, **kwargs: Any) -> list[Task]:
    """Tasks of a registered suite, a task file path, a folder of Harbor tasks, or a "module:function" loader.
    `source_root` (task files only; a loader gets it when given) is where repositories live."""
    if source_root is not None:
        if not Path(source_root).expanduser().is_dir():
            raise TaskFileError(f"source root {source_root} is not a folder; fix: pass --source-root DIR "
                                "(config: source_root) naming the folder that holds the repositories")
        kwargs["source_root"] = source_root
    if name in SUITES or (":" in name and not Path(name).exists()):
        loader: Callable[..., list[Task]] = resolve(SUITES, name, "suite")
        if "source_root" in kwargs and "source_root" not in inspect.signature(loader).parameters:
            del kwargs["source_root"]  # a suite that ships its repositories (builtin) needs none
        return loader(**kwargs)
    if Path(name).is_dir():  # a folder of task folders (or one) of a folder format: Harbor's
        return load_folder(name)
    if Path(name).suffix.lower() in (".jsonl", ".json", ".parquet", ".pq"):
        if not Path(name).exists():
            raise TaskFileError(f"task file {name} does not exist")
        return load_tasks(name, **kwargs)
    raise ValueError(f"unknown suite {name!r}; valid: {', '.join(sorted(SUITES))}, "
                     "a path to a .jsonl/.parquet task file, a folder of Harbor tasks, or a 'module:function' loader")


def suite_meta(name: str | None) -> Path | None:
    """The meta.jsonl of a synthesized task set (`harnessrl tasks synth`: per task its split and
    mutated functions), if there is one: beside a .jsonl task file, or beside the module of a
    registered suite that ships one (the fix-level set)."""
    if name is None:
        return None
    if name in SUITES:
        import importlib.util

        spec = importlib.util.find_spec(SUITES[name].split(":")[0])
        folder = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    else:
        folder = Path(name).parent if name.endswith(".jsonl") else None
    meta = folder / "meta.jsonl" if folder is not None else None
    return meta if meta is not None and meta.exists() else None


def load_folder(path: str | Path) -> list[Task]:
    """The tasks of a folder, by the first folder format (`FOLDERS`) whose loader claims it (a
    loader refuses a folder that is not its own with TaskFileError); all refusals when none does."""
    refusals = []
    for kind in FOLDERS:
        try:
            return resolve(FOLDERS, kind, "task folder format")(path)
        except TaskFileError as e:
            refusals.append(str(e))
    raise TaskFileError("\n".join(refusals))
