"""SWE suites from the command line: `--source-root` finds each row's repository under every
spelling (owner__name checkout, name.tar.gz, name.bundle), `harnessrl tasks check` grades a
SWE-bench JSONL of them in real Docker sandboxes (gold 1.0 / empty 0.0 per task), a loading
problem is one line naming the task and the fix, extra dataset columns keep the SWE-bench
layout, and a task's own Docker image is used when present locally and refused when not."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from harnessrl.gym.tasks.loaders import TaskFileError, detect_layout, load_jsonl, require_sources

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull}
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = ("from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n\n\n"
         "def test_add():\n    assert add(2, 3) == 5\n")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=GIT_ENV).stdout


def make_repo(path: Path, buggy: str = BUGGY) -> tuple[str, str, str]:
    """A repository whose `add` is wrong; returns (base commit, gold patch, test patch)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(buggy)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    base = git(path, "rev-parse", "HEAD").strip()
    (path / "calc.py").write_text(buggy.replace(BUGGY, FIXED))
    gold = git(path, "diff")
    git(path, "checkout", "-q", "calc.py")
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text(TESTS)
    git(path, "add", "-N", "tests/test_calc.py")
    test_patch = git(path, "diff")
    git(path, "rm", "-q", "--cached", "tests/test_calc.py")
    (path / "tests" / "test_calc.py").unlink()
    return base, gold, test_patch


def row(repo: str, base: str, gold: str, test_patch: str, **extra) -> dict:
    name = repo.replace("/", "__")
    return {"instance_id": f"{name}-1", "repo": repo, "base_commit": base, "problem_statement": "add() subtracts",
            "hints_text": "", "patch": gold, "test_patch": test_patch, "created_at": "2024-01-01",
            "version": "0.1", "environment_setup_commit": base,
            "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
            "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero"]), **extra}


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """repos/ with acme__alpha (a checkout), beta.tar.gz and gamma.bundle; swe.jsonl naming them."""
    root = tmp_path_factory.mktemp("src")
    repos = root / "repos"
    rows = []
    for repo in ("acme/alpha", "acme/beta", "acme/gamma"):
        work = root / "work" / repo.split("/")[1]
        rows.append(row(repo, *make_repo(work)))
    (repos).mkdir()
    os.rename(root / "work" / "alpha", repos / "acme__alpha")
    with tarfile.open(repos / "beta.tar.gz", "w:gz") as tf:
        tf.add(root / "work" / "beta", arcname="beta")
    git(root / "work" / "gamma", "bundle", "create", str(repos / "gamma.bundle"), "--all")
    # Dataset columns of SWE-Gym / SWE-rebench style: a `source` label, a difficulty, meta.
    rows[1].update(source="swe-gym", difficulty="easy", meta={"has_test_patch": True})
    path = root / "swe.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, repos, rows


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harnessrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_every_spelling_is_found_and_extra_columns_keep_the_layout(suite):
    path, repos, rows = suite
    assert [detect_layout(r) for r in rows] == ["swebench"] * 3
    tasks = {t.repo: t for t in load_jsonl(path, source_root=repos)}
    assert tasks["acme/alpha"].source == str(repos / "acme__alpha")
    assert tasks["acme/beta"].source == str(repos / "beta.tar.gz")  # "swe-gym" is a label, not a path
    assert tasks["acme/gamma"].source == str(repos / "gamma.bundle")
    assert tasks["acme/beta"].difficulty == "easy"
    assert tasks["acme/beta"].FAIL_TO_PASS == ["tests/test_calc.py::test_add"]


def test_image_name_column_becomes_the_task_image(tmp_path):
    r = row("acme/alpha", "a" * 40, "diff --git a/x b/x\n", "diff --git a/t b/t\n",
            image_name="swebench/sweb.eval.x86_64.acme__alpha-1:latest", difficulty="hard")
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(r) + "\n")
    (task,) = load_jsonl(path)
    assert detect_layout(r) == "swebench"
    assert (task.image, task.difficulty) == ("swebench/sweb.eval.x86_64.acme__alpha-1:latest", "hard")
    assert task.model_copy(update={"source": str(tmp_path)}).repo_spec().image == task.image


