"""One episode: task -> sandbox -> proxy session -> harness run -> reward -> closed trajectory.

Contract: `run_episode` always returns an `EpisodeResult` (whatever raises where: only
KeyboardInterrupt and SystemExit pass through) whose trajectory is closed and stored with a
reward, a status and a termination reason, one of submitted | harness_exited | call_limit |
timeout | harness_crashed | sandbox_died | engine_error | infra | stale | cancelled |
proxy_lost (the episode's proxy could not be reached: its process died) | context_exceeded (the engine refused the last prompt as longer than its context: truncated); an
unexpected exception is `infra` with the stage and the exception in `error`. The harness's exit
code, the tails of its stdout/stderr and the ending in words (`ending`) go into the record's
metadata; a harness that never started (exit 126/127, no model call) is `infra`. The record is
read from the proxy once, after the session is closed. The harness only ever gets plain data
(session URL, key, model, the problem statement, its sandbox); hidden tests are applied by `gym.grading.score` after it
has exited. An ending caused by the infrastructure (sandbox died, engine unreachable,
harness not installed, reward run failed) is `infra_error` with reward None: masked from
training, never taught as a 0. So is `stale`: the proxy aborted the session because its
data exceeded the scheduler's staleness bound (`staleness_limit` in `session_meta`); it is
not scored, and the scheduler reruns the task. A timeout or call limit is `truncated`, not `ok`.
An engine failure is `engine_error` whatever the harness made of it: a call the proxy
recorded as failed (even if the harness then exited 0), or an engine that no longer answers
/health when the harness stopped short.
A `Cancel` set by the scheduler (episode timeout) kills the harness's process tree and
closes the sandbox; the episode ends `cancelled`, masked.

Where the sandbox comes from: `make_sandbox` is either a `SandboxFactory` (a fresh sandbox per
episode, closed at its end) or a `SandboxSource` (gym.sandbox_source.PooledSandboxes: a warm
sandbox leased for the episode, reset and kept on release, discarded when cancelled).
`timings` holds `sandbox_s` (getting the sandbox, any wait included) and, from a pool,
`sandbox_reset_s` (the reset on release).

Endings travel as a small exception family (`EpisodeEnded` and its subclasses), so an
adapter or any code under it can end an episode with a reason by raising one.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from pydantic import BaseModel, Field

from harnessrl.adapters.cancel import Cancel
from harnessrl.adapters.base import SOCKET_NAME, Endpoint, HarnessAdapter, HarnessResult, Launch, Limits, Mount
from harnessrl.adapters.relay import Relay
from harnessrl.gym.canary import canary_record, withheld
from harnessrl.gym.failures import describe
from harnessrl.gym.proxy_admin import EpisodeAdmin, ProxyAdmin, ProxyHandle, ProxyUnreachable, engine_down
from harnessrl.gym.grading.score import score
from harnessrl.gym.grading.verdict import RewardConfig, RewardResult
from harnessrl.gym.sandbox_source import SandboxLease, SandboxSource
from harnessrl.gym.tasks import Task
from harnessrl.gym.trajectory import Trajectory
from harnessrl.sandboxes.base import RepoSpec, Sandbox, SandboxDied


# -- endings ------------------------------------------------------------------------------
class EpisodeEnded(Exception):
    """The episode is over; `reason` goes into the trajectory, `status` decides training."""

    reason: ClassVar[str] = "infra"
    status: ClassVar[str] = "infra_error"


class Submitted(EpisodeEnded):
    reason, status = "submitted", "ok"


class HarnessExited(EpisodeEnded):
    reason, status = "harness_exited", "ok"


class HarnessCrashed(EpisodeEnded):
    # The deployed harness falling over is part of the environment the policy acts in
    # (often provoked by the policy's own output), so it is scored, not masked.
    reason, status = "harness_crashed", "ok"


class CallLimit(EpisodeEnded):
    reason, status = "call_limit", "truncated"


class Timeout(EpisodeEnded):
    reason, status = "timeout", "truncated"


class SandboxGone(EpisodeEnded):
    reason, status = "sandbox_died", "infra_error"


class EngineFailed(EpisodeEnded):
    reason, status = "engine_error", "infra_error"


class InfraFailed(EpisodeEnded):
    reason, status = "infra", "infra_error"


class ContextExceeded(EpisodeEnded):
    # The engine refused the conversation's next prompt (longer than its context) and the
    # harness ended there: the episode was cut short, like a step limit.
    reason, status = "context_exceeded", "truncated"


class Stale(EpisodeEnded):
    reason, status = "stale", "infra_error"


class ProxyLost(EpisodeEnded):
    # The episode's proxy went away (a run's extra proxy process died, `gym.proxies`): its
    # record is gone with it, so nothing can be judged.
    reason, status = "proxy_lost", "infra_error"


class Cancelled(EpisodeEnded):
    # Abandoned by the scheduler (episode timeout, shutdown): its sandbox and harness are
    # taken away mid-run, so whatever it did is not scored.
    reason, status = "cancelled", "infra_error"


ENDINGS: dict[str, type[EpisodeEnded]] = {c.reason: c for c in (
    Submitted, HarnessExited, HarnessCrashed, CallLimit, Timeout, SandboxGone, EngineFailed, InfraFailed, Stale,
    Cancelled, ContextExceeded, ProxyLost)}


# -- plain data in and out ------------------------------------------------------------------
class EpisodeConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """Limits and bookkeeping of one episode."""

    max_calls: int = Field(30, ge=1)
    """Model calls the harness may make (passed to its own step limit where it has one)."""
    max_tokens: int | None = None
    """Completion tokens for the whole episode (sent to the proxy session), None = unbounded."""
    wall_time_s: float = Field(600.0, gt=0)
    """Wall-clock limit of the harness run (reward time not included)."""
    scratch_root: str | None = None
    """Where per-episode host dirs go; None: the system temp dir."""
    keep_scratch: bool = False
    """Keep the host scratch dir (harness logs, trajectory files) after the episode."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """How hidden tests are run."""


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    harness: HarnessResult | None
    reward: RewardResult | None
    reason: str
    status: str
    timings: dict[str, float] = field(default_factory=dict)
    error: str = ""


SandboxFactory = Callable[[RepoSpec, Sequence[Mount]], Sandbox]
"""Makes a started sandbox for a repo with extra bind mounts (e.g. DockerBackend().create)."""


# -- the loop ---------------------------------------------------------------------------------
def ending_for(result: HarnessResult, calls_made: int, max_calls: int) -> EpisodeEnded:
    """The ending of a harness run that returned: its own reason, except that a harness that
    stopped after the proxy's call budget was spent hit the call limit, whatever it says."""
    if result.reason in ("harness_exited", "harness_crashed") and calls_made >= max_calls:
        return CallLimit(f"{calls_made} calls made, limit {max_calls}")
    if result.exit_code in (126, 127) and calls_made == 0:  # its command (or node) was not found
        return InfraFailed(f"the harness did not start: {result.account()}")
    if result.exit_code == 0:
        return ENDINGS[result.reason](f"harness status {result.harness_status!r}, exit 0")
    return ENDINGS[result.reason](f"harness status {result.harness_status!r}, {result.account()}")


