"""Python harnesses inside the sandbox from a config alone (issue 46 item 1), on real parts: pip
from the package index this machine reaches, the real base image's python3, real Docker.

Installs go to the default toolchain (stamped: the second run of the suite reuses them, well
under a second). Covers: the layout and stamp, launchers that run on the sandbox's interpreter,
the harness's packages reaching neither the agent's `python3` nor its environment, the
read-only mount, the `python` requirement, and mini-swe-agent inside passing check-adapter.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harnessrl.adapters.base import TOOLCHAIN_MOUNT, Mount
from harnessrl.adapters.command import CommandAdapter
from harnessrl.adapters.install import InstallFailed, install_config
from harnessrl.adapters.toolchain import HarnessNotInstalled, installed_spec, toolchain_root

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, docker_backend  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MINI_INSIDE = REPO / "examples" / "harnesses" / "mini-swe-agent-inside.toml"
INSIDE = 'dialect = "openai-chat"\nplacement = "inside"\n'
#: python-dotenv's CLI runs a command with its own environment (`dotenv run CMD`), as a harness
#: runs the agent's commands; its dependency click is not in the sandbox's python3.
DOTENV = 'name = "pip-inside-dotenv"\ninstall = "pip:python-dotenv[cli]==1.2.2"\n' + INSIDE + 'command = ["dotenv"]\n'


def _config(tmp_path: Path, body: str, name: str = "h") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(body)
    return p


def test_pip_inside_is_accepted_and_python_needs_it(tmp_path):
    a = CommandAdapter.from_file(_config(tmp_path, DOTENV + 'python = ">=3.9"\n'))
    assert a.pip_inside and a.install_dir == ("pip", "pip-inside-dotenv")
    with pytest.raises(HarnessNotInstalled, match=r"harness 'pip-inside-dotenv' not installed in .*: run "
                                                  r"`harnessrl harness install .*h.toml`"):
        a.check_installed(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"python and python_runtime need install = \"pip:...\" and placement = \"inside\""):
        CommandAdapter({"name": "x", "dialect": "openai-chat", "placement": "beside", "command": ["x"],
                        "install": "pip:cowsay==6.1", "python": ">=3.12"})
    with pytest.raises(ValueError, match=r"python: python 'new' is not a version requirement"):
        CommandAdapter.from_file(_config(tmp_path, DOTENV + 'python = "new"\n'))


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_built_for_the_sandbox_python_read_only_and_nothing_leaks_to_the_agent(tmp_path):
    backend = docker_backend()
    cfg = _config(tmp_path, DOTENV)
    root = toolchain_root()
    done = install_config(str(cfg), root)
    assert done.spec == "python-dotenv[cli]==1.2.2 for python 3.11"  # the base image's python3
    assert installed_spec("pip", "pip-inside-dotenv", root) == done.spec
    dest = root / "pip" / "pip-inside-dotenv"
    assert sorted(p.name for p in (dest / "bin").iterdir()) == ["dotenv"]  # not click's, not pip's
    assert (dest / "lib" / "click").is_dir() and not (dest / "lib" / "bin").exists()
    assert install_config(str(cfg), root).action == "present"
    CommandAdapter.from_file(cfg).check_installed(root)

    sb = backend.create(builtin_task().repo_spec(), mounts=[Mount(str(root), TOOLCHAIN_MOUNT, True)])
    try:
        env = {"PATH": f"{TOOLCHAIN_MOUNT}/pip/pip-inside-dotenv/bin:/usr/local/bin:/usr/bin:/bin"}
        version = sb.exec("dotenv --version", timeout=60, env=env)
        assert version.exit_code == 0 and version.output.strip() == "dotenv, version 1.2.2"
        # the harness (its interpreter has click) runs the agent's command with its environment
        probe = ("import os, sys; print('A=' + os.environ['A']); print([p for p in sys.path if 'toolchain' in p]); "
                 "print({k for k in os.environ if k.startswith('PYTHON') and k != 'PYTHONDONTWRITEBYTECODE'}); "
                 "import click")
        sb.write_file("/tmp/h.env", b"A=1\n")
        r = sb.exec(f"dotenv -f /tmp/h.env run python3 -u -c \"{probe}\" 2>&1; echo rc=$?", timeout=60, env=env)
        lines = r.output.strip().splitlines()
        assert lines[:3] == ["A=1", "[]", "set()"], r.output
        assert "ModuleNotFoundError: No module named 'click'" in r.output and lines[-1] == "rc=1"
        plain = sb.exec("python3 -c 'import dotenv' 2>&1; echo rc=$?", timeout=60)
        assert "No module named 'dotenv'" in plain.output and plain.output.strip().endswith("rc=1")
        w = sb.exec(f"touch {TOOLCHAIN_MOUNT}/pip/pip-inside-dotenv/lib/x 2>&1; echo rc=$?", timeout=60)
        assert "Read-only file system" in w.output and "rc=1" in w.output
    finally:
        sb.close()
        backend.reap(run_id=backend.run_id)
    assert not (dest / "lib" / "x").exists()


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_python_runtime_runs_the_harness_on_debian_cpython_3_13_and_the_agent_keeps_3_11(tmp_path):
    """A harness needing >= 3.12 in the 3.11 sandbox: the runtime from Debian's archive, offline at run time."""
    backend = docker_backend()
    name = "pip-inside-dotenv-313"
    cfg = _config(tmp_path, DOTENV.replace("pip-inside-dotenv", name) + 'python = ">=3.12"\npython_runtime = "3.13"\n')
    root = toolchain_root()
    done = install_config(str(cfg), root)
    assert done.spec == "python-dotenv[cli]==1.2.2 for python 3.13"
    assert installed_spec("python", "3.13", root) == "python 3.13 from debian trixie"
    assert install_config(str(cfg), root).action == "present"
    CommandAdapter.from_file(cfg).check_installed(root)
    sb = backend.create(builtin_task().repo_spec(), mounts=[Mount(str(root), TOOLCHAIN_MOUNT, True)])
    try:
        env = {"PATH": f"{TOOLCHAIN_MOUNT}/pip/{name}/bin:/usr/local/bin:/usr/bin:/bin"}
        sb.write_file("/tmp/h.env", b"A=1\n")
        # the launcher exits 3 on any interpreter but the 3.13 it was built for
        version = sb.exec("dotenv --version", timeout=60, env=env)
        assert version.exit_code == 0 and version.output.strip() == "dotenv, version 1.2.2", version.output
        py = f"{TOOLCHAIN_MOUNT}/python/3.13/usr/bin/python3.13"
        own = sb.exec(f"{py} -I -c 'import sys, ssl, sqlite3, ctypes; print(sys.version_info[:2], sys.prefix)'",
                      timeout=60)
        assert own.output.strip() == f"(3, 13) {TOOLCHAIN_MOUNT}/python/3.13/usr", own.output
        sb.write_file("/tmp/who.sh", b"python3 -u -c 'import sys; print(sys.version_info[:2]); import click' 2>&1\n")
        r = sb.exec("dotenv -f /tmp/h.env run sh /tmp/who.sh", timeout=60, env=env)
        lines = r.output.strip().splitlines()
        assert lines[0] == "(3, 11)" and lines[-1] == "ModuleNotFoundError: No module named 'click'", r.output
        w = sb.exec(f"touch {TOOLCHAIN_MOUNT}/python/3.13/x 2>&1; echo rc=$?", timeout=60)
        assert "Read-only file system" in w.output and "rc=1" in w.output
    finally:
        sb.close()
        backend.reap(run_id=backend.run_id)


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(300)
def test_a_python_requirement_the_sandbox_misses_names_both_versions(tmp_path):
    docker_backend()
    cfg = _config(tmp_path, DOTENV.replace("pip-inside-dotenv", "needs-99") + 'python = ">=99"\n')
    with pytest.raises(InstallFailed, match=r"python-dotenv\[cli\]==1.2.2 needs python >=99, but the sandbox "
                                            r"image harnessrl/base:\w+ has python 3.11"):
        install_config(str(cfg), tmp_path / "tc")
    assert installed_spec("pip", "needs-99", tmp_path / "tc") is None


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mini_swe_agent_inside_from_its_config_alone_passes_check_adapter():
    """Installed by pip for the sandbox's python3 (cached in the toolchain), then all checks PASS."""
    from harnessrl.gym.tools.check_adapter import check_adapter

    docker_backend()
    done = install_config(str(MINI_INSIDE))
    assert done.spec == "mini-swe-agent==2.4.6 for python 3.11"
    rep = check_adapter(str(MINI_INSIDE), "docker", 300)
    assert rep.ok, [(c.name, c.detail) for c in rep.checks if not c.ok]
    names = [c.name for c in rep.checks]
    assert {"gold: reward 1.0", "empty: reward 0.0", "gold: token-exact record",
            "first prompt fits the context"} <= set(names)
    assert rep.harness["gold"]["exit_code"] == 0
