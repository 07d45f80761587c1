"""scripts/need_docker_engine.sh: set-up installs docker.io exactly when no engine is there.

The machine image ships a `docker` CLI without `dockerd`; the old check (`command -v docker`)
skipped the install and set-up then failed to start the daemon. These run the real script
with fake `docker` / `dockerd` executables on a controlled PATH.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "need_docker_engine.sh"


def _exe(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _needs_install(tmp_path: Path, *, cli: str | None, dockerd: bool) -> bool:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if cli is not None:
        _exe(bin_dir / "docker", cli)
    if dockerd:
        _exe(bin_dir / "dockerd", "exit 0")
    env = {"PATH": f"{bin_dir}:/bin:/usr/bin", "DOCKERD_SEARCH_PATH": str(bin_dir), "HOME": str(tmp_path)}
    if cli is None:  # no CLI at all: make sure no real `docker` on /usr/bin is found first
        env["PATH"] = str(bin_dir) + ":" + str(tmp_path / "empty")
    done = subprocess.run(["/bin/bash", str(SCRIPT)], env=env, capture_output=True, timeout=30)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def test_cli_without_engine_needs_docker_io(tmp_path):
    # This image's state: `docker` exists, `docker info` fails, no dockerd anywhere.
    assert _needs_install(tmp_path, cli="exit 1", dockerd=False)


def test_nothing_installed_needs_docker_io(tmp_path):
    assert _needs_install(tmp_path, cli=None, dockerd=False)


def test_engine_binary_present_needs_no_install(tmp_path):
    assert not _needs_install(tmp_path, cli="exit 1", dockerd=True)


def test_running_engine_needs_no_install(tmp_path):
    # An engine answers `docker info` (e.g. a remote DOCKER_HOST): nothing to install.
    assert not _needs_install(tmp_path, cli='[ "$1" = info ] && exit 0; exit 1', dockerd=False)


def test_setup_uses_the_engine_check():
    setup = (SCRIPT.parent / "setup.sh").read_text()
    assert "need_docker_engine.sh" in setup
    assert "command -v docker >/dev/null 2>&1 || need+=(docker.io)" not in setup
    assert os.access(SCRIPT, os.X_OK)
