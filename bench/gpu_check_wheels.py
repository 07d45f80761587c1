"""Wheels for bench/gpu_check.sh on a GPU box without network: `bash bench/gpu_check.sh --prepare-wheels`.

Downloads (where PyPI is reachable) the distributions the check imports beyond torch and
transformers, and everything they pull in, for CPython 3.10-3.13 on manylinux x86_64 and
aarch64, into bench/wheels (gitignored, ~30 MB, under the device run's 64 MiB carry):
binary wheels (pydantic-core, orjson, pyyaml, markupsafe, psutil, safetensors) once per
python/arch, pure-Python ones once. The first target is resolved to the newest versions;
`requirements.txt` pins the top level and `constraints.txt` every distribution, so all
targets get the same versions.

`pip download --python-version X` evaluates environment markers against the interpreter
that runs it, not X, so a dependency such as anyio's `exceptiongroup; python_version <
"3.11"` would be missed; each target's markers are therefore evaluated here from the
wheels' own metadata, and what is missing is downloaded until nothing is.
"""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement

#: Distributions the check imports beyond torch/transformers (bench/gpu_check.sh's REQS).
REQS = ["fastapi", "uvicorn", "httpx", "pydantic", "orjson", "psutil", "pyyaml", "jinja2", "safetensors"]
PYVERS = ["3.10", "3.11", "3.12", "3.13"]
ARCHES = ["x86_64", "aarch64"]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def have(folder: Path) -> dict[str, str]:
    """{normalized name: version} of the wheels in `folder`."""
    return {norm(w.name.split("-")[0]): w.name.split("-")[1] for w in folder.glob("*.whl")}


def download(folder: Path, pyver: str, arch: str, args: list[str]) -> None:
    plats = [x for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_28") for x in ("--platform", f"{tag}_{arch}")]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--implementation", "cp",
           "--python-version", pyver, *plats, "-d", str(folder), *args]
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"pip download failed for python {pyver} {arch}: {' '.join(args)}")


def marker_deps(folder: Path, pyver: str, arch: str) -> list[str]:
    """Requirements of the wheels in `folder` that apply on (pyver, arch) but have no wheel there."""
    env = {"python_version": pyver, "python_full_version": f"{pyver}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": arch, "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    present, out = have(folder), set()
    for w in folder.glob("*.whl"):
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode("utf-8", "replace").splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if norm(req.name) not in present:
                out.add(f"{req.name}{req.specifier}")
    return sorted(out)


def complete(folder: Path, pyver: str, arch: str, extra: list[str]) -> None:
    for _ in range(6):
        missing = marker_deps(folder, pyver, arch)
        if not missing:
            return
        print(f"python {pyver} {arch}: also needs {', '.join(missing)}", file=sys.stderr)
        download(folder, pyver, arch, [*missing, *extra])
    raise SystemExit(f"python {pyver} {arch}: dependencies still missing: {marker_deps(folder, pyver, arch)}")


def main(folder: str) -> int:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for w in out.glob("*"):
        w.unlink()
    pins, cons = out / "requirements.txt", out / "constraints.txt"
    for i, (arch, pyver) in enumerate((a, v) for a in ARCHES for v in PYVERS):
        if i == 0:
            download(out, pyver, arch, REQS)
            complete(out, pyver, arch, [])
            found = have(out)
            pins.write_text("".join(f"{r}=={found[norm(r)]}\n" for r in REQS))
        else:
            download(out, pyver, arch, ["-r", str(pins), "-c", str(cons)])
            complete(out, pyver, arch, ["-c", str(cons)])
        cons.write_text("".join(f"{n}=={v}\n" for n, v in sorted(have(out).items())))
    size = sum(w.stat().st_size for w in out.glob("*.whl"))
    print(f"gpu_check wheels: {len(list(out.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {out}", file=sys.stderr)
    print(pins.read_text(), end="", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent / "wheels")))
