"""One episode: task -> sandbox -> proxy session -> harness run -> reward -> closed trajectory.

Contract: `run_episode` always returns an `EpisodeResult` whose trajectory is closed and
stored with a reward, a status and a termination reason, one of
submitted | harness_exited | call_limit | timeout | harness_crashed | sandbox_died |
engine_error | infra | stale. The harness only ever gets plain data (session URL, key, model, the
problem statement, its sandbox); hidden tests are applied by `gym.rewards.score` after it
has exited. An ending caused by the infrastructure (sandbox died, engine unreachable,
harness not installed, reward run failed) is `infra_error` with reward None: masked from
training, never taught as a 0. So is `stale`: the proxy aborted the session because its
data exceeded the scheduler's staleness bound (`staleness_limit` in `session_meta`); it is
not scored, and the scheduler reruns the task. A timeout or call limit is `truncated`, not `ok`.

Endings travel as a small exception family (`EpisodeEnded` and its subclasses), so an
adapter or any code under it can end an episode with a reason by raising one.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import httpx
from pydantic import BaseModel, Field

from harnessrl.adapters.base import SOCKET_NAME, Endpoint, HarnessAdapter, HarnessResult, Launch, Limits, Mount
from harnessrl.adapters.relay import Relay
from harnessrl.gym.rewards import RewardConfig, RewardResult, score
from harnessrl.gym.tasks import Task
from harnessrl.gym.trajectory import Trajectory
from harnessrl.sandboxes.base import RepoSpec, Sandbox, SandboxDied, SandboxError


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


class Stale(EpisodeEnded):
    reason, status = "stale", "infra_error"


ENDINGS: dict[str, type[EpisodeEnded]] = {c.reason: c for c in (
    Submitted, HarnessExited, HarnessCrashed, CallLimit, Timeout, SandboxGone, EngineFailed, InfraFailed, Stale)}


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


@dataclass(frozen=True)
class ProxyHandle:
    """How to reach a running proxy: its harness-facing URL and its admin API token."""

    url: str
    admin_token: str
    uds_path: str | None = None
    """The proxy's own unix socket, if it serves one (else the relay targets its TCP port)."""
    engine_url: str | None = None
    """The engine behind the proxy; when a harness stops on an error, its /health tells an
    engine failure (infra, masked) from a harness that gave up (scored)."""


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


class ProxyAdmin:
    """The few admin calls an episode needs (loopback HTTP, admin token)."""

    def __init__(self, proxy: ProxyHandle):
        self.proxy = proxy
        self.http = httpx.Client(base_url=proxy.url, timeout=30,
                                 headers={"Authorization": f"Bearer {proxy.admin_token}"})

    def _call(self, method: str, path: str, **kw: Any) -> dict:
        r = self.http.request(method, path, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"proxy admin {method} {path}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def open(self, meta: dict[str, Any]) -> tuple[str, str]:
        d = self._call("POST", "/admin/sessions", json={"meta": meta, **{k: meta[k] for k in (
            "max_calls", "max_tokens") if meta.get(k) is not None}})
        return d["session_id"], d["key"]

    def finish(self, sid: str, reward: float | None, status: str, termination: str) -> Trajectory:
        self._call("POST", f"/admin/sessions/{sid}/close")
        self._call("POST", f"/admin/sessions/{sid}/reward",
                   json={"reward": reward, "status": status, "termination": termination})
        return Trajectory.from_dict(self._call("GET", f"/admin/sessions/{sid}/trajectory"))

    def trajectory(self, sid: str) -> Trajectory:
        return Trajectory.from_dict(self._call("GET", f"/admin/sessions/{sid}/trajectory"))

    def close(self) -> None:
        self.http.close()


# -- the loop ---------------------------------------------------------------------------------
def ending_for(result: HarnessResult, calls_made: int, max_calls: int) -> EpisodeEnded:
    """The ending of a harness run that returned: its own reason, except that a harness that
    stopped after the proxy's call budget was spent hit the call limit, whatever it says."""
    if result.reason in ("harness_exited", "harness_crashed") and calls_made >= max_calls:
        return CallLimit(f"{calls_made} calls made, limit {max_calls}")
    return ENDINGS[result.reason](f"harness status {result.harness_status!r}, exit {result.exit_code}")


def _engine_failed(traj: Trajectory) -> bool:
    return any(c.finish_reason in ("engine_error", "error") or c.flags.get("engine_error") for c in traj.calls)


def engine_down(engine_url: str | None) -> bool:
    """True when the engine does not answer GET /health (unknown engine: assume it is up)."""
    if not engine_url:
        return False
    try:
        return httpx.get(f"{engine_url.rstrip('/')}/health", timeout=10).status_code >= 500
    except httpx.HTTPError:
        return True


@dataclass
class _Run:
    """What one episode accumulates while it runs (closed over by the helpers below)."""

    relay: Relay | None = None
    sandbox: Sandbox | None = None
    harness: HarnessResult | None = None
    timings: dict[str, float] = field(default_factory=dict)


def _endpoint(run: _Run, adapter: HarnessAdapter, proxy: ProxyHandle, sid: str, key: str, model: str,
              scratch: Path) -> Endpoint:
    """The session as plain data; an inside harness also gets a private socket dir whose
    `proxy.sock` (a host relay) reaches the proxy, to be bind-mounted into its sandbox."""
    socket_dir = None
    if adapter.placement == "inside":
        socket_dir = scratch / "sock"
        socket_dir.mkdir()
        os.chmod(socket_dir, 0o755)  # the sandbox user (uid 1000) must reach the socket
        target = f"unix:{proxy.uds_path}" if proxy.uds_path else "tcp:" + proxy.url.split("://", 1)[1].rstrip("/")
        run.relay = Relay(f"unix:{socket_dir / SOCKET_NAME}", target).start()
    return Endpoint(f"{proxy.url.rstrip('/')}/s/{sid}", key, model, str(socket_dir) if socket_dir else None)


def _play(run: _Run, task: Task, adapter: HarnessAdapter, make_sandbox: SandboxFactory, proxy: ProxyHandle,
          admin: ProxyAdmin, sid: str, endpoint: Endpoint, cfg: EpisodeConfig, scratch: Path,
          toolchain: Path | None) -> None:
    """Sandbox up, harness run to its end; always raises the EpisodeEnded that says why."""
    try:
        t0 = time.monotonic()
        run.sandbox = make_sandbox(task.repo_spec(), adapter.mounts(endpoint, toolchain))
        run.timings["sandbox_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        run.harness = adapter.launch(Launch(endpoint, task.problem_statement, run.sandbox,
                                            Limits(cfg.max_calls, cfg.max_tokens, cfg.wall_time_s),
                                            scratch / "harness", toolchain))
        run.timings["harness_s"] = time.monotonic() - t0
        if not run.sandbox.alive():
            raise SandboxGone("the sandbox died during the harness run")
        end = ending_for(run.harness, _calls_so_far(admin, sid), cfg.max_calls)
        if end.reason in ("harness_exited", "harness_crashed", "timeout") and engine_down(proxy.engine_url):
            raise EngineFailed(f"the engine stopped answering ({end.reason}: {end})")
        raise end
    except EpisodeEnded:
        raise
    except SandboxDied as e:
        raise SandboxGone(str(e)) from e
    except Exception as e:  # anything else is ours, not the policy's: mask the episode
        raise InfraFailed(f"{type(e).__name__}: {e}") from e


