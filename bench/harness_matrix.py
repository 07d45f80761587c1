"""Every harness through `check-adapter`, at its pinned version and at the newest the registry serves.

    .venv/bin/python bench/harness_matrix.py                      # all: built-ins + examples/harnesses/*.toml
    .venv/bin/python bench/harness_matrix.py --harness pi --harness claude-code
    .venv/bin/python bench/harness_matrix.py --quick              # pinned versions only
    .venv/bin/python bench/harness_matrix.py --list               # pins and newest versions, no checks

Harnesses: the built-in adapters (harnessrl.adapters.REGISTRY) and every shipped config in
examples/harnesses/. For each, side by side in one run:
- pinned: installed into the toolchain if missing (`harnessrl harness install`), then
  `harnessrl check-adapter` (Docker, the scripted policy: gold 1.0, empty 0.0, token-exact);
- newest: the version the registry serves now (`npm view PKG version`, `pip index versions
  PKG`), installed into a throwaway toolchain (HARNESSRL_TOOLCHAIN) and checked the same way;
  a config is checked as a copy with its `install`/`version` raised, a built-in with its
  adapter's pin raised in the check's own process only. A failing install or check is
  reported with its first failing check, never hidden.
Prints one table and ends with one JSON line; target_met: every harness passes at its pin
(newest-version failures are reported in the JSON, they do not decide target_met).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "harnesses"
PY = sys.executable


@dataclass
class Outcome:
    """One check-adapter run (or the install before it) of one harness at one version."""

    version: str
    ok: bool | None
    """None: not run (--quick, or the newest equals the pin)."""
    first_failure: str = ""
    seconds: float = 0.0

    def cell(self) -> str:
        if self.ok is None:
            return self.first_failure or "not run"
        return "pass" if self.ok else f"FAIL: {self.first_failure}"


@dataclass
class Row:
    name: str
    target: str
    """What check-adapter is given: a registry name or a config path."""
    install: str
    python: str | None = None
    """A config's python_runtime: the registry's newest release is looked up for that python."""
    pinned: Outcome | None = None
    newest: Outcome | None = None
    notes: list[str] = field(default_factory=list)


def harnesses(only: list[str]) -> list[Row]:
    """The built-in adapters, then the shipped configs; `only` filters by name or config stem."""
    from harnessrl.adapters import REGISTRY, get_adapter

    rows = [Row(n, n, get_adapter(n).install) for n in REGISTRY if n != "command"]
    for cfg in sorted(EXAMPLES.glob("*.toml")):
        a = get_adapter(str(cfg))
        rows.append(Row(a.name, str(cfg.relative_to(REPO)), a.install, getattr(a.config, "python_runtime", None)))
    if only:
        unknown = set(only) - {r.name for r in rows} - {Path(r.target).stem for r in rows}
        if unknown:
            raise SystemExit(f"harness_matrix: unknown --harness {sorted(unknown)}; known: {[r.name for r in rows]}")
        rows = [r for r in rows if r.name in only or Path(r.target).stem in only]
    return rows


def newest_version(install: str, python: str | None = None) -> tuple[str | None, str]:
    """(the newest version the registry serves, or None; why not) for an npm:/pip: spec; a pip
    one for `python` when given (pip filters releases by Requires-Python: mistral-vibe has none
    for this venv's 3.11)."""
    from harnessrl.adapters.toolchain import parse_install

    spec = parse_install(install)
    if spec is None:
        return None, "user-provided (install = none)"
    if spec.kind == "npm":
        res = subprocess.run(["npm", "view", spec.package, "version"], capture_output=True, text=True, timeout=120)
        got = res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout.strip() else None
    else:
        package = re.sub(r"\[.*\]", "", spec.package)
        res = subprocess.run([PY, "-m", "pip", "index", "versions", package, "--disable-pip-version-check",
                              *(["--python-version", python] if python else [])],
                             capture_output=True, text=True, timeout=120)
        m = re.search(rf"^{re.escape(package)} \(([^)]+)\)", res.stdout, re.M | re.I)
        got = m.group(1) if m else None
    return got, "" if got else f"registry query failed: {(res.stderr or res.stdout).strip()[-200:]}"


#: check-adapter options every check gets (--context-length, from the command line).
CHECK_ARGS: list[str] = []


def run_check(target: str, env: dict[str, str], wall_s: int, override: str | None = None) -> Outcome:
    """check-adapter in a subprocess; the outcome's first failure names the check and its detail."""
    argv = [PY, str(Path(__file__).resolve()), "--check-one", target, "--wall-time", str(wall_s), *CHECK_ARGS]
    if override:
        argv += ["--override", override]
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=wall_s * 2 + 600)
    took = time.monotonic() - t0
    try:
        report = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Outcome("", False, f"check-adapter crashed (exit {res.returncode}): {res.stderr.strip()[-300:]}", took)
    failed = [c for c in report["checks"] if not c["ok"]]
    first = f"{failed[0]['name']}: {failed[0]['detail'][:300]}" if failed else ""
    return Outcome("", bool(report["ok"]), first, took)


