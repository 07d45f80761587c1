"""Hidden-test rewards: score an episode's sandbox after the harness has ended.

Contract: reward 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes once (a) every
test file the agent could have tampered with is restored to the base commit and (b) the
hidden `test_patch` is applied; 0.0 otherwise. An infrastructure failure (the sandbox
died, set-up failed, the test run itself timed out, no JUnit report came back) gives
`reward=None` with status "infra_error", never 0, so a broken machine is never taught to
the policy as a bad answer.

The hidden tests reach the sandbox only here, as a file written with `write_file` and then
`git apply`-ed; node ids travel in a file too, so no patch or id list is ever on a command
line. Results come from pytest's JUnit XML, matched to node ids the way pytest names them.
"""
from __future__ import annotations

import re
import shlex
import time
import uuid
import xml.etree.ElementTree as ET
from typing import Literal

from pydantic import BaseModel, Field

from harnessrl.gym.tasks import Task
from harnessrl.sandboxes.base import Sandbox, SandboxError

TestStatus = Literal["passed", "failed", "error", "skipped", "missing"]
_WORST_FIRST = ("error", "failed", "skipped", "missing", "passed")

# Runs inside the sandbox. `prepare`: put the listed files back to base (deleting ones that
# did not exist there), then `git apply` the hidden tests; `run`: exec the test command with
# the node ids appended. One exec each, since every exec is a round trip to the sandbox.
_EVAL_SCRIPT = r'''
import os, shutil, subprocess, sys
mode, base, listing = sys.argv[1], sys.argv[2], sys.argv[3]
paths = [p for p in open(listing, encoding="utf-8").read().split("\n") if p]
if mode == "prepare":
    for p in paths:
        known = subprocess.run(["git", "cat-file", "-e", f"{base}:{p}"], capture_output=True).returncode == 0
        if known:
            subprocess.run(["git", "checkout", base, "--", p], check=True)
        elif os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.remove(p)
    patch = sys.argv[4]
    if os.path.getsize(patch):
        done = subprocess.run(["git", "apply", "--whitespace=nowarn", patch], capture_output=True, text=True)
        if done.returncode:
            sys.exit("hidden test patch did not apply: " + done.stderr.strip()[-400:])
    sys.exit(0)
junit, cmd = sys.argv[4], sys.argv[5:]
if os.path.exists(junit):
    os.remove(junit)
os.execvp(cmd[0], cmd + ["--junitxml=" + junit] + paths)
'''


class RewardConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """How hidden tests are run after an episode."""

    test_timeout_s: float = 600.0
    """Wall-clock limit of the hidden test run; exceeding it is an infra_error."""
    command_timeout_s: float = 60.0
    """Limit for each bookkeeping command (git rev-parse, restore, git apply)."""
    output_tail_chars: int = 4000
    """How much of the test run's output is kept in the result."""


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
    tests: list[TestOutcome] = Field(default_factory=list)
    agent_diff: str = ""
    """The agent's changes against base, taken before anything was restored."""
    restored_files: list[str] = Field(default_factory=list)
    """Test files put back to base (or removed) before the hidden tests ran."""
    head_moved: bool = False
    """The agent committed or checked out something; scoring used the working tree anyway."""
    test_output: str = ""
    duration_s: float = 0.0


# --- helpers shared with the suite builder ---------------------------------------------

def patch_files(patch: str) -> list[str]:
    """Paths a git diff touches (both sides of renames), in order of appearance."""
    seen: dict[str, None] = {}
    for a, b in re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.M):
        seen.setdefault(a, None)
        seen.setdefault(b, None)
    return list(seen)


