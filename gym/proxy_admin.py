"""How an episode reaches its proxy: the handle (plain, picklable data) and the admin client.

`ProxyHandle.of(proxy_server)` is the one way to build a handle: it carries the engine URL
from the proxy's own config, so no episode can judge engine failures without it.
`ProxyAdmin` is the `EpisodeAdmin` an episode uses: open a session, close it, read its record
once, set its reward, over the admin HTTP API with the admin token. A proxy that cannot be
reached at all (its process is gone: the connection is refused or dropped) raises
`ProxyUnreachable`, which ends the episode masked as `proxy_lost` (`gym.proxies`).
"""
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

import httpx

from harnessrl.gym.trajectory import Trajectory


@dataclass(frozen=True)
class ProxyHandle:
    """How to reach a running proxy: its harness-facing URL, its admin API token, its unix
    socket and the engine behind it. Build it with `ProxyHandle.of(proxy_server)`; the engine
    URL has no default, so no construction can silently forget it."""

    url: str
    admin_token: str
    _: KW_ONLY
    engine_url: str | None
    """The engine behind the proxy; when a harness stops, its /health tells an engine failure
    (infra, masked) from a harness that gave up (scored). None for a proxy whose engine
    cannot be reached from here (then only the recorded calls tell), and for one with several
    engines (each call records the engine that served it, `flags["engine"]`, which is asked)."""
    uds_path: str | None = None
    """The proxy's own unix socket, if it serves one (else the relay targets its TCP port)."""

    @classmethod
    def of(cls, server: Any, url: str | None = None) -> "ProxyHandle":
        """The handle of a started `ProxyServer`. `url`: a front door in front of it (the gym
        env's tap, an address remote workers reach); the unix socket, which would bypass that
        door, is then left out."""
        if not server.url:
            raise RuntimeError("ProxyHandle.of: the proxy is not started (it has no URL yet)")
        urls = server.config.engine_urls
        return cls(url or server.url, server.admin_token, engine_url=urls[0] if len(urls) == 1 else None,
                   uds_path=None if url else server.config.uds_path)


class EpisodeAdmin(Protocol):
    """The proxy admin calls one episode makes (`ProxyAdmin`: over the admin HTTP API)."""

    def open(self, meta: dict[str, Any]) -> tuple[str, str]:
        """A new session with this meta: (session id, harness key)."""
        ...

    def close_session(self, sid: str) -> None:
        """No further call is accepted or recorded: the record is final."""
        ...

    def trajectory(self, sid: str) -> Trajectory: ...

    def set_reward(self, sid: str, reward: float | None, status: str, termination: str) -> None: ...

    def close(self) -> None: ...


class ProxyUnreachable(RuntimeError):
    """The proxy's admin API could not be reached (refused or dropped connection): the proxy
    is gone, and whatever its episode did since its last record is lost with it."""


class ProxyAdmin:
    """The admin calls an episode needs (loopback HTTP, admin token)."""

    def __init__(self, proxy: ProxyHandle):
        self.proxy = proxy
        self.http = httpx.Client(base_url=proxy.url, timeout=30,
                                 headers={"Authorization": f"Bearer {proxy.admin_token}"})

    def _call(self, method: str, path: str, **kw: Any) -> dict:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TimeoutException:  # alive but slow: not a lost proxy
            raise
        except httpx.TransportError as e:
            raise ProxyUnreachable(f"the proxy at {self.proxy.url} is unreachable ({method} {path}: "
                                   f"{type(e).__name__}: {e})") from e
        if r.status_code >= 400:
            raise RuntimeError(f"proxy admin {method} {path}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def open(self, meta: dict[str, Any]) -> tuple[str, str]:
        d = self._call("POST", "/admin/sessions", json={"meta": meta, **{k: meta[k] for k in (
            "max_calls", "max_tokens") if meta.get(k) is not None}})
        return d["session_id"], d["key"]

    def close_session(self, sid: str) -> None:
        self._call("POST", f"/admin/sessions/{sid}/close")

    def trajectory(self, sid: str) -> Trajectory:
        return Trajectory.from_dict(self._call("GET", f"/admin/sessions/{sid}/trajectory"))

    def set_reward(self, sid: str, reward: float | None, status: str, termination: str) -> None:
        self._call("POST", f"/admin/sessions/{sid}/reward",
                   json={"reward": reward, "status": status, "termination": termination})

    def close(self) -> None:
        self.http.close()


def engine_down(engine_url: str | None) -> bool:
    """True when the engine does not answer GET /health (unknown engine: assume it is up)."""
    if not engine_url:
        return False
    try:  # TLS settings only for https: httpx loads the CA bundle per client (~34 ms of CPU a probe)
        return httpx.get(f"{engine_url.rstrip('/')}/health", timeout=10,
                         verify=engine_url.startswith("https:")).status_code >= 500
    except httpx.HTTPError:
        return True