def refused_at_end(traj: Trajectory) -> ContextExceeded | None:
    """The ending when the engine refused the last prompt the harness sent (recorded by the
    proxy as a detached "refused" row with the engine's message and the prompt's length)."""
    last = traj.calls[-1] if traj.calls else None
    if last is None or last.flags.get("detached") != "refused":
        return None
    return ContextExceeded(f"the engine refused call {last.index}'s prompt of {last.flags.get('prompt_tokens')} "
                           f"tokens: {last.flags.get('refused')}")


def engine_failures(traj: Trajectory) -> list[int]:
    """Indices of the calls whose engine request failed, as the proxy recorded them."""
    return [c.index for c in traj.calls if c.finish_reason in ("engine_error", "error") or c.flags.get("engine_error")]


def served_by(traj: Trajectory) -> str | None:
    """The engine that served the session's last call, when several engines serve the proxy
    (`flags["engine"]`); None with one engine (the handle names it)."""
    return next((c.flags["engine"] for c in reversed(traj.calls) if c.flags.get("engine")), None)


def _fatal(e: BaseException) -> bool:
    """What no episode may swallow: the process is being stopped."""
    return isinstance(e, (KeyboardInterrupt, SystemExit))


@dataclass
class _Run:
    """What one episode accumulates while it runs (closed over by the helpers below)."""

    cancel: Cancel
    relay: Relay | None = None
    sandbox: Sandbox | None = None
    lease: SandboxLease | None = None
    """Set when the sandbox came from a pool: released (reset, kept) at the end, discarded on cancel."""
    harness: HarnessResult | None = None
    timings: dict[str, float] = field(default_factory=dict)
    stage: str = "start"
    """The stage running now; an unexpected exception is reported with it."""
    _sandbox_lock: threading.Lock = field(default_factory=threading.Lock)
    _sandbox_closed: bool = False

    def adopt(self, sandbox: Sandbox, lease: SandboxLease | None = None) -> None:
        """The episode's sandbox: closed when the episode is cancelled, and at its end."""
        self.sandbox, self.lease = sandbox, lease
        self.cancel.on_set(self.close_sandbox)

    def close_sandbox(self, keep: bool = False) -> None:
        """Once, from whichever thread comes first; a second caller waits until it is closed.
        keep (the episode's own end): a leased sandbox goes back to its pool, reset; else closed."""
        with self._sandbox_lock:
            if self._sandbox_closed or self.sandbox is None:
                return
            self._sandbox_closed = True
            if self.lease is None:
                self.sandbox.close()
            elif keep and not self.cancel.is_set():
                reset_s = self.lease.release()
                if reset_s is not None:
                    self.timings["sandbox_reset_s"] = reset_s
            else:
                self.lease.discard()