def script_dirs() -> dict[str, str]:
    """Package spec -> the install script's harness name (its toolchain dir), for built-ins:
    a variant adapter (claude-code-agents) runs the binary its base installs."""
    res = subprocess.run(["bash", str(REPO / "scripts" / "install_harnesses.sh"), "--list"], capture_output=True,
                         text=True, timeout=60)
    pairs = [line.split(" ", 1) for line in res.stdout.strip().splitlines() if " " in line]
    return {spec: name for name, spec in reversed(pairs)}


def check_pinned(row: Row, wall_s: int) -> Outcome:
    from harnessrl.adapters.toolchain import installed_spec, parse_install

    spec = parse_install(row.install)
    version = spec.version if spec else "none"
    if spec is not None:
        what = row.target if row.target.endswith(".toml") else script_dirs().get(spec.spec, row.name)
        done = not row.target.endswith(".toml") and installed_spec(spec.subdir, what) == spec.spec
        inst = subprocess.run([PY, "-m", "harnessrl.adapters.install", "install", what], capture_output=True,
                              text=True, timeout=3600) if not done else subprocess.CompletedProcess([], 0)
        if inst.returncode != 0:
            return Outcome(version, False, f"install: {(inst.stderr or inst.stdout).strip()[-300:]}")
    out = run_check(row.target, dict(os.environ), wall_s)
    out.version = version
    return out


def check_newest(row: Row, version: str, wall_s: int, scratch: Path) -> Outcome:
    """Install `version` into a throwaway toolchain and check the harness there."""
    from harnessrl.adapters.install import InstallFailed, install
    from harnessrl.adapters.toolchain import parse_install

    spec = parse_install(row.install)
    raised = f"{spec.kind}:{spec.package}{'@' if spec.kind == 'npm' else '=='}{version}"
    root = scratch / f"{row.name}-{version}" / "toolchain"
    t0 = time.monotonic()
    is_config = row.target.endswith(".toml")
    target, override = row.target, None
    if is_config:
        from harnessrl.adapters import get_adapter
        dirname = get_adapter(str(REPO / row.target)).install_dir[1]
        copy = root.parent / Path(row.target).name
        root.parent.mkdir(parents=True, exist_ok=True)
        text = (REPO / row.target).read_text()
        text = re.sub(r'(?m)^install = ".*"$', f'install = "{raised}"', text, count=1)
        text = re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', text, count=1)
        copy.write_text(text)
        target = str(copy)
    else:
        dirname, override = script_dirs().get(spec.spec, row.name), raised
    try:
        install(parse_install(raised), dirname, root, log=lambda s: None)
    except (InstallFailed, OSError, ValueError) as e:
        return Outcome(version, False, f"install: {_why(str(e))}", time.monotonic() - t0)
    out = run_check(target, {**os.environ, "HARNESSRL_TOOLCHAIN": str(root)}, wall_s, override)
    out.version, out.seconds = version, time.monotonic() - t0
    return out


def _why(message: str) -> str:
    """The telling line of an npm/pip failure (a missing version), else its tail."""
    hit = re.search(r"No matching version found for [^\s]+|No matching distribution found for [^\s]+", message)
    return hit.group(0) if hit else message.strip()[-300:]


def check_one(target: str, wall_s: int, override: str | None, context: int | None) -> int:
    """The subprocess side: check-adapter on `target`, a built-in's pin raised to `override`."""
    from harnessrl.gym import check_adapter

    if override:
        from harnessrl.adapters import adapter_class

        cls = adapter_class(target)
        cls.install, cls.version = override, re.split(r"@|==", override.split(":", 1)[1])[-1]
    return check_adapter.main([target, "--backend", "docker", "--wall-time", str(wall_s),
                               *(["--context-length", str(context)] if context else [])])


