"""One Docker sandbox: a container whose PID 1 (sandbox_init.py) runs commands, resets and
tunnels for the host over `docker attach` (sandboxes/attach.py); files cross as tar streams.
The contract is sandboxes/docker.py's module docstring; this is its `Sandbox`.
"""
from __future__ import annotations

import base64
import io
import queue
import tarfile
import threading
import time
from pathlib import PurePosixPath

from harnessrl.sandboxes.attach import Channel
from harnessrl.sandboxes.base import ExecResult, RepoSpec, SandboxDied, SandboxError
from harnessrl.sandboxes.docker_config import DockerConfig
from harnessrl.sandboxes.images import PRISTINE_DIR
from harnessrl.sandboxes.repo import DIFF_SCRIPT
from harnessrl.sandboxes.tunnel import Tunnel

HOME = "/home/agent"
#: PID 1's interpreter flags when it keeps a warm python (DockerConfig.warm_python), and so
#: the flags of a python that may fork from it: the grader's runner's (gym/grading/hidden_tests.py).
WARM_PYTHON_FLAGS = ("-I", "--check-hash-based-pycs", "always")
# Every exec: `timeout` puts the command in its own process group; the group dies with it.
# $1=1 merges stderr into stdout at the source, so their order is kept (PID 1 reads the two apart).
_WRAP = """[ "$1" = 1 ] && exec 2>&1
t="$2"; shift 2
timeout -k 2 "$t" "$@" &
pid=$!
{ wait "$pid"; } 2>/dev/null; rc=$?
kill -9 -- "-$pid" 2>/dev/null; kill -9 -- "-$pid" 2>/dev/null
exit "$rc"
"""


