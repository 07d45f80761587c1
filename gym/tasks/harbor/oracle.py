"""`tasks check` for a Harbor task: the empty run scores 0.0 and solution/solve.sh scores 1.0.

Contract: `check_harbor(sb, task, config, out)` (`CHECKS["harbor"]`) fills `check_task`'s result dict: the
untouched environment is graded (`base_reward`, must be 0.0 and not `tampered`), then after a reset the gold
plan (solve.sh, unpacked at /solution, run in the workdir as the agent would run it, under
[agent] timeout_sec) and a grading (`gold_reward`, must be 1.0). An infra_error is reported as
such; a task without solution/solve.sh is invalid (its gold cannot be checked).
"""
from __future__ import annotations

from typing import Any

from harnessrl.gym.grading.score import score
from harnessrl.gym.grading.verdict import RewardConfig
from harnessrl.gym.tasks.suites.gold import gold_verdict, score_base, verdict
from harnessrl.gym.tasks import Task


def check_harbor(sb: Any, task: Task, config: RewardConfig | None, out: dict[str, Any]) -> dict[str, Any]:
    base = score_base(sb, task, config, out)
    if base is None:
        return out
    problems = [] if base.reward == 0.0 else [f"the empty run is rewarded {base.reward:g}: {base.reason}"]
    if not task.gold_plan:
        problems.append("no solution/solve.sh: the gold cannot be checked")
        return verdict(out, problems)
    sb.reset()
    for command in task.gold_plan:
        ran = sb.exec(command, timeout=task.agent_wall_time_s(3600.0), workdir=task.workdir)
        if ran.exit_code != 0:
            problems.append(f"solve.sh failed (exit {ran.exit_code}{', timed out' if ran.timed_out else ''}): "
                            f"{ran.output.strip()[-300:]}")
            break
    return gold_verdict(out, problems, score(sb, task, config), "solve.sh not rewarded 1.0")