def table(rows: list[Row]) -> str:
    head = ["harness", "pinned", "at pin", "newest", "at newest"]
    body = [[r.name, r.pinned.version if r.pinned else "", r.pinned.cell() if r.pinned else "",
             r.newest.version if r.newest else "", r.newest.cell() if r.newest else ""] for r in rows]
    width = [max(len(x[i][:90]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c[:90].ljust(w) for c, w in zip(cells, width))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in width]), *map(line, body)])


def list_versions(rows: list[Row]) -> int:
    """--list: each harness's pin and the newest version its registry serves, nothing run."""
    from harnessrl.adapters.toolchain import parse_install

    for r in rows:
        spec = parse_install(r.install)
        r.pinned = Outcome(spec.version if spec else "none", None, "not run (--list)")
        newest, why = newest_version(r.install, r.python)
        r.newest = Outcome(newest or "", None, why or ("= pin" if newest == r.pinned.version else "newer"))
    print(table(rows))
    print(json.dumps({"bench": "harness_matrix", "list": True, "harnesses": len(rows),
                      "versions": {r.name: {"install": r.install, "pin": r.pinned.version, "newest": r.newest.version,
                                            "note": r.newest.first_failure} for r in rows},
                      "target_met": bool(rows) and all(r.newest.version for r in rows if parse_install(r.install))}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", action="append", default=[], help="only this harness (name or config stem); repeat")
    ap.add_argument("--quick", action="store_true", help="pinned versions only (the newest are looked up, not run)")
    ap.add_argument("--list", action="store_true", help="list every harness with its pin and the newest version; "
                                                         "run nothing")
    ap.add_argument("--wall-time", type=int, default=420, help="harness wall-clock limit per episode (s)")
    ap.add_argument("--context-length", type=int, default=None,
                    help="the serving context the first prompt must fit (default: smollm2-135m's, check-adapter's)")
    ap.add_argument("--keep", default=None, help="keep the newest-version toolchains in this dir (default: removed)")
    ap.add_argument("--check-one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--override", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.check_one:
        return check_one(args.check_one, args.wall_time, args.override, args.context_length)
    if args.context_length:
        CHECK_ARGS.extend(["--context-length", str(args.context_length)])
    rows = harnesses(args.harness)
    if args.list:
        return list_versions(rows)
    scratch = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="harnessrl-matrix-"))
    t0 = time.monotonic()
    try:
        for r in rows:
            r.pinned = check_pinned(r, args.wall_time)
            newest, why = newest_version(r.install, r.python)
            if newest is None:
                r.newest = Outcome("", None, why)
            elif r.pinned.version == newest:
                r.newest = Outcome(newest, None, "= pin")
            elif args.quick:
                r.newest = Outcome(newest, None, "not run (--quick)")
            else:
                r.newest = check_newest(r, newest, args.wall_time, scratch)
            print(f"{r.name}: pin {r.pinned.version} {r.pinned.cell()[:120]}; newest {r.newest.version} "
                  f"{r.newest.cell()[:120]}", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(table(rows))
    at_pin = [r for r in rows if r.pinned and r.pinned.ok]
    newest_run = [r for r in rows if r.newest and r.newest.ok is not None]
    raise_pin = {r.name: r.newest.version for r in newest_run if r.newest.ok}
    print(json.dumps({
        "bench": "harness_matrix", "harnesses": len(rows), "pass_at_pin": len(at_pin),
        "fail_at_pin": {r.name: r.pinned.first_failure for r in rows if r.pinned and not r.pinned.ok},
        "newest_checked": len(newest_run), "pass_at_newest": len(raise_pin),
        "fail_at_newest": {r.name: f"{r.newest.version}: {r.newest.first_failure}" for r in newest_run
                           if not r.newest.ok},
        "newest_passes_can_raise_pin": raise_pin, "quick": args.quick, "context_length": args.context_length, "seconds": round(time.monotonic() - t0),
        "rows": [asdict(r) for r in rows],
        "target_met": bool(rows) and len(at_pin) == len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