def test_missing_source_is_one_line_naming_the_task_and_the_fix(suite, tmp_path):
    path, repos, _ = suite
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TaskFileError) as e:
        load_jsonl(path, source_root=empty)
    assert "\n" not in str(e.value)
    assert "(task 'acme__alpha-1')" in str(e.value) and "acme__alpha, alpha" in str(e.value)
    with pytest.raises(TaskFileError) as e:
        require_sources(load_jsonl(path))
    lines = str(e.value).splitlines()
    assert len(lines) == 3 and lines[2].startswith("task 'acme__gamma-1': no repository for 'acme/gamma'")
    assert "--source-root DIR" in lines[2] and "gamma.bundle" in lines[2]

    out = cli("tasks", "check", str(path), timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("harnessrl tasks: task 'acme__") for line in err), out.stderr
    assert "Traceback" not in out.stderr
    out = cli("tasks", "list", str(path), "--source-root", str(empty), timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert "(task 'acme__alpha-1')" in out.stderr
    out = cli("tasks", "list", str(path), "--source-root", str(tmp_path / "nope"), timeout=120)
    assert out.returncode == 2 and "is not a folder" in out.stderr and "Traceback" not in out.stderr
    for cmd in ("rollout", "collect"):
        out = cli(cmd, "--suite", str(path), "--source-root", str(empty), "--out", str(tmp_path / cmd), timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith(f"harnessrl {cmd}: ") and "(task 'acme__" in out.stderr
    import tomllib
    tiny = tomllib.loads((Path(__file__).resolve().parents[1] / "examples" / "train-tiny.toml").read_text())
    tiny["rollout"].update(suite=str(path), source_root=str(tmp_path / "nope"))
    config = tmp_path / "train.yaml"  # YAML reads JSON
    config.write_text(json.dumps(tiny))
    out = cli("train", "--config", str(config), "--source-root", str(empty), timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("harnessrl train: ") and "(task 'acme__alpha-1')" in out.stderr


def test_tasks_list_with_source_root(suite):
    path, repos, _ = suite
    out = cli("tasks", "list", str(path), "--source-root", str(repos), timeout=120)
    assert out.returncode == 0, out.stderr
    assert [line.split("\t")[:2] for line in out.stdout.splitlines()] == [
        ["acme__alpha-1", "-"], ["acme__beta-1", "easy"], ["acme__gamma-1", "-"]]


def _docker_or_skip():
    from harnessrl.sandboxes import make_backend
    try:
        return make_backend("docker")
    except Exception as e:
        pytest.skip(f"docker backend unavailable here: {e}")


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_tasks_check_grades_bundles_from_the_cli(suite):
    _docker_or_skip()
    path, repos, _ = suite
    out = cli("tasks", "check", str(path), "--source-root", str(repos), "--backend", "docker")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    verdicts = [line.split() for line in lines[:-1]]
    assert [v[:4] for v in verdicts] == [["ok", f"acme__{n}-1", "gold=1.0", "empty=0.0"]
                                         for n in ("alpha", "beta", "gamma")], out.stdout
    assert all(v[4].endswith("s") and float(v[4][:-1]) > 0 for v in verdicts)
    assert json.loads(lines[-1]) == {"checked": 3, "valid": 3, "invalid": []}


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_task_image_present_is_used_and_missing_is_a_clear_error(suite, tmp_path):
    import docker

    from harnessrl.sandboxes.images import base_image_tag

    _docker_or_skip()
    path, repos, rows = suite
    client = docker.from_env()
    tag = f"harnessrl-test/own-image:{uuid.uuid4().hex[:8]}"
    missing = f"harnessrl-test/never-built:{uuid.uuid4().hex[:8]}"
    # A task image of the SWE-Gym kind: its own environment, here a marker file on top of the base.
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tf:
        data = f"FROM {base_image_tag()}\nUSER 0:0\nRUN echo own-env > /etc/task-marker\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    ctx.seek(0)
    client.images.build(fileobj=ctx, custom_context=True, tag=tag, pull=False, network_mode="none", rm=True)
    try:
        present = dict(rows[0], instance_id="own-image-1", image_name=tag)
        absent = dict(rows[2], instance_id="missing-image-1", image_name=missing)
        f = tmp_path / "images.jsonl"
        f.write_text(json.dumps(present) + "\n" + json.dumps(absent) + "\n")
        from harnessrl.sandboxes import make_backend
        backend = make_backend("docker")
        (task, _) = load_jsonl(f, source_root=repos)
        sb = backend.create(task.repo_spec())
        try:
            assert sb.exec("cat /etc/task-marker").output.strip() == "own-env"
            assert sb.exec("python3 -c 'import calc; print(calc.add(2, 3))'").output.strip() == "-1"
        finally:
            sb.close()
        out = cli("tasks", "check", str(f), "--source-root", str(repos), "--backend", "docker")
        assert out.returncode == 1, out.stdout + out.stderr
        lines = out.stdout.strip().splitlines()
        assert lines[0].split()[:4] == ["ok", "own-image-1", "gold=1.0", "empty=0.0"], out.stdout
        assert lines[1].startswith("INVALID missing-image-1  gold=- empty=-"), out.stdout
        assert f"task image {missing!r}" in lines[1] and "never pulled" in lines[1] and "docker load" in lines[1]
        with pytest.raises(docker.errors.ImageNotFound):  # and nothing was pulled
            client.images.get(missing)
        assert "Traceback" not in out.stderr
    finally:
        client.images.remove(tag, force=True)


# calc.py of a base that rewrites pytest's reports at import: the grader calls any grading of it tampered.
RIGGED = "import _pytest.reports\n_pytest.reports.TestReport.__repr__ = lambda self: 'rigged'\n\n" + BUGGY
SHADOW = ("diff --git a/pytest.py b/pytest.py\nnew file mode 100644\n--- /dev/null\n+++ b/pytest.py\n"
          "@@ -0,0 +1 @@\n+import sys; sys.exit(0)\n")


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_tasks_check_names_an_ungradable_task_in_one_line(tmp_path):
    """A base the grader scores `tampered` (its own code rewrites pytest at import) and a gold
    patch that adds a top-level pytest.py (a runner shadow) are one INVALID line each, saying
    which grading was tampered and why; the good task beside them is still checked; no traceback."""
    _docker_or_skip()
    repos = tmp_path / "repos"
    rows = [row("acme/rigged", *make_repo(repos / "acme__rigged", RIGGED))]
    base, gold, test_patch = make_repo(repos / "acme__shadow")
    rows.append(row("acme/shadow", base, gold + SHADOW, test_patch))
    rows.append(row("acme/fine", *make_repo(repos / "acme__fine")))
    path = tmp_path / "swe.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli("tasks", "check", str(path), "--source-root", str(repos), "--backend", "docker")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4, out.stdout
    assert lines[0].startswith("INVALID acme__rigged-1  gold=- empty=0.0  "), lines[0]
    assert "  base graded tampered: " in lines[0], lines[0]
    assert lines[1].startswith("INVALID acme__shadow-1  gold=0.0 empty=0.0  "), lines[1]
    assert "  gold graded tampered: pytest.py: shadows the test runner (pytest)" in lines[1], lines[1]
    assert lines[2].startswith("ok      acme__fine-1  gold=1.0 empty=0.0  "), lines[2]
    assert json.loads(lines[3]) == {"checked": 3, "valid": 1, "invalid": ["acme__rigged-1", "acme__shadow-1"]}
