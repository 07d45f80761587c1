"""The wheel installs one import namespace, `harnessrl`, and never bare gym/adapters/... modules."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_wheel_installs_only_the_harnessrl_namespace(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("harnessrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    code_tops = {t for t in tops if not t.endswith((".dist-info", ".data"))}
    assert code_tops == {"harnessrl"}, code_tops
    for layer in ("gym", "adapters", "sandboxes", "trainers"):
        assert f"harnessrl/{layer}/__init__.py" in names
    assert "harnessrl/cli.py" in names
    assert not any(n.startswith("harnessrl/tests/") for n in names), "tests must not ship"
    # Every folder with an __init__.py in the source tree must be in the wheel (the package
    # list in pyproject.toml is explicit; a forgotten sub-package would silently vanish).
    for init in ROOT.glob("*/**/__init__.py"):
        rel = init.relative_to(ROOT)
        if rel.parts[0] in ("gym", "adapters", "sandboxes", "trainers"):
            assert f"harnessrl/{rel.as_posix()}" in names, f"{rel} missing from the wheel: add it to pyproject packages"
    # Data the package reads at run time ships too: every file of the shipped Harbor tasks.
    for f in (ROOT / "gym" / "tasks" / "suites" / "harbor").rglob("*"):
        if f.is_file():
            rel = f.relative_to(ROOT).as_posix()
            assert f"harnessrl/{rel}" in names, f"{rel} missing from the wheel: add it to package-data"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "harnessrl = harnessrl.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_torch_pin_is_the_cpu_wheel_version() -> None:
    # setup.sh pins the CPU wheel, first alone and again on the extras' line so nothing can
    # upgrade it; the core takes a range (test_extras: the extras resolve against it).
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "\n  pipq torch==2.13.0\n" in setup
    assert '\n  pipq -e ".[dev,bridges]" torch==2.13.0 transformers==5.8.0\n' in setup
    text = (ROOT / "pyproject.toml").read_text()
    assert '"torch==' not in text and '"torch>=2.4",' in text
    gpu = text.split("[project.optional-dependencies]")[1].split("\n\n")[0]
    assert "sglang" in gpu


def test_env_layer_imports_without_torch() -> None:
    code = (
        "import sys, harnessrl.gym, harnessrl.adapters, harnessrl.sandboxes, harnessrl.gym.models;"
        "bad=[m for m in ('torch','ray','sglang') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_version_and_help() -> None:
    out = subprocess.run([sys.executable, "-m", "harnessrl.cli", "version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "0.1.0"
