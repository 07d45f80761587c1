"""The extras resolve against the core requirements, proven from package metadata only.

For every `name==version` pin of an extra, the test reads that release's declared
requirements (Requires-Dist, markers evaluated for this interpreter and platform): from the
installed distribution when the pinned version is installed, else from the METADATA of
that one wheel (`pip download --no-deps`, kept under $HARNESSRL_HOME/wheels; sglang's wheel
is 39 MB, and no CUDA build or other dependency is ever fetched). Each requirement on a package that the core, the same extra or setup.sh's pins also
constrain must share at least one version with them. So the core cannot re-pin
torch==2.13.0 (sglang 0.5.23 pins torch 2.14.1) or cap transformers<5 (sglang pins 5.19.0,
verl and skyrl need >=5.5.3 / >=5.6.1) without this failing; and setup.sh's
transformers==5.8.0 / torch==2.13.0 must satisfy every bridge framework.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from harnessrl.gym.models import home

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CORE = [Requirement(r) for r in PYPROJECT["dependencies"]]
EXTRAS = {name: [Requirement(r) for r in reqs] for name, reqs in PYPROJECT["optional-dependencies"].items()}


def _setup_pins() -> dict[str, SpecifierSet]:
    """The pins setup.sh puts on the line that installs the extras (torch, transformers)."""
    line = next(ln for ln in (ROOT / "scripts" / "setup.sh").read_text().splitlines()
                if re.match(r'\s*pipq -e "\.\[', ln))
    return {canonicalize_name(r.name): r.specifier for r in map(Requirement, re.findall(r"\S+==\S+", line))}


SETUP_PINS = _setup_pins()


def _pin(req: Requirement) -> str | None:
    specs = list(req.specifier)
    return specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None


@lru_cache(maxsize=None)
def requires_dist(name: str, version: str) -> tuple[str, ...]:
    """Requires-Dist of name==version: the installed distribution's when it is that version,
    else the METADATA inside its wheel, fetched once by `pip download --no-deps` into
    $HARNESSRL_HOME/wheels (the wheel alone: sglang's is 39 MB; nothing it depends on)."""
    try:
        if metadata.version(name) == version:
            return tuple(metadata.requires(name) or ())
    except metadata.PackageNotFoundError:
        pass
    folder = home() / "wheels"
    stem = f"{canonicalize_name(name).replace('-', '_')}-{version}-"
    found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem)]
    if not found:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder),
             f"{name}=={version}"], capture_output=True, text=True, timeout=600)
        found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem)]
        if done.returncode != 0 or not found:
            pytest.skip(f"cannot fetch {name}=={version}'s wheel for its metadata: "
                        f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    with zipfile.ZipFile(found[0]) as wheel:
        (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        return tuple(Parser().parsestr(wheel.read(meta).decode()).get_all("Requires-Dist") or ())


def _applies(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate({**default_environment(), "extra": ""})


def _candidates(*specs: SpecifierSet) -> list[Version]:
    """The versions where specifier sets can start overlapping: 0 (no lower bound), every
    bound, and the next releases just past it (so `>4.46` meets `<4.47` at 4.46.1)."""
    out = {Version("0")}
    for spec in specs:
        for s in spec:
            if s.version.endswith(".*"):
                continue
            v = Version(s.version)
            out |= {v, Version(".".join(map(str, v.release + (1,)))), Version(f"{v.base_version}.post1")}
    return sorted(out)


def overlap(*specs: SpecifierSet) -> bool:
    """Whether some version satisfies every specifier set (an empty set allows all)."""
    return any(all(spec.contains(v, prereleases=True) for spec in specs) for v in _candidates(*specs))


def conflicts(extra: str) -> list[str]:
    """Requirements of the extra's pinned releases that no version satisfies together with
    the core's, the extra's own and setup.sh's (bridges) constraints on the same package."""
    constraints: dict[str, list[tuple[str, SpecifierSet]]] = {}
    for req in CORE + EXTRAS[extra]:
        constraints.setdefault(canonicalize_name(req.name), []).append((str(req), req.specifier))
    if extra == "bridges":  # setup.sh installs the bridges with these pins on the same line
        for name, spec in SETUP_PINS.items():
            constraints.setdefault(name, []).append((f"setup.sh {name}{spec}", spec))
    for req in EXTRAS[extra]:  # what the pinned releases ask for is a constraint too
        if (version := _pin(req)) is not None:
            for dep in map(Requirement, requires_dist(req.name, version)):
                if _applies(dep):
                    constraints.setdefault(canonicalize_name(dep.name), []).append(
                        (f"{req.name}=={version} needs {dep.name}{dep.specifier}", dep.specifier))
    return [f"{name}: " + "; ".join(who for who, _ in cs)
            for name, cs in sorted(constraints.items()) if not overlap(*(spec for _, spec in cs))]


def test_overlap_is_exact_on_hand_cases():
    assert overlap(SpecifierSet(">=4.46,<6"), SpecifierSet("==5.19.0"))
    assert not overlap(SpecifierSet(">=4.46,<5"), SpecifierSet("==5.19.0"))
    assert not overlap(SpecifierSet("==2.13.0"), SpecifierSet("==2.14.1"))
    assert overlap(SpecifierSet(">4.46"), SpecifierSet("<4.47"))
    assert not overlap(SpecifierSet(">=5.5.3,<5.11"), SpecifierSet("<=5.5.2"))
    assert overlap(SpecifierSet("!=5.6.0,<5.11,>=5.5.3"), SpecifierSet("<=5.8.0,>=5.6.1"), SpecifierSet("==5.8.0"))
    assert overlap(SpecifierSet(""), SpecifierSet(">=1"))
    assert overlap(SpecifierSet("<3"), SpecifierSet(""))
    assert not overlap(SpecifierSet("<3"), SpecifierSet(">=3"))


def test_core_has_no_torch_pin_and_takes_transformers_5():
    core = {canonicalize_name(r.name): r.specifier for r in CORE}
    assert _pin(Requirement(f"torch{core['torch']}")) is None  # setup.sh pins the CPU wheel instead
    assert core["transformers"].contains("5.8.0") and core["transformers"].contains("4.57.6")
    assert SETUP_PINS == {"torch": SpecifierSet("==2.13.0"), "transformers": SpecifierSet("==5.8.0")}


def test_extras_pin_their_frameworks():
    assert [str(r) for r in EXTRAS["gpu"]] == ["sglang==0.5.23"]
    assert {r.name: _pin(r) for r in EXTRAS["bridges"] if _pin(r)} == {
        "verl": "0.9.1", "skyrl": "0.3.0", "tinker": "0.38.0", "skyrl-gym": "0.4.0"}


@pytest.mark.parametrize("extra", ["gpu", "bridges"])
def test_extra_resolves_against_core(extra):
    assert conflicts(extra) == []


def test_a_repinned_core_would_conflict(monkeypatch):
    """The check bites: the old core (torch==2.13.0, transformers<5) conflicts with both."""
    old = [Requirement(r) if not r.startswith(("torch", "transformers")) else None for r in PYPROJECT["dependencies"]]
    old = [r for r in old if r] + [Requirement("torch==2.13.0"), Requirement("transformers>=4.46,<5")]
    monkeypatch.setattr(sys.modules[__name__], "CORE", old)
    assert conflicts("gpu") == [
        "torch: torch==2.13.0; sglang==0.5.23 needs torch==2.14.1",
        "transformers: transformers<5,>=4.46; sglang==0.5.23 needs transformers==5.19.0",
    ]
    assert [c.split(":")[0] for c in conflicts("bridges")] == ["transformers"]
