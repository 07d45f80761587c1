"""Grade a Harbor task: its tests/test.sh, run in a clean room after the agent is gone.

Contract (reached through `gym.grading.score`, whose verdict helpers it shares; never raises
past it). In order:
1. the agent's change is read as one diff of the workdir against base and triaged as for
   every task (`gym.grading.diff.triage`): shadows of a test runner, site hooks, code reaching into
   pytest make the episode `tampered` (0.0); build artefacts are dropped; pytest's config
   files (conftest.py, pytest.ini, tox.ini) are left at base; other files, test-named ones
   included (a Harbor task's tests live in /tests, not in the workdir), are kept;
2. `sandbox.reset()` kills every process the agent started and empties /tmp, home and the
   workdir back to base, so nothing the agent wrote to /logs (a link into /tmp) survives;
3. `/logs/verifier` and `/tests` are created fresh, tests/ is unpacked into /tests (the
   first time it is in the sandbox), the kept diff is applied (it failing is the agent's 0);
4. one exec runs `bash /tests/test.sh` in the workdir with [verifier] env, in its own
   process group, under min([verifier] timeout_sec, RewardConfig.test_timeout_s); when it
   ends, any process still alive outside that exec (one that escaped the group and could
   write the reward after test.sh did) is killed and noted, and only then are
   `/logs/verifier/reward.txt` (one number, read first) and `reward.json` (named numbers)
   read; the verdict comes back between markers only the grader knows.
The reward is reward.txt's number, else reward.json's `reward` key, else its only key (the
`metrics` of the result hold every key). A timeout is the agent's 0. No usable reward (no
file, not a number, several keys and no `reward`; or a run that cannot be trusted: test.sh
killed by a signal, a process that escaped its group) is decided by running the verifier
again on the pristine base: if test.sh runs to its own end there, the verifier works and the
agent's state caused it (0.0, reason recorded: also what a test.sh that never writes a
reward gets, and `tasks check` flags its gold); if not, the verifier or the machine is
broken (infra_error, masked). The sandbox dying or the runner giving no verdict is infra.

What is protected and what is not. Protected: nothing the agent left running or wrote under
/logs, /tmp or home survives into grading (step 2); the reward is read only after test.sh and
every process of its group are gone, and a process that escaped the group makes the run
untrusted (step 4). Not protected: test.sh runs as the sandbox's only user (uid 1000, as the
agent did; `[verifier] user` is not honoured: there is no root, no capability and no user
namespace in a sandbox, so no second user can own the reward file), and so does the agent's
code that the tests execute, as in Harbor itself. That code can write the reward file (which a
test.sh that writes a reward only on success does not overwrite), rewrite /tests while test.sh
reads it, or make the test runner exit 0. So every Harbor verdict carries `protected=False` and
an `unprotected_reason` (gym.tasks.harbor.reward_watch.UNPROTECTED, plus whether a writer was
checked). Caught, where test.sh writes its reward only with echo/printf: a change to the reward
file while a program test.sh started (not a shell, gone by test.sh's end) was running, scored
`tampered` with `reward_file` evidence; reward_watch's docstring lists what slips past.
"""
from __future__ import annotations

import ast
import base64
import io
import json
import math
import re
import tarfile
import uuid
from pathlib import Path
from typing import Any

from harnessrl.gym.grading.diff import TEST_CONFIG_NAMES, triage
from harnessrl.gym.grading.verdict import RewardConfig, RewardResult, agent, infra, read_changes, tampered, twice
from harnessrl.gym.grading import evidence
from harnessrl.gym.tasks.harbor.reward_watch import UNPROTECTED, WATCH, reward_evidence
from harnessrl.gym.tasks import Task
from harnessrl.sandboxes.base import Sandbox
from harnessrl.sandboxes.context_image import SCRATCH_LINKS

LOGS, TESTS = SCRATCH_LINKS["/logs"], SCRATCH_LINKS["/tests"]

# python3 -I -c _PREPARE <bundle> <workdir>: fresh /logs and /tests, tests unpacked, the kept
# diff applied (exit 4: it does not apply, the agent's).
_PREPARE = r'''
import base64, io, json, os, shutil, subprocess, sys, tarfile
path, workdir = sys.argv[1], sys.argv[2]
with open(path, encoding="utf-8") as f:
    bundle = json.load(f)
os.remove(path)
for d in (LOGS, TESTS):
    shutil.rmtree(d, ignore_errors=True)
for d in ("verifier", "agent"):
    os.makedirs(os.path.join(LOGS, d))
os.makedirs(TESTS)
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(fileobj=io.BytesIO(base64.b64decode(bundle["tests"]))).extractall(TESTS, **kw)
if bundle["patch"]:
    patch = path + ".patch"
    with open(patch, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(bundle["patch"])
    done = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "apply",
                           "--whitespace=nowarn", patch], cwd=workdir, capture_output=True, text=True)
    os.remove(patch)
    if done.returncode:
        print("the agent's diff did not apply: " + done.stderr.strip()[-400:])
        sys.exit(4)
print("ready")
'''.replace("LOGS", repr(LOGS)).replace("TESTS", repr(TESTS))

