"""Which Docker engine a backend drives, and what reaches a sandbox on it without host paths.

Contract. `connect(engine, cert_path)` opens a client on an engine named in DOCKER_HOST form:
`unix:///path`, `tcp://host:port` (TLS verified against `cert_path`'s ca.pem / cert.pem /
key.pem when given) or `ssh://user@host` (needs paramiko: the `remote` extra); None means
$DOCKER_HOST, else this machine's default socket. `is_local(engine)` says whether it is that
default socket, the one engine whose host is this machine for sure: only there are host paths
bind-mounted and this host's cgroupfs written.

Everything else reaches another engine over its API alone:
- `ensure_base_image(client, tag)`: the base image, loaded from this machine's default engine
  (`docker save` streamed into the engine's `load`: no registry) when the engine lacks it;
  task images are then built on the engine itself (images.py, offline).
- `copied_volume(client, host_dir, image)`: a read-only host folder (a harness's toolchain)
  copied once per engine into a named volume, `harnessrl-ro-<fingerprint>`, whose name is a
  hash of the folder's listing (paths, sizes, mtimes, modes, link targets), so a changed folder
  is a new volume and an unchanged one is copied once. A volume is complete only with its
  marker file, written after the copy; an incomplete one (a crashed copy) is removed and made
  again. Sandboxes mount it read-only where the folder would have been bound.
"""
from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import tempfile
import threading
from pathlib import Path

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
VOLUME_PREFIX = "harnessrl-ro-"
MARKER = ".harnessrl-copied"
COPY_LABEL = "harnessrl.copy_of"
_locks: dict[tuple[str, str], threading.Lock] = {}
_fingerprints: dict[str, str] = {}
_guard = threading.Lock()


def resolve(engine: str | None) -> str:
    """The engine's DOCKER_HOST form: `engine`, else $DOCKER_HOST, else the default socket."""
    got = engine or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
    if got.startswith("/"):
        got = "unix://" + got
    if not got.startswith(("unix://", "tcp://", "ssh://", "npipe://")):
        raise ValueError(f"docker engine {got!r}: want unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST")
    return got


def is_local(engine: str | None) -> bool:
    """True for this machine's default socket (bind mounts and cgroups are this host's)."""
    return resolve(engine) in (DEFAULT_SOCKET, "unix:///run/docker.sock")


def connect(engine: str | None = None, cert_path: str | None = None, timeout: int = 120):
    """A docker client on the engine (see the module docstring); raises what docker raises."""
    import docker

    url = resolve(engine)
    tls = None
    if cert_path:
        import docker.tls

        d = Path(cert_path)
        tls = docker.tls.TLSConfig(client_cert=(str(d / "cert.pem"), str(d / "key.pem")), ca_cert=str(d / "ca.pem"),
                                   verify=True)
    if url.startswith("ssh://"):
        try:
            import paramiko  # noqa: F401 - docker's ssh transport
        except ImportError:
            raise RuntimeError(f"engine {url}: ssh:// needs paramiko: pip install 'harnessrl[remote]'") from None
    return docker.DockerClient(base_url=url, tls=tls, timeout=timeout)


def ensure_base_image(client, tag: str) -> None:
    """Load `tag` into the engine from this machine's default engine when it lacks it."""
    import docker.errors

    from harnessrl.sandboxes.base import SandboxUnavailable

    try:
        client.images.get(tag)
        return
    except docker.errors.ImageNotFound:
        pass
    with _lock(client, tag):
        try:
            client.images.get(tag)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            local = connect(DEFAULT_SOCKET, timeout=600)
            stream = local.images.get(tag).save(chunk_size=1 << 20, named=True)
        except Exception as e:  # noqa: BLE001 - no local engine, or it lacks the tag too
            raise SandboxUnavailable(f"base image {tag} is missing on engine {engine_id(client)} and cannot be "
                                     f"loaded from this machine's engine ({type(e).__name__}: {e}): build it there "
                                     "with DOCKER_HOST=<engine> bash sandboxes/base_image.sh") from None
        client.images.load(_Reader(stream))


class _Reader:
    """A file over an iterator of bytes (docker's `load` reads a file)."""

    def __init__(self, chunks):
        self.chunks, self.buf = iter(chunks), b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buf) < n:
            try:
                self.buf += next(self.chunks)
            except StopIteration:
                break
        n = len(self.buf) if n < 0 else n
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def engine_id(client) -> str:
    """The engine's own ID (`docker info`), the same for every client of one engine."""
    got = getattr(client, "_harnessrl_engine_id", None)
    if got is None:
        got = client._harnessrl_engine_id = str(client.info().get("ID") or id(client))
    return got


def _lock(client, key: str) -> threading.Lock:
    eid = engine_id(client)
    with _guard:
        return _locks.setdefault((eid, key), threading.Lock())


def fingerprint(host_dir: str) -> str:
    """16 hex of sha256 over the folder's listing (computed once per folder per process)."""
    with _guard:
        got = _fingerprints.get(host_dir)
    if got:
        return got
    h = hashlib.sha256(host_dir.encode())
    for root, dirs, files in os.walk(host_dir):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            p = os.path.join(root, name)
            st = os.lstat(p)
            link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else ""
            h.update(f"{os.path.relpath(p, host_dir)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\0{link}\n".encode())
    got = h.hexdigest()[:16]
    with _guard:
        _fingerprints[host_dir] = got
    return got


def copied_volume(client, host_dir: str, image: str) -> str:
    """The name of a volume on the engine holding a copy of `host_dir` (see the module docstring);
    `image` (one with a shell) hosts the copy while it is made."""
    import docker.errors
    import docker.types

    name = VOLUME_PREFIX + fingerprint(host_dir)
    with _lock(client, name):
        try:
            client.volumes.get(name)
            if _complete(client, name, image):
                return name
            client.volumes.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
        client.volumes.create(name, labels={COPY_LABEL: host_dir, "harnessrl.managed": "1"})
        helper = client.containers.create(image, ["true"], network_mode="none",
                                          mounts=[docker.types.Mount("/v", name, type="volume")],
                                          labels={"harnessrl.managed": "1"})
        try:
            with tempfile.TemporaryFile() as tar:
                with tarfile.open(fileobj=tar, mode="w") as tf:
                    tf.add(host_dir, arcname=".")
                tar.seek(0)
                if not client.api.put_archive(helper.id, "/v", tar):
                    raise RuntimeError(f"copying {host_dir} into volume {name} failed")
            done = _tar_of(MARKER, host_dir.encode())
            client.api.put_archive(helper.id, "/v", done)
        finally:
            helper.remove(force=True)
    return name


def _complete(client, name: str, image: str) -> bool:
    import docker.errors
    import docker.types

    helper = client.containers.create(image, ["true"], network_mode="none",
                                      mounts=[docker.types.Mount("/v", name, type="volume", read_only=True)])
    try:
        helper.get_archive(f"/v/{MARKER}")
        return True
    except docker.errors.NotFound:
        return False
    finally:
        helper.remove(force=True)


def _tar_of(name: str, data: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o444
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
