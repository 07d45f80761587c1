"""Shared by the adapter / episode tests: a built-in task that has a gold plan."""
from __future__ import annotations

import json


def builtin_task():
    from harnessrl.gym.suites.builtin import SUITE_DIR, TASKS_FILE
    from harnessrl.gym.tasks import Task

    try:
        from harnessrl.gym.suites.builtin import load
        tasks = load()
    except ImportError:  # the suite loader not there yet: read the shipped file directly
        tasks = []
        for line in TASKS_FILE.read_text().splitlines():
            d = json.loads(line)
            d["source"] = str(SUITE_DIR / d["source"])
            tasks.append(Task.model_validate(d))
    return next(t for t in tasks if t.gold_plan)
