"""Reward kinds: what a task's `reward` field selects (`gym.tasks.REWARDS`), each a pydantic model
of its task-file parameters whose `grade(sandbox, task, config, out)` fills the RewardResult or
raises a Verdict, like a format's grader (`gym.grading.score.score` calls it and never raises),
and whose `needs_judge()` says whether it asks the run's judge (a run whose tasks need one and
that configures none is refused at start, `gym.stack.load_suite_tasks`).

- "tests": the task format's own grader (`GRADERS`: hidden tests, Harbor's test.sh).
- "judge": the agent's diff, read from outside the sandbox after the harness ended, scored by an
  OpenAI-compatible judge against the task's rubric (`gym.grading.judge`); no hidden tests.
- "composite": the tests and the judge, weighted. Only a completed test run is weighted: any
  verdict the tests end on themselves (tampering: 0, the agent's 0 for a hung run or a diff
  that does not apply, an infrastructure failure: masked) ends the composite as it is, and the
  judge is not asked (a tampering agent earns nothing from the judge).

A judge that fails (no judge configured, its key unset, a timeout, an HTTP error, an answer that
is not the strict format) masks the episode: reward None, status infra_error, cause infra, the
reason and the call recorded (`RewardResult.judge`). It is never scored 0 or 1.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from harnessrl.gym.grading.judge import JudgeFailed, ask
from harnessrl.gym.grading.score import grader
from harnessrl.gym.grading.verdict import RewardConfig, RewardResult, Verdict, infra, read_changes
from harnessrl.gym.tasks import Task
from harnessrl.sandboxes.base import Sandbox

__all__ = ["TestsReward", "JudgeReward", "CompositeReward", "judge_score"]


class TestsReward(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """The task format's own grader decides (hidden tests; Harbor's test.sh)."""

    __test__ = False  # not a pytest class, whatever its name says
    kind: Literal["tests"] = "tests"
    """This kind's name."""

    def needs_judge(self) -> bool:
        return False

    def grade(self, sandbox: Sandbox, task: Task, config: RewardConfig, out: RewardResult) -> None:
        grader(task)(sandbox, task, config, out)


class JudgeReward(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """An OpenAI-compatible judge (`RewardConfig.judge`) scores the agent's diff against the rubric."""

    kind: Literal["judge"] = "judge"
    """This kind's name."""
    rubric: str = Field(min_length=1)
    """What the judge checks the agent's change against (shown to the judge, never to the agent)."""

    def needs_judge(self) -> bool:
        return True

    def grade(self, sandbox: Sandbox, task: Task, config: RewardConfig, out: RewardResult) -> None:
        out.kind = self.kind
        read_changes(sandbox, out)
        out.reward = judge_score(task, self.rubric, config, out)
        out.reason = f"judge: {out.reward:g}" + (f" ({out.judge.get('reason')})" if out.judge.get("reason") else "")


class CompositeReward(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """The tests and the judge, weighted: (tests_weight x tests + judge_weight x judge) / (sum of weights)."""

    kind: Literal["composite"] = "composite"
    """This kind's name."""
    rubric: str = Field(min_length=1)
    """What the judge checks the agent's change against."""
    tests_weight: float = Field(0.5, ge=0.0, allow_inf_nan=False)
    """Weight of the tests' 0 or 1 (0: the tests are not run)."""
    judge_weight: float = Field(0.5, ge=0.0, allow_inf_nan=False)
    """Weight of the judge's score (0: the judge is not asked)."""

    @model_validator(mode="after")
    def _weights(self) -> "CompositeReward":
        if self.tests_weight + self.judge_weight <= 0:
            raise ValueError("tests_weight + judge_weight must be > 0")
        return self

    def needs_judge(self) -> bool:
        return self.judge_weight > 0

    def grade(self, sandbox: Sandbox, task: Task, config: RewardConfig, out: RewardResult) -> None:
        out.kind = self.kind
        if self.tests_weight > 0:
            grader(task)(sandbox, task, config, out)  # a verdict of its own (tampered, hung, masked) ends here
            if out.reward is None:
                raise Verdict(None, out.reason or "the tests gave no reward", "infra")
            out.parts["tests"] = out.reward
        else:
            read_changes(sandbox, out)
        if self.judge_weight > 0:
            out.parts["judge"] = judge_score(task, self.rubric, config, out)
        total = self.tests_weight + self.judge_weight
        out.reward = sum(w * out.parts.get(k, 0.0) for k, w in
                         (("tests", self.tests_weight), ("judge", self.judge_weight))) / total
        tests = f"tests {out.parts['tests']:g} x {self.tests_weight:g} ({out.reason})" if "tests" in out.parts else ""
        judge = f"judge {out.parts['judge']:g} x {self.judge_weight:g}" if "judge" in out.parts else ""
        out.reason = f"composite {out.reward:g} = ({' + '.join(p for p in (tests, judge) if p)}) / {total:g}"


def judge_score(task: Task, rubric: str, config: RewardConfig, out: RewardResult) -> float:
    """The judge's score of the diff read into `out.agent_diff`; its call recorded in `out.judge`.
    Any failure of the judge is an infrastructure verdict (masked), with its reason."""
    if config.judge is None:
        out.judge = {"failure": "config", "error": "no judge configured"}
        raise infra(f"task {task.instance_id} is rewarded by a judge, but no judge is configured "
                    "(rollout.episode.reward.judge: base_url, model, api_key_env)")
    try:
        call = ask(config.judge, task.problem_statement, rubric, out.agent_diff)
    except JudgeFailed as e:
        out.judge = e.record
        raise infra(f"judge {e.failure}: {e}") from None
    out.judge = call.record
    return call.score
