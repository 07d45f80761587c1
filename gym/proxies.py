"""Several proxies serving one run: the run's in-process proxy and `extra` proxy processes beside it.

Contract:
- `ProxyFleet(local, extra, folder)` over a built (not started) `ProxyServer`: `start()` starts
  it and `extra` processes (`python -m harnessrl.gym.proxy --config FILE --watch-stdin`), each
  with the local proxy's config (`gym.stack.proxy_config`: same engines, backend, sampling,
  limits) except its own store and unix socket, `<folder>/proxies/<k>/trajectories.db` and
  `proxy.sock`, a port of its own, and its own admin token, written to its stdin (so it is in
  neither its command line nor its environment, which /proc shows). With extra proxies, `<folder>/stores.json` lists every store of the
  run (`gym.proxy.run_stores`), with each proxy's URL and pid.
- `lease()` pins an episode to one proxy for its whole life: the handle of the proxy in service
  with the fewest episodes now (ties: the one after the last chosen, round the fleet).
- `pause`, `resume`, `use_lora`, `use_engines` (a weight sync's gate) and `set_policy_version`
  (`gym.stack.Publisher`) reach every proxy in service, in fleet order; `stats()` is the local
  proxy's, plus `proxies` (each one's URL, pid, episodes, state) and, with several engines,
  `engines` merged (out of service on one proxy: out).
- A proxy process that exits is lost: no episode is pinned to it any more and the fan-outs
  skip it; its in-flight episodes find it unreachable (`ProxyUnreachable`) and end masked as
  `proxy_lost`; the run goes on with the others. One that fails a fan-out's admin call (no
  answer within `admin_timeout_s`, a 5xx) is killed and lost the same way: a run never waits
  on a hung proxy. The local proxy lives as long as the run.
- `stop()` stops every process (SIGTERM, then SIGKILL after `stop_wait_s`) and the local proxy;
  a process whose parent dies sees its stdin close and exits too: no proxy outlives its run.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from harnessrl.gym.proxy.config import ADMIN_TOKEN_ENV
from harnessrl.gym.proxy.run_stores import write_index
from harnessrl.gym.proxy_admin import ProxyHandle

log = logging.getLogger(__name__)


class ProxyRefused(RuntimeError):
    """A proxy process answered an admin call with an HTTP error (`status`)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class ProxyProcess:
    """One proxy served by a child process, with the attributes `ProxyHandle.of` reads (`url`,
    `admin_token`, `config`) and its admin calls over HTTP."""

    def __init__(self, index: int, config: Any, folder: Path, admin_timeout_s: float = 30.0):
        self.index, self.folder, self.admin_timeout_s = index, folder, admin_timeout_s
        sock = str(folder / "proxy.sock")
        self.config = config.model_copy(update={  # a socket path past sun_path's 108 bytes: TCP only
            "db_path": str(folder / "trajectories.db"), "uds_path": sock if len(sock.encode()) < 100 else None,
            "port": 0, "admin_token": None})
        self.admin_token = secrets.token_urlsafe(24)
        self.url = ""
        self.proc: subprocess.Popen | None = None
        self.http: httpx.Client | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        conf = self.folder / "proxy-config.json"  # 0600: a teacher's API key may be in it
        with open(os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(self.config.model_dump_json(indent=1))
        package_parent = str(Path(__file__).parents[2])  # the folder holding this harnessrl: the child imports it
        env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
        with open(self.folder / "proxy.log", "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "harnessrl.gym.proxy", "--config", str(conf),
                                          "--admin-token-stdin", "--watch-stdin"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, env=env, cwd=str(self.folder))
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.admin_token.encode() + b"\n")
        self.proc.stdin.flush()  # the pipe stays open: its end is the child's signal that this process died

    def ready(self, timeout_s: float) -> None:
        """Wait for its one JSON line (it accepts calls from then on); a RuntimeError says why not."""
        assert self.proc is not None and self.proc.stdout is not None
        line = b""
        end = time.monotonic() + timeout_s
        while not line.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise RuntimeError(f"proxy {self.index} did not start within {timeout_s:g} s{self._log_tail()}")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"proxy {self.index} exited with code {self.proc.wait()} before it "
                                   f"served{self._log_tail()}")
            line += chunk
        said = json.loads(line)
        if said.get("admin_token") != self.admin_token or said.get("pid") != self.proc.pid:
            raise RuntimeError(f"proxy {self.index}: its first line is not its own: {line[:200]!r}")
        self.url = said["url"]
        self.http = httpx.Client(base_url=self.url, timeout=self.admin_timeout_s, headers={"Authorization": f"Bearer {self.admin_token}"})

    def admin(self, path: str, body: dict[str, Any] | None = None, method: str = "POST") -> dict[str, Any]:
        assert self.http is not None
        r = self.http.request(method, path, json=body)
        if r.status_code >= 400:
            raise ProxyRefused(f"proxy {self.index} {method} {path}: HTTP {r.status_code}: {r.text[:300]}",
                               r.status_code)
        return r.json()

    def stop(self, wait_s: float) -> None:
        if self.http is not None:
            self.http.close()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()

    def _log_tail(self) -> str:
        try:
            tail = (self.folder / "proxy.log").read_text(errors="replace")[-1500:].strip()
        except OSError:
            return ""
        return f"; its log ({self.folder / 'proxy.log'}) ends: {tail}" if tail else ""


