"""Images built from a task's own Dockerfile context, offline, and its workdir as a git source.

Contract: `build_context_image(client, spec)` builds `spec.image` from the Docker build context
`spec.image_context` (a folder holding a `Dockerfile`, e.g. a Harbor task's `environment/`)
when that tag is missing, with the network off (`network_mode=none`) and `pull=False`. Before
building, every image the Dockerfile names (`FROM`, `COPY --from`) that is not one of its own
stages must be present locally: one that is not is a SandboxUnavailable naming the file, the
line and the image (the engine would otherwise try to pull it). The build argument
`HARNESSRL_BASE` carries the current offline base image tag (`FROM ${HARNESSRL_BASE}`).
Three links are added on top: `/logs`, `/tests` and `/solution` point into `/tmp`
(`/tmp/harnessrl-logs` ...), the one writable scratch a sandbox empties on every reset, so the
grader can create them fresh after the agent is gone on a read-only root.

`export_workdir(client, spec)` then copies the built image's `spec.workdir` to `spec.source`
on the host as a fresh git repository (one commit on `main`, every file included), which the
sandbox image is built from like any other repository. Empty directories are not kept (git
tracks files); a `.git` the image's workdir had is replaced. Nothing here ever pulls.
"""
from __future__ import annotations

import io
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from harnessrl.sandboxes.base import RepoSpec, SandboxError, SandboxUnavailable

#: Where the links of the harbor layout point (the grader writes there after reset).
SCRATCH_LINKS = {"/logs": "/tmp/harnessrl-logs", "/tests": "/tmp/harnessrl-tests",
                 "/solution": "/tmp/harnessrl-solution"}
