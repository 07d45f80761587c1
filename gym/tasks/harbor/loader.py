"""A folder of Harbor task folders (or one task folder) -> Tasks.

Contract: `load_dir(path)` returns one Task per task folder (a folder holding `task.toml`),
sorted by folder name, or raises TaskFileError with one line per task that cannot run here,
naming the file, the field and the fix: a task that needs the internet or a GPU (sandboxes
have neither), no `instruction.md`, no `tests/test.sh`, no `environment/Dockerfile` (a
`docker_image` alone would need a pull). Nothing here touches Docker: the image is built, offline, when
a docker sandbox is first made for the task (`RepoSpec.image_context`), under a tag that
hashes the environment folder and the base image, and the image's WORKDIR becomes the
repository the agent works in. `solution/` becomes the gold plan (`Task.gold_plan`, one
shell command that unpacks solution/ to /solution and runs solve.sh in the workdir);
`tests/` reaches the sandbox only when grading (`harbor.verify`).
"""
from __future__ import annotations

import base64
import hashlib
import io
import re
import shlex
import tarfile
from pathlib import Path

from harnessrl.gym.tasks.harbor.spec import HarborError, HarborSpec, parse_task_toml
from harnessrl.gym.tasks import Task, TaskFileError
from harnessrl.sandboxes.context_image import SCRATCH_LINKS, final_workdir

#: Bump when what the image build adds changes (context_image's links): new tags, new sources.
BUILD_VERSION = "1"
DEFAULT_WORKDIR = "/app"


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


def task_dirs(root: Path) -> list[Path]:
    """`root` itself when it is a task folder, else its task sub-folders by name."""
    if is_task_dir(root):
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and is_task_dir(p))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-._") or "task"


def _tree_digest(h: "hashlib._Hash", folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
        h.update(b"\1")


def _pack(folder: Path) -> str:
    """A folder as base64 of a .tar.gz (its contents at the top)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for p in sorted(folder.rglob("*")):
            tf.add(p, arcname=p.relative_to(folder).as_posix(), recursive=False)
    return base64.b64encode(buf.getvalue()).decode()


def gold_command(solution: Path, workdir: str, env: dict[str, str]) -> str:
    """One shell command: solution/ put at /solution, then solve.sh run in `workdir`. A lone
    solve.sh travels as a here-document (plain text: few tokens for a scripted policy to
    emit), a solution/ with more files as a base64 .tar.gz."""
    target = SCRATCH_LINKS["/solution"]
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
    run = f"cd {shlex.quote(workdir)} && {exports}bash /solution/solve.sh"
    files = [p for p in solution.rglob("*") if p.is_file()]
    text = (solution / "solve.sh").read_text(encoding="utf-8", errors="replace")
    if len(files) == 1:
        mark = "HARNESSRL_SOLVE_EOF"
        while mark in text:
            mark += "_"
        return (f"rm -rf {target} && mkdir -p {target} && cat > {target}/solve.sh <<'{mark}'\n"
                f"{text.rstrip(chr(10))}\n{mark}\n{run}")
    return f"rm -rf {target} && mkdir -p {target} && echo {_pack(solution)} | base64 -d | tar -xzf - -C {target} && {run}"


def load_task(folder: Path) -> Task:
    """One Harbor task folder as a Task; HarborError names what is wrong."""
    from harnessrl.gym.models import home
    from harnessrl.sandboxes.images import base_image_tag

    folder = folder.resolve()
    toml = parse_task_toml(folder / "task.toml")
    where = folder / "task.toml"
    if toml.allow_internet:
        raise HarborError(f"{where}: [environment] allow_internet = true: the task needs the internet and "
                          "sandboxes have none; fix: leave the task out (or set false if it does not need it)")
    if toml.gpus:
        raise HarborError(f"{where}: [environment] gpus = {toml.gpus}: sandboxes have no GPU; fix: leave the task out")
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        raise HarborError(f"{instruction} is missing: it is the problem statement the agent sees")
    if not (folder / "tests" / "test.sh").is_file():
        raise HarborError(f"{folder / 'tests' / 'test.sh'} is missing: it is the verifier that writes the reward")
    context = folder / "environment"
    if not (context / "Dockerfile").is_file():
        extra = (f" (docker_image {toml.docker_image!r} would need a pull; sandboxes build offline)"
                 if toml.docker_image else "")
        raise HarborError(f"{context / 'Dockerfile'} is missing{extra}: the task's image is built from it")
    workdir = final_workdir((context / "Dockerfile").read_text(encoding="utf-8")) or DEFAULT_WORKDIR
    if "$" in workdir or workdir.rstrip("/") in ("", "/tmp", "/home/agent") or workdir.startswith(("/tmp/", "/logs")):
        raise HarborError(f"{context / 'Dockerfile'}: WORKDIR {workdir!r} cannot hold the task's files; fix: "
                          f"WORKDIR {DEFAULT_WORKDIR} (a literal folder of its own)")
    statement = instruction.read_text(encoding="utf-8").strip()
    if not statement:
        raise HarborError(f"{instruction} is empty")
    h = hashlib.sha256(f"{BUILD_VERSION}\0{base_image_tag()}\0{workdir}\0".encode())
    _tree_digest(h, context)
    key = h.hexdigest()[:16]
    slug = _slug(folder.name)
    solution = folder / "solution"
    has_gold = (solution / "solve.sh").is_file()
    harbor = HarborSpec(task_dir=str(folder), tests_dir=str(folder / "tests"),
                        solution_dir=str(solution) if has_gold else None,
                        verifier_timeout_s=toml.verifier_timeout_s, verifier_env=toml.verifier_env,
                        agent_timeout_s=toml.agent_timeout_s, solution_env=toml.solution_env,
                        build_timeout_s=toml.build_timeout_s, cpus=toml.cpus, memory_mb=toml.memory_mb,
                        storage_mb=toml.storage_mb)
    return Task(instance_id=folder.name, repo=f"harbor/{slug}", base_commit="main", problem_statement=statement,
                source=str(home() / "harbor" / f"{slug}-{key}" / "workdir"), image=f"harnessrl/harbor-{slug}:{key}",
                workdir=workdir, difficulty=toml.difficulty, format="harbor", harbor=harbor,
                gold_plan=[gold_command(solution, workdir, toml.solution_env)] if has_gold else [])


def load_dir(path: str | Path, source_root: str | Path | None = None) -> list[Task]:
    """Every Harbor task under `path` (see the module docstring). `source_root` is not used:
    a Harbor task's files come from its own image."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise TaskFileError(f"{root} is not a folder of Harbor tasks")
    folders = task_dirs(root)
    if not folders:
        raise TaskFileError(f"{root}: no Harbor task in it (a task folder holds task.toml, instruction.md, "
                            "environment/Dockerfile and tests/test.sh)")
    tasks, problems = [], []
    for folder in folders:
        try:
            tasks.append(load_task(folder))
        except HarborError as e:
            problems.append(f"harbor task {folder.name!r}: {e}")
    if problems:
        raise TaskFileError("\n".join(problems))
    return tasks