# python3 -I -c _RUN <spec>: test.sh in its own process group; then strays killed, reward read.
_RUN = r'''
import json, os, signal, subprocess, sys, time
with open(sys.argv[1], encoding="utf-8") as f:
    spec = json.load(f)
os.remove(sys.argv[1])
mine = set()
pid = os.getpid()
while pid > 1:  # this process and its ancestors (the exec wrapper) are not strays
    mine.add(pid)
    with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
t0 = time.monotonic()
watch = _Watch(spec["logs"])
proc = subprocess.Popen(["bash", spec["script"]], cwd=spec["workdir"], env=spec["env"], start_new_session=True,
                        stdin=subprocess.DEVNULL)
watch.start(proc.pid)
timed_out = False
try:
    code = proc.wait(timeout=spec["timeout"])
except subprocess.TimeoutExpired:
    timed_out, code = True, None
watched = watch.finish()
for _ in range(2):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
proc.wait()
strays = []
for _ in range(50):
    alive = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != 1 and int(p) not in mine]
    if not alive:
        break
    for p in alive:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                strays.append(f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120])
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.05)
out = {"exit": code, "timed_out": timed_out, "strays": sorted(set(strays))[:5], "seconds": time.monotonic() - t0,
       "watch": watched}
for name in ("reward.txt", "reward.json"):
    try:
        with open(os.path.join(spec["logs"], "verifier", name), encoding="utf-8", errors="replace") as f:
            out[name] = f.read(65536)
    except OSError:
        out[name] = None
sys.stdout.flush()
print(spec["marker"] + "-begin " + repr(out) + " " + spec["marker"] + "-end", flush=True)
'''
_RUN = WATCH + _RUN


def read_reward(txt: str | None, js: str | None) -> tuple[float, dict[str, float], str]:
    """(reward, metrics, which file and key) from the two files' texts; ValueError says why not."""
    if txt is not None:
        try:
            value = float(txt.strip())
        except ValueError:
            raise ValueError(f"reward.txt is not one number: {txt.strip()[:80]!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"reward.txt is not a finite number: {txt.strip()[:80]!r}")
        return value, {"reward": value}, "reward.txt"
    if js is None:
        raise ValueError("test.sh wrote neither /logs/verifier/reward.txt nor reward.json")
    try:
        data = json.loads(js)
    except json.JSONDecodeError as e:
        raise ValueError(f"reward.json is not JSON: {e.msg}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError("reward.json must be an object of named numbers")
    metrics: dict[str, float] = {}
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"reward.json: {k!r} is not a number ({v!r})")
        metrics[str(k)] = float(v)
    key = "reward" if "reward" in metrics else next(iter(metrics)) if len(metrics) == 1 else None
    if key is None:
        raise ValueError(f"reward.json has metrics {sorted(metrics)} and no 'reward' key: which is the reward?")
    return metrics[key], metrics, f"reward.json[{key!r}]"


def _pack_tests(folder: Path) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for p in sorted(folder.rglob("*")):
            info = tf.gettarinfo(p, arcname=p.relative_to(folder).as_posix())
            info.uid, info.gid, info.uname, info.gname = 1000, 1000, "", ""
            tf.addfile(info, io.BytesIO(p.read_bytes()) if p.is_file() else None)
    return base64.b64encode(buf.getvalue()).decode()


def _run_verifier(sandbox: Sandbox, task: Task, config: RewardConfig, patch: str) -> tuple[dict, str]:
    """Reset, prepare (fresh /logs and /tests, `patch` applied), run test.sh; (verdict, output)."""
    h = task.harbor
    twice(sandbox, sandbox.reset, "the sandbox could not be reset to base from the state the agent left")
    token = uuid.uuid4().hex
    bundle = f"/tmp/harnessrl-harbor-{token}.json"
    sandbox.write_file(bundle, json.dumps({"tests": _pack_tests(Path(h.tests_dir)), "patch": patch}).encode(),
                       mode=0o600)
    done = sandbox.exec(["python3", "-I", "-c", _PREPARE, bundle, task.workdir], timeout=config.command_timeout_s,
                        workdir=task.workdir)
    if done.exit_code == 4:
        raise agent(done.output.strip()[-500:])
    if done.exit_code != 0 or done.timed_out:
        raise infra(f"preparing /logs and /tests failed (exit {done.exit_code}): {done.output.strip()[-500:]}")
    timeout = min(h.verifier_timeout_s, config.test_timeout_s)
    marker = f"harnessrl-harbor-{uuid.uuid4().hex}"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/agent",
           "LANG": "C.UTF-8", **h.verifier_env}
    spec = {"script": "/tests/test.sh", "workdir": task.workdir, "env": env, "timeout": timeout,
            "logs": LOGS, "marker": marker}
    spec_path = f"/tmp/harnessrl-harbor-{token}.spec.json"
    sandbox.write_file(spec_path, json.dumps(spec).encode(), mode=0o600)
    run = sandbox.exec(["python3", "-I", "-c", _RUN, spec_path], timeout=timeout + config.command_timeout_s,
                       workdir=task.workdir)
    pattern = re.compile(re.escape(marker) + r"-begin (.*?) " + re.escape(marker) + "-end", re.S)
    blocks = pattern.findall(run.output)
    shown = pattern.sub("[grader verdict]", run.output)
    if len(blocks) > 1:
        raise tampered([evidence("channel", f"{len(blocks)} verdicts in one verifier run: something besides the grader wrote one")])
    if not blocks:
        if run.timed_out:
            raise agent(f"the verifier run was killed after {timeout:g}s")
        raise infra(f"the verifier runner gave no verdict (exit {run.exit_code}): {run.output.strip()[-300:]}")
    try:
        verdict = ast.literal_eval(blocks[0])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise tampered([evidence("channel", "the grader's verdict was garbled")]) from None
    if not isinstance(verdict, dict):
        raise tampered([evidence("channel", "the grader's verdict was garbled")])
    return verdict, shown


