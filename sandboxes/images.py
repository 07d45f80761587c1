"""Docker images for sandboxes, all built offline: the base image and one image per RepoSpec.

The base image comes from `base_image.sh` (debootstrap + `docker import`), tagged by a hash of
that script's recipe section; `base_image_tag()` computes the same tag in Python. A task image
is `FROM` the base with the repository (see repo.materialize) baked in at `spec.workdir` and
the spec's setup commands run at build time with no network. Nothing here ever pulls.
"""
from __future__ import annotations

import hashlib
import io
import json
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

from harnessrl.sandboxes.base import RepoSpec, SandboxError, SandboxUnavailable
from harnessrl.sandboxes.repo import FINALIZE_SCRIPT, image_name, materialize, spec_key

BASE_SCRIPT = Path(__file__).with_name("base_image.sh")
#: Inside task images: root-owned copies of .git's config/info/hooks/refs and of the home
#: directory after set-up, which reset restores.
PRISTINE_DIR = "/opt/harnessrl/pristine"
HOME_PRISTINE = "/opt/harnessrl/home"
AGENT = "1000:1000"
_build_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def base_image_tag() -> str:
    """`harnessrl/base:<12 hex of sha256(recipe section of base_image.sh)>`, as the script computes."""
    lines = BASE_SCRIPT.read_text().splitlines(keepends=True)
    try:
        start = lines.index("# >>> recipe\n")
        end = lines.index("# <<< recipe\n", start)
    except ValueError:
        raise SandboxError(f"{BASE_SCRIPT} lost its '# >>> recipe' / '# <<< recipe' markers") from None
    section = "".join(lines[start:end + 1])
    return "harnessrl/base:" + hashlib.sha256(section.encode()).hexdigest()[:12]


def build_base_image() -> str:
    """Run base_image.sh (a no-op when the tag exists); return the tag."""
    proc = subprocess.run(["bash", str(BASE_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"building the base image failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _build_locks.setdefault(key, threading.Lock())


def _dockerfile(base: str, spec: RepoSpec, key: str, sha: str) -> str:
    run = [f"RUN {json.dumps(['bash', '-c', 'set -e; ' + c])}" for c in spec.setup_commands]
    return "\n".join([
        f"FROM {base}",
        f"COPY --chown={AGENT} repo {spec.workdir}",
        "COPY finalize.sh /opt/harnessrl/finalize.sh",
        f"USER {AGENT}",
        f"WORKDIR {spec.workdir}",
        "ENV HOME=/home/agent",
        *run,
        "USER 0:0",
        # Root owns the pristine copy, so the agent cannot change what reset restores.
        f"RUN bash /opt/harnessrl/finalize.sh {shlex.quote(spec.workdir)} {sha} {PRISTINE_DIR}"
        f" && chown -R {AGENT} {shlex.quote(spec.workdir)} && cp -a /home/agent {HOME_PRISTINE}",
        f"USER {AGENT}",
        f'LABEL harnessrl.managed="1" harnessrl.spec="{key}" harnessrl.repo_id="{spec.repo_id}" '
        f'harnessrl.base_sha="{sha}"',
        "",
    ])


def _context_tar(checkout: Path, dockerfile: str) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, text in (("Dockerfile", dockerfile), ("finalize.sh", FINALIZE_SCRIPT)):
            info = tarfile.TarInfo(name)
            data = text.encode()
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
        tf.add(checkout, arcname="repo")
    buf.seek(0)
    return buf


def ensure_task_image(client, spec: RepoSpec, base: str | None = None, key_extra: str = "") -> str:
    """The tag of `spec`'s task image, building it (offline, cached by content) when missing.
    `key_extra` joins the cache key (e.g. the id of a task's own base image)."""
    import docker.errors

    base = base or base_image_tag()
    key = spec_key(spec, extra=base + key_extra)
    tag = f"{image_name(spec)}:{key[:16]}"
    with lock_for(tag):
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.get(base)
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(f"base image {base} is missing: run scripts/build_base_image.sh "
                                     "(or `python -c 'from harnessrl.sandboxes.docker import "
                                     "build_base_image; build_base_image()'`)") from None
        scratch = Path(tempfile.mkdtemp(prefix="harnessrl-ctx-"))
        try:
            sha = materialize(spec, scratch / "repo")
            ctx = _context_tar(scratch / "repo", _dockerfile(base, spec, key, sha))
            log: list[str] = []
            for chunk in client.api.build(fileobj=ctx, custom_context=True, tag=tag, pull=False,
                                          rm=True, forcerm=True, network_mode="none", decode=True):
                if "stream" in chunk:
                    log.append(chunk["stream"])
                if "error" in chunk:
                    raise SandboxError(f"building the image of {spec.repo_id!r} failed: "
                                       f"{chunk['error'].strip()}\n{''.join(log)[-3000:]}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return tag
