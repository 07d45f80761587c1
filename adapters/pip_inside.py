"""Install a pip harness to run INSIDE the sandbox, on the sandbox's own interpreter.

    <root>/pip/<name>/lib/                  `pip install --target`: the harness and its dependencies,
                                            wheels only, chosen for the sandbox's CPython and glibc
    <root>/pip/<name>/bin/<script>          the harness package's own console scripts (not its
                                            dependencies', so none shadows the agent's `pytest`)
    <root>/pip/<name>/harnessrl_launch.py   what each script runs: `python3 -I` (no PYTHON*
                                            variables, no user site) with lib/ put on sys.path by
                                            the launcher itself, in that process only
    <root>/pip/<name>/.harnessrl-installed  "<spec> for python <X.Y>", written last

Nothing sets PYTHONPATH, so the commands a harness runs for the agent (`python3`, `pytest`) see
the sandbox's interpreter exactly as without the harness. The sandbox's CPython version and
glibc are read from the sandbox image (`docker run --network none`); pip downloads on the host
(the package index this machine reaches), so the sandbox never needs network; the files are
then byte-compiled by the sandbox's interpreter in a throwaway container (the toolchain is
mounted read-only at run time, so Python could not write its caches there).
"""
from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harnessrl.adapters.toolchain import InstallSpec

LAUNCHER = "harnessrl_launch.py"
#: What a launcher script prints (exit 3) when the interpreter is not the one the harness was built for.
WRONG_PYTHON_EXIT = 3

_LAUNCH_SRC = '''"""harnessrl: run one console script of this folder's pip harness (written by adapters/pip_inside.py)."""
import importlib
import os
import sys

BUILT_FOR = {built!r}
if "%d.%d" % sys.version_info[:2] != BUILT_FOR:
    sys.stderr.write("harnessrl: this harness was installed for python %s, not %s (%s): reinstall it "
                     "with `harnessrl harness install CONFIG`\\n" % (BUILT_FOR, sys.version.split()[0], sys.executable))
    sys.exit({wrong})
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
sys.argv[0] = sys.argv.pop(1)
target = sys.argv.pop(1)
module, _, attr = target.partition(":")
func = importlib.import_module(module)
for part in attr.split("."):
    func = getattr(func, part)
sys.exit(func())
'''


class PipInsideFailed(RuntimeError):
    """pip, the image probe or the byte-compile failed; the message carries the tool's output tail."""


@dataclass(frozen=True)
class SandboxPython:
    """The interpreter of the sandbox image a harness is built for."""

    version: str
    """"3.11"."""
    glibc: str
    """"2.36"; "" when the image's libc is not glibc (then no manylinux wheel fits)."""
    machine: str
    """"x86_64"."""

    @property
    def platforms(self) -> list[str]:
        """pip's --platform values for this interpreter: every manylinux tag its glibc runs, newest
        first (pip does not widen a given manylinux_2_X tag to the older ones by itself)."""
        major, minor = map(int, self.glibc.split(".")[:2])
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{name}_{self.machine}" for m, name in legacy.items() if major == 2 and minor >= m]


def _run(argv: list[str], what: str, timeout: float = 1800) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    if res.returncode != 0:
        raise PipInsideFailed(f"{what} failed (exit {res.returncode}): {(res.stdout + res.stderr)[-3000:].strip()}")
    return res.stdout


def probe_image(image: str) -> SandboxPython:
    """The image's python3 version, glibc and machine (one `docker run --network none`)."""
    code = "import platform,sys; print('%d.%d' % sys.version_info[:2], platform.libc_ver()[1], platform.machine())"
    out = _run(["docker", "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "python3", image,
                "-c", code],
               f"reading the python3 of sandbox image {image}", timeout=300).split()
    if len(out) == 2:  # not glibc: libc_ver() gave ""
        out = [out[0], "", out[1]]
    return SandboxPython(*out)


def console_scripts(lib: Path, package: str) -> dict[str, str]:
    """The console scripts of `package` (its own dist-info's entry_points.txt): name -> "module:attr"."""
    want = package.split("[")[0].lower().replace("-", "_").replace(".", "_")
    for info in lib.glob("*.dist-info"):
        if info.name.removesuffix(".dist-info").rsplit("-", 1)[0].lower().replace("-", "_").replace(".", "_") != want:
            continue
        parser = configparser.ConfigParser(delimiters=("=",))
        parser.optionxform = str  # keep the scripts' case
        ep = info / "entry_points.txt"
        if ep.is_file():
            parser.read_string(ep.read_text())
        if not parser.has_section("console_scripts"):
            return {}
        return {k: v.split("[")[0].strip() for k, v in parser.items("console_scripts")}
    raise PipInsideFailed(f"pip installed no {package} distribution in {lib}")


