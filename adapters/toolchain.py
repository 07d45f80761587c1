"""Where scripts/install_harnesses.sh put each harness (keep the two in step).

    <root>/node/bin/node               node runtime, mounted into sandboxes with the npm prefixes
    <root>/npm/<harness>/bin/<cli>     npm harnesses (run inside the sandbox)
    <root>/venvs/<harness>/bin/<cli>   pip harnesses (run beside the sandbox, on the host)

Each installed directory holds a `.harnessrl-installed` stamp with the package spec.
"""
from __future__ import annotations

import os
from pathlib import Path

INSTALL_SCRIPT = "scripts/install_harnesses.sh"


class HarnessNotInstalled(RuntimeError):
    """The harness is not in the toolchain; the message says how to install it."""


def toolchain_root() -> Path:
    home = os.environ.get("HARNESSRL_HOME") or os.path.expanduser("~/.cache/harnessrl")
    return Path(home) / "toolchain"


def installed_spec(kind: str, name: str, root: Path | None = None) -> str | None:
    """The package spec a harness was installed at, or None when it is not (fully) installed."""
    stamp = (root or toolchain_root()) / kind / name / ".harnessrl-installed"
    return stamp.read_text().strip() if stamp.is_file() else None


def require(kind: str, name: str, spec: str, root: Path | None = None) -> Path:
    """The harness's install dir; raises HarnessNotInstalled unless it is there at `spec`."""
    root = root or toolchain_root()
    got = installed_spec(kind, name, root)
    if got != spec:
        state = "not installed" if got is None else f"installed at {got!r}, want {spec!r}"
        raise HarnessNotInstalled(f"harness {name!r} {state} in {root}: run `{INSTALL_SCRIPT} {name}`")
    return root / kind / name