class DockerSandbox:
    """One container holding one repository checkout (see the module docstring)."""

    def __init__(self, container, spec: RepoSpec, base_sha: str, config: DockerConfig):
        self.container, self.spec, self.base_sha, self.config = container, spec, base_sha, config
        self.workdir = spec.workdir
        self.id = container.id
        self._api = container.client.api
        self._ctl: Channel | None = None  # PID 1's attach stream: commands and resets
        self._ctl_lock = threading.Lock()
        self.warm_runs = 0
        """Execs PID 1 ran in a fork of its warm python (DockerConfig.warm_python)."""

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        """Start the container and wait until PID 1 says it is ready (its signal dispositions
        set: before that, a SIGINT from inside could still stop it). One that fails to is
        closed (the container removed, not left behind "Created"), as a local sandbox is."""
        try:
            ctl = self._channel()  # attached before start, so the ready line cannot be missed
            self.container.start()
            ready = ctl.ready.wait(timeout) and not ctl.closed
        except BaseException as e:
            self.close()
            if not isinstance(e, Exception):
                raise
            raise SandboxError(f"container for {self.spec.repo_id!r} failed to start: "
                               f"{type(e).__name__}: {e}") from e
        if not ready:
            why = ctl.closed or f"no ready line in {timeout:.0f} s"
            self.close()
            raise SandboxError(f"container for {self.spec.repo_id!r} started without its init ({why})")

    def alive(self) -> bool:
        try:
            return self._api.inspect_container(self.id)["State"]["Running"]
        except Exception:
            return False

    def close(self) -> None:
        self._close_ctl()
        try:
            self.container.remove(force=True, v=True)
        except Exception:
            pass  # already gone: closing is idempotent

    # -- PID 1's channel -------------------------------------------------------------------
    def _channel(self) -> Channel:
        """The open channel; a new attach if the last one ended while the container runs (an
        attach to a stopped container would wait for its start: a stopped one raises)."""
        with self._ctl_lock:
            if self._ctl is None or self._ctl.closed:
                if self._ctl is not None:
                    self._ctl.close()
                    self._ctl = None
                    if not self.alive():
                        raise ConnectionError("the container is not running")
                sock = self._api.attach_socket(self.id, params={"stdin": 1, "stdout": 1, "stream": 1})
                raw = getattr(sock, "_sock", sock)
                raw.settimeout(None)
                self._ctl = Channel(raw)
            return self._ctl

    def _close_ctl(self) -> None:
        with self._ctl_lock:
            if self._ctl is not None:
                self._ctl.close()
                self._ctl = None

    def _request(self, msg: dict, what: str) -> tuple[Channel, int, queue.SimpleQueue]:
        try:
            ctl = self._channel()
            return (ctl, *ctl.request(msg))
        except Exception as e:
            if not self.alive():
                raise self._died(f"cannot {what}", e) from e
            raise SandboxError(f"{what} failed in {self.id[:12]}: {type(e).__name__}: {e}") from e

    def tunnel(self, listen: str, target: str) -> Tunnel:
        """Listen on `listen` in the sandbox; carry each connection over PID 1's attach stream
        to `target` on this host (sandboxes/tunnel.py). Close it when done."""
        try:
            return Tunnel(self._channel(), listen, target)
        except ConnectionError as e:
            if not self.alive():
                raise self._died("cannot open a tunnel", e) from e
            raise SandboxError(f"tunnel in {self.id[:12]}: {e}") from e

    # -- commands --------------------------------------------------------------------------
    def _died(self, what: str, err: Exception | None = None) -> SandboxDied:
        return SandboxDied(f"sandbox {self.id[:12]} ({self.spec.repo_id}) is not running; {what}"
                           + (f": {err}" if err else ""))

    def _run(self, argv: list[str], timeout: float, env: dict[str, str] | None,
             workdir: str | None, demux: bool = True, limit: int | None = None
             ) -> tuple[int, bytes, bytes, bool, float]:
        """Run argv through PID 1 (no `docker exec`); return (exit code, stdout, stderr,
        timed_out, seconds). demux=False: stdout and stderr interleaved as they came, all in
        the stdout slot."""
        # In-container `timeout` kills the command's process group at its deadline, and the
        # wrapper kills what is left of the group when the command ends (a fork bomb, stray
        # `&` jobs); the host's deadline below is the backstop for processes that left the group.
        wrapped = ["bash", "-c", _WRAP, "harnessrl-exec", "0" if demux else "1",
                   f"{max(timeout, 0.001):.3f}", *argv]
        limit = limit or self.config.output_limit
        msg = {"op": "exec", "argv": wrapped, "env": env or {}, "cwd": workdir or self.workdir, "limit": limit,
               "merge": not demux}
        if self.config.warm_python and not env and len(argv) > 4 and argv[1:4] == list(WARM_PYTHON_FLAGS) \
                and not argv[4].startswith("-"):  # PID 1 runs it in a fork of its warm interpreter if it can
            msg["warm"] = {"argv": list(argv), "timeout": max(timeout, 0.001)}
        t0 = time.monotonic()
        ctl, rid, q = self._request(msg, "exec")
        out, err = bytearray(), bytearray()
        code, size, forced, ended = None, 0, False, False
        deadline = t0 + timeout + self.config.kill_grace_s
        try:
            while True:
                try:
                    msg = q.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    if forced:
                        break
                    # kill everything but PID 1, then collect what came (5 s more)
                    forced, deadline = True, time.monotonic() + 5.0
                    try:
                        ctl.send({"op": "kill", "id": 0})
                    except OSError:
                        pass
                    continue
                if msg is None:  # the stream ended: the container stopped, or the daemon went
                    ended = True
                    break
                if "o" in msg:
                    out += base64.b64decode(msg["o"])
                elif "e" in msg:
                    err += base64.b64decode(msg["e"])
                elif "rc" in msg:
                    code, size = msg["rc"], msg.get("size", 0)
                    self.warm_runs += bool(msg.get("warm"))
                    break
        finally:
            ctl.done(rid)
        dur = time.monotonic() - t0
        if ended or code is None:
            if not self.alive():
                raise self._died("it stopped while a command ran")
            if ended:
                raise SandboxError(f"exec in {self.id[:12]}: {ctl.closed}")
        if size > limit:
            out += f"\n[harnessrl: output truncated at {limit} bytes]\n".encode()
        timed_out = forced or (code in (124, 137) and dur >= timeout)
        return (-1 if timed_out or code is None else code), bytes(out), bytes(err), timed_out, dur

    def exec(self, command: str | list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        code, out, _, timed_out, dur = self._run(argv, timeout, env, workdir, demux=False)
        text = out.decode("utf-8", "replace")
        return ExecResult(exit_code=code, output=text, timed_out=timed_out, duration_s=dur)

    def _script(self, script: str, *args: str, timeout: float = 120.0, limit: int | None = None) -> bytes:
        code, out, err, timed_out, _ = self._run(["bash", "-c", script, "harnessrl", *args],
                                                 timeout, None, "/", limit=limit)
        if code != 0:
            raise SandboxError(f"sandbox script failed (exit {code}{', timed out' if timed_out else ''}): "
                               f"{err.decode('utf-8', 'replace')[-2000:]}")
        return out

    def diff(self) -> str:
        """Bytes that are not UTF-8 (a latin-1 source file) come back as PEP 383 surrogate
        escapes, so `text.encode("utf-8", "surrogateescape")` is the patch git wrote."""
        return self._script(DIFF_SCRIPT, self.workdir, self.base_sha, PRISTINE_DIR,
                            limit=self.config.diff_limit).decode("utf-8", "surrogateescape")

    def reset(self) -> None:
        """Through PID 1 (no `docker exec`): `kill -9 -1` in the reset script spares PID 1 and
        itself, so every process of the last episode dies."""
        ctl, rid, q = self._request({"op": "reset"}, "reset")
        try:
            reply = q.get(timeout=120.0)
        except queue.Empty:
            reply = None
        finally:
            ctl.done(rid)
        if reply is None:
            why = ctl.closed or "no reply in 120 s"
            if not self.alive():
                raise self._died("cannot reset", ConnectionError(why))
            raise SandboxError(f"reset of {self.id[:12]} failed: {why}")
        if reply.get("rc") != 0:
            raise SandboxError(f"reset of {self.id[:12]} failed (exit {reply.get('rc')}): "
                               f"{reply.get('err', '')[-2000:]}")

    # -- files -----------------------------------------------------------------------------
    def _abs(self, path: str) -> PurePosixPath:
        p = PurePosixPath(path)
        return p if p.is_absolute() else PurePosixPath(self.workdir) / p

    def read_file(self, path: str) -> bytes:
        import docker.errors

        p = self._abs(path)
        if not self.alive():  # the volumes outlive the container; its sandbox does not
            raise self._died("cannot read")
        try:
            stream, _ = self.container.get_archive(str(p))
        except docker.errors.NotFound as e:
            if not self.alive():
                raise self._died("cannot read", e) from e
            raise FileNotFoundError(f"{p} does not exist in sandbox {self.id[:12]}") from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tf:
            member = tf.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"{p} is not a regular file in sandbox {self.id[:12]}")
            return tf.extractfile(member).read()

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        import docker.errors

        p = self._abs(path)
        if not self.alive():
            raise self._died("cannot write")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo(p.name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, 1000, 1000, time.time()
            tf.addfile(info, io.BytesIO(data))
        for attempt in range(2):
            try:
                self.container.put_archive(str(p.parent), buf.getvalue())
                return
            except docker.errors.NotFound as e:
                if not self.alive():
                    raise self._died("cannot write", e) from e
                if attempt:
                    raise
                self._script('mkdir -p -- "$1"', str(p.parent))
            except docker.errors.APIError as e:
                raise SandboxError(f"cannot write {p}: {e.explanation} (writable: {self.workdir}, "
                                   f"/tmp, {HOME})") from e

    def __repr__(self) -> str:
        return f"DockerSandbox({self.id[:12]}, {self.spec.repo_id}@{self.base_sha[:8]})"
