"""The fix-level task set of the default `harnessrl train`: synthesized once, verified, shipped.

Every task is a single mutation of a built-in project (`suites.builtin`) at the `fix` hint level
(difficulty "trivial"): the statement lists the failing tests, names the file, function and line,
and shows the one `sed -i` command that fixes it. Solving one means copying that command into a
correct tool call through the harness: a check that the pipeline learns, not a debugging task.

Provenance: written by `gym.tasks.synth` (the manifest.json beside this file holds its config,
the clean commits, counts and rejections; meta.jsonl the per-task mutation, function and split),
every task checked through the real grader in a sandbox (base 0.0, gold 1.0). Regenerate it from
the repository root with

    harnessrl tasks synth --fix-only --seed 0 --max-tasks 50 --out gym/tasks/suites/fixlevel

(synthesis is deterministic for a seed: the same tasks and split; `tests/test_fixlevel_suite.py`
checks what the files promise). The split is by function (`heldout_fraction` 0.2): no held-out
task mutates a function that a training task mutates.

Suites (`loaders.SUITES`): "fix-train" (train.jsonl, the RL and teacher tasks) and "fix-heldout"
(heldout.jsonl, the held-out evaluation). Each row's `source` is a bundle in repos/.
"""
from __future__ import annotations

from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent
TRAIN_FILE = SUITE_DIR / "train.jsonl"
HELDOUT_FILE = SUITE_DIR / "heldout.jsonl"
META_FILE = SUITE_DIR / "meta.jsonl"


def train():
    """The training tasks (list[Task]), sources resolved to the shipped bundles."""
    from harnessrl.gym.tasks.loaders import load_jsonl

    return load_jsonl(TRAIN_FILE, layout="harnessrl")


def heldout():
    """The held-out tasks (list[Task]): functions no training task mutates."""
    from harnessrl.gym.tasks.loaders import load_jsonl

    return load_jsonl(HELDOUT_FILE, layout="harnessrl")
