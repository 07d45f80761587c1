"""Custom harnesses from a config file alone (issue 16 item 1), on real parts: real npm and pip
installs into a toolchain under tmp_path, real Docker sandboxes, the real proxy on loopback,
the scripted policy with the real tokenizer, and Grok CLI (npm) as a harness no module knows.

Covers `install` + stamp + a no-op second run + a reinstall on a changed version, the `node`
requirement, `mounts` (read-only in the sandbox; refused places), separate model and toolchain
locations, the harness's exit code and stream tails in every failure (check-adapter, the
record, the rollout report), and prompts that do not fit the context (check-adapter's numbers;
an engine 400 ends the episode `context_exceeded` with the engine's numbers).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.adapters.command import CommandAdapter
from harnessrl.adapters.host_mounts import parse_mount
from harnessrl.adapters.install import InstallFailed, install_config, main as harness_main
from harnessrl.adapters.toolchain import HarnessNotInstalled, NodeTooOld, installed_spec, node_version, toolchain_root

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, docker_backend, scripted_stack  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GROK = REPO / "examples" / "harnesses" / "grok-cli.toml"
BESIDE = {"dialect": "openai-chat", "placement": "beside"}


def _config(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(f'name = "{name}"\n{body}\n')
    return p


# -- install ----------------------------------------------------------------------------------
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_npm_install_is_stamped_a_second_run_is_a_no_op_and_a_new_version_reinstalls(tmp_path):
    root = tmp_path / "toolchain"
    cfg = _config(tmp_path, "semver-cli", 'install = "npm:semver@7.6.3"\ndialect = "openai-chat"\n'
                                          'placement = "inside"\ncommand = ["semver", "1.2.3"]')
    first = install_config(str(cfg), root)
    assert first.action == "installed" and first.path == root / "npm" / "semver-cli"
    assert installed_spec("npm", "semver-cli", root) == "semver@7.6.3"
    host_node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    assert node_version(root) == host_node[1:]
    # the installed CLI runs on the toolchain's own node
    out = subprocess.run([str(root / "node/bin/node"), str(root / "npm/semver-cli/bin/semver"), "-i", "minor", "1.2.3"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "1.3.0"
    stamp = root / "npm" / "semver-cli" / ".harnessrl-installed"
    before = stamp.stat().st_mtime_ns
    again = install_config(str(cfg), root)
    assert again.action == "present" and stamp.stat().st_mtime_ns == before
    CommandAdapter.from_file(cfg).check_installed(root)  # launchable now
    cfg.write_text(cfg.read_text().replace("7.6.3", "7.6.2"))
    with pytest.raises(HarnessNotInstalled, match=r"installed at 'semver@7.6.3', want 'semver@7.6.2'.*"
                                                  r"run `harnessrl harness install .*semver-cli.toml`"):
        CommandAdapter.from_file(cfg).check_installed(root)
    third = install_config(str(cfg), root)
    assert third.action == "installed" and installed_spec("npm", "semver-cli", root) == "semver@7.6.2"
    assert not (root / "npm" / "semver-cli.tmp").exists()


@pytest.mark.harness
@pytest.mark.timeout(600)
def test_after_install_runs_once_in_the_prefix_before_the_stamp_and_is_part_of_it(tmp_path):
    """`after_install` (Copilot CLI's unpack-once) runs on the real installed CLI, in its prefix,
    with its bin/ and the toolchain's node on PATH; a failing one leaves no stamp; changing it
    reinstalls, and an install without it no longer counts."""
    root = tmp_path / "toolchain"
    body = ('install = "npm:semver@7.6.3"\ndialect = "openai-chat"\nplacement = "inside"\ncommand = ["semver", "1.2.3"]\n'
            'after_install = ["bash", "-c", "semver -i minor 1.2.3 > \\"$$OUT\\"; echo $$PWD >> \\"$$OUT\\""]\n'
            '[after_install_env]\nOUT = "${prefix}/unpacked.txt"\n')
    cfg = _config(tmp_path, "semver-after", body)
    done = install_config(str(cfg), root)
    prefix = root / "npm" / "semver-after"
    assert done.action == "installed" and (prefix / "unpacked.txt").read_text() == f"1.3.0\n{prefix}\n"
    stamp = installed_spec("npm", "semver-after", root)
    assert stamp.startswith("semver@7.6.3 + after ") and len(stamp) == len("semver@7.6.3 + after ") + 12
    CommandAdapter.from_file(cfg).check_installed(root)
    assert install_config(str(cfg), root).action == "present"
    cfg.write_text(cfg.read_text().replace("-i minor", "-i major"))
    with pytest.raises(HarnessNotInstalled, match="installed at 'semver@7.6.3 \\+ after [0-9a-f]{12}', want "
                                                  "'semver@7.6.3 \\+ after [0-9a-f]{12}'"):
        CommandAdapter.from_file(cfg).check_installed(root)
    assert install_config(str(cfg), root).action == "installed" and (prefix / "unpacked.txt").read_text().startswith("2.0.0\n")
    failing = _config(tmp_path, "semver-fails", body.replace("semver -i minor", "exit 3; semver"))
    with pytest.raises(InstallFailed, match=r"after_install \[.*\] failed \(exit 3\)"):
        install_config(str(failing), root)
    assert installed_spec("npm", "semver-fails", root) is None
    with pytest.raises(ValueError, match="after_install needs an npm or beside pip install"):
        CommandAdapter({"name": "x", "dialect": "openai-chat", "placement": "inside", "command": ["x"],
                        "after_install": ["true"]})


@pytest.mark.harness
@pytest.mark.timeout(600)
def test_pip_install_makes_a_stamped_venv_and_the_cli_command_installs_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESSRL_TOOLCHAIN", str(tmp_path / "tc"))
    cfg = _config(tmp_path, "cowsay-cli", 'install = "pip:cowsay==6.1"\ndialect = "openai-chat"\n'
                                          'placement = "beside"\ncommand = ["${bin}/cowsay", "-t", "moo"]')
    assert harness_main(["install", str(cfg)]) == 0
    assert "cowsay==6.1: installed" in capsys.readouterr().out
    venv = tmp_path / "tc" / "venvs" / "cowsay-cli"
    assert installed_spec("venvs", "cowsay-cli", tmp_path / "tc") == "cowsay==6.1"
    out = subprocess.run([str(venv / "bin" / "cowsay"), "-t", "moo"], capture_output=True, text=True, timeout=60)
    assert "moo" in out.stdout
    assert not (tmp_path / "tc" / "node").exists()  # a pip harness needs no node
    assert harness_main(["install", str(cfg)]) == 0
    assert "cowsay==6.1: present" in capsys.readouterr().out


def test_a_config_install_must_be_pinned_and_pip_inside_goes_to_its_own_folder(tmp_path):
    for bad in ("npm:semver", "npm:semver@^7", "pip:cowsay>=6", "brew:cowsay", "pip:cowsay"):
        with pytest.raises(ValueError, match=r"install .*want \"npm:<package>@<x.y.z>\""):
            CommandAdapter({"name": "x", **BESIDE, "command": ["x"], "install": bad})
    inside = CommandAdapter({"name": "x", "dialect": "openai-chat", "placement": "inside", "command": ["x"],
                             "install": "pip:cowsay==6.1"})
    assert inside.install_dir == ("pip", "x")  # built for the sandbox's python3 (tests/test_pip_inside.py)
    assert CommandAdapter({"name": "x", **BESIDE, "command": ["x"], "install": "pip:cowsay==6.1"}).install_dir == (
        "venvs", "x")


def test_not_installed_names_the_command_to_run(tmp_path):
    a = CommandAdapter.from_file(GROK)
    with pytest.raises(HarnessNotInstalled, match=rf"harness 'grok-cli' not installed in {tmp_path}: "
                                                  rf"run `harnessrl harness install {GROK}`"):
        a.check_installed(tmp_path)
    assert a.install_dir == ("npm", "grok-cli")  # npm_prefix defaults to the name


def test_rollout_and_check_adapter_name_the_install_command_before_running(tmp_path, monkeypatch, capsys):
    from harnessrl.cli import main
    from harnessrl.gym.tools.check_adapter import check_adapter

    monkeypatch.setenv("HARNESSRL_TOOLCHAIN", str(tmp_path / "empty"))
    assert main(["rollout", "--harness", str(GROK), "--episodes", "1", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == ("harnessrl rollout: harness 'grok-cli' not installed in "
                                               f"{tmp_path / 'empty'}: run `harnessrl harness install {GROK}`")
    assert not (tmp_path / "run").exists()  # nothing started
    rep = check_adapter(str(GROK))
    installed = rep.checks[-1]
    assert (installed.name, installed.ok) == ("installed", False) and not rep.ok
    assert installed.detail.endswith(f"run `harnessrl harness install {GROK}`")


def test_a_node_requirement_the_toolchain_misses_is_an_error_naming_both_versions(tmp_path, capsys, monkeypatch):
    root = tmp_path / "tc"
    cfg = _config(tmp_path, "future", 'install = "npm:semver@7.6.3"\nnode = ">=99"\ndialect = "openai-chat"\n'
                                      'placement = "inside"\ncommand = ["semver"]')
    with pytest.raises(NodeTooOld, match=r"harness 'future' \(semver@7.6.3\) needs node >=99, but the toolchain's "
                                         r"node is v\d+\.\d+\.\d+"):
        install_config(str(cfg), root)
    assert not (root / "npm" / "future").exists()  # refused before npm ran
    monkeypatch.setenv("HARNESSRL_TOOLCHAIN", str(root))
    assert harness_main(["install", str(cfg)]) == 2
    assert "needs node >=99, but the toolchain's node is v" in capsys.readouterr().err
    # installed under an older requirement, then the config asks for more: the launch check says so
    (root / "npm" / "future").mkdir(parents=True)
    (root / "npm" / "future" / ".harnessrl-installed").write_text("semver@7.6.3\n")
    with pytest.raises(NodeTooOld, match=r"needs node >=99, but the toolchain's node is v"):
        CommandAdapter.from_file(cfg).check_installed(root)
    with pytest.raises(ValueError, match=r"node 'twenty' is not a version requirement"):
        CommandAdapter({"name": "x", **BESIDE, "command": ["x"], "node": "twenty"})
    with pytest.raises(ValueError, match=r"node_runtime '22': want one exact node version"):
        CommandAdapter({"name": "x", **BESIDE, "command": ["x"], "node_runtime": "22"})
    with pytest.raises(ValueError, match=r"node_runtime needs an npm install"):
        CommandAdapter({"name": "x", **BESIDE, "command": ["x"], "node_runtime": "22.23.5"})


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_node_runtime_installs_a_newer_node_from_npm_that_the_harness_runs_on_in_the_sandbox(tmp_path):
    from harnessrl.adapters.base import TOOLCHAIN_MOUNT, Mount

    root = tmp_path / "tc"
    body = ('install = "npm:semver@7.6.3"\nnode = ">=22"\ndialect = "openai-chat"\nplacement = "inside"\n'
            'command = ["semver"]\n')
    bare = _config(tmp_path, "needs22", body)
    if node_version(root) is None and int(subprocess.run(["node", "--version"], capture_output=True,
                                                          text=True).stdout[1:].split(".")[0]) >= 22:
        pytest.skip("the host node already satisfies >=22")
    with pytest.raises(NodeTooOld, match=r"needs node >=22, but the toolchain's node is v\d+.*set node_runtime"):
        install_config(str(bare), root)
    own = tmp_path / "needs22-own.toml"
    own.write_text(bare.read_text() + 'node_runtime = "22.23.5"\n')
    done = install_config(str(own), root)
    assert done.action == "installed" and done.spec == "semver@7.6.3 + node 22.23.5"
    assert installed_spec("npm", "needs22", root) == "semver@7.6.3 + node 22.23.5"
    assert install_config(str(own), root).action == "present"
    CommandAdapter.from_file(own).check_installed(root)
    with pytest.raises(HarnessNotInstalled, match=r"installed at 'semver@7.6.3 \+ node 22.23.5', want 'semver@7.6.3'"):
        CommandAdapter.from_file(bare).check_installed(root)
    backend = docker_backend()
    for d in (tmp_path, root):
        d.chmod(0o755)
    sb = backend.create(builtin_task().repo_spec(), mounts=[Mount(str(root), TOOLCHAIN_MOUNT, True)])
    try:
        path = f"{TOOLCHAIN_MOUNT}/npm/needs22/bin:{TOOLCHAIN_MOUNT}/node/bin:/usr/bin:/bin"  # as the adapter sets it
        r = sb.exec(f"export PATH={path}; node --version; semver -i minor 1.2.3", timeout=120)
        assert r.exit_code == 0 and r.output.split() == ["v22.23.5", "1.3.0"], r.output
    finally:
        sb.close()
        backend.reap(run_id=backend.run_id)


def test_models_and_toolchain_move_separately(tmp_path, monkeypatch):
    from harnessrl.gym.tools.doctor import check_locations
    from harnessrl.gym.models import model_dir

    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HARNESSRL_MODELS", raising=False)
    monkeypatch.delenv("HARNESSRL_TOOLCHAIN", raising=False)
    assert toolchain_root() == tmp_path / "home" / "toolchain"
    assert model_dir("tiny-llama") == tmp_path / "home" / "models" / "tiny-llama"
    monkeypatch.setenv("HARNESSRL_TOOLCHAIN", str(tmp_path / "tc"))
    assert toolchain_root() == tmp_path / "tc" and model_dir("tiny-llama").parent == tmp_path / "home" / "models"
    monkeypatch.setenv("HARNESSRL_MODELS", str(tmp_path / "m"))
    assert model_dir("tiny-llama") == tmp_path / "m" / "tiny-llama" and toolchain_root() == tmp_path / "tc"
    detail = check_locations().detail
    assert f"models {tmp_path / 'm'}" in detail and f"toolchain {tmp_path / 'tc'}" in detail
    script = subprocess.run(["bash", str(REPO / "scripts" / "install_harnesses.sh"), "--print-home"],
                            capture_output=True, text=True, env={**os.environ}, timeout=30)
    assert script.stdout.strip() == str(tmp_path / "tc")


# -- mounts -----------------------------------------------------------------------------------
def test_mount_paths_are_validated_and_sensitive_ones_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    assert parse_mount(str(data)).target == str(data) and parse_mount(str(data)).read_only
    m = parse_mount(f"{data}:/opt/extra")
    assert (m.host, m.target, m.read_only) == (str(data), "/opt/extra", True)
    (tmp_path / "to-etc").symlink_to("/etc")
    cases = {
        "relative/path": "must be absolute",
        f"{data}:relative": "must be absolute",
        str(tmp_path / "missing"): "does not exist on this host",
        "/": "refused: / is refused whole",
        "/etc": "refused: /etc is under /etc",
        "/etc/ssl": "refused: /etc/ssl is under /etc",
        str(tmp_path / "to-etc"): "refused: /etc is under /etc",  # resolved before judged
        "/proc/self": "is under /proc",
        "/root": "refused whole",
        f"{data}:/": "target / is reserved",
        f"{data}:/opt/harnessrl-toolchain/x": "target /opt/harnessrl-toolchain/x is reserved",
        f"{data}:/run/harnessrl": "is reserved",
        f"{data}:/usr/bin": "is reserved",
    }
    if os.path.exists("/var/run/docker.sock"):
        cases["/var/run/docker.sock"] = "refused: /run/docker.sock is under /run"
    for entry, why in cases.items():
        with pytest.raises(ValueError, match=rf"mounts: '{entry}': .*{why}"):
            parse_mount(entry)
    with pytest.raises(ValueError, match=r"invalid harness config: .*mounts: '/etc': refused"):
        CommandAdapter.from_file(_config(tmp_path, "m", 'dialect = "openai-chat"\nplacement = "beside"\n'
                                                       'command = ["x"]\nmounts = ["/etc"]'))


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_mounts_are_visible_read_only_in_the_sandbox(tmp_path):
    from harnessrl.adapters.base import Endpoint

    backend = docker_backend()
    data = tmp_path / "prefix"
    (data / "bin").mkdir(parents=True)
    (data / "bin" / "hello").write_text("#!/bin/sh\necho hello from the mount\n")
    (data / "bin" / "hello").chmod(0o755)
    data.chmod(0o755)
    tmp_path.chmod(0o755)
    a = CommandAdapter({"name": "m", **BESIDE, "command": ["x"], "mounts": [str(data), f"{data}:/opt/extra"]})
    mounts = a.mounts(Endpoint("http://127.0.0.1:1/s/x", "k", "policy"))
    assert [(m.target, m.read_only) for m in mounts] == [(str(data), True), ("/opt/extra", True)]
    sb = backend.create(builtin_task().repo_spec(), mounts=mounts)
    try:
        for where in (str(data), "/opt/extra"):
            r = sb.exec(f"{where}/bin/hello", timeout=60)
            assert r.exit_code == 0 and r.output.strip() == "hello from the mount"
            w = sb.exec(f"touch {where}/new 2>&1; echo rc=$?", timeout=60)
            assert "Read-only file system" in w.output and "rc=1" in w.output
        assert not (data / "new").exists()
    finally:
        sb.close()
        backend.reap(run_id=backend.run_id)


# -- failures that show why -------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_missing_harness_command_shows_exit_127_and_its_stderr_everywhere(tmp_path):
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode
    from harnessrl.gym.rollout import report

    inside = CommandAdapter({"name": "missing-inside", "dialect": "openai-chat", "placement": "inside",
                             "command": ["no-such-harness-cli", "${task}"]})
    task = builtin_task()
    with scripted_stack() as (engine, proxy, backend):
        engine.set_tasks([task], gold=True)
        res = run_episode(task, inside, lambda s, m: backend.create(s, mounts=m), ProxyHandle.of(proxy), "policy",
                          EpisodeConfig(max_calls=5, wall_time_s=120))
    meta = res.trajectory.metadata
    assert res.harness.exit_code == 127 and meta["harness_exit_code"] == 127
    assert "no-such-harness-cli" in meta["harness_stderr_tail"] and "No such file" in meta["harness_stderr_tail"]
    assert (res.reason, res.status) == ("infra", "infra_error")  # it never ran: masked, not a 0 to learn from
    assert res.error.startswith("the harness did not start: exit 127; stderr: ") and "no-such-harness-cli" in res.error
    fail, = report([res.trajectory])["failures"]
    assert fail["exit_code"] == 127 and "no-such-harness-cli" in fail["stderr_tail"]
    assert fail["ending"] == res.error and fail["termination"] == "infra"


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_check_adapter_fails_a_missing_command_with_127_and_the_stderr_tail(tmp_path):
    from harnessrl.gym.tools.check_adapter import check_adapter

    docker_backend()
    cfg = _config(tmp_path, "gone", 'dialect = "openai-chat"\nplacement = "beside"\n'
                                    'command = ["/nonexistent/bin/agent-cli", "${task}"]')
    rep = check_adapter(str(cfg), "docker", 60)
    checks = {c.name: c for c in rep.checks}
    assert not rep.ok and not checks["gold: reward 1.0"].ok
    detail = checks["gold: ends with a reason"].detail
    assert "exit 127; stderr: /nonexistent/bin/agent-cli: No such file or directory" in detail, detail
    assert rep.harness["gold"]["exit_code"] == 127 and "agent-cli" in rep.harness["gold"]["stderr_tail"]


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_check_adapter_fails_a_first_prompt_over_the_context_with_both_numbers():
    from harnessrl.gym.tools.check_adapter import check_adapter

    docker_backend()
    rep = check_adapter(str(REPO / "examples" / "harnesses" / "tiny-agent.toml"), "docker", 120, context=64)
    fits = next(c for c in rep.checks if c.name == "first prompt fits the context")
    assert not fits.ok and not rep.ok
    n = int(fits.detail.split("first prompt ")[1].split(" tokens")[0])
    assert n > 64 and "context length 64 (--context-length)" in fits.detail
    assert all(c.ok for c in rep.checks if c.name != fits.name)  # the rest of the contract holds


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_an_engine_400_for_a_long_prompt_ends_the_episode_context_exceeded_with_the_numbers():
    from harnessrl.gym.doubles.standin import StandinEngine
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.served import ServedApp

    backend = docker_backend()
    tiny = CommandAdapter.from_file(REPO / "examples" / "harnesses" / "tiny-agent.toml")
    task = builtin_task()
    eng = StandinEngine(max_context=100)
    with ServedApp(eng.app()) as served, \
            ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama"),
                        tokenizer=load_tokenizer("tiny-llama")) as p:
        res = run_episode(task, tiny, lambda s, m: backend.create(s, mounts=m), ProxyHandle.of(p), "policy",
                          EpisodeConfig(max_calls=5, wall_time_s=120))
    backend.reap(run_id=backend.run_id)
    t = res.trajectory
    assert (res.reason, res.status, t.termination) == ("context_exceeded", "truncated", "context_exceeded")
    refused, = t.calls
    assert refused.flags["detached"] == "refused" and refused.completion_ids == [] and t.segments == []
    n = refused.flags["prompt_tokens"]
    assert n >= 100 and f"{n} tokens do not fit the context length 100" in t.metadata["ending"]
    assert t.metadata["harness_exit_code"] == 2 and "model call failed" in t.metadata["harness_stdout_tail"]
    assert t.metadata["ending"].startswith(f"the engine refused call 0's prompt of {n} tokens")


# -- a real harness no module knows: Grok CLI, installed from its config alone ----------------
@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grok_cli_from_its_config_alone_passes_the_contract_in_docker():
    """Gold plan -> 1.0, empty -> 0.0, token-exact record, first prompt within the context."""
    from harnessrl.gym.tools.check_adapter import check_adapter

    docker_backend()
    try:
        CommandAdapter.from_file(GROK).check_installed()
    except HarnessNotInstalled as e:
        pytest.skip(str(e))
    rep = check_adapter(str(GROK), "docker", 300)
    assert rep.ok, [(c.name, c.detail) for c in rep.checks if not c.ok]
    names = [c.name for c in rep.checks]
    assert {"gold: reward 1.0", "empty: reward 0.0", "gold: token-exact record",
            "first prompt fits the context"} <= set(names)
    gold = rep.harness["gold"]
    assert gold["exit_code"] == 0 and '"name":"bash"' in gold["stdout_tail"]  # its own JSON-lines transcript
