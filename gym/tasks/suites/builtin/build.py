"""Regenerate the built-in suite from its readable sources: one git bundle per project and
tasks.jsonl, written next to this file.

    python -m harnessrl.gym.tasks.suites.builtin.build          # from a source checkout

Sources (in the checkout only, not installed): `projects/<name>/` is each project's tree at
its base commit, Python files stored as `*.py.txt` (every task's bug is present there, none of its hidden tests), and
`specs/<name>.py` lists that project's tasks: the fix as exact string replacements, the
hidden tests as text appended to (or creating) test files. All tasks of a project share one
base commit, so one sandbox per project serves all of them through reset().

For every task this script derives `patch` and `test_patch` with git, then runs pytest twice
(base + hidden tests, base + hidden tests + fix) and takes FAIL_TO_PASS = failing -> passing,
PASS_TO_PASS = passing in both. It refuses a task whose fix breaks a passing test, whose
hidden tests do not all pass with the fix, or that has no FAIL_TO_PASS test. Commits use a
fixed author, committer and date, so the base commit ids are stable across rebuilds.
"""
from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harnessrl.gym.grading.hidden_tests import nodeid_key, parse_junit

HERE = Path(__file__).resolve().parent
REPO_OWNER = "harnessrl-builtin"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "harnessrl builtin", "GIT_AUTHOR_EMAIL": "builtin@harnessrl.invalid",
    "GIT_COMMITTER_NAME": "harnessrl builtin", "GIT_COMMITTER_EMAIL": "builtin@harnessrl.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "PYTHONDONTWRITEBYTECODE": "1",
}
EDIT_DELIMITER = "HARNESSRL_EDIT"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def make_repo(project: str, dest: Path) -> str:
    """Commit projects/<project> into a fresh repo at dest; returns the base commit."""
    shutil.copytree(HERE / "projects" / project, dest,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    # Sources are stored as *.py.txt so that nothing in harnessrl's own tree (packaging,
    # pytest, linters) mistakes these projects for harnessrl code.
    for stored in sorted(dest.rglob("*.py.txt")):
        stored.rename(stored.with_suffix(""))
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"Import {project}")
    return git(dest, "rev-parse", "HEAD").strip()


def apply_fix(repo: Path, fix: dict[str, list[tuple[str | None, str]]], task_id: str) -> None:
    for rel, edits in fix.items():
        path = repo / rel
        for old, new in edits:
            if old is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(new)
                continue
            text = path.read_text()
            if text.count(old) != 1:
                raise SystemExit(f"{task_id}: fix for {rel} expects exactly one {old!r}, found {text.count(old)}")
            path.write_text(text.replace(old, new))


def apply_tests(repo: Path, tests: dict[str, str]) -> None:
    for rel, text in tests.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((path.read_text() if path.exists() else "") + text)


def diff(repo: Path) -> str:
    git(repo, "add", "-A")
    out = git(repo, "diff", "--cached", "--binary", "HEAD")
    git(repo, "reset", "-q", "--hard", "HEAD")
    git(repo, "clean", "-qfdx")
    return out


def run_pytest(repo: Path) -> dict[str, str]:
    """node id -> status for every collected test."""
    # No third-party plugins: the projects need none, and loading them dominates the run time.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir=.", "-q"]
    collected = subprocess.run([*cmd, "--collect-only"], cwd=repo, capture_output=True, text=True, env=env)
    nodes = [line.strip() for line in collected.stdout.splitlines() if "::" in line]
    junit = repo / ".junit.xml"
    subprocess.run([*cmd, f"--junitxml={junit}"], cwd=repo, capture_output=True, text=True, env=env)
    results = parse_junit(junit.read_bytes())
    junit.unlink()
    return {node: results.get(nodeid_key(node), ("missing", ""))[0] for node in nodes}


