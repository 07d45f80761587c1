"""What grading decides: the result record, its config, and the verdicts every grader raises.

Contract: `RewardResult` is what one episode's grading produced (reward 1.0 / 0.0 / None, why,
whose failure, the evidence of tampering); `RewardConfig` how hidden tests run. A grader (one
per task format, `gym.grading.score.GRADERS`) fills a result or raises a `Verdict` through
`infra` (masked), `agent` (the agent's 0) or `tampered` (0 with evidence); `twice` retries a
sandbox step once and tells a dead sandbox from a state the agent left.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from harnessrl.gym.failures import describe
from harnessrl.gym.grading.judge import JudgeConfig
from harnessrl.sandboxes.base import Sandbox, SandboxDied, SandboxError

TestStatus = Literal["passed", "failed", "error", "skipped", "missing"]


class RewardConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """How an episode is rewarded: how hidden tests are run, and which judge scores the tasks
    whose reward kind asks one (`Task.reward`, docs/grading.md)."""

    test_timeout_s: float = 600.0
    """Wall-clock limit of the hidden test run; exceeding it scores 0 (the code under test hung)."""
    command_timeout_s: float = 60.0
    """Limit for each bookkeeping command (git rev-parse, git apply)."""
    output_tail_chars: int = 4000
    """How much of the test run's output is kept in the result."""
    runner_paths: list[str] = Field(default_factory=list)
    """Directories inside the sandbox that hold pytest when the sandbox's python lacks it (a
    read-only mount the grader lends); appended to sys.path before the runner is imported."""
    check_cause: bool = True
    """When the run leaves no complete report, re-run the hidden tests on the pristine base to
    tell the agent's failure (base completes: reward 0) from the infrastructure's (masked)."""

    judge: JudgeConfig | None = None
    """The OpenAI-compatible judge of tasks whose reward kind is "judge" or "composite"; None:
    such a task's episodes are masked ("no judge configured")."""

    def worst_case_s(self) -> float:
        """About the longest scoring may take: two hidden-test runs (the agent's, and the
        pristine base's when the first left no report), the bookkeeping commands around them,
        and a judge's call (2 x its timeout, which bounds each phase: the connection, and the
        wait for its short answer). A backstop timeout around an episode (the scheduler's
        `episode_timeout_s`) must leave this much after the harness's wall time, or an agent
        whose code hangs the hidden tests would be masked by the backstop instead of scored 0
        by the grader."""
        judge = 2 * self.judge.timeout_s if self.judge is not None else 0.0
        return 2 * self.test_timeout_s + 6 * self.command_timeout_s + judge


class TestOutcome(BaseModel):
    """One listed test's result after the hidden tests ran."""

    node_id: str
    kind: Literal["FAIL_TO_PASS", "PASS_TO_PASS"]
    status: TestStatus
    message: str = ""


class RewardResult(BaseModel):
    """What scoring one episode produced."""

    instance_id: str
    reward: float | None
    """1.0 all listed tests pass, 0.0 otherwise, None on infra_error; a judge's score in [0, 1],
    or a composite's weighted mean, for those reward kinds."""
    kind: str = "tests"
    """The reward kind that decided (`gym.tasks.REWARDS`: the task's `reward.kind`)."""
    parts: dict[str, float] = Field(default_factory=dict)
    """A composite's parts before weighting: {"tests": 0/1, "judge": score} (those that ran)."""
    judge: dict[str, Any] | None = None
    """The judge's call when one was made (`gym.grading.judge`): request, response, latency,
    what the judge was shown of the diff, its score or its failure. Never trained."""
    status: Literal["ok", "infra_error"]
    reason: str = ""
    tampered: bool = False
    """The agent changed the test machinery or reached into it: reward 0.0, status ok, and
    `reason` starts with "tampered: "."""
    evidence: list[dict[str, str]] = Field(default_factory=list)
    """What the grader can show for `tampered`: {"kind", "what", "where"} each, `kind` one of
    `gym.grading.TAMPER_KINDS` (empty unless tampered)."""
    protected: bool = True
    """False when the verdict could be written by the code it judged (a Harbor verifier whose
    reward file the tested code may write, a test runner loaded from the repository itself)."""
    unprotected_reason: str = ""
    cause: Literal["", "agent", "infra"] = ""
    """Whose failure it was when the hidden tests gave no verdict ("" when they did)."""
    tests: list[TestOutcome] = Field(default_factory=list)
    agent_diff: str = ""
    """The agent's changes against base, taken before anything was restored."""
    restored_files: list[str] = Field(default_factory=list)
    """Test infrastructure the agent changed, left at base for grading."""
    dropped_files: list[str] = Field(default_factory=list)
    """Build artefacts (bytecode, egg-info, site-packages) and stdlib shadows not graded."""
    head_moved: bool = False
    """The agent committed or checked out something; scoring used the working tree anyway."""
    test_output: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)
    """A Harbor verifier's named numbers (reward.json, or {"reward": x} from reward.txt)."""
    duration_s: float = 0.0


class Verdict(Exception):
    """Ends grading with this reward (None: infra_error), reason, cause and evidence; `score`
    turns it into the RewardResult. Graders of every task format raise it through the helpers below."""

    def __init__(self, reward: float | None, reason: str, cause: str = "", tampered: bool = False,
                 evidence: list[dict[str, str]] | None = None):
        super().__init__(reason)
        self.reward, self.reason, self.cause, self.tampered = reward, reason, cause, tampered
        self.evidence = evidence or []


def infra(reason: str) -> Verdict:
    """The infrastructure failed: masked (reward None, status infra_error)."""
    return Verdict(None, reason, "infra")


def agent(reason: str) -> Verdict:
    """The agent's own 0: scored, not masked."""
    return Verdict(0.0, reason, "agent")


def tampered(found: list[dict[str, str]]) -> Verdict:
    """The verdict for tampering shown by `found` (evidence dicts, `gym.grading.evidence`)."""
    reasons = [f"{e['where']}: {e['what']}" if e.get("where") else e["what"] for e in found]
    return Verdict(0.0, "tampered: " + "; ".join(reasons)[:1500], "agent", tampered=True, evidence=found)


def answers(sandbox: Sandbox) -> bool:
    """The sandbox still runs commands (so a failed step was the state the agent left)."""
    try:
        return sandbox.alive() and sandbox.exec("true", timeout=30).exit_code == 0
    except SandboxError:
        return False


def twice(sandbox: Sandbox, step, what: str):
    """Run a sandbox step; retry once (a transient channel failure passes the second time).
    Failing twice while the sandbox still runs commands is the state the agent left: its 0."""
    for attempt in (1, 2):
        try:
            return step()
        except SandboxDied:
            raise
        except SandboxError as e:
            if attempt == 2:
                if answers(sandbox):
                    raise agent(f"{what}: {describe(e)}") from None
                raise


def read_changes(sandbox: Sandbox, out: RewardResult) -> list:
    """The agent's changes against base, read before anything changes the tree: recorded in
    `out.agent_diff` (as text; what is applied keeps any non-UTF-8 bytes) and cut per path
    (`gym.grading.diff.split_patch`); an unreadable diff is the agent's 0."""
    from harnessrl.gym.grading.diff import split_patch
    diff = twice(sandbox, sandbox.diff, "the agent's changes could not be read")
    out.agent_diff = diff.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    try:
        return split_patch(diff)
    except ValueError as e:
        raise agent(f"the agent's diff is unreadable: {e}") from None
