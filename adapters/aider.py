"""aider 0.86.2, beside the sandbox, edit-only, Chat Completions (streamed, no tools).

aider edits files with SEARCH/REPLACE blocks and never runs shell commands the model
suggests. It runs on the host (own venv) in a host copy of the sandbox's repository: the
workspace is copied out (tar through the Sandbox protocol), aider runs one shot there, and
its changes come back as a git patch applied in the sandbox. aider's own files (`.aider*`)
never enter the patch, so they stay out of the graded diff. Flags as
../shared/docs/harnesses.md records; the model price map is pre-seeded so litellm never
fetches it. Exit 0 after its one exchange.
"""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import ClassVar

from harnessrl.adapters.base import Endpoint, HarnessResult, Launch, Mount, classify_exit, tail
from harnessrl.adapters.prefork import ForkServer, Prefork, warm
from harnessrl.adapters.proc import clean_env, run_host
from harnessrl.adapters.toolchain import require

MAX_FILES = 40
"""aider is given every tracked file of a small repo (up to this many) so the model sees code."""
PREFORK = Prefork(preload=("litellm",), late=("HOME", "OPENAI_API_KEY", "OPENAI_API_BASE"),
                  complete_models=("litellm", "openai"))
"""aider imports litellm lazily, on its first model call; a warm interpreter has it already
(adapters/prefork.py)."""
BASE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}


class AiderAdapter:
    name: ClassVar[str] = "aider"
    dialect: ClassVar[str] = "openai-chat"
    """Chat Completions, streamed, no tools; a second call may ask for a commit message."""
    placement: ClassVar[str] = "beside"
    streams: ClassVar[bool] = True
    completion: ClassVar[str] = "one shot (--message): applies the edits in its reply and exits 0"
    version: ClassVar[str] = "0.86.2"
    install: ClassVar[str] = "pip:aider-chat==0.86.2"
    network: str = "proxy-only"
    """Beside, in a network namespace where only the proxy is reachable (adapters/netns.py);
    "host" (set on an instance) opts out. Recorded as the trajectory's `harness_network`."""

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        return []

    def warm(self, toolchain: Path | None = None) -> ForkServer | None:
        """Start the fork server now, in the background (see adapters/prefork.py)."""
        venv = require("venvs", self.name, self.install.split(":", 1)[1], toolchain)
        return warm(str(venv / "bin" / "aider"), PREFORK, clean_env(BASE_ENV), self.network == "proxy-only")

    def launch(self, launch: Launch) -> HarnessResult:
        venv = require("venvs", self.name, self.install.split(":", 1)[1], launch.toolchain)
        scratch = Path(launch.scratch_dir)
        repo, home = scratch / "repo", scratch / "home"
        _copy_out(launch, repo)
        _seed_model_prices(home, launch.endpoint.model)
        files = _git(repo, "ls-files").split()[:MAX_FILES]
        ep = launch.endpoint
        env = clean_env({**BASE_ENV, "HOME": str(home), "OPENAI_API_BASE": f"{ep.base_url}/v1",
                         "OPENAI_API_KEY": ep.api_key})
        argv = [str(venv / "bin" / "aider"), "--model", f"openai/{ep.model}", "--edit-format", "diff",
                "--message", launch.problem_statement, "--yes-always", "--no-check-update", "--no-analytics",
                "--no-show-model-warnings", "--no-gitignore", "--no-pretty", "--no-fancy-input",
                "--no-show-release-notes", "--no-auto-commits", "--map-tokens", "0", *files]
        run = run_host(argv, env, str(repo), launch.limits.wall_time_s, launch.cancel, PREFORK, self.network, ep.base_url)
        patch = _host_patch(repo)
        if patch:
            launch.sandbox.write_file("/tmp/harnessrl/aider.patch", patch.encode())
            res = launch.sandbox.exec("git apply --whitespace=nowarn /tmp/harnessrl/aider.patch", timeout=60)
            if res.exit_code != 0:
                raise RuntimeError(f"aider's patch did not apply in the sandbox: {res.output[-500:]}")
        return HarnessResult(classify_exit(run.exit_code, run.timed_out), run.exit_code, None,
                             tail(run.stdout), tail(run.stderr), run.duration_s,
                             {"patch_bytes": len(patch), "launch": run.launch, "network": run.network})


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _copy_out(launch: Launch, dest: Path) -> None:
    """The sandbox's repository on the host, self-contained: a sandbox's .git may borrow its
    objects from a read-only store (`objects/info/alternates`, e.g. the pristine base copy
    its reset restores from); those are copied too and the host copy points at them."""
    sb = launch.sandbox
    _fetch_tree(sb, ".", sb.workdir, dest)
    alternates = dest / ".git" / "objects" / "info" / "alternates"
    if alternates.is_file():
        local = []
        for i, path in enumerate(p for p in alternates.read_text().splitlines() if p.strip()):
            objects = dest.parent / f"objects-{i}"
            _fetch_tree(sb, ".", path.strip(), objects)
            local.append(str(objects))
        alternates.write_text("".join(f"{p}\n" for p in local))


def _fetch_tree(sb, what: str, workdir: str, dest: Path) -> None:
    sb.exec(f"mkdir -p /tmp/harnessrl && tar -C . -cf /tmp/harnessrl/copy.tar {what}", timeout=120, workdir=workdir)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(sb.read_file("/tmp/harnessrl/copy.tar"))) as tf:
        tf.extractall(dest, filter="data")
    sb.exec("rm -f /tmp/harnessrl/copy.tar", timeout=30)


def _host_patch(repo: Path) -> str:
    """Everything aider changed (new files too), without its own .aider* files."""
    _git(repo, "add", "-A", "--", ".", ":(exclude).aider*")
    return _git(repo, "diff", "--cached", "--binary", "HEAD", "--", ".", ":(exclude).aider*")


def _seed_model_prices(home: Path, model: str) -> None:
    cache = home / ".aider" / "caches"
    cache.mkdir(parents=True, exist_ok=True)
    entry = {"max_tokens": 4096, "max_input_tokens": 32768, "max_output_tokens": 4096, "input_cost_per_token": 0.0,
             "output_cost_per_token": 0.0, "litellm_provider": "openai", "mode": "chat"}
    (cache / "model_prices_and_context_window.json").write_text(
        json.dumps({model: entry, f"openai/{model}": entry}))
