"""The Docker backend's config: limits, labels, the engine, and how folders reach its sandboxes
(sandboxes/docker.py reads it; every field is documented and printed whole by --print-config)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class DockerConfig(BaseModel):
    """How docker sandboxes are limited and labelled, and on which engine."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    cpus: float = 1.0
    """CPU quota per container (cores)."""
    memory: str = "2g"
    """Memory limit per container (docker syntax, e.g. 512m); swap is not allowed on top."""
    pids_limit: int = 512
    """Most processes/threads in one container (contains fork bombs)."""
    run_id: str | None = None
    """Label for this run's containers (reap(run_id=...)); None: a fresh id per backend."""
    base_image: str | None = None
    """Base image tag; None: base_image_tag() of the packaged recipe."""
    output_limit: int = Field(default=4 << 20, gt=0)
    """Most bytes of command output kept per exec (the rest is dropped and noted)."""
    kill_grace_s: float = 5.0
    """Seconds past an exec's timeout before the host kills it from outside."""
    shm_size: str = "64m"
    """Size of /dev/shm (a tmpfs, emptied on reset)."""
    file_size_limit: int | None = Field(default=1 << 30, gt=0)
    """RLIMIT_FSIZE in bytes for every process (a write past it fails with EFBIG / SIGXFSZ);
    None: unlimited. The repository, /tmp and home volumes have no total quota on this engine
    (overlay2 on ext4 offers none; storage_opt size needs xfs with pquota, and a tmpfs /tmp
    would not take put_archive), so this per-file limit and `shm_size` are what is enforced."""
    diff_limit: int = Field(default=256 << 20, gt=0)
    """Most bytes of the agent's diff read back (past it the diff is cut and noted)."""
    warm_python: tuple[str, ...] = ("pytest", "pluggy", "_pytest.config:default_plugins")
    """Modules PID 1 imports at start, before any command (sandbox_init.py): an exec of
    `python3 -I --check-hash-based-pycs always SCRIPT ...` with no env of its own then runs in
    a fork of it (the grader's hidden-test runner skips ~0.2 s of CPU of pytest's imports an
    episode). Empty: PID 1 runs `python3 -S` and every python is a new interpreter."""
    engine: str | None = None
    """The Docker engine, in DOCKER_HOST form: unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST
    (the `remote` extra); None: $DOCKER_HOST, else this machine's default socket
    (sandboxes/engine.py). Images are built (or the base image loaded) on it, offline."""
    cert_path: str | None = None
    """For a tcp:// engine: a folder with ca.pem, cert.pem and key.pem; TLS is verified against
    it. None: plain TCP (only for an engine on a trusted network)."""
    host_mounts: bool | None = None
    """Whether read-only mounts (a harness's toolchain) are bind-mounted from this host. False:
    each is copied once per engine into a volume and mounted from there, and a writable mount
    is refused (the proxy's socket dir is never mounted: sandboxes tunnel to it). None: bound
    only on this machine's default engine, where host paths are the engine's."""

    @field_validator("engine")
    @classmethod
    def _engine_form(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("unix:///", "tcp://", "ssh://")):
            raise ValueError(f"engine {v!r}: want DOCKER_HOST form, unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST")
        return v