def _broken(verdict: dict) -> str:
    """Why this verifier run did not complete on its own ("" when it did): a timeout, test.sh
    killed by a signal, or processes that escaped its group (any of them could have written
    the reward file in place of test.sh)."""
    if verdict.get("timed_out"):
        return "test.sh timed out"
    code = verdict.get("exit")
    if code is None or code < 0:
        return f"test.sh was killed by signal {-code if code else '?'} before it ended"
    if verdict.get("strays"):
        return (f"processes escaped test.sh's process group and outlived it (they could write the reward "
                f"after it did): {verdict['strays']}")
    return ""


def _usable(verdict: dict) -> tuple[float, dict[str, float], str]:
    """The verdict's reward, or ValueError saying why it cannot be trusted or read."""
    why = _broken(verdict)
    if why:
        raise ValueError(why)
    return read_reward(verdict.get("reward.txt"), verdict.get("reward.json"))


def score_harbor(sandbox: Sandbox, task: Task, config: RewardConfig, out: RewardResult) -> None:
    """Fill `out` for a Harbor task (see the module docstring); raises a Verdict (gym.grading.verdict)."""
    out.protected, out.unprotected_reason = False, UNPROTECTED  # whatever the verdict (reward_watch)
    if not sandbox.alive():
        raise infra("sandbox is not alive")
    changes = read_changes(sandbox, out)
    sorted_ = triage(changes)
    if sorted_.tampered:
        raise tampered(sorted_.tampered)
    reverted = [c for c in changes if c.path in sorted_.reverted]
    out.restored_files = [c.path for c in reverted if c.path.rsplit("/", 1)[-1] in TEST_CONFIG_NAMES]
    out.dropped_files = sorted_.dropped
    kept = {c.path for c in sorted_.kept} | {c.path for c in reverted if c.path not in out.restored_files}
    patch = "".join(c.text for c in changes if c.path in kept)
    verdict, shown = _run_verifier(sandbox, task, config, patch)
    out.test_output = shown[-config.output_tail_chars:]
    found, unchecked = reward_evidence(verdict, Path(task.harbor.tests_dir))
    out.unprotected_reason = UNPROTECTED + (f"; no writer was checked: {unchecked}" if unchecked else
                                            "; a writer seen running while it changed is caught")
    if found:
        raise tampered(found)
    if verdict.get("timed_out"):
        raise agent(f"test.sh timed out after {min(task.harbor.verifier_timeout_s, config.test_timeout_s):g}s")
    try:
        reward, metrics, source = _usable(verdict)
    except ValueError as e:
        _no_reward(sandbox, task, config, f"no usable reward: {e} (test.sh exit {verdict.get('exit')})")
    out.metrics = metrics
    out.reward = reward
    out.reason = f"{source} = {reward:g}" + (f"; metrics {metrics}" if len(metrics) > 1 else "") \
        + f" (test.sh exit {verdict.get('exit')}, {verdict.get('seconds', 0.0):.1f}s)"


def _no_reward(sandbox: Sandbox, task: Task, config: RewardConfig, what: str) -> Any:
    """No usable reward: the agent's doing (0.0) when test.sh runs to its own end on the
    pristine base (the verifier works; a test.sh that writes no reward on failure is common),
    else the verifier's or the machine's (infra_error, masked)."""
    if not config.check_cause:
        raise agent(what)
    verdict, _ = _run_verifier(sandbox, task, config, "")
    why = _broken(verdict)
    if why:
        raise infra(f"{what} -- on the pristine base the verifier does not complete either ({why})")
    raise agent(f"{what} -- on the pristine base test.sh runs to its end, so the agent's state caused it")