def _endpoint(run: _Run, adapter: HarnessAdapter, proxy: ProxyHandle, sid: str, key: str, model: str,
              scratch: Path | None, socket_dir: Path | None = None) -> Endpoint:
    """The session as plain data; an inside harness also gets a private socket dir whose
    `proxy.sock` (a host relay) reaches the proxy, to be bind-mounted into its sandbox (a
    leased sandbox has its own, mounted already: `socket_dir`)."""
    if adapter.placement == "inside":
        if socket_dir is None:
            socket_dir = scratch / "sock"
            socket_dir.mkdir()
            os.chmod(socket_dir, 0o755)  # the sandbox user (uid 1000) must reach the socket
        target = f"unix:{proxy.uds_path}" if proxy.uds_path else "tcp:" + proxy.url.split("://", 1)[1].rstrip("/")
        run.relay = Relay(f"unix:{socket_dir / SOCKET_NAME}", target).start()
    return Endpoint(f"{proxy.url.rstrip('/')}/s/{sid}", key, model, str(socket_dir) if socket_dir else None)


def _play(run: _Run, task: Task, adapter: HarnessAdapter, make_sandbox: SandboxFactory | SandboxSource,
          endpoint: Endpoint | Callable[[Path | None], Endpoint], cfg: EpisodeConfig, scratch: Path,
          toolchain: Path | None) -> EpisodeEnded | None:
    """Sandbox up, harness run to its end. Returns None when the harness ran to an end of its
    own (judged once its record is read), else the ending that stopped it early. From a
    source, `endpoint` makes the endpoint (and its relay) in the leased sandbox's socket dir."""
    try:
        run.stage = "sandbox creation"
        if run.cancel.is_set():
            return Cancelled(run.cancel.reason)
        t0 = time.monotonic()
        if isinstance(make_sandbox, SandboxSource):
            lease = make_sandbox.lease(task.repo_spec(), adapter, toolchain)
            run.adopt(lease.sandbox, lease)
            run.timings["sandbox_s"] = time.monotonic() - t0
            run.stage = "relay"
            endpoint = endpoint(lease.socket_dir)
        else:
            run.adopt(make_sandbox(task.repo_spec(), adapter.mounts(endpoint, toolchain)))
            run.timings["sandbox_s"] = time.monotonic() - t0
        run.stage = "harness launch"
        t0 = time.monotonic()
        wall = task.agent_wall_time_s(cfg.wall_time_s)  # a Harbor task's own [agent] timeout_sec, capped
        run.harness = adapter.launch(Launch(endpoint, task.problem_statement, run.sandbox,
                                            Limits(cfg.max_calls, cfg.max_tokens, wall),
                                            scratch / "harness", toolchain, run.cancel))
        run.timings["harness_s"] = time.monotonic() - t0
        if run.cancel.is_set():
            return Cancelled(run.cancel.reason)
        if not run.sandbox.alive():
            return SandboxGone("the sandbox died during the harness run")
        return None
    except EpisodeEnded as end:
        return end
    except BaseException as e:
        if _fatal(e):
            raise
        if run.cancel.is_set():  # its sandbox or process was taken away on purpose
            return Cancelled(f"{run.cancel.reason} ({run.stage}: {describe(e)})")
        if isinstance(e, SandboxDied):
            return SandboxGone(str(e))
        return InfraFailed(f"{run.stage}: {describe(e)}")  # ours, not the policy's: mask it


