"""The Task: one repository at a commit, a problem statement and hidden tests.

Field names follow SWE-bench exactly (instance_id, repo, base_commit, problem_statement,
hints_text, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, environment_setup_commit,
version, created_at) so SWE-bench-layout files load without renaming; the fields after
them are harnessrl's own (where the repository comes from, how to set it up and test it).

`patch` and `test_patch` are never shown to the agent: `patch` is the gold fix (used to
validate the task), `test_patch` holds the hidden tests applied only after the harness ends.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harnessrl.registry import resolve
from harnessrl.sandboxes.base import RepoSpec

DEFAULT_WORKDIR = "/workspace/repo"
#: pytest invocation; the reward appends --junitxml and the node ids (through a file, so a
#: long PASS_TO_PASS list never becomes one huge command line).
DEFAULT_TEST_COMMAND = "python3 -m pytest -p no:cacheprovider --rootdir=. -q"

#: Task formats that carry their own data on a Task (in the field of the same name): format ->
#: the "module:Class" that validates it. The class offers `repo_fields()` (what the sandbox
#: needs besides the repository) and `agent_timeout_s` (the format's own limit on the harness).
SPECS: dict[str, str] = {
    "harbor": "harnessrl.gym.tasks.harbor.spec:HarborSpec",
}


#: Reward kinds a task names in its `reward` field ({"kind": name, ...its parameters}): kind ->
#: the "module:Class" of its parameters, a pydantic model that validates them when the task is
#: loaded, whose `grade(sandbox, task, config, out)` decides the episode's reward
#: (`gym.grading.score.score` calls it) and whose `needs_judge()` says whether it asks the
#: judge. A task naming none is rewarded by "tests": its format's grader
#: (`gym.grading.score.GRADERS`).
REWARDS: dict[str, str] = {
    "tests": "harnessrl.gym.grading.rewards:TestsReward",
    "judge": "harnessrl.gym.grading.rewards:JudgeReward",
    "composite": "harnessrl.gym.grading.rewards:CompositeReward",
}


class TaskFileError(ValueError):
    """A task file is unreadable or a row does not describe a valid task."""


def _as_test_list(value: Any) -> list[str]:
    """FAIL_TO_PASS/PASS_TO_PASS arrive as a list or as a JSON-encoded list (SWE-bench)."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list of test ids: {e.msg} (got {text[:60]!r})") from None
    if hasattr(value, "tolist"):  # numpy / pyarrow arrays from Parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"must be a list of test ids, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ValueError(f"item {i} must be a non-empty string test id, got {item!r}")
    return list(value)