BASE_ARG = "HARNESSRL_BASE"
_VAR = re.compile(r"\$(\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with backslash continuations joined, comments dropped."""
    out, buf, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if not buf:
            start = number
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _expand(word: str, args: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(2) or m.group(5)
        return args.get(name) or (m.group(4) or "")
    return _VAR.sub(sub, word)


def external_images(dockerfile: str, build_args: dict[str, str]) -> list[tuple[int, str]]:
    """(line, image) for every image the Dockerfile takes from outside itself: `FROM` images
    that are not earlier stages (nor `scratch`) and `COPY --from=` references of the same kind."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    found: list[tuple[int, str]] = []
    for number, line in _logical_lines(dockerfile):
        word, _, rest = line.partition(" ")
        op = word.upper()
        if op == "ARG" and not stages and not found:
            name, _, default = rest.strip().partition("=")
            args[name] = build_args.get(name, default.strip().strip('"'))
        elif op == "FROM":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            if not parts:
                continue
            image = _expand(parts[0], {**args, **build_args})
            if image.lower() != "scratch" and image.lower() not in stages:
                found.append((number, image))
            if len(parts) >= 3 and parts[1].lower() == "as":
                stages.add(parts[2].lower())
            stages.add(str(len(stages)))
        elif op == "COPY":
            for flag in re.findall(r"--from=(\S+)", rest):
                ref = _expand(flag, {**args, **build_args})
                if ref.lower() not in stages and not ref.isdigit():
                    found.append((number, ref))
    return found


def final_workdir(dockerfile: str) -> str | None:
    """The last stage's last `WORKDIR` (relative ones joined), or None when it sets none."""
    workdir: str | None = None
    for _, line in _logical_lines(dockerfile):
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            workdir = None
        elif word.upper() == "WORKDIR":
            path = rest.strip().strip('"')
            workdir = path if path.startswith("/") or workdir is None else f"{workdir.rstrip('/')}/{path}"
            if not path.startswith("/") and workdir and not workdir.startswith("/"):
                workdir = "/" + workdir
    return workdir


def _context_tar(context: Path, dockerfile: str) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path in sorted(context.rglob("*")):
            rel = path.relative_to(context).as_posix()
            if rel != "Dockerfile":
                tf.add(path, arcname=rel, recursive=False)
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(data), 0o644
        tf.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _with_links(dockerfile: str) -> str:
    links = " && ".join(f"rm -rf {link} && ln -s {target} {link}" for link, target in SCRATCH_LINKS.items())
    return (dockerfile.rstrip("\n") + "\n# added by harnessrl: grader scratch on a read-only root\n"
            f"USER 0:0\nRUN {links}\n")


#: Seconds the build stream may go without a line before the build counts as failed.
BUILD_READ_TIMEOUT_S = 600


def build_context_image(client, spec: RepoSpec, base: str) -> str:
    """Build `spec.image` from `spec.image_context` unless present (see the module docstring)."""
    import docker
    import docker.errors
    import requests

    context = Path(spec.image_context or "")
    dockerfile_path = context / "Dockerfile"
    if not dockerfile_path.is_file():
        raise SandboxError(f"{dockerfile_path} does not exist: the task's environment has no Dockerfile")
    try:
        client.images.get(spec.image)
        return spec.image
    except docker.errors.ImageNotFound:
        pass
    text = dockerfile_path.read_text(encoding="utf-8")
    build_args = {BASE_ARG: base}
    for number, image in external_images(text, build_args):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(
                f"{dockerfile_path}:{number}: image {image!r} is not present locally and is never pulled "
                f"(sandboxes build offline); fix: `docker load` or build it here under that tag, or use "
                f"FROM ${{{BASE_ARG}}} (the offline base image, {base})") from None
    log: list[str] = []
    try:  # on the backend's own engine, with a longer read timeout than its other calls
        for chunk in client.api.build(fileobj=_context_tar(context, _with_links(text)), custom_context=True,
                                      timeout=BUILD_READ_TIMEOUT_S, tag=spec.image, pull=False, rm=True,
                                      forcerm=True, network_mode="none", buildargs=build_args, decode=True,
                                      labels={"harnessrl.managed": "1"}):
            if "stream" in chunk:
                log.append(chunk["stream"])
            if "error" in chunk:  # one line: the error, then the build's last lines of output
                text_out = re.sub(r"\x1b\[[0-9;]*m", "", "".join(log))  # the engine colours stderr
                tail = [ln.strip() for ln in text_out.splitlines() if ln.strip()][-4:]
                raise SandboxError(f"building {dockerfile_path} (offline, no network) failed: "
                                   f"{chunk['error'].strip()}; its output ended: {' | '.join(tail)[-600:]}")
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        raise SandboxError(f"building {dockerfile_path} failed: {type(e).__name__}: {e}") from None
    working = (client.images.get(spec.image).attrs.get("Config") or {}).get("WorkingDir") or "/"
    if working.rstrip("/") != spec.workdir.rstrip("/"):
        client.images.remove(spec.image, force=True)
        raise SandboxError(f"{dockerfile_path}: the image's working directory is {working!r}, the task's is "
                           f"{spec.workdir!r}; fix: end the Dockerfile with `WORKDIR {spec.workdir}`")
    return spec.image


def _git(*args: str, cwd: Path) -> None:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
    proc = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "user.name=harnessrl",
                           "-c", "user.email=harnessrl@invalid", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-1000:]}")


def export_workdir(client, spec: RepoSpec) -> str:
    """`spec.image`'s `spec.workdir` as a git repository at `spec.source` (made once)."""
    dest = Path(spec.source)
    if (dest / ".git").is_dir():
        return str(dest)
    container = client.containers.create(spec.image, ["true"], network_mode="none")
    try:
        stream, _ = container.get_archive(spec.workdir)
        data = b"".join(stream)
    finally:
        container.remove(force=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="export-", dir=dest.parent))
    try:
        repo = scratch / "repo"
        repo.mkdir()
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            tf.extractall(scratch / "raw", filter="data")
        top = scratch / "raw" / Path(spec.workdir).name  # the archive holds the folder itself
        for item in top.iterdir():
            if item.name != ".git":
                shutil.move(str(item), repo / item.name)
        _git("init", "-q", "-b", "main", ".", cwd=repo)
        _git("add", "-A", "-f", ".", cwd=repo)
        _git("commit", "-q", "--allow-empty", "-m", "task environment workdir", cwd=repo)
        try:
            repo.rename(dest)
        except OSError:  # another thread exported it first
            if not (dest / ".git").is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return str(dest)