def _judge(run: _Run, early: EpisodeEnded | None, played: Trajectory, proxy: ProxyHandle,
           cfg: EpisodeConfig) -> EpisodeEnded:
    """The ending, from the harness's account and the final record: a proxy abort or a
    failed engine call overrides what the harness says (a harness that prints the API
    error and exits 0 must not pass for a submitted answer)."""
    if run.cancel.is_set():
        return Cancelled(run.cancel.reason)
    if played.termination == "stale":  # the proxy aborted it: whatever the harness did after
        return Stale("the proxy aborted the session: its data exceeded the staleness bound")
    if early is None and run.harness is None:
        return InfraFailed("the harness never ran")
    end = early or ending_for(run.harness, len(played.calls), cfg.max_calls)
    if end.status == "infra_error":
        return end
    refused = refused_at_end(played) if end.reason not in ("timeout", "call_limit") else None
    if refused is not None:
        return ContextExceeded(f"{refused} ({end.reason}: {end})")
    failed = engine_failures(played)
    if failed:  # a timed-out call counts whatever /health said after it (`engine_healthy`): the
        # policy's reply is capped by max_new_tokens, so a call past the engine bounds is load or
        # a stopped engine, never the policy's doing
        return EngineFailed(f"engine call(s) {failed} failed ({end.reason}: {end})")
    broken = [c.index for c in played.calls if c.finish_reason == "proxy_error" or c.flags.get("proxy_error")]
    if broken:  # the proxy itself failed the harness's call: our bug, not the policy's
        return InfraFailed(f"the proxy failed call(s) {broken} ({end.reason}: {end})")
    # A harness that stopped short may have given up on an engine that died after its last
    # recorded call; one that submitted or spent its budget ended on its own (its record says
    # whether any call failed), so a slow /health must not void it.
    if end.reason in ("harness_exited", "harness_crashed", "timeout") and engine_down(served_by(played)
                                                                                  or proxy.engine_url):
        return EngineFailed(f"the engine stopped answering ({end.reason}: {end})")
    return end


#: How much of the agent's diff the record keeps (`metadata.grading.agent_diff`; `agent_diff_chars`
#: says how long it was): enough to read a fix, bounded when an agent writes a huge file.
_DIFF_KEPT_CHARS = 64_000


