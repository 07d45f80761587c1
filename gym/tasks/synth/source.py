"""The repository a synthesis run mutates: its clean commit, one bug commit per task, one bundle.

Contract: `clean_repo(project, dest)` leaves at `dest` a git repository whose branch `main`
is one parentless commit (the *clean* commit) holding the project's tree with its tests
passing: for a built-in project (`builtin:<name>`), its shipped sources with every built-in
task's fix and hidden tests applied (the fully fixed project); for a path (a checkout, a git
bundle or a .tar/.tar.gz archive), its HEAD tree. `bug_commit(repo, edits)` records a tree
with some files replaced as another parentless commit with the clean commit's message,
author and date, so a sandbox's history (base's ancestry only) shows nothing of the fix.
`gold_patch` is the diff from a bug commit back to clean; `write_bundle` ships the clean
commit and the named bug commits in one git bundle. Commit ids depend only on content:
fixed author, committer and date.
"""
from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import tempfile
from pathlib import Path

from harnessrl.gym.grading.diff import is_test_path

__all__ = ["BUILTIN_PROJECTS", "clean_repo", "source_files", "bug_commit", "gold_patch", "write_bundle",
           "git", "project_name"]

_BUILTIN = Path(__file__).resolve().parent.parent / "suites" / "builtin"
BUILTIN_PROJECTS = ("cachekit", "calc", "ledger", "spans", "textkit")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "harnessrl synth", "GIT_AUTHOR_EMAIL": "synth@harnessrl.invalid",
    "GIT_COMMITTER_NAME": "harnessrl synth", "GIT_COMMITTER_EMAIL": "synth@harnessrl.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-C", str(repo), *args], input=input,
                          capture_output=True, text=True, env={**os.environ, **GIT_ENV, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} in {repo} failed: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def project_name(project: str) -> str:
    """`builtin:calc` -> `calc`; a path -> its file or folder name without archive suffixes."""
    if project.startswith("builtin:"):
        return project.split(":", 1)[1]
    name = Path(project.rstrip("/")).name
    for suffix in (".bundle", ".tar.gz", ".tgz", ".tar", ".git"):
        name = name.removesuffix(suffix)
    return name


def _builtin_tree(name: str, dest: Path) -> None:
    """The built-in project with every built-in task's fix and hidden tests applied."""
    if name not in BUILTIN_PROJECTS:
        raise ValueError(f"unknown built-in project {name!r}; valid: {', '.join(BUILTIN_PROJECTS)}")
    if not (_BUILTIN / "projects" / name).is_dir():
        raise FileNotFoundError(f"{_BUILTIN / 'projects' / name} is missing: built-in project sources ship "
                                "in a source checkout only (use a path to a repository instead)")
    shutil.copytree(_BUILTIN / "projects" / name, dest,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    for stored in sorted(dest.rglob("*.py.txt")):
        stored.rename(stored.with_suffix(""))
    spec = runpy.run_path(str(_BUILTIN / "specs" / f"{name}.py"))
    for task in spec["TASKS"]:
        for rel, edits in task["fix"].items():
            path = dest / rel
            for old, new in edits:
                if old is None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(new)
                elif path.read_text().count(old) == 1:
                    path.write_text(path.read_text().replace(old, new))
                else:
                    raise RuntimeError(f"{task['id']}: its fix does not apply to {rel} once the others are in")
        for rel, text in task["tests"].items():
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text((path.read_text() if path.exists() else "") + text)


def clean_repo(project: str, dest: Path) -> str:
    """Make the clean repository at `dest` (must not exist); return the clean commit id.
    `project` is `builtin:<name>` or a path to a checkout, bundle or archive (its HEAD)."""
    name = project_name(project)
    if project.startswith("builtin:"):
        _builtin_tree(name, dest)
        git(dest, "init", "-q", "-b", "main")
    else:
        from harnessrl.sandboxes.base import RepoSpec
        from harnessrl.sandboxes.repo import materialize

        src = Path(project).expanduser().resolve()
        if not src.exists():
            raise FileNotFoundError(f"project {project!r} does not exist")
        materialize(RepoSpec(repo_id="synth", source=str(src), base_commit="HEAD"), dest)
        shutil.rmtree(dest / ".git")
        git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    tree = git(dest, "write-tree").strip()
    commit = git(dest, "commit-tree", tree, "-m", f"Import {name}").strip()
    git(dest, "update-ref", "refs/heads/main", commit)
    git(dest, "reset", "-q", "--hard", commit)
    return commit


def source_files(repo: Path) -> list[str]:
    """Tracked Python files that are not tests (nor test configuration), sorted."""
    files = git(repo, "ls-files", "-z", "--", "*.py").split("\0")
    return sorted(f for f in files if f and not is_test_path(f) and Path(f).name != "setup.py")


def bug_commit(repo: Path, clean: str, files: dict[str, str]) -> str:
    """A parentless commit: the clean tree with `files` (path -> new text) replaced."""
    with tempfile.TemporaryDirectory(prefix="harnessrl-synth-idx-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", clean, env=env)
        for path, text in sorted(files.items()):
            blob = git(repo, "hash-object", "-w", "--stdin", "--path", path, input=text).strip()
            mode = git(repo, "ls-tree", clean, "--", path).split()[0]
            git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{path}", env=env)
        tree = git(repo, "write-tree", env=env).strip()
    message = git(repo, "log", "-1", "--format=%B", clean).strip()
    return git(repo, "commit-tree", tree, "-m", message).strip()


def gold_patch(repo: Path, bug: str, clean: str) -> str:
    """The fix: a git diff from the bug commit back to the clean one."""
    return git(repo, "diff", "--binary", "--no-color", "--no-ext-diff", "--no-renames", bug, clean)


def write_bundle(repo: Path, clean: str, refs: dict[str, str], path: Path) -> None:
    """One bundle with the clean commit as `main` and each bug commit under refs/heads/synth/<name>."""
    for ref in git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/synth/").split():
        git(repo, "update-ref", "-d", ref)
    for name, commit in sorted(refs.items()):
        git(repo, "update-ref", f"refs/heads/synth/{name}", commit)
    git(repo, "update-ref", "refs/heads/main", clean)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    git(repo, "-c", "pack.threads=1", "bundle", "create", "-q", str(path.resolve()), "refs/heads/main",
        *[f"refs/heads/synth/{n}" for n in sorted(refs)])
