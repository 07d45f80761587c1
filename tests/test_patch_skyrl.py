"""scripts/patch_skyrl.py: the one import line it rewrites, and the interface it makes importable."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "patch_skyrl.py"
spec = importlib.util.spec_from_file_location("patch_skyrl", SCRIPT)
patch_skyrl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(patch_skyrl)

HEAD = "from __future__ import annotations\n\nfrom enum import Enum\n"
TAIL = "from urllib.parse import urlparse\n\nclass MultiModalKwargs(TypedDict):\n    pixel_values: Any | None\n"


def test_rewrites_only_the_typing_import_and_is_idempotent(tmp_path):
    f = tmp_path / "types.py"
    f.write_text(HEAD + "from typing import Annotated, Any, Literal, TypedDict\n" + TAIL)
    assert subprocess.run([sys.executable, str(SCRIPT), str(f)], capture_output=True).returncode == 0
    want = (HEAD + "from typing import Annotated, Any, Literal\n\nfrom typing_extensions import TypedDict"
            "  # patched by harnessrl: pydantic needs it on Python < 3.12\n" + TAIL)
    assert f.read_text() == want
    assert patch_skyrl.patch_text(want) == want


def test_an_unknown_file_is_a_clear_error(tmp_path):
    f = tmp_path / "types.py"
    f.write_text(HEAD + TAIL)
    done = subprocess.run([sys.executable, str(SCRIPT), str(f)], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr == ("patch_skyrl: skyrl/tinker/types.py does not hold the import line this patch expects "
                           "('from typing import Annotated, Any, Literal, TypedDict'); is skyrl 0.3.0 installed?\n")
    assert f.read_text() == HEAD + TAIL


def test_the_installed_skyrl_gives_the_generator_interface():
    pytest.importorskip("skyrl", reason="skyrl comes with the bridges extra (scripts/setup.sh installs it)")
    code = ("from skyrl.train.generators.base import GeneratorInterface, GeneratorInput, GeneratorOutput, TrajectoryID;"
            "import inspect; print(TrajectoryID('task-1', 2).to_string(), inspect.isabstract(GeneratorInterface),"
            " sorted(GeneratorInput.__annotations__)[:2])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "task-1_2 True ['batch_metadata', 'env_classes']"