def run_episode(task: Task, adapter: HarnessAdapter, make_sandbox: SandboxFactory | SandboxSource, proxy: ProxyHandle,
                model: str, config: EpisodeConfig | None = None, toolchain: Path | None = None,
                session_meta: dict[str, Any] | None = None, cancel: Cancel | None = None,
                admin: EpisodeAdmin | None = None) -> EpisodeResult:
    """Run one episode to its end, whatever raises where (only KeyboardInterrupt and
    SystemExit pass through). `session_meta` is merged into the proxy session's meta (e.g.
    `staleness_limit` and `start_version` from the scheduler). `cancel`: set it to abandon the
    episode (the scheduler timed it out): the harness's process tree is killed, the sandbox
    closed, the session closed as `cancelled` (masked), and this returns soon after.
    `admin`: the proxy admin client (default: `ProxyAdmin(proxy)`). `make_sandbox`: a factory,
    or a `SandboxSource` whose warm sandbox is leased for this episode (module docstring)."""
    cfg = config or EpisodeConfig()
    run = _Run(cancel or Cancel())
    scratch: Path | None = None
    sid: str | None = None
    played: Trajectory | None = None
    reward: RewardResult | None = None
    final: float | None = None
    graded: float | None = None  # the grader's reward; `final` differs for a canary only
    status, reason, error = "infra_error", "infra", ""
    ending_text = ""  # why it ended, in words, whatever the status (`error` is for infra only)
    cleanup: list[str] = []
    try:
        try:
            run.stage = "admin client"
            admin = admin or ProxyAdmin(proxy)
            run.stage = "scratch dir"
            scratch = Path(tempfile.mkdtemp(prefix="harnessrl-ep-", dir=cfg.scratch_root))
            run.stage = "session open"
            sid, key = admin.open({**(session_meta or {}), "task_id": task.instance_id, "harness": adapter.name,
                                   "harness_version": adapter.version, "max_calls": cfg.max_calls,
                                   "max_tokens": cfg.max_tokens})
            run.stage = "relay"
            if isinstance(make_sandbox, SandboxSource):  # the relay goes in the leased sandbox's socket dir
                endpoint = lambda d: _endpoint(run, adapter, proxy, sid, key, model, None, d)  # noqa: E731
            else:
                endpoint = _endpoint(run, adapter, proxy, sid, key, model, scratch)
            early = _play(run, task, adapter, make_sandbox, endpoint, cfg, scratch, toolchain)
            run.stage = "trajectory fetch"
            admin.close_session(sid)  # nothing more is recorded: the one read below is final
            played = admin.trajectory(sid)
            ending = _judge(run, early, played, proxy, cfg)
            status, reason, ending_text = ending.status, ending.reason, str(ending)
            error = ending_text if status == "infra_error" else ""
            if status != "infra_error" and run.sandbox is not None:
                reward = _score(run, task, cfg)
                if run.cancel.is_set():
                    status, reason = "infra_error", Cancelled.reason
                    error = f"cancelled while scoring: {run.cancel.reason}"
                elif reward.status == "infra_error":  # the grader's own failure, not the agent's
                    status, reason, error = "infra_error", InfraFailed.reason, f"reward: {reward.reason}"
            final = reward.reward if (reward is not None and status != "infra_error") else None
            graded, final = final, withheld(task, final)  # a canary is never rewarded (gym.canary)
            run.stage = "finish"
            admin.set_reward(sid, final, status, reason)
        except BaseException as e:
            if _fatal(e):
                raise
            final, status = None, "infra_error"
            reason = (Cancelled.reason if run.cancel.is_set() else
                      ProxyLost.reason if isinstance(e, ProxyUnreachable) else InfraFailed.reason)
            error = ending_text = f"{run.stage}: {describe(e)}"
            if sid is not None and admin is not None:
                _record_failure(admin, sid, played is None, status, reason, cleanup)
    finally:
        _release(run, admin, scratch, cfg, cleanup)
    traj = played if played is not None else Trajectory(  # no record could be read: say so in a local one
        session_id=sid or f"unrecorded-{uuid.uuid4().hex[:12]}", segments=[], task_id=task.instance_id,
        harness=adapter.name)
    traj.reward, traj.status, traj.termination = final, status, reason
    _annotate(traj, run, task, reward, graded, error, ending_text, cleanup)
    return EpisodeResult(traj, run.harness, reward, reason, status, run.timings, error)


