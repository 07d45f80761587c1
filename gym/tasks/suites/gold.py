"""The gold check's pieces every task format uses, and the check of hidden-tests tasks.

Contract: a format's check (`gym.tasks.suites.check.CHECKS`) fills the result dict of `check_task`
({"instance_id", "valid", "problem", "base_reward", "gold_reward"}): the untouched base and the
gold are each graded by `gym.grading.score`; `score_base`, `base_problem`, `apply_gold`, `verdict` and
`gold_verdict` are the shared steps (Harbor's oracle and the canaries' check use them too).
"""
from __future__ import annotations

from typing import Any

from harnessrl.gym.grading.score import score
from harnessrl.gym.grading.verdict import RewardConfig
from harnessrl.gym.tasks import Task


def check_hidden_tests(sb: Any, task: Task, config: RewardConfig | None, out: dict[str, Any]) -> dict[str, Any]:
    """A FAIL_TO_PASS / PASS_TO_PASS task: the base scores 0.0 with every FAIL_TO_PASS test
    failing and every PASS_TO_PASS test passing, the gold `patch` scores 1.0."""
    base = score_base(sb, task, config, out)
    if base is None:
        return out
    status = {t.node_id: t.status for t in base.tests}
    passing_f2p = [n for n in task.FAIL_TO_PASS if status.get(n) == "passed"]
    failing_p2p = [n for n in task.PASS_TO_PASS if status.get(n) != "passed"]
    not_applied = apply_gold(sb, task)
    if not_applied:
        out["problem"] = not_applied
        return out
    gold = score(sb, task, config)
    problems = []
    if passing_f2p:
        problems.append(f"FAIL_TO_PASS already passing at base: {passing_f2p[:3]}")
    if failing_p2p:
        problems.append(f"PASS_TO_PASS not passing at base: {failing_p2p[:3]}")
    return gold_verdict(out, problems, gold, "gold patch not rewarded")


def score_base(sb: Any, task: Task, config: RewardConfig | None, out: dict[str, Any]) -> Any:
    """Grade the untouched repository into `out["base_reward"]`; its result, or None with
    `out["problem"]` set when the base cannot be graded (`base_problem`)."""
    sb.reset()
    base = score(sb, task, config)
    out["base_reward"] = base.reward
    why = base_problem(base)
    if why:
        out["problem"] = why
        return None
    return base


def apply_gold(sb: Any, task: Task) -> str:
    """Reset `sb` and `git apply` the task's gold patch (written as a file); "" when it applied,
    else why not."""
    sb.reset()
    sb.write_file("/tmp/harnessrl-gold.patch", task.patch.encode())
    applied = sb.exec("git apply --whitespace=nowarn /tmp/harnessrl-gold.patch && rm /tmp/harnessrl-gold.patch",
                      timeout=60)
    return "" if applied.exit_code == 0 else f"gold patch does not apply: {applied.output.strip()[-300:]}"


def base_problem(base: Any) -> str:
    """Why the base grading `base` (a RewardResult) leaves the task unchecked ("" when it
    does not): an infra_error, or `tampered` on a tree nobody changed (the grader misreads
    the repository, so no grading of it can be trusted)."""
    if base.status != "ok":
        return f"infra_error at base: {base.reason}"
    if base.tampered:
        return f"base graded tampered: {base.reason.removeprefix('tampered: ')}"
    return ""


def verdict(out: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """`out` with its problems joined: valid exactly when there are none."""
    out["problem"] = "; ".join(problems)
    out["valid"] = not problems
    return out


def gold_verdict(out: dict[str, Any], problems: list[str], gold: Any, unrewarded: str) -> dict[str, Any]:
    """`verdict` after the gold grading `gold` (a RewardResult): its reward recorded, an
    infra_error or a reward other than 1.0 (`unrewarded`: what to call that) a problem."""
    out["gold_reward"] = gold.reward
    if gold.status != "ok":
        problems.append(f"infra_error with gold: {gold.reason}")
    elif gold.tampered:
        problems.append(f"gold graded tampered: {gold.reason.removeprefix('tampered: ')}")
    elif gold.reward != 1.0:
        problems.append(f"{unrewarded}: {gold.reason}")
    return verdict(out, problems)
