"""mini-swe-agent 2.4.6, beside the sandbox: the agent runs on the host, its commands run in
the episode's sandbox through the exec bridge (adapters/exec_bridge.py + mini_env.py).

Configured exactly as ../shared/docs/harnesses.md records: `-c mini.yaml` first (a `-c`
replaces the default config), `-y --exit-immediately`, `MSWEA_CONFIGURED` so it never starts
its interactive set-up, cost tracking off (a local model has no price). Its exit code is
always 0; the end is read from the trajectory file's `info.exit_status`.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

from harnessrl.adapters.base import Endpoint, HarnessResult, Launch, Mount, tail
from harnessrl.adapters.exec_bridge import ExecBridge
from harnessrl.adapters.prefork import ForkServer, Prefork, warm
from harnessrl.adapters.proc import clean_env, run_host
from harnessrl.adapters.toolchain import require

ENV_SRC = Path(__file__).with_name("mini_env.py")
#: mini-swe-agent's own exit statuses -> our reasons.
STATUS_REASONS = {"Submitted": "submitted", "LimitsExceeded": "call_limit"}
#: litellm (8-11 s of CPU to import here) comes from a warm interpreter; mini itself, which
#: reads its config dir at import, is imported by each episode (adapters/prefork.py).
#: `optional`: what an episode would import anyway, found by diffing `sys.modules` around
#: mini's imports and its first `litellm.completion` (on this machine, 0.21 s and 0.63 s of
#: CPU per episode; with them preloaded, 0.04 s and 0.07 s): mini's CLI and terminal stack
#: (typer, prompt_toolkit, tenacity, ...) and the modules litellm loads lazily on a first
#: OpenAI-compatible call (its proxy types, provider configs, the httpcore/h11/h2 stack).
PREFORK = Prefork(
    preload=("litellm",), late=("OPENAI_API_KEY", "HOME", "PYTHONPATH", "MSWEA_GLOBAL_CONFIG_DIR"),
    optional=("typer", "tenacity", "platformdirs", "shellingham", "rich.logging", "rich.rule", "rich._emoji_codes",
              "prompt_toolkit", "prompt_toolkit.patch_stdout", "prompt_toolkit.input.vt100",
              "prompt_toolkit.key_binding.bindings.search", "xml.dom.minidom", "tty", "termios",
              "httpcore", "h11", "h2.connection",
              "litellm.proxy._types", "litellm.proxy.openai_files_endpoints.common_utils",
              "litellm.proxy.spend_tracking.savings", "litellm.llms.litellm_proxy.chat.transformation",
              "litellm.llms.github_copilot.authenticator", "litellm.llms.github_copilot.per_user_auth",
              "litellm.integrations.generic_api.generic_api_callback", "litellm._service_logger",
              "litellm.litellm_core_utils.logging_callback_manager",
              "litellm.llms.openai.chat.gpt_audio_transformation", "litellm.llms.openai_like.dynamic_config"),
    complete_models=("litellm", "openai"))


class MiniSweAgentAdapter:
    name: ClassVar[str] = "mini-swe-agent"
    dialect: ClassVar[str] = "openai-chat"
    """Chat Completions, one `bash(command)` tool; tool results as role:tool JSON."""
    placement: ClassVar[str] = "beside"
    """Agent on the host (own venv); commands in the sandbox via Sandbox.exec."""
    streams: ClassVar[bool] = False
    completion: ClassVar[str] = ("runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`; exit code always 0, "
                                 "end read from trajectory info.exit_status (Submitted, LimitsExceeded, <Error>)")
    version: ClassVar[str] = "2.4.6"
    install: ClassVar[str] = "pip:mini-swe-agent==2.4.6"
    network: str = "proxy-only"
    """Beside, in a network namespace where only the proxy is reachable (adapters/netns.py);
    "host" (set on an instance) opts out. Recorded as the trajectory's `harness_network`."""

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        return []

    def warm(self, toolchain: Path | None = None) -> ForkServer | None:
        """Start the fork server now (it imports in the background), so the first episodes
        need not wait for it; the launch uses the same server (same environment but the
        per-episode keys)."""
        venv = require("venvs", self.name, self.install.split(":", 1)[1], toolchain)
        return warm(str(venv / "bin" / "mini"), PREFORK, _env(Path("/nonexistent"), ""), self.network == "proxy-only")

    def launch(self, launch: Launch) -> HarnessResult:
        venv = require("venvs", self.name, self.install.split(":", 1)[1], launch.toolchain)
        scratch = Path(launch.scratch_dir)
        scratch.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ENV_SRC, scratch / "harnessrl_mini_env.py")
        traj = scratch / "mini.traj.json"
        sock = str(scratch / "exec.sock")
        ep = launch.endpoint
        env = _env(scratch, ep.api_key)
        argv = [str(venv / "bin" / "mini"), "-m", f"openai/{ep.model}", "-t", launch.problem_statement,
                "-y", "--exit-immediately", "-o", str(traj),
                "--environment-class", "harnessrl_mini_env.SandboxEnvironment",
                "-c", "mini.yaml",
                "-c", f"model.model_kwargs.api_base={ep.base_url}/v1",
                "-c", f"agent.step_limit={launch.limits.max_calls}", "-c", "agent.cost_limit=0",
                "-c", f"environment.exec_socket={sock}", "-c", f"environment.cwd={launch.sandbox.workdir}"]
        with ExecBridge(launch.sandbox, sock) as bridge:
            run = run_host(argv, env, str(scratch), launch.limits.wall_time_s, launch.cancel, PREFORK,
                           self.network, ep.base_url)
        status = _exit_status(traj)
        details = {"commands": bridge.calls, "trajectory_file": str(traj), "launch": run.launch, "network": run.network}
        if bridge.sandbox_error:
            details["sandbox_error"] = bridge.sandbox_error
        if run.timed_out:
            reason = "timeout"
        elif status in STATUS_REASONS:
            reason = STATUS_REASONS[status]
        elif status is None or run.exit_code != 0:
            reason = "harness_crashed"
        else:  # mini stopped on an error of its own (e.g. the proxy refused a call)
            reason = "harness_exited"
        return HarnessResult(reason, run.exit_code, status, tail(run.stdout), tail(run.stderr), run.duration_s, details)


def _env(scratch: Path, api_key: str) -> dict[str, str]:
    return clean_env({
        "MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_SILENT_STARTUP": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_GLOBAL_CONFIG_DIR": str(scratch / "mini-cfg"),
        "OPENAI_API_KEY": api_key,
        # One retry: mini's default (10 with backoff up to a minute) would turn an engine
        # failure into a wall-clock timeout.
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2", "PYTHONPATH": str(scratch), "HOME": str(scratch),
    })


def _exit_status(traj: Path) -> str | None:
    try:
        return json.loads(traj.read_text())["info"]["exit_status"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
