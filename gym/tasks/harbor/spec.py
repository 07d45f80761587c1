"""What a Harbor task's `task.toml` says, as the fields harnessrl acts on.

Contract: `parse_task_toml(path)` returns a `TaskToml` or raises `HarborError` naming the file
and the field. Read: `[verifier] timeout_sec, env`, `[agent] timeout_sec`, `[solution] env`,
`[environment] build_timeout_sec, docker_image, cpus, memory_mb (or memory = "2G"),
storage_mb (or storage), gpus, allow_internet`, `[metadata] difficulty`, `[task] name`.
Other keys are Harbor's own (authors, tags, schema versions...) and are ignored. A task that
needs the internet or a GPU is refused by the loader: sandboxes have neither.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class HarborError(ValueError):
    """A Harbor task folder is not one harnessrl can run; the message names the file and field."""


class HarborSpec(BaseModel):
    """The Harbor part of a Task: where its verifier and oracle live and how long they may run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    task_dir: str
    """The task folder on the host."""
    tests_dir: str
    """Host folder copied to /tests only at grading time (never visible to the agent)."""
    solution_dir: str | None = None
    """Host folder with solve.sh (the gold plan); None when the task ships none."""
    verifier_timeout_s: float = Field(600.0, gt=0)
    """[verifier] timeout_sec: test.sh's wall-clock limit (capped by RewardConfig.test_timeout_s)."""
    verifier_env: dict[str, str] = Field(default_factory=dict)
    """[verifier] env: variables test.sh sees."""
    agent_timeout_s: float = Field(600.0, gt=0)
    """[agent] timeout_sec: the harness's wall-clock limit (capped by EpisodeConfig.wall_time_s)."""
    solution_env: dict[str, str] = Field(default_factory=dict)
    """[solution] env: variables solve.sh sees."""
    build_timeout_s: float = Field(600.0, gt=0)
    """[environment] build_timeout_sec: read, not enforced; a build fails when its output stream
    is silent for sandboxes.context_image.BUILD_READ_TIMEOUT_S."""
    cpus: float | None = None
    """[environment] cpus: the sandbox's CPU quota (capped at this host's cores)."""
    memory_mb: int | None = None
    """[environment] memory_mb (or memory = "2G"): the sandbox's memory limit."""
    storage_mb: int | None = None
    """[environment] storage_mb (or storage): enforced by docker as the largest file."""

    @property
    def context_dir(self) -> str:
        """The Docker build context: the task's environment/ folder."""
        return f"{self.task_dir}/environment"

    def repo_fields(self) -> dict:
        """What `Task.repo_spec` adds to the RepoSpec: the image's build context and the limits."""
        return dict(image_context=self.context_dir, cpus=self.cpus, memory_mb=self.memory_mb,
                    storage_mb=self.storage_mb)


class TaskToml(BaseModel):
    """The fields of task.toml harnessrl uses (see the module docstring)."""

    name: str | None = None
    difficulty: str | None = None
    verifier_timeout_s: float = 600.0
    verifier_env: dict[str, str] = Field(default_factory=dict)
    agent_timeout_s: float = 600.0
    solution_env: dict[str, str] = Field(default_factory=dict)
    build_timeout_s: float = 600.0
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int = 0
    allow_internet: bool = False


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.I)


def _mb(value: Any, where: str) -> int:
    """Megabytes from an int (MB) or a size string ("2G", "512M", "2048")."""
    if isinstance(value, bool):
        raise HarborError(f"{where} must be a size, got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise HarborError(f"{where} must be megabytes or a size like '2G', got {value!r}")
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return max(1, int(float(m.group(1)) * scale))


def _table(data: dict, name: str, path: Path) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise HarborError(f"{path}: [{name}] must be a table, got {type(value).__name__}")
    return value


def _num(table: dict, key: str, where: str, default: float | None) -> float | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise HarborError(f"{where}.{key} must be a positive number, got {value!r}")
    return float(value)


def _env(table: dict, where: str) -> dict[str, str]:
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise HarborError(f"{where}.env must be a table of strings, got {env!r}")
    return {k: str(v) for k, v in env.items()}


def parse_task_toml(path: Path) -> TaskToml:
    """Read one task.toml (see the module docstring)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise HarborError(f"{path}: not valid TOML: {e}") from None
    verifier, agent = _table(data, "verifier", path), _table(data, "agent", path)
    env, meta = _table(data, "environment", path), _table(data, "metadata", path)
    solution, task = _table(data, "solution", path), _table(data, "task", path)
    w = f"{path}: [environment]"
    out = TaskToml(
        name=task.get("name") if isinstance(task.get("name"), str) else None,
        difficulty=str(meta["difficulty"]) if "difficulty" in meta else None,
        verifier_timeout_s=_num(verifier, "timeout_sec", f"{path}: [verifier]", 600.0),
        verifier_env=_env(verifier, f"{path}: [verifier]"),
        agent_timeout_s=_num(agent, "timeout_sec", f"{path}: [agent]", 600.0),
        solution_env=_env(solution, f"{path}: [solution]"),
        build_timeout_s=_num(env, "build_timeout_sec", w, 600.0),
        cpus=_num(env, "cpus", w, None))
    for key, legacy in (("memory_mb", "memory"), ("storage_mb", "storage")):
        if key in env or legacy in env:
            name = key if key in env else legacy
            setattr(out, key, _mb(env[name], f"{w}.{name}"))
    image = env.get("docker_image")
    if image is not None and not isinstance(image, str):
        raise HarborError(f"{w}.docker_image must be a string, got {image!r}")
    out.docker_image = image or None
    gpus = env.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise HarborError(f"{w}.gpus must be a whole number, got {gpus!r}")
    out.gpus = gpus
    allow = env.get("allow_internet", False)
    if not isinstance(allow, bool):
        raise HarborError(f"{w}.allow_internet must be true or false, got {allow!r}")
    out.allow_internet = allow
    return out
