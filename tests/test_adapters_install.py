"""scripts/install_harnesses.sh: pins, argument errors, and the idempotent fast path."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harnessrl.adapters import get_adapter
from harnessrl.adapters.toolchain import HarnessNotInstalled, installed_spec, require, toolchain_root

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_harnesses.sh"
HARNESSES = ["mini-swe-agent", "codex", "claude-code", "opencode", "aider", "gemini-cli"]


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_list_matches_the_adapters_pins():
    out = _run("--list")
    assert out.returncode == 0
    pins = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert list(pins) == HARNESSES
    for name, spec in pins.items():
        # The script and each adapter module pin the same package at the same version.
        assert get_adapter(name).install.split(":", 1)[1] == spec


def test_unknown_harness_is_refused_with_the_known_names(tmp_path):
    out = _run("codx", env={"HARNESSRL_HOME": str(tmp_path)})
    assert out.returncode == 2
    assert "unknown harness 'codx'" in out.stderr and "claude-code" in out.stderr
    assert not (tmp_path / "toolchain").exists() or not any((tmp_path / "toolchain").iterdir())


def test_require_names_the_fix_when_missing(tmp_path):
    with pytest.raises(HarnessNotInstalled, match=r"harness .codex. not installed in .*: run `scripts/install_harnesses.sh codex`"):
        require("npm", "codex", "@openai/codex@0.171.0", tmp_path)
    (tmp_path / "npm" / "codex").mkdir(parents=True)
    (tmp_path / "npm" / "codex" / ".harnessrl-installed").write_text("@openai/codex@0.1.0\n")
    with pytest.raises(HarnessNotInstalled, match="installed at '@openai/codex@0.1.0', want '@openai/codex@0.171.0'"):
        require("npm", "codex", "@openai/codex@0.171.0", tmp_path)


@pytest.mark.harness
def test_second_run_is_a_no_op_when_installed():
    missing = [h for h in HARNESSES
               if installed_spec("npm" if get_adapter(h).install.startswith("npm") else "venvs", h) is None]
    if missing:
        pytest.skip(f"not installed in {toolchain_root()}: {missing} (scripts/install_harnesses.sh)")
    out = _run()
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [line.split(":")[1].strip().split(" ")[0] for line in lines if "present" in line][:1] == ["node"]
    assert sum("present" in line for line in lines) == len(HARNESSES) + 1  # + node
    assert not any("installed in" in line for line in lines)
