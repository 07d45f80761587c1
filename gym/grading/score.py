"""Score one episode: the entry every caller uses, whatever the task's format.

Contract: `score(sandbox, task, config)` never raises. It grades by the task's reward kind
(`Task.reward_kind()`, from the registry `gym.tasks.REWARDS`: "tests", "judge", "composite";
`gym.grading.rewards`); the "tests" kind picks the task format's grader from `GRADERS` (a
registry: short name -> "module:function"; `task_format(task)` names the task's). It turns the
Verdict, a sandbox failure or a grader bug into the RewardResult (`gym.grading.verdict`): a dead
sandbox, a grader error or a failed judge is masked (infra_error), never scored.
"""
from __future__ import annotations

import time

from harnessrl.gym.failures import describe
from harnessrl.gym.grading.verdict import RewardConfig, RewardResult, Verdict
from harnessrl.gym.tasks import Task
from harnessrl.registry import resolve
from harnessrl.sandboxes.base import Sandbox, SandboxError

__all__ = ["GRADERS", "score", "task_format", "grader"]

#: Task formats (`Task.format`) and their graders: each fills a RewardResult or raises a Verdict.
GRADERS: dict[str, str] = {
    "hidden_tests": "harnessrl.gym.grading.hidden_tests:grade",
    "canary": "harnessrl.gym.grading.hidden_tests:grade",
    "harbor": "harnessrl.gym.tasks.harbor.verify:score_harbor",
}


def task_format(task: Task) -> str:
    """The GRADERS key of this task: its format, which the loader that made it set."""
    return task.format


def grader(task: Task):
    """The grading function of this task's format."""
    return resolve(GRADERS, task_format(task), "task format")


def score(sandbox: Sandbox, task: Task, config: RewardConfig | None = None) -> RewardResult:
    """Score the agent's work in `sandbox` by the task's reward kind; never raises. With hidden
    tests, the sandbox is reset on the way (it ends at base + kept diff + hidden tests)."""
    config = config or RewardConfig()
    started = time.monotonic()
    out = RewardResult(instance_id=task.instance_id, reward=None, status="infra_error")
    try:
        task.reward_kind().grade(sandbox, task, config, out)
    except Verdict as v:
        out.reward, out.reason, out.cause, out.tampered = v.reward, v.reason, v.cause, v.tampered
        out.evidence = v.evidence
    except SandboxError as e:  # SandboxDied included: the container is gone, not the agent's fault
        out.reward, out.reason, out.cause = None, describe(e), "infra"
    except Exception as e:  # a grader bug must mask the episode, never stall the caller
        out.reward, out.reason, out.cause = None, f"grader error: {describe(e)}", "infra"
    out.status = "infra_error" if out.reward is None else "ok"
    out.duration_s = time.monotonic() - started
    return out
