"""Hidden pytest tests (SWE-bench style): grade an episode's sandbox after the harness has ended, in a clean room.

Contract: reward 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes when the hidden tests
run on *base + the agent's diff + the hidden test patch*, with the runner, its configuration
and its plugins coming from the grader. In order:
1. the agent's change is read as one diff against base (every file, untracked and ignored
   ones included; `sandbox.diff()`), and sorted by `gym.grading.diff.triage`: test infrastructure
   is reverted, build artefacts dropped, runner shadows / site hooks / code reaching into the
   test framework make the episode `tampered` (reward 0.0, status ok, no test run);
2. `sandbox.reset()` kills every process the agent started and puts the tree, /tmp, home
   (and, on docker, /dev/shm, /dev/mqueue) back to base: nothing the agent left outside the
   diff takes part;
3. in a fresh, unguessable directory, the hidden test patch is applied (it must apply on the
   pristine base, else infra), then the kept part of the agent's diff (if that fails, the
   agent's 0), and the runner (gym/grading/runner: a supervisor and a guarded test process) runs the tests under `python3 -I`, recording outcomes
   per node id and checking the framework's integrity (a violation: tampered, 0); its verdict
   comes back on the run's own output between per-run markers, never from a file.
A failure is classified by cause. The sandbox dying, a hidden patch that does not apply on a
clean base, a test command the grader cannot own, an error of the grader itself: `reward=None`,
status "infra_error" (masked, reason recorded). The agent's code hanging the tests (timeout),
killing the runner or leaving no report (decided by re-running the hidden tests on the
pristine base: if that run completes, the failure was the agent's), an unreadable or
unresettable tree: reward 0.0, status ok, reason recorded. `score` never raises.

The hidden tests reach the sandbox only here, as files written with `write_file` after the
reset (no agent process is alive to see them); node ids travel in a file too.
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

from harnessrl.gym.grading import evidence
from harnessrl.gym.grading.diff import SECTIONED_CONFIG_NAMES, pytest_section, triage
from harnessrl.gym.grading.verdict import (RewardConfig, RewardResult, TestOutcome, TestStatus, agent, infra,
                                           read_changes, tampered, twice)
from harnessrl.gym.tasks import Task
from harnessrl.sandboxes.base import Sandbox, SandboxDied, SandboxError

__all__ = ["grade", "patch_files", "nodeid_key", "parse_junit", "runner_command", "node_statuses"]

_WORST_FIRST = ("error", "failed", "skipped", "missing", "passed")
_RUNNER_FILES = {("runner.py" if f.name == "supervisor.py" else f.name): f.read_text()
                 for f in sorted((Path(__file__).parent / "runner").glob("*.py"))}

# Runs inside the sandbox after reset, as `python3 -I -c _PREPARE <eval dir> <base commit>`:
# unpack the bundle the grader wrote beside the eval dir into it, check HEAD is the task's base, apply the hidden tests
# (exit 3: they do not apply on a clean base, infra), then the agent's kept diff (exit 4: the
# agent's). One exec, since every exec is a round trip to the sandbox.
_PREPARE = r'''
import json, os, subprocess, sys
d, base = sys.argv[1], sys.argv[2]
with open(d + ".json", encoding="utf-8") as f:
    bundle = json.load(f)
os.remove(d + ".json")
os.mkdir(d, 0o700)
for name, text in bundle.items():
    with open(os.path.join(d, name), "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]
def out(*args):
    return subprocess.run([*git, *args], capture_output=True, text=True)
head = out("rev-parse", "HEAD").stdout.strip()
want = out("rev-parse", "--verify", "-q", base + "^{commit}").stdout.strip()
if not want or head != want:
    print(f"sandbox HEAD {head!r} is not the task's base commit {base!r} ({want!r})")
    sys.exit(2)
for name, code, what in (("test.patch", 3, "hidden test patch"), ("agent.patch", 4, "agent's diff")):
    path = os.path.join(d, name)
    if os.path.getsize(path):
        done = out("apply", "--whitespace=nowarn", path)
        if done.returncode:
            print(f"{what} did not apply: " + done.stderr.strip()[-400:])
            sys.exit(code)
print(head)
'''


# --- helpers shared with the suite builder ---------------------------------------------

def patch_files(patch: str) -> list[str]:
    """Paths a git diff touches (both sides of renames), in order of appearance."""
    seen: dict[str, None] = {}
    for a, b in re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.M):
        seen.setdefault(a, None)
        seen.setdefault(b, None)
    return list(seen)


def nodeid_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest writes to JUnit XML for a node id (its mangle_test_address)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def parse_junit(xml_text: str | bytes) -> dict[tuple[str, str], tuple[TestStatus, str]]:
    """(classname, name) -> (status, first line of the failure message). Worst status wins."""
    root = ET.fromstring(xml_text)
    results: dict[tuple[str, str], tuple[TestStatus, str]] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        status: TestStatus = "passed"
        message = ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip().split("\n")[0][:300]
                break
        previous = results.get(key)
        if previous is None or _WORST_FIRST.index(status) < _WORST_FIRST.index(previous[0]):
            results[key] = (status, message)
    return results


def runner_command(test_command: str) -> tuple[str, list[str], dict[str, str]]:
    """(python, pytest args, env) of a pytest command line (`[VAR=v ...] python3 -m pytest ARGS`
    or `pytest ARGS`); ValueError for anything the grader cannot run itself."""
    argv = shlex.split(test_command)
    env: dict[str, str] = {}
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        key, value = argv.pop(0).split("=", 1)
        env[key] = value
    if argv[:1] in (["pytest"], ["py.test"]):
        return "python3", argv[1:], env
    if len(argv) >= 3 and re.fullmatch(r"(\S*/)?python(\d(\.\d+)?)?", argv[0]) and argv[1:3] == ["-m", "pytest"]:
        return argv[0], argv[3:], env
    raise ValueError(f"test_command {test_command!r} is not a pytest invocation the grader can run "
                     "itself ([VAR=value ...] python3 -m pytest ARGS, or pytest ARGS)")


def node_statuses(records: list[dict], nodes: list[str]) -> dict[str, tuple[TestStatus, str]]:
    """node id -> (status, message) from grade_runner's report lines, JUnit's way: a failing
    setup or teardown is an error, a failing call a failure; worst status wins."""
    seen: dict[str, tuple[TestStatus, str]] = {}
    for r in records:
        if "report" not in r:
            continue
        o, when = r.get("outcome"), r.get("when")
        status: TestStatus = "passed" if o == "passed" else "skipped" if o == "skipped" \
            else "failed" if when == "call" else "error"
        prev = seen.get(r["report"])
        if prev is None or _WORST_FIRST.index(status) < _WORST_FIRST.index(prev[0]):
            seen[r["report"]] = (status, str(r.get("message", ""))[:300])
    collect = next((str(r.get("message", "")) for r in records if "collect_error" in r), "")
    why = f"not run: {collect.strip().splitlines()[-1][:300]}" if collect.strip() else "not run"
    return {n: seen.get(n, ("missing", why)) for n in nodes}


def grade(sandbox: Sandbox, task: Task, config: RewardConfig, out: RewardResult) -> None:
    """Grade a task with hidden pytest tests (SWE-bench style) into `out`, or raise a Verdict."""
    nodes = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    if not task.FAIL_TO_PASS:
        raise infra(f"task {task.instance_id} lists no FAIL_TO_PASS tests; it cannot be scored")
    try:
        python, args, env = runner_command(task.test_command)
    except ValueError as e:
        raise infra(str(e)) from None
    if not sandbox.alive():
        raise infra("sandbox is not alive")
    quick = config.command_timeout_s
    # 1. The agent's work, read before anything changes it.
    head = sandbox.exec("git -c core.fsmonitor=false rev-parse -q --verify HEAD", timeout=quick,
                        workdir=sandbox.workdir)
    changes = read_changes(sandbox, out)
    protected = set(patch_files(task.test_patch)) | set(task.test_files())
    sorted_ = triage(changes, protected)
    out.restored_files, out.dropped_files = sorted_.reverted, sorted_.dropped
    if sorted_.tampered:
        raise tampered(sorted_.tampered)
    # 2. A pristine tree, no process of the agent's left; 3. base + hidden tests + kept diff.
    pythonpath = [p for p in env.pop("PYTHONPATH", "").split(":") if p]
    spec = {"repo": sandbox.workdir, "args": args, "ids": nodes, "env": env, "pythonpath": pythonpath,
            "runner_paths": config.runner_paths, "marker": f"harnessrl-verdict-{uuid.uuid4().hex}"}
    spec["agent_files"] = [c.path for c in sorted_.kept if not c.deleted]
    spec["test_files"] = sorted(protected)
    base, eval_dir = _prepare(sandbox, task, config, sorted_.kept_patch(), spec, sections=[
        c.path for c in sorted_.kept if c.path.rsplit("/", 1)[-1] in SECTIONED_CONFIG_NAMES])
    out.head_moved = head.output.strip() != base
    verdict, run, shown = _run_tests(sandbox, config, python, eval_dir, spec["marker"])
    out.test_output = shown[-config.output_tail_chars:]
    if verdict is not None and verdict.get("violations"):
        raise tampered([v if isinstance(v, dict) else evidence("framework", str(v)) for v in verdict["violations"]])
    if run.timed_out:
        where = _last_started(sandbox, eval_dir)
        raise agent(f"hidden test run timed out after {config.test_timeout_s:g}s"
                     + (f" (in {where})" if where else " (before any test started)"))
    if verdict is None or verdict.get("done") is None:
        _no_report(sandbox, task, config, python, spec, run)
    records = [r for r in verdict["records"] if isinstance(r, dict)]
    results = node_statuses(records, nodes)
    for kind, ids in (("FAIL_TO_PASS", task.FAIL_TO_PASS), ("PASS_TO_PASS", task.PASS_TO_PASS)):
        for node in ids:
            status, message = results[node]
            out.tests.append(TestOutcome(node_id=node, kind=kind, status=status, message=message))
    failed = [t.node_id for t in out.tests if t.status != "passed"]
    out.reward = 0.0 if failed else 1.0
    out.reason = f"{len(failed)} of {len(out.tests)} tests not passing: {failed[:5]}" if failed \
        else f"all {len(out.tests)} tests pass"


def _prepare(sandbox: Sandbox, task: Task, config: RewardConfig, kept: str, spec: dict,
             sections: list[str] = ()) -> tuple[str, str]:
    """Reset, then base + hidden tests + `kept`, and the runner with its `spec` in a fresh
    directory; return (base sha, that directory)."""
    twice(sandbox, sandbox.reset, "the sandbox could not be reset to base from the state the agent left")
    before = {p: _read_text(sandbox, p) for p in sections}
    eval_dir = f"/tmp/harnessrl-eval-{uuid.uuid4().hex}"  # fresh and unguessable
    spec = {**spec, "out": f"{eval_dir}/progress.jsonl"}
    spec["private"] = [eval_dir, f"{eval_dir}.json"]
    bundle = {"test.patch": task.test_patch, "agent.patch": kept, **_RUNNER_FILES, "spec.json": json.dumps(spec)}
    sandbox.write_file(f"{eval_dir}.json", json.dumps(bundle).encode(), mode=0o600)  # /tmp exists: one call
    done = sandbox.exec(["python3", "-I", "-c", _PREPARE, eval_dir, task.base_commit],
                        timeout=config.command_timeout_s, workdir=sandbox.workdir)
    if done.timed_out:
        raise infra(f"preparing the hidden tests timed out after {config.command_timeout_s:g}s")
    if done.exit_code == 4:
        raise agent(f"the agent's diff does not apply to a clean base: {done.output.strip()[-400:]}")
    if done.exit_code != 0:
        raise infra(f"restoring test files and applying the hidden tests failed (exit {done.exit_code}): "
                     f"{done.output.strip()[-500:]}")
    changed = [p for p in sections if pytest_section(p, before[p]) != pytest_section(p, _read_text(sandbox, p))]
    if changed:
        raise tampered([evidence("test_config", "changes the pytest configuration", p) for p in changed])
    return done.output.strip().splitlines()[-1], eval_dir


def _run_tests(sandbox: Sandbox, config: RewardConfig, python: str, eval_dir: str, marker: str):
    """Run the hidden tests; return (verdict or None, the run, its output without the verdict)."""
    run = sandbox.exec([python, "-I", "--check-hash-based-pycs", "always", f"{eval_dir}/runner.py",
                        f"{eval_dir}/spec.json"], timeout=config.test_timeout_s, workdir=sandbox.workdir)
    pattern = re.compile(re.escape(marker) + r"-begin (.*?) " + re.escape(marker) + "-end", re.S)
    blocks = pattern.findall(run.output)
    shown = pattern.sub("[grader verdict]", run.output)
    if len(blocks) > 1:
        raise tampered([evidence("channel", f"{len(blocks)} verdicts in one test run: something besides the grader wrote one")])
    verdict = None
    if blocks:
        try:
            verdict = ast.literal_eval(blocks[0])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise tampered([evidence("channel", "the grader's verdict was garbled")]) from None
        if not isinstance(verdict, dict) or not isinstance(verdict.get("records"), list):
            raise tampered([evidence("channel", "the grader's verdict was garbled")])
    return verdict, run, shown


def _last_started(sandbox: Sandbox, eval_dir: str) -> str:
    """The test a timed-out run was in, from the runner's progress file (best effort)."""
    try:
        text = sandbox.read_file(f"{eval_dir}/progress.jsonl").decode("utf-8", "replace")
    except SandboxDied:
        raise
    except (OSError, SandboxError):
        return ""
    started = [line for line in text.splitlines() if line.startswith('{"start": ')]
    try:
        return str(json.loads(started[-1])["start"]) if started else ""
    except (ValueError, KeyError):
        return ""


def _no_report(sandbox: Sandbox, task: Task, config: RewardConfig, python: str, spec: dict, run) -> None:
    """Whose failure is a run without a complete report? Re-run on the pristine base to see."""
    what = (f"the hidden test run left no complete report (exit {run.exit_code}): "
            f"{run.output.strip()[-300:]}")
    if not config.check_cause:
        raise agent(what)
    _, eval_dir = _prepare(sandbox, task, config, "", spec)
    verdict, base_run, _ = _run_tests(sandbox, config, python, eval_dir, spec["marker"])
    if verdict is not None and verdict.get("done") is not None:
        raise agent(what + " -- on the pristine base the same run completes, so the agent's code ended it")
    raise infra(what + f" -- the pristine base gives none either (exit {base_run.exit_code}"
                 f"{', timed out' if base_run.timed_out else ''}): {base_run.output.strip()[-300:]}")


def _read_text(sandbox: Sandbox, path: str) -> str:
    try:
        return sandbox.read_file(path).decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError):
        return ""