def run_episode(task: Task, adapter: HarnessAdapter, make_sandbox: SandboxFactory, proxy: ProxyHandle,
                model: str, config: EpisodeConfig | None = None, toolchain: Path | None = None,
                session_meta: dict[str, Any] | None = None) -> EpisodeResult:
    """Run one episode to its end; `session_meta` is merged into the proxy session's meta
    (e.g. `staleness_limit` and `start_version` from the scheduler)."""
    cfg = config or EpisodeConfig()
    scratch = Path(tempfile.mkdtemp(prefix="harnessrl-ep-", dir=cfg.scratch_root))
    admin = ProxyAdmin(proxy)
    run = _Run()
    reward: RewardResult | None = None
    try:
        sid, key = admin.open({**(session_meta or {}), "task_id": task.instance_id, "harness": adapter.name,
                               "harness_version": adapter.version, "max_calls": cfg.max_calls,
                               "max_tokens": cfg.max_tokens})
        try:
            endpoint = _endpoint(run, adapter, proxy, sid, key, model, scratch)
            _play(run, task, adapter, make_sandbox, proxy, admin, sid, endpoint, cfg, scratch, toolchain)
        except EpisodeEnded as end:
            ending = end
        except Exception as e:  # the relay or socket dir could not be set up
            ending = InfraFailed(f"{type(e).__name__}: {e}")
        played = admin.trajectory(sid)  # the harness is gone: its record no longer changes
        if played.termination == "stale":  # the proxy aborted it: whatever the harness did after
            ending = Stale("the proxy aborted the session: its data exceeded the staleness bound")
        status, reason = ending.status, ending.reason
        error = str(ending) if status == "infra_error" else ""
        if status != "infra_error" and run.sandbox is not None:
            t0 = time.monotonic()
            reward = score(run.sandbox, task, cfg.reward)  # hidden tests only now, harness gone
            run.timings["reward_s"] = time.monotonic() - t0
            if reward.status == "infra_error":
                status, error = "infra_error", f"reward: {reward.reason}"
        if status != "infra_error" and _engine_failed(played):
            status, reason, error = "infra_error", "engine_error", "an engine call failed"
        final = reward.reward if (reward is not None and status != "infra_error") else None
        traj = admin.finish(sid, final, status, reason)
    finally:
        if run.relay is not None:
            run.relay.close()
        if run.sandbox is not None:
            try:
                run.sandbox.close()
            except SandboxError:
                pass
        admin.close()
        if not cfg.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    h = run.harness
    traj.metadata.update({"harness_status": h.harness_status if h else None,
                          "harness_exit_code": h.exit_code if h else None, "timings": run.timings, "error": error})
    return EpisodeResult(traj, h, reward, reason, status, run.timings, error)


def _calls_so_far(admin: ProxyAdmin, sid: str) -> int:
    try:
        return len(admin.trajectory(sid).calls)
    except RuntimeError:
        return 0