class ProxyFleet:
    """The proxies of one run (module doc): `members[0]` the local `ProxyServer`, then the processes."""

    def __init__(self, local: Any, extra: int, folder: str | Path, start_timeout_s: float = 120.0,
                 stop_wait_s: float = 10.0, admin_timeout_s: float = 30.0):
        if extra and not any(local.config.engine_urls):
            raise ValueError(f"rollout.proxies: {extra + 1} proxies need an engine URL they all reach; this run "
                             "generates through an object in this process (a trainer's or bridge's own backend)")
        self.local, self.folder = local, Path(folder)
        self.members: list[Any] = [local] + [ProxyProcess(k, local.config, self.folder.absolute() / "proxies" / str(k),
                                                          admin_timeout_s)
                                             for k in range(1, extra + 1)]
        self.episodes = [0] * len(self.members)
        """Episodes pinned to each proxy now."""
        self.lost: dict[int, str] = {}
        """Proxies out of service: index -> why."""
        self.start_timeout_s, self.stop_wait_s = start_timeout_s, stop_wait_s
        self._lock = threading.Lock()
        self._next = 0

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "ProxyFleet":
        try:
            self.local.start()
            for m in self.members[1:]:
                m.spawn()  # all at once: each loads its tokenizer in parallel
            for m in self.members[1:]:
                m.ready(self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        if len(self.members) > 1:
            write_index(self.folder, [{"path": os.path.relpath(os.path.abspath(m.config.db_path), self.folder.absolute()),
                                       "proxy": k,
                                       "url": m.url, "pid": m.pid if k else os.getpid()}
                                      for k, m in enumerate(self.members)])
        return self

    def stop(self) -> None:
        for m in self.members[1:]:
            m.stop(self.stop_wait_s)
        self.local.stop()

    def __enter__(self) -> "ProxyFleet":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- pinning episodes -------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self) -> Iterator[ProxyHandle]:
        """The handle of the proxy this episode uses for its whole life (module doc)."""
        with self._lock:
            self._check()
            n = len(self.members)
            live = [k for k in range(n) if k not in self.lost]
            k = min(live, key=lambda i: (self.episodes[i], (i - self._next) % n))
            self._next = (k + 1) % n
            self.episodes[k] += 1
        try:
            yield ProxyHandle.of(self.members[k])
        finally:
            with self._lock:
                self.episodes[k] -= 1

    def _check(self) -> None:
        """Mark every proxy process that has exited as lost (under the lock)."""
        for k, m in enumerate(self.members[1:], 1):
            if k not in self.lost and not m.alive:
                self._lose(k, f"its process (pid {m.pid}) exited with code {m.proc.returncode if m.proc else None}")

    def _lose(self, k: int, why: str) -> None:
        self.lost[k] = why
        log.warning("proxy %d (%s) is lost: %s; its episodes end masked (proxy_lost), the run goes on with %d "
                    "proxies", k, self.members[k].url, why, len(self.members) - len(self.lost))

    # -- fan-out ------------------------------------------------------------------------------
    def _each(self, local_fn: Any, path: str, body: dict[str, Any] | None = None) -> list[Any]:
        """`local_fn()` on the local proxy, then `path` on each process in service. A process
        that cannot be reached, does not answer within `admin_timeout_s` or answers a 5xx is
        broken: it is killed (so its episodes end, masked, instead of hanging) and lost. A 4xx
        is this caller's mistake and raises."""
        out = [local_fn()]
        for k, m in enumerate(self.members[1:], 1):
            if k in self.lost:
                continue
            try:
                out.append(m.admin(path, body))
            except (httpx.TransportError, ProxyRefused) as e:
                if isinstance(e, ProxyRefused) and e.status < 500:
                    raise
                with self._lock:
                    self._check()
                    if k not in self.lost:
                        m.proc.kill()
                        self._lose(k, f"its admin call {path} failed ({type(e).__name__}: {e}); it was killed")
        return out

    def pause(self) -> None:
        """New calls wait on every proxy (then 429); interrupted generations wait for resume()."""
        self._each(self.local.pause, "/admin/pause")

    def resume(self) -> None:
        self._each(self.local.resume, "/admin/resume")

    def use_lora(self, name: str | None) -> bool:
        """Every proxy names adapter `name` in its generations (`ProxyServer.use_lora`)."""
        return bool(self._each(lambda: self.local.use_lora(name), "/admin/lora", {"name": name})[0])

    def use_engines(self, urls: list[str]) -> bool:
        """Every proxy routes only to these engines (`ProxyServer.use_engines`)."""
        return bool(self._each(lambda: self.local.use_engines(urls), "/admin/engines", {"urls": list(urls)})[0])

    def set_policy_version(self, version: int) -> None:
        self._each(lambda: self.local.set_policy_version(version), "/admin/policy_version", {"version": version})

    def stats(self) -> dict[str, Any]:
        out = self.local.stats()
        with self._lock:
            self._check()
            lost, episodes = dict(self.lost), list(self.episodes)
        per: list[dict[str, Any]] = []
        for k, m in enumerate(self.members):
            s = out if k == 0 else None
            if k and k not in lost:
                with contextlib.suppress(httpx.TransportError, ProxyRefused):
                    s = m.admin("/admin/stats", method="GET")
            per.append({"proxy": k, "url": m.url, "pid": m.pid if k else os.getpid(), "episodes": episodes[k],
                        "in_service": k not in lost, "reason": lost.get(k, ""),
                        "sessions": s.get("sessions") if s else None})
            if k and s and "engines" in out:
                out["engines"] = _merge_engines(out["engines"], s.get("engines", []))
        return out | {"proxies": per}


def _merge_engines(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Engines as the fleet sees them: out of service where any proxy has it out; loads added."""
    other = {e["url"]: e for e in theirs}
    out = []
    for e in mine:
        o = other.get(e["url"])
        if o is not None:
            e = dict(e, sessions=e["sessions"] + o["sessions"], calls=e["calls"] + o["calls"])
            if e["in_service"] and not o["in_service"]:
                e.update(in_service=False, reason=o["reason"])
        out.append(e)
    return out