def gold_plan(fix: dict[str, list[tuple[str | None, str]]]) -> list[str]:
    """One `python3 - <<EOF` edit per file, the way an agent would apply a str-replace."""
    plan = []
    for rel, edits in fix.items():
        lines = ["import pathlib", f"p = pathlib.Path({rel!r})"]
        for old, new in edits:
            if old is None:
                lines += ["p.parent.mkdir(parents=True, exist_ok=True)", f"p.write_text({new!r})"]
            else:
                lines += ["s = p.read_text()", f"old = {old!r}",
                          "assert s.count(old) == 1, 'edit target not found exactly once'",
                          f"p.write_text(s.replace(old, {new!r}))"]
        plan.append(f"python3 - <<'{EDIT_DELIMITER}'\n" + "\n".join(lines) + f"\n{EDIT_DELIMITER}")
    return plan


def build_task(project: str, spec: dict, work: Path, base: str) -> dict:
    task_id = spec["id"]
    apply_fix(work, spec["fix"], task_id)
    patch = diff(work)
    apply_tests(work, spec["tests"])
    test_patch = diff(work)
    if any(not p.startswith("tests/") for p in _paths(test_patch)) or any(p.startswith("tests/") for p in _paths(patch)):
        raise SystemExit(f"{task_id}: patch must touch source files only, test_patch test files only")

    apply_tests(work, spec["tests"])
    before = run_pytest(work)
    apply_fix(work, spec["fix"], task_id)
    after = run_pytest(work)
    diff(work)  # back to base

    new_tests = set(after) - _base_nodes(work)
    broken = [n for n, s in after.items() if s != "passed" and (before.get(n) == "passed" or n in new_tests)]
    if broken:
        raise SystemExit(f"{task_id}: tests not passing with the gold fix: {broken}")
    f2p = sorted(n for n, s in after.items() if s == "passed" and before.get(n) != "passed")
    p2p = sorted(n for n, s in after.items() if s == "passed" and before.get(n) == "passed")
    if not f2p:
        raise SystemExit(f"{task_id}: no FAIL_TO_PASS test (the hidden tests pass at base)")
    return {
        "instance_id": f"{REPO_OWNER}__{task_id}", "repo": f"{REPO_OWNER}/{project}",
        "base_commit": base, "problem_statement": spec["problem_statement"],
        "hints_text": spec.get("hints_text", ""), "patch": patch, "test_patch": test_patch,
        "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "environment_setup_commit": base,
        "version": spec.get("version", "0.1"), "created_at": "2025-01-01T00:00:00Z",
        "source": f"{project}.bundle", "difficulty": spec["difficulty"], "gold_plan": gold_plan(spec["fix"]),
    }


_BASE_NODES: dict[str, set[str]] = {}


def _base_nodes(work: Path) -> set[str]:
    key = str(work)
    if key not in _BASE_NODES:
        _BASE_NODES[key] = set(run_pytest(work))
    return _BASE_NODES[key]


def _paths(patch: str) -> list[str]:
    return [line.split(" b/", 1)[1] for line in patch.splitlines() if line.startswith("diff --git ")]


def main() -> None:
    if not (HERE / "specs").is_dir() or not (HERE / "projects").is_dir():
        raise SystemExit(f"{HERE} has no specs/ and projects/: run this from a source checkout")
    projects = sorted(p.stem for p in (HERE / "specs").glob("*.py"))
    tasks = []
    with tempfile.TemporaryDirectory() as tmp:
        for project in projects:
            spec_module = runpy.run_path(str(HERE / "specs" / f"{project}.py"))
            work = Path(tmp) / project
            base = make_repo(project, work)
            _base_nodes(work)
            bundle = HERE / f"{project}.bundle"
            bundle.unlink(missing_ok=True)
            git(work, "-c", "pack.threads=1", "bundle", "create", "-q", str(bundle), "main")
            for spec in spec_module["TASKS"]:
                tasks.append(build_task(project, spec, work, base))
                print(f"{tasks[-1]['instance_id']}: {len(tasks[-1]['FAIL_TO_PASS'])} fail->pass, "
                      f"{len(tasks[-1]['PASS_TO_PASS'])} pass->pass", file=sys.stderr)
    with open(HERE / "tasks.jsonl", "w") as f:
        for task in tasks:
            f.write(json.dumps(task, sort_keys=True) + "\n")
    print(f"wrote {len(tasks)} tasks from {len(projects)} projects to {HERE / 'tasks.jsonl'}", file=sys.stderr)


if __name__ == "__main__":
    main()
