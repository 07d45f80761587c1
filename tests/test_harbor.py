"""Harbor task folders as a suite, on real parts: the shipped tasks (gym/tasks/suites/harbor) built
offline and graded in real Docker sandboxes, `harnessrl tasks list|check DIR` from the CLI,
the attacks on the reward file, and a real mini-swe-agent episode with the scripted gold."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harnessrl.gym.tasks.harbor.loader import load_dir
from harnessrl.gym.tasks.harbor.spec import HarborError, parse_task_toml
from harnessrl.gym.tasks.harbor.verify import read_reward
from harnessrl.gym.tasks.loaders import TaskFileError, load_suite
from harnessrl.sandboxes.context_image import external_images, final_workdir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import docker_backend, scripted_stack  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[1] / "gym" / "tasks" / "suites" / "harbor"
DOCKERFILE = ("ARG HARNESSRL_BASE=harnessrl/base:latest\nFROM ${HARNESSRL_BASE}\nWORKDIR /app\n"
              "RUN echo 'echo 41' > /app/answer.sh\n")
# Writes the reward only when the answer is right: a file left from before would survive.
ONLY_ON_PASS = '#!/bin/bash\nif [ "$(bash /app/answer.sh)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; fi\n'
ALWAYS_WRITES = ('#!/bin/bash\nif [ "$(bash /app/answer.sh)" = 42 ]; then echo 1; else echo 0; fi'
                 ' > /logs/verifier/reward.txt\n')


def make_task(root: Path, name: str, test_sh: str, dockerfile: str = DOCKERFILE, toml: str = "",
              solve: str | None = "#!/bin/bash\necho 'echo 42' > /app/answer.sh\n") -> Path:
    task = root / name
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text(f"Task {name} {uuid.uuid4().hex[:6]}: make /app/answer.sh print 42.\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n' + toml)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text(test_sh)
    if solve is not None:
        (task / "solution" / "solve.sh").write_text(solve)
    return task


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harnessrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})


# --- loading (no Docker) ----------------------------------------------------------------------

def test_shipped_tasks_load_with_their_task_toml():
    tasks = {t.instance_id: t for t in load_suite(str(SHIPPED))}
    assert sorted(tasks) == ["csv-stats", "greet-script", "wordcount-fix"]
    wc = tasks["wordcount-fix"]
    assert wc.problem_statement == (SHIPPED / "wordcount-fix" / "instruction.md").read_text().strip()
    assert (wc.workdir, wc.difficulty, wc.FAIL_TO_PASS, wc.patch) == ("/app", "easy", [], "")
    h = wc.harbor
    assert (h.verifier_timeout_s, h.agent_timeout_s, h.cpus, h.memory_mb, h.storage_mb) == (120.0, 300.0, 1.0, 1024, 1024)
    spec = wc.repo_spec()
    assert spec.image_context == str(SHIPPED / "wordcount-fix" / "environment")
    assert (spec.cpus, spec.memory_mb, spec.storage_mb) == (1.0, 1024, 1024)
    assert spec.image.startswith("harnessrl/harbor-wordcount-fix:") and len(spec.image.split(":")[1]) == 16
    assert tasks["greet-script"].harbor.memory_mb == 512  # memory = "512M", the older spelling
    assert tasks["csv-stats"].harbor.verifier_env == {"SUMMARY_PATH": "/app/summary.json"}
    # The agent's wall time is the task's own, capped by the run's.
    assert (wc.agent_wall_time_s(600.0), wc.agent_wall_time_s(100.0)) == (300.0, 100.0)
    # The gold plan runs solve.sh from /solution; tests/ is nowhere in what the agent is given.
    assert len(wc.gold_plan) == 1 and wc.gold_plan[0].endswith("bash /solution/solve.sh")
    assert "test_wordcount" not in json.dumps(wc.public_view()) + wc.gold_plan[0]


def test_allow_internet_and_gpus_are_refused_one_line_each(tmp_path):
    make_task(tmp_path, "needs-net", ONLY_ON_PASS, toml="[environment]\nallow_internet = true\n")
    make_task(tmp_path, "needs-gpu", ONLY_ON_PASS, toml="[environment]\ngpus = 1\n")
    make_task(tmp_path, "fine", ONLY_ON_PASS)
    with pytest.raises(TaskFileError) as e:
        load_dir(tmp_path)
    lines = str(e.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("harbor task 'needs-gpu': ") and "gpus = 1: sandboxes have no GPU" in lines[0]
    assert lines[1].startswith("harbor task 'needs-net': ") and "task.toml" in lines[1]
    assert "allow_internet = true: the task needs the internet and sandboxes have none" in lines[1]
    out = cli("tasks", "list", str(tmp_path))  # from the CLI: one line per task, exit 2, no traceback
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert [ln.split(":")[0] for ln in out.stderr.strip().splitlines()] == ["harnessrl tasks"] * 2
    assert "allow_internet = true" in out.stderr


def test_bad_task_toml_fields_are_named(tmp_path):
    task = make_task(tmp_path, "bad", ONLY_ON_PASS, toml='[environment]\ncpus = "two"\n')
    with pytest.raises(HarborError, match=r"task.toml: \[environment\].cpus must be a positive number, got 'two'"):
        parse_task_toml(task / "task.toml")
    (task / "task.toml").write_text('[environment]\nmemory = "lots"\n')
    with pytest.raises(HarborError, match=r"\[environment\].memory must be megabytes or a size"):
        parse_task_toml(task / "task.toml")
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 10\n")
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(TaskFileError, match=r"tests/test.sh is missing: it is the verifier"):
        load_dir(task)


def test_dockerfile_images_and_workdir_are_read_without_docker():
    text = ("ARG BASE=debian:12\nFROM ${BASE} AS build\nRUN make\nFROM ${HARNESSRL_BASE}\n"
            "COPY --from=build /out /out\nCOPY --from=tools:1 /bin/x /x\nWORKDIR /srv\nWORKDIR app\n")
    assert external_images(text, {"HARNESSRL_BASE": "harnessrl/base:abc"}) == [
        (2, "debian:12"), (4, "harnessrl/base:abc"), (6, "tools:1")]
    assert final_workdir(text) == "/srv/app"
    assert final_workdir("FROM x\nWORKDIR /a\nFROM y\n") is None  # the last stage sets none


def test_reward_files_are_read_as_harbor_writes_them():
    assert read_reward("1\n", '{"reward": 0}') == (1.0, {"reward": 1.0}, "reward.txt")  # reward.txt first
    assert read_reward(None, '{"reward": 0.5, "passed": 3}') == (0.5, {"reward": 0.5, "passed": 3.0},
                                                                "reward.json['reward']")
    assert read_reward(None, '{"accuracy": 0.25}') == (0.25, {"accuracy": 0.25}, "reward.json['accuracy']")
    for txt, js, why in (("yes", None, "reward.txt is not one number"), (None, None, "wrote neither"),
                         (None, '{"a": 1, "b": 0}', "no 'reward' key"), (None, '{"reward": "1"}', "not a number"),
                         ("nan", None, "not a finite number")):
        with pytest.raises(ValueError, match=why):
            read_reward(txt, js)


# --- real Docker --------------------------------------------------------------------------

def _sandbox(backend, task):
    return backend.create(task.repo_spec())


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_tasks_check_grades_the_shipped_harbor_tasks_from_the_cli():
    docker_backend()
    out = cli("tasks", "check", str(SHIPPED), "--backend", "docker")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    verdicts = [line.split() for line in lines[:-1]]
    assert [v[:4] for v in verdicts] == [["ok", name, "gold=1.0", "empty=0.0"]
                                         for name in ("csv-stats", "greet-script", "wordcount-fix")], out.stdout
    assert all(v[4].endswith("s") and float(v[4][:-1]) > 0 for v in verdicts)
    assert json.loads(lines[-1]) == {"checked": 3, "valid": 3, "invalid": []}


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_missing_from_image_is_a_clear_error_naming_it_and_nothing_is_pulled(tmp_path):
    docker_backend()
    missing = f"harnessrl-test/never-built:{uuid.uuid4().hex[:8]}"
    make_task(tmp_path, "no-base", ONLY_ON_PASS, dockerfile=f"FROM {missing}\nWORKDIR /app\n")
    make_task(tmp_path, "no-gold", ONLY_ON_PASS, solve=None)
    # The build runs with the network off: a RUN that reaches out fails the build, clearly.
    online = DOCKERFILE + ("RUN python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 5); "
                           "print('ONLINE')\"\n")
    make_task(tmp_path, "online-build", ONLY_ON_PASS, dockerfile=online)
    out = cli("tasks", "check", str(tmp_path), "--backend", "docker")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4  # one line per task, then the summary
    assert lines[0].startswith("INVALID no-base  gold=- empty=-")
    assert f"Dockerfile:1: image '{missing}' is not present locally and is never pulled" in lines[0]
    assert "FROM ${HARNESSRL_BASE}" in lines[0]
    assert lines[1].startswith("INVALID no-gold  gold=- empty=0.0") and "no solution/solve.sh" in lines[1]
    assert lines[2].startswith("INVALID online-build  gold=- empty=-")
    assert "Dockerfile (offline, no network) failed" in lines[2] and "Network is unreachable" in lines[2]
    assert "ONLINE" not in out.stdout.replace("print('ONLINE')", "")
    assert json.loads(lines[-1]) == {"checked": 3, "valid": 0, "invalid": ["no-base", "no-gold", "online-build"]}


@pytest.fixture(scope="module")
def backend():
    b = docker_backend()
    yield b
    b.reap(run_id=b.run_id)


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_tests_and_solution_are_not_visible_and_limits_apply(backend):
    from harnessrl.gym.grading.score import score

    task = next(t for t in load_dir(SHIPPED) if t.instance_id == "wordcount-fix")
    sb = _sandbox(backend, task)
    try:
        host = sb.container.client.api.inspect_container(sb.id)["HostConfig"]
        assert (host["NanoCpus"], host["Memory"]) == (10 ** 9, 1024 << 20)
        assert {u["Name"]: u["Hard"] for u in host["Ulimits"]}["fsize"] == 1024 << 20
        seen = sb.exec("ls /app; test -e /tests/test.sh && echo TESTS; test -e /solution/solve.sh && echo SOLUTION;"
                       " find / -xdev -name 'test_wordcount.py' -o -name solve.sh 2>/dev/null | head -3")
        assert seen.output.split() == ["README.md", "wordcount.py"], seen.output
        assert score(sb, task).reward == 0.0  # graded: /tests was there only for the verifier
        sb.reset()
        assert sb.exec("test -e /tests/test.sh || echo gone").output.strip() == "gone"
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_reward_json_metrics_are_kept_and_reward_is_the_reward_key(backend):
    from harnessrl.gym.grading.score import score

    task = next(t for t in load_dir(SHIPPED) if t.instance_id == "csv-stats")
    sb = _sandbox(backend, task)
    try:
        sb.exec('echo \'{"rows": 7, "total": 1.0, "top_region": "north"}\' > /app/summary.json')
        part = score(sb, task)
        assert (part.reward, part.status) == (0.0, "ok")
        assert part.metrics == {"reward": 0.0, "fields_correct": 1.0, "fields_total": 3.0}
        assert part.reason.startswith("reward.json['reward'] = 0; metrics ")
        sb.reset()
        assert sb.exec(task.gold_plan[0], timeout=120).exit_code == 0
        gold = score(sb, task)
        assert (gold.reward, gold.metrics["fields_correct"]) == (1.0, 3.0), gold.reason
        assert "summary.json" in gold.agent_diff
    finally:
        sb.close()


@pytest.fixture(scope="module")
def answer_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor")
    make_task(root, "only-on-pass", ONLY_ON_PASS)
    make_task(root, "always-writes", ALWAYS_WRITES)
    make_task(root, "never-writes", "#!/bin/bash\necho checked, wrote nothing\n")
    make_task(root, "verifier-dies", "#!/bin/bash\nkill -KILL $$\n")
    return {t.instance_id: t for t in load_dir(root)}


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_reward_file_the_agent_wrote_beforehand_does_not_count(backend, answer_tasks):
    from harnessrl.gym.grading.score import score

    task = answer_tasks["only-on-pass"]
    sb = _sandbox(backend, task)
    try:
        wrote = sb.exec("mkdir -p /tmp/harnessrl-logs/verifier && echo 1.0 > /logs/verifier/reward.txt"
                        " && cat /logs/verifier/reward.txt")
        assert wrote.output.strip() == "1.0"  # the agent can write there during its episode...
        res = score(sb, task)  # ...but /logs is made fresh after every agent process is gone
        assert (res.reward, res.status, res.cause) == (0.0, "ok", "agent"), res.reason
        assert "wrote neither /logs/verifier/reward.txt nor reward.json" in res.reason
        sb.reset()
        sb.exec("echo 'echo 42' > /app/answer.sh")
        assert score(sb, task).reward == 1.0  # the same grading rewards a real answer
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_background_process_the_agent_left_cannot_write_the_reward(backend, answer_tasks):
    from harnessrl.gym.grading.score import score

    task = answer_tasks["only-on-pass"]
    sb = _sandbox(backend, task)
    try:
        loop = ("setsid -f bash -c 'while true; do mkdir -p /tmp/harnessrl-logs/verifier; "
                "echo 1 > /tmp/harnessrl-logs/verifier/reward.txt; sleep 0.05; done' >/dev/null 2>&1; "
                "for i in $(seq 600); do [ -s /logs/verifier/reward.txt ] && break; sleep 0.1; done; "
                "cat /logs/verifier/reward.txt")
        assert sb.exec(loop, timeout=120).output.strip() == "1"
        procs = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"
        assert "while true" in sb.exec(procs).output  # it runs on after the agent's command ended
        res = score(sb, task)
        assert (res.reward, res.cause) == (0.0, "agent"), res.reason
        assert "while true" not in sb.exec(procs).output  # reset killed it before the verifier ran
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_process_escaping_the_verifier_makes_its_reward_untrusted(backend, answer_tasks):
    """The agent's code, run by test.sh, leaves a writer that outlives test.sh (its own session)
    and keeps overwriting the reward test.sh wrote: it is found, killed, and the run scores 0."""
    from harnessrl.gym.grading.score import score

    task = answer_tasks["always-writes"]
    sb = _sandbox(backend, task)
    try:
        sb.write_file("/app/answer.sh", b"setsid -f bash -c 'while true; do echo 1 > /logs/verifier/reward.txt;"
                      b" sleep 0.02; done' >/dev/null 2>&1\necho 41\n")
        res = score(sb, task)
        assert (res.reward, res.status, res.cause) == (0.0, "ok", "agent"), res.reason
        assert "processes escaped test.sh's process group" in res.reason
        assert "on the pristine base test.sh runs to its end" in res.reason
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_no_reward_is_the_agents_zero_and_a_dying_verifier_is_masked(backend, answer_tasks):
    from harnessrl.gym.grading.score import score

    never = answer_tasks["never-writes"]
    sb = _sandbox(backend, never)
    try:
        res = score(sb, never)
        assert (res.reward, res.status, res.cause) == (0.0, "ok", "agent")
        assert "wrote neither" in res.reason and "checked, wrote nothing" in res.test_output
    finally:
        sb.close()
    dies = answer_tasks["verifier-dies"]
    sb = _sandbox(backend, dies)
    try:
        sb.exec("echo 'echo 42' > /app/answer.sh")
        res = score(sb, dies)
        assert (res.reward, res.status, res.cause) == (None, "infra_error", "infra"), res.reason
        assert "killed by signal 9" in res.reason and "does not complete either" in res.reason
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_mini_swe_agent_episode_on_a_harbor_task_with_the_scripted_gold():
    from harnessrl.adapters.toolchain import installed_spec

    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter
    from harnessrl.gym.tools.check_adapter import token_exact_problems
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode

    task = next(t for t in load_dir(SHIPPED) if t.instance_id == "greet-script")
    with scripted_stack() as (engine, proxy, backend):
        for gold, want in ((True, 1.0), (False, 0.0)):
            engine.set_tasks([task], gold=gold)
            start = len(engine.calls)
            res = run_episode(task, MiniSweAgentAdapter(), lambda s, m: backend.create(s, mounts=m),
                              ProxyHandle.of(proxy), "policy", EpisodeConfig(max_calls=6, wall_time_s=400))
            assert (res.reason, res.status, res.trajectory.reward) == ("submitted", "ok", want), res.error
            assert token_exact_problems(res.trajectory, engine.calls[start:]) == []
            grading = res.trajectory.metadata["grading"]
            assert grading["reason"].startswith(f"reward.txt = {want:g}"), grading


def test_the_local_backend_refuses_a_dockerfile_task_with_the_fix():
    from harnessrl.sandboxes.base import SandboxUnavailable
    from harnessrl.sandboxes.local import LocalBackend

    try:
        backend = LocalBackend()
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap sandboxes unavailable: {e}")
    task = load_dir(SHIPPED / "greet-script")[0]
    with pytest.raises(SandboxUnavailable, match=r"built from its own Dockerfile .*needs the docker backend"):
        backend.create(task.repo_spec())


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_collect_runs_the_harbor_suite_from_the_cli(tmp_path):
    """`harnessrl collect --suite DIR`: the loader path rollout, train and collect share; every
    shipped task's gold plan (solve.sh) through mini-swe-agent scores 1.0 and is kept."""
    from harnessrl.adapters.toolchain import installed_spec

    docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    out = cli("collect", "--teacher", "scripted", "--suite", str(SHIPPED), "--harness", "mini-swe-agent",
              "--model", "tiny-llama", "--episodes", "3", "--sandbox", "docker", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    kept = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(t["task_id"] for t in kept) == ["csv-stats", "greet-script", "wordcount-fix"]
    assert all(t["reward"] == 1.0 and t["metadata"]["teacher"] == "scripted" for t in kept)
    reasons = {t["task_id"]: t["metadata"]["grading"]["reason"] for t in kept}
    assert reasons["csv-stats"].startswith("reward.json['reward'] = 1; metrics ")
    assert reasons["greet-script"].startswith("reward.txt = 1 ")
    metrics = {t["task_id"]: t["metadata"]["grading"]["metrics"] for t in kept}
    assert metrics["csv-stats"] == {"reward": 1.0, "fields_correct": 3.0, "fields_total": 3.0}


def test_check_adapter_takes_its_gold_task_from_a_harbor_folder(tmp_path):
    """`check-adapter --suite DIR` (run in full on gym/tasks/suites/harbor by hand: all checks PASS);
    a folder whose tasks have no solve.sh fails the gold-task check, naming the suite."""
    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.tools.check_adapter import check_adapter

    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    make_task(tmp_path, "no-gold", ONLY_ON_PASS, solve=None)
    report = check_adapter("mini-swe-agent", "docker", 60, suite=str(tmp_path))
    last = report.checks[-1]
    assert (last.name, last.ok) == ("gold task", False)
    assert last.detail == f"suite {str(tmp_path)!r}: no task has a gold plan"


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_runner_shadow_in_the_workdir_is_tampering(backend):
    """wordcount-fix's test.sh runs `python3 -m pytest` from /app, where a pytest.py of the
    agent's would be imported first and could exit 0: the episode is tampered, scored 0."""
    from harnessrl.gym.grading.score import score

    task = next(t for t in load_dir(SHIPPED) if t.instance_id == "wordcount-fix")
    sb = _sandbox(backend, task)
    try:
        sb.write_file("/app/pytest.py", b"import sys\nsys.exit(0)\n")
        assert sb.exec("cd /app && python3 -m pytest -q /nowhere; echo rc=$?").output.strip() == "rc=0"
        res = score(sb, task)
        assert (res.reward, res.status, res.tampered) == (0.0, "ok", True)
        assert res.reason.startswith("tampered: pytest.py: shadows the test runner (pytest)"), res.reason
    finally:
        sb.close()


# --- the reward file and the code test.sh runs (gym.tasks.harbor.reward_watch) ----------------------

PYTEST_ON_PASS = ("#!/bin/bash\ncd /app\nif python3 -m pytest -q -p no:cacheprovider /tests/test_answer.py; then\n"
                  "  echo 1 > /logs/verifier/reward.txt\nfi\n")
ANSWER_TESTS = "from answer import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
PY_DOCKERFILE = DOCKERFILE.replace("echo 'echo 41' > /app/answer.sh", "printf 'def answer():\\n    return 41\\n' > /app/answer.py")
# The attack: the module under test writes the reward itself when the tests import it.
WRITES_REWARD = b'open("/logs/verifier/reward.txt", "w").write("1")\n\n\ndef answer():\n    return 41\n'


@pytest.fixture(scope="module")
def reward_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor-reward")
    task = make_task(root, "pytest-on-pass", PYTEST_ON_PASS, dockerfile=PY_DOCKERFILE,
                     solve="#!/bin/bash\nprintf 'def answer():\\n    return 42\\n' > /app/answer.py\n")
    (task / "tests" / "test_answer.py").write_text(ANSWER_TESTS)
    make_task(root, "program-writes", "#!/bin/bash\npython3 /tests/grade.py > /logs/verifier/reward.txt\n")
    (root / "program-writes" / "tests" / "grade.py").write_text(
        "import subprocess\nout = subprocess.run(['bash', '/app/answer.sh'], capture_output=True, text=True).stdout\n"
        "print(1 if out.strip() == '42' else 0)\n")
    return {t.instance_id: t for t in load_dir(root)}


def test_which_test_sh_writes_its_reward_itself(tmp_path):
    from harnessrl.gym.tasks.harbor.reward_watch import shell_written

    assert shell_written(SHIPPED / "wordcount-fix" / "tests") == ""
    assert shell_written(SHIPPED / "greet-script" / "tests") == ""  # echo "$ok" > ...
    assert "with a command" in shell_written(SHIPPED / "csv-stats" / "tests")  # python3 ... > reward.json
    for name, script, why in (
            ("compound", ALWAYS_WRITES, "with a command"),  # `fi > reward.txt`: the condition's programs write too
            ("tee", "#!/bin/bash\necho 1 | tee /logs/verifier/reward.txt\n", "with a command"),
            ("folder", "#!/bin/bash\npytest --out /logs/verifier\n", "folder"),
            ("subst", '#!/bin/bash\necho "$(python3 g.py)" > /logs/verifier/reward.txt\n', "with a command"),
            ("none", "#!/bin/bash\n/app/grade\n", "does not write")):
        tests = tmp_path / name
        tests.mkdir()
        (tests / "test.sh").write_text(script)
        assert why in shell_written(tests), name
    helper = tmp_path / "helper"
    helper.mkdir()
    (helper / "test.sh").write_text(ONLY_ON_PASS)
    (helper / "lib.py").write_text("REWARD = '/logs/verifier/reward.txt'\n")
    assert shell_written(helper) == "tests/lib.py names the reward file or its folder"


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_code_under_test_writing_the_reward_file_is_tampered(backend, reward_tasks):
    """The module under test writes 1 to reward.txt when pytest imports it; its test fails, so
    test.sh (which writes only on success) leaves that 1 in place. The watch saw the file change
    while pytest ran: tampered, with `reward_file` evidence. The gold is paid, and both verdicts
    say the reward file was not protected."""
    from harnessrl.gym.tasks.harbor.reward_watch import UNPROTECTED
    from harnessrl.gym.grading.score import score

    task = reward_tasks["pytest-on-pass"]
    sb = _sandbox(backend, task)
    try:
        sb.write_file("/app/answer.py", WRITES_REWARD)
        res = score(sb, task)
        assert (res.reward, res.status, res.tampered) == (0.0, "ok", True), res.reason
        assert [e["kind"] for e in res.evidence] == ["reward_file"], res.evidence
        assert "python3 -m pytest" in res.evidence[0]["what"], res.evidence
        assert res.evidence[0]["where"] == "/logs/verifier/reward.txt", res.evidence
        assert res.protected is False and res.unprotected_reason.startswith(UNPROTECTED)
        sb.reset()
        assert sb.exec(task.gold_plan[0], timeout=60).exit_code == 0
        gold = score(sb, task)
        assert (gold.reward, gold.tampered, gold.protected) == (1.0, False, False), gold.reason
        assert gold.unprotected_reason == UNPROTECTED + "; a writer seen running while it changed is caught"
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_reward_no_writer_can_be_checked_for_is_recorded_unprotected(backend, answer_tasks, reward_tasks):
    """Where the watch cannot tell the writer (the agent's script is itself run by bash; the
    reward is a program's output), the attack is not caught, and the verdict says so."""
    from harnessrl.gym.tasks.harbor.reward_watch import UNPROTECTED
    from harnessrl.gym.grading.score import score

    task = answer_tasks["only-on-pass"]
    sb = _sandbox(backend, task)
    try:
        sb.write_file("/app/answer.sh", b"echo 1 > /logs/verifier/reward.txt\necho 41\n")
        res = score(sb, task)  # paid today: a shell writing the file is test.sh's own kind of write
        assert (res.protected, res.tampered) == (False, False), res.reason
        assert res.unprotected_reason.startswith(UNPROTECTED)
    finally:
        sb.close()
    task = reward_tasks["program-writes"]
    sb = _sandbox(backend, task)
    try:
        res = score(sb, task)
        assert (res.reward, res.protected) == (0.0, False), res.reason
        assert res.unprotected_reason == (UNPROTECTED + "; no writer was checked: test.sh writes its reward with a "
                                          "command: 'python3 /tests/grade.py > /logs/verifier/reward.txt'")
    finally:
        sb.close()