def is_test_path(path: str) -> bool:
    """Files that decide how tests run or what they assert: agents may not change them."""
    parts = path.split("/")
    name = parts[-1]
    return (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py") \
        or name in ("conftest.py", "pytest.ini", "tox.ini") \
        or any(p in ("tests", "test", "testing") for p in parts[:-1])


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


# --- scoring -------------------------------------------------------------------------------

class _Infra(Exception):
    """Internal: abort scoring with an infra_error reason."""


def _run(sandbox: Sandbox, command: str, timeout: float, what: str):
    result = sandbox.exec(command, timeout=timeout, workdir=sandbox.workdir)
    if result.timed_out:
        raise _Infra(f"{what} timed out after {timeout:g}s")
    if result.exit_code != 0:
        raise _Infra(f"{what} failed (exit {result.exit_code}): {result.output.strip()[-500:]}")
    return result


def score(sandbox: Sandbox, task: Task, config: RewardConfig | None = None) -> RewardResult:
    """Score the sandbox's current working tree against the task's hidden tests."""
    config = config or RewardConfig()
    started = time.monotonic()
    out = RewardResult(instance_id=task.instance_id, reward=None, status="infra_error")
    try:
        _score(sandbox, task, config, out)
    except _Infra as e:
        out.reward, out.status, out.reason = None, "infra_error", str(e)
    except SandboxError as e:  # SandboxDied included: the container is gone, not the agent's fault
        out.reward, out.status, out.reason = None, "infra_error", f"{type(e).__name__}: {e}"
    out.duration_s = time.monotonic() - started
    return out


def _score(sandbox: Sandbox, task: Task, config: RewardConfig, out: RewardResult) -> None:
    ids = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    if not task.FAIL_TO_PASS:
        raise _Infra(f"task {task.instance_id} lists no FAIL_TO_PASS tests; it cannot be scored")
    if not sandbox.alive():
        raise _Infra("sandbox is not alive")
    out.agent_diff = sandbox.diff()
    quick = config.command_timeout_s
    # A fresh, unguessable directory: nothing the agent planted can pose as our report.
    eval_dir = f"/tmp/harnessrl-eval-{uuid.uuid4().hex}"
    refs = _run(sandbox, "git rev-parse --verify --quiet " + shlex.quote(task.base_commit + "^{commit}")
                + f" && git rev-parse HEAD && mkdir -p {eval_dir}", quick,
                f"resolving base commit {task.base_commit} and HEAD").output.split()
    base, head = refs[-2], refs[-1]
    out.head_moved = head != base

    touched = patch_files(out.agent_diff)
    protected = dict.fromkeys([*patch_files(task.test_patch), *task.test_files(),
                               *(p for p in touched if is_test_path(p))])
    out.restored_files = [p for p in protected if p in touched]
    sandbox.write_file(f"{eval_dir}/eval.py", _EVAL_SCRIPT.encode())
    sandbox.write_file(f"{eval_dir}/restore.txt", "\n".join(protected).encode())
    sandbox.write_file(f"{eval_dir}/test.patch", task.test_patch.encode())
    sandbox.write_file(f"{eval_dir}/ids.txt", "\n".join(ids).encode())
    _run(sandbox, f"python3 {eval_dir}/eval.py prepare {base} {eval_dir}/restore.txt {eval_dir}/test.patch",
         quick, "restoring test files and applying the hidden tests")

    junit = f"{eval_dir}/junit.xml"
    run = sandbox.exec(f"python3 {eval_dir}/eval.py run {base} {eval_dir}/ids.txt {junit} {task.test_command}",
                       timeout=config.test_timeout_s, workdir=sandbox.workdir)
    out.test_output = run.output[-config.output_tail_chars:]
    if run.timed_out:
        raise _Infra(f"hidden test run timed out after {config.test_timeout_s:g}s")
    try:
        report = sandbox.read_file(junit)
    except FileNotFoundError:
        raise _Infra(f"test run produced no JUnit report (exit {run.exit_code}): {run.output.strip()[-300:]}") from None
    try:
        results = parse_junit(report)
    except ET.ParseError as e:
        raise _Infra(f"unreadable JUnit report: {e}") from None
    for kind, nodes in (("FAIL_TO_PASS", task.FAIL_TO_PASS), ("PASS_TO_PASS", task.PASS_TO_PASS)):
        for node in nodes:
            status, message = results.get(nodeid_key(node), ("missing", "not in the JUnit report"))
            out.tests.append(TestOutcome(node_id=node, kind=kind, status=status, message=message))
    failed = [t.node_id for t in out.tests if t.status != "passed"]
    out.status = "ok"
    out.reward = 0.0 if failed else 1.0
    out.reason = f"{len(failed)} of {len(out.tests)} tests not passing: {failed[:5]}" if failed \
        else f"all {len(out.tests)} tests pass"
