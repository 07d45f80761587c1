"""The built-in offline suite: small pure-Python projects written for harnessrl, shipped as
git bundles next to this file, with SWE-bench-form tasks in tasks.jsonl.

`build.py` regenerates both from the readable sources in a checkout; `load()` returns the
tasks with each `source` resolved to the bundle's absolute path.
"""
from __future__ import annotations

from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent
TASKS_FILE = SUITE_DIR / "tasks.jsonl"


def load():
    """All built-in tasks (list[Task]), sources resolved to the shipped bundles."""
    from harnessrl.gym.tasks.loaders import load_jsonl

    return load_jsonl(TASKS_FILE, layout="harnessrl")