def _score(run: _Run, task: Task, cfg: EpisodeConfig) -> RewardResult:
    """The hidden tests, run only now that the harness is gone; their time in `reward_s`."""
    run.stage = "scoring"
    t0 = time.monotonic()
    reward = score(run.sandbox, task, cfg.reward)
    run.timings["reward_s"] = time.monotonic() - t0
    return reward


def _annotate(traj: Trajectory, run: _Run, task: Task, reward: RewardResult | None, graded: float | None,
              error: str, ending_text: str, cleanup: list[str]) -> None:
    """What the record says besides its reward and ending: the harness's own account, the
    timings, a canary's cheat signal, cleanup failures and why the grader decided as it did."""
    h = run.harness
    traj.metadata.update({"harness_status": h.harness_status if h else None,
                          "harness_exit_code": h.exit_code if h else None, "timings": run.timings, "error": error,
                          "sandbox_id": getattr(run.sandbox, "id", None),
                          # beside: "proxy-only" or "host" (adapters/netns.py); inside: the sandbox's
                          "harness_network": (h.details.get("network", "sandbox") if h else None),
                          # the harness's own account (adapters keep the last few KB of each stream)
                          "harness_stdout_tail": h.stdout_tail if h else "",
                          "harness_stderr_tail": h.stderr_tail if h else "", "ending": ending_text})
    if task.canary:  # its graded pass is the cheat signal, its reward 0.0 (gym.canary)
        traj.metadata.update(canary_record(graded if traj.reward is not None else None))
    if cleanup:
        traj.metadata["cleanup_error"] = "; ".join(cleanup)
    if reward is not None:  # why the grader decided as it did travels with the record
        traj.metadata["grading"] = {"status": reward.status, "reason": reward.reason, "tampered": reward.tampered,
                                    "evidence": reward.evidence, "tamper_kinds": sorted({e["kind"] for e in reward.evidence}),
                                    "protected": reward.protected, "unprotected_reason": reward.unprotected_reason,
                                    "cause": reward.cause, "restored_files": reward.restored_files,
                                    "dropped_files": reward.dropped_files,
                                    # what the viewer shows: the agent's patch and the hidden tests' run
                                    "agent_diff": reward.agent_diff[:_DIFF_KEPT_CHARS],
                                    "agent_diff_chars": len(reward.agent_diff), "test_output": reward.test_output,
                                    "tests": [t.model_dump() for t in reward.tests],
                                    "metrics": reward.metrics,  # a Harbor verifier's named numbers
                                    # the reward kind, a composite's parts, the judge's call (never trained)
                                    "kind": reward.kind, "parts": reward.parts, "judge": reward.judge}


def _record_failure(admin: EpisodeAdmin, sid: str, close: bool, status: str, reason: str, errors: list[str]) -> None:
    """Best effort: the store says how the episode ended too (the returned record always does)."""
    steps = [admin.close_session] if close else []
    steps.append(lambda s: admin.set_reward(s, None, status, reason))
    for step in steps:
        try:
            step(sid)
        except BaseException as e:  # the proxy itself is failing; the result still says why
            if _fatal(e):
                raise
            errors.append(f"recording the failure: {describe(e)}")


def _release(run: _Run, admin: EpisodeAdmin | None, scratch: Path | None, cfg: EpisodeConfig, errors: list[str]) -> None:
    """Every resource back, each on its own: one failing release never keeps the others.
    Their failures are reported (`cleanup_error`) but do not change the outcome: the reward
    was decided before, and a policy must not be able to void its own zero by breaking
    the teardown."""
    steps: list[tuple[str, Callable[[], None]]] = [
        ("relay", run.relay.close if run.relay is not None else lambda: None),
        ("sandbox", lambda: run.close_sandbox(keep=True)), ("admin", admin.close if admin is not None else lambda: None)]
    if scratch is not None and not cfg.keep_scratch:
        steps.append(("scratch", lambda: shutil.rmtree(scratch, ignore_errors=True)))
    for what, fn in steps:
        try:
            fn()
        except BaseException as e:
            if _fatal(e):
                raise
            errors.append(f"closing the {what}: {describe(e)}")
