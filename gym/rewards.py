"""Hidden-test rewards: score an episode's sandbox after the harness has ended, in a clean room.

Contract: reward 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes when the hidden tests
run on *base + the agent's diff + the hidden test patch*, with the runner, its configuration
and its plugins coming from the grader. In order:
1. the agent's change is read as one diff against base (every file, untracked and ignored
   ones included; `sandbox.diff()`), and sorted by `reward_diff.triage`: test infrastructure
   is reverted, build artefacts dropped, runner shadows / site hooks / code reaching into the
   test framework make the episode `tampered` (reward 0.0, status ok, no test run);
2. `sandbox.reset()` kills every process the agent started and puts the tree, /tmp, home
   (and, on docker, /dev/shm, /dev/mqueue) back to base: nothing the agent left outside the
   diff takes part;
3. in a fresh, unguessable directory, the hidden test patch is applied (it must apply on the
   pristine base, else infra), then the kept part of the agent's diff (if that fails, the
   agent's 0), and `grade_runner.py` runs the tests under `python3 -I`, recording outcomes
   per node id and checking the framework's integrity (a violation: tampered, 0); its verdict
   comes back on the run's own output between per-run markers, never from a file.
A failure is classified by cause. The sandbox dying, a hidden patch that does not apply on a
clean base, a test command the grader cannot own, an error of the grader itself: `reward=None`,
status "infra_error" (masked, reason recorded). The agent's code hanging the tests (timeout),
killing the runner or leaving no report (decided by re-running the hidden tests on the
pristine base: if that run completes, the failure was the agent's), an unreadable or
unresettable tree: reward 0.0, status ok, reason recorded. `score` never raises.

A Harbor task (`task.harbor`) is graded by its own tests/test.sh instead, in the same clean
room (gym.harbor.verify).

The hidden tests reach the sandbox only here, as files written with `write_file` after the
reset (no agent process is alive to see them); node ids travel in a file too.
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from harnessrl.gym.failures import describe
from harnessrl.gym.grading import evidence
from harnessrl.gym.reward_diff import SECTIONED_CONFIG_NAMES, is_test_path, pytest_section, split_patch, triage
from harnessrl.gym.tasks import Task
from harnessrl.sandboxes.base import Sandbox, SandboxDied, SandboxError

__all__ = ["RewardConfig", "RewardResult", "TestOutcome", "score", "patch_files", "is_test_path",
           "nodeid_key", "parse_junit", "runner_command"]

TestStatus = Literal["passed", "failed", "error", "skipped", "missing"]
_WORST_FIRST = ("error", "failed", "skipped", "missing", "passed")
#: The in-sandbox runner (gym/grading/runner): supervisor.py is the entry, the rest its siblings.
_RUNNER_FILES = {("runner.py" if f.name == "supervisor.py" else f.name): f.read_text()
                 for f in sorted((Path(__file__).parent / "grading" / "runner").glob("*.py"))}

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


class RewardConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """How hidden tests are run after an episode."""

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

    def worst_case_s(self) -> float:
        """About the longest scoring may take: two hidden-test runs (the agent's, and the
        pristine base's when the first left no report) and the bookkeeping commands around
        them. A backstop timeout around an episode (the scheduler's `episode_timeout_s`) must
        leave this much after the harness's wall time, or an agent whose code hangs the hidden
        tests would be masked by the backstop instead of scored 0 by the grader."""
        return 2 * self.test_timeout_s + 6 * self.command_timeout_s


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
    """1.0 all listed tests pass, 0.0 otherwise, None on infra_error."""
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


# --- scoring -------------------------------------------------------------------------------

class _Verdict(Exception):
    """Internal: end scoring with this reward (None: infra_error) and reason."""

    def __init__(self, reward: float | None, reason: str, cause: str = "", tampered: bool = False,
                 evidence: list[dict[str, str]] | None = None):
        super().__init__(reason)
        self.reward, self.reason, self.cause, self.tampered = reward, reason, cause, tampered
        self.evidence = evidence or []


def _infra(reason: str) -> _Verdict:
    return _Verdict(None, reason, "infra")


def _agent(reason: str) -> _Verdict:
    return _Verdict(0.0, reason, "agent")


def tampered(found: list[dict[str, str]]) -> _Verdict:
    """The verdict for tampering shown by `found` (evidence dicts, `gym.grading.evidence`)."""
    reasons = [f"{e['where']}: {e['what']}" if e.get("where") else e["what"] for e in found]
    return _Verdict(0.0, "tampered: " + "; ".join(reasons)[:1500], "agent", tampered=True, evidence=found)


def _answers(sandbox: Sandbox) -> bool:
    """The sandbox still runs commands (so a failed step was the state the agent left)."""
    try:
        return sandbox.alive() and sandbox.exec("true", timeout=30).exit_code == 0
    except SandboxError:
        return False


def score(sandbox: Sandbox, task: Task, config: RewardConfig | None = None) -> RewardResult:
    """Score the agent's work in `sandbox` against the task's hidden tests; never raises.
    The sandbox is reset on the way (it ends at base + kept diff + hidden tests)."""
    config = config or RewardConfig()
    started = time.monotonic()
    out = RewardResult(instance_id=task.instance_id, reward=None, status="infra_error")
    try:
        _score(sandbox, task, config, out)
    except _Verdict as v:
        out.reward, out.reason, out.cause, out.tampered = v.reward, v.reason, v.cause, v.tampered
        out.evidence = v.evidence
    except SandboxError as e:  # SandboxDied included: the container is gone, not the agent's fault
        out.reward, out.reason, out.cause = None, describe(e), "infra"
    except Exception as e:  # a grader bug must mask the episode, never stall the caller
        out.reward, out.reason, out.cause = None, f"grader error: {describe(e)}", "infra"
    out.status = "infra_error" if out.reward is None else "ok"
    out.duration_s = time.monotonic() - started
    return out


def _score(sandbox: Sandbox, task: Task, config: RewardConfig, out: RewardResult) -> None:
    if task.harbor is not None:  # a Harbor task: its tests/test.sh grades (gym.harbor.verify)
        from harnessrl.gym.harbor.verify import score_harbor
        return score_harbor(sandbox, task, config, out)
    nodes = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    if not task.FAIL_TO_PASS:
        raise _infra(f"task {task.instance_id} lists no FAIL_TO_PASS tests; it cannot be scored")
    try:
        python, args, env = runner_command(task.test_command)
    except ValueError as e:
        raise _infra(str(e)) from None
    if not sandbox.alive():
        raise _infra("sandbox is not alive")
    quick = config.command_timeout_s
    # 1. The agent's work, read before anything changes it.
    head = sandbox.exec("git -c core.fsmonitor=false rev-parse -q --verify HEAD", timeout=quick,
                        workdir=sandbox.workdir)
    diff = _twice(sandbox, sandbox.diff, "the agent's changes could not be read")
    # The record is plain text; what is applied keeps any non-UTF-8 bytes (surrogate escapes).
    out.agent_diff = diff.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    try:
        changes = split_patch(diff)
    except ValueError as e:
        raise _agent(f"the agent's diff is unreadable: {e}") from None
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
        raise _agent(f"hidden test run timed out after {config.test_timeout_s:g}s"
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


def _twice(sandbox: Sandbox, step, what: str):
    """Run a sandbox step; retry once (a transient channel failure passes the second time).
    Failing twice while the sandbox still runs commands is the state the agent left: its 0."""
    for attempt in (1, 2):
        try:
            return step()
        except SandboxDied:
            raise
        except SandboxError as e:
            if attempt == 2:
                if _answers(sandbox):
                    raise _agent(f"{what}: {describe(e)}") from None
                raise


def _prepare(sandbox: Sandbox, task: Task, config: RewardConfig, kept: str, spec: dict,
             sections: list[str] = ()) -> tuple[str, str]:
    """Reset, then base + hidden tests + `kept`, and the runner with its `spec` in a fresh
    directory; return (base sha, that directory)."""
    _twice(sandbox, sandbox.reset, "the sandbox could not be reset to base from the state the agent left")
    before = {p: _read_text(sandbox, p) for p in sections}
    eval_dir = f"/tmp/harnessrl-eval-{uuid.uuid4().hex}"  # fresh and unguessable
    spec = {**spec, "out": f"{eval_dir}/progress.jsonl"}
    spec["private"] = [eval_dir, f"{eval_dir}.json"]
    bundle = {"test.patch": task.test_patch, "agent.patch": kept, **_RUNNER_FILES, "spec.json": json.dumps(spec)}
    sandbox.write_file(f"{eval_dir}.json", json.dumps(bundle).encode(), mode=0o600)  # /tmp exists: one call
    done = sandbox.exec(["python3", "-I", "-c", _PREPARE, eval_dir, task.base_commit],
                        timeout=config.command_timeout_s, workdir=sandbox.workdir)
    if done.timed_out:
        raise _infra(f"preparing the hidden tests timed out after {config.command_timeout_s:g}s")
    if done.exit_code == 4:
        raise _agent(f"the agent's diff does not apply to a clean base: {done.output.strip()[-400:]}")
    if done.exit_code != 0:
        raise _infra(f"restoring test files and applying the hidden tests failed (exit {done.exit_code}): "
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
        raise _agent(what)
    _, eval_dir = _prepare(sandbox, task, config, "", spec)
    verdict, base_run, _ = _run_tests(sandbox, config, python, eval_dir, spec["marker"])
    if verdict is not None and verdict.get("done") is not None:
        raise _agent(what + " -- on the pristine base the same run completes, so the agent's code ended it")
    raise _infra(what + f" -- the pristine base gives none either (exit {base_run.exit_code}"
                 f"{', timed out' if base_run.timed_out else ''}): {base_run.output.strip()[-300:]}")


def _read_text(sandbox: Sandbox, path: str) -> str:
    try:
        return sandbox.read_file(path).decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError):
        return ""