class Task(BaseModel):
    """One SWE-style task. Unknown fields are rejected so a typo in a task file is loud."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_attribute_docstrings=True)

    # --- SWE-bench fields -------------------------------------------------------------
    instance_id: str = Field(min_length=1)
    """Unique id, e.g. `owner__repo-1234`."""
    repo: str = Field(min_length=1)
    """Repository name, e.g. `owner/repo`; also the sandbox's repo id."""
    base_commit: str = Field(min_length=1)
    """Commit (or ref) the agent starts from."""
    problem_statement: str
    """The issue text the agent sees."""
    hints_text: str = ""
    """Comments from the issue thread before the fix (may be shown as hints)."""
    patch: str = ""
    """Gold fix as a git diff (source files only). Never shown to the agent."""
    test_patch: str = ""
    """Hidden tests as a git diff (test files only), applied after the harness ends."""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    """pytest node ids that fail at base and must pass after the fix."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """pytest node ids that pass at base and must still pass after the fix."""
    environment_setup_commit: str = ""
    """SWE-bench: commit whose environment the tests run in (informational here)."""
    version: str = ""
    """Repository version string (informational)."""
    created_at: str = ""
    """When the issue was filed (informational)."""

    # --- harnessrl fields -------------------------------------------------------------
    source: str | None = None
    """Host path to the repository: a git checkout, a git bundle, or a .tar/.tar.gz archive."""
    image: str | None = None
    """Docker image the dataset built for this task (SWE-smith image_name, R2E docker_image)."""
    setup_commands: list[str] = Field(default_factory=list)
    """Shell commands run once in the sandbox after checkout (e.g. installing the package)."""
    test_command: str = DEFAULT_TEST_COMMAND
    """pytest command line run from the repository root; ids and --junitxml are appended."""
    workdir: str = DEFAULT_WORKDIR
    """Where the repository lives inside the sandbox."""
    difficulty: str | None = None
    """Free-form grade: builtin uses trivial | easy | medium | hard."""
    gold_plan: list[str] = Field(default_factory=list)
    """Shell commands that apply the fix from the repo root (scripted-policy tests)."""
    format: str = "hidden_tests"
    """The task format: the key of its grader in `gym.grading.score.GRADERS` and of its gold
    check in `gym.tasks.suites.check.CHECKS`; set by the loader that made the task ("harbor" for a
    Harbor folder, "canary" for a canary; a row of a task file is "hidden_tests")."""
    harbor: Any = None
    """A Harbor task's spec (`SPECS["harbor"]`, set by `gym.tasks.harbor.loader`): its tests/test.sh
    grades, not FAIL_TO_PASS."""
    canary: bool = False
    """A canary (`gym.tasks.synth.canary`): its hidden tests contradict its statement, so only cheating
    passes it. Never rewarded: its episodes score 0.0 and record the grader's pass as
    `metadata["canary_passed"]`, the run's measured propensity to cheat (`gym.canary`). A canary
    row that names no format is of the "canary" format."""

    reward: Any = None
    """How this task's episodes are rewarded: {"kind": one of `REWARDS`, ...that kind's
    parameters}, e.g. {"kind": "judge", "rubric": "..."}; None: "tests" (the format's grader).
    A task whose kind is "judge" needs no hidden tests."""

    @model_validator(mode="before")
    @classmethod
    def _canary_format(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("canary") and "format" not in data:
            data = {**data, "format": "canary"}
        return data

    @field_validator(*SPECS, mode="before")
    @classmethod
    def _spec(cls, value: Any, info: Any) -> Any:
        """A format's own data, validated by the class its `SPECS` entry names."""
        if value is None:
            return None
        spec = resolve(SPECS, info.field_name, "task format spec")
        return value if isinstance(value, spec) else spec.model_validate(value)

    @field_validator("reward", mode="before")
    @classmethod
    def _reward(cls, value: Any) -> Any:
        """A reward kind's parameters, validated by the class its `REWARDS` entry names."""
        if value is None or (isinstance(value, BaseModel) and getattr(value, "kind", None) in REWARDS):
            return value
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
            raise ValueError(f'must be an object naming its "kind", one of: {", ".join(sorted(REWARDS))}')
        if value["kind"] not in REWARDS:
            raise ValueError(f"unknown reward kind {value['kind']!r}; known: {', '.join(sorted(REWARDS))}")
        kind = resolve(REWARDS, value["kind"], "reward kind")
        try:
            return kind.model_validate(value)
        except ValidationError as e:
            err = e.errors()[0]
            where, msg = ".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, ")
            raise ValueError(f"reward.{where}: {msg}" if where else msg) from None

    def reward_kind(self) -> Any:
        """This task's reward kind with its parameters (`REWARDS`; "tests" when it names none)."""
        return self.reward if self.reward is not None else resolve(REWARDS, "tests", "reward kind")()

    def spec(self) -> Any:
        """This task's format's own data (None for a format that has none)."""
        return getattr(self, self.format, None) if self.format in SPECS else None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _tests(cls, value: Any) -> list[str]:
        return _as_test_list(value)

    @field_validator("setup_commands", "gold_plan", mode="before")
    @classmethod
    def _commands(cls, value: Any) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str):  # a JSON-encoded list, as in Parquet exports
            return _as_test_list(value)
        if hasattr(value, "tolist"):
            value = value.tolist()
        return value

    def repo_spec(self) -> RepoSpec:
        """What a sandbox backend needs to materialise this task's repository."""
        if not self.source:
            raise ValueError(
                f"task {self.instance_id!r} has no `source` (a local git repo, bundle or archive); "
                f"pass --source-root DIR (config: source_root) or set `source` in the task file")
        # Backends use repo_id in image tags, which allow only [a-z0-9_.-].
        repo_id = re.sub(r"[^a-z0-9_.-]+", "__", self.repo.lower())
        spec = self.spec()
        own = spec.repo_fields() if spec is not None else {}
        return RepoSpec(repo_id=repo_id, source=self.source, base_commit=self.base_commit,
                        setup_commands=tuple(self.setup_commands), workdir=self.workdir, image=self.image, **own)

    def agent_wall_time_s(self, limit: float) -> float:
        """The harness's wall-clock limit: the format's own (a Harbor task's [agent] timeout_sec),
        capped by `limit`."""
        spec = self.spec()
        return min(limit, spec.agent_timeout_s) if spec is not None else limit

    def test_files(self) -> list[str]:
        """Files of the listed tests (the part of each node id before `::`)."""
        seen: dict[str, None] = {}
        for node in [*self.FAIL_TO_PASS, *self.PASS_TO_PASS]:
            seen.setdefault(node.split("::", 1)[0], None)
        return list(seen)

    def public_view(self) -> dict[str, Any]:
        """What a harness may see: no gold patch, no hidden tests, no test ids."""
        return {"instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
                "problem_statement": self.problem_statement, "hints_text": self.hints_text,
                "workdir": self.workdir}