def write_launchers(dest: Path, scripts: dict[str, str], python: str, built_for: str) -> None:
    """bin/<script> for each console script: sh that execs `<python> -I harnessrl_launch.py <target>`."""
    (dest / LAUNCHER).write_text(_LAUNCH_SRC.format(built=built_for, wrong=WRONG_PYTHON_EXIT))
    (dest / "bin").mkdir(exist_ok=True)
    for name, target in scripts.items():
        path = dest / "bin" / name
        path.write_text('#!/bin/sh\nhere="$(dirname "$(readlink -f "$0")")/.."\n'
                        f'exec {python} -I "$here/{LAUNCHER}" {shlex.quote(name)} {shlex.quote(target)} "$@"\n')
        path.chmod(0o755)


def install_inside(spec: InstallSpec, dest: Path, image: str, requirement: str | None = None,
                   pip: list[str] | None = None, runtime: str | None = None) -> str:
    """Build `spec` into `dest` for the python3 of `image`; returns the stamp (written by the caller).
    `requirement`: the config's `python` (a PEP 440 specifier set) the sandbox's interpreter must
    satisfy; `pip`: the pip to download with (default: this interpreter's); `runtime`: build for
    the toolchain's python_runtime of that version instead (adapters/python_runtime.py, installed)."""
    from harnessrl.adapters.base import TOOLCHAIN_MOUNT
    from harnessrl.adapters.python_runtime import RUNTIMES, interpreter

    target = probe_image(image)
    python, mounts, where = "python3", [], image
    if runtime is not None:
        target = SandboxPython(runtime, RUNTIMES[runtime][1], target.machine)
        python, mounts = interpreter(runtime), ["-v", f"{dest.parent.parent}:{TOOLCHAIN_MOUNT}:ro"]
        where = f"{image} + python_runtime {runtime}"
    check_python(requirement, target.version, spec.spec, where)
    if not target.glibc:
        raise PipInsideFailed(f"sandbox image {image} has no glibc: no manylinux wheel runs on it")
    tmp = dest.with_name(dest.name + ".tmp")
    for d in (dest, tmp):
        shutil.rmtree(d, ignore_errors=True)
    tmp.mkdir(parents=True)
    major, minor = target.version.split(".")
    # Two steps: `download` resolves for the target's python (Requires-Python included); `install`
    # would also check each Requires-Python against the python running pip, so it gets the wheels
    # alone, with that check off (resolution already did it, for the right version).
    pip = pip or [sys.executable, "-m", "pip"]
    tags = ["--only-binary=:all:", "--python-version", target.version, "--implementation", "cp",
            "--abi", f"cp{major}{minor}", *[a for p in target.platforms for a in ("--platform", p)]]
    what = f"{spec.spec} for python {target.version} ({target.platforms[0]})"
    _run([*pip, "download", "--quiet", "--disable-pip-version-check", "--no-input", "-d", str(tmp / "wheels"),
          *tags, spec.spec], f"pip download {what}")
    _run([*pip, "install", "--quiet", "--disable-pip-version-check", "--no-input", "--no-deps", "--no-index",
          "--ignore-requires-python", "--target", str(tmp / "lib"), *tags,
          *sorted(str(w) for w in (tmp / "wheels").glob("*.whl"))], f"pip install {what}")
    shutil.rmtree(tmp / "wheels")
    shutil.rmtree(tmp / "lib" / "bin", ignore_errors=True)  # pip's scripts point at the host's python
    scripts = console_scripts(tmp / "lib", spec.package)
    write_launchers(tmp, scripts, python, target.version)
    uid = f"{os.getuid()}:{os.getgid()}"
    _run(["docker", "run", "--rm", "--pull", "never", "--network", "none", "--user", uid, *mounts, "-v", f"{tmp}:/h",
          "--entrypoint", python, image, "-m", "compileall", "-q", "-j", "0", "/h/lib"], f"byte-compiling {spec.spec} in {image}")
    tmp.rename(dest)
    return f"{spec.spec} for python {target.version}"


def check_python(requirement: str | None, version: str, who: str, image: str) -> None:
    """Raise PipInsideFailed unless the sandbox's python `version` satisfies `requirement`."""
    if requirement is None:
        return
    from packaging.specifiers import SpecifierSet

    if version not in SpecifierSet(requirement):
        raise PipInsideFailed(
            f"{who} needs python {requirement}, but the sandbox image {image} has python {version}; harnessrl "
            "cannot provide another interpreter offline yet (docs/harnesses.md, 'Python harnesses inside'): "
            "use a sandbox image whose python3 satisfies it, or run the harness beside the sandbox")
