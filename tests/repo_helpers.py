"""Shared by sandbox tests: a git repository with fixed dates (so its commit shas, and the task
images built from it, are the same every run)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git(cwd, *args) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def one_commit_repo(d: Path, files: dict[str, str]) -> str:
    """`d` (created) as a repository whose one commit, on main, holds `files`; returns its sha."""
    d.mkdir(parents=True)
    git(d, "init", "-q", "-b", "main")
    for name, text in files.items():
        (d / name).write_text(text)
    git(d, "add", "-A")
    git(d, "commit", "-qm", "base")
    return git(d, "rev-parse", "HEAD")
