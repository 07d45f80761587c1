"""OpenCode 1.18.33, inside the sandbox, Chat Completions (streamed, include_usage).

Configured by `$XDG_CONFIG_HOME/opencode/opencode.json` with one `local` provider
(@ai-sdk/openai-compatible) and every XDG dir private, model fetch / autoupdate / default
plugins / LSP download / share disabled, as ../shared/docs/harnesses.md records. It sends
a title request without tools first. `opencode run --format json` exits 0 when done.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from harnessrl.adapters.base import SANDBOX_SCRATCH, Endpoint, HarnessResult, Launch, Mount, classify_exit, tail
from harnessrl.adapters.inside import inside_mounts, npm_parts, path_for, run_inside
from harnessrl.adapters.toolchain import require


def opencode_config(model: str, base_url: str, api_key: str, context: int = 32768, output: int = 4096) -> dict:
    """OpenCode's config. `context`/`output`: the model's `limit`; OpenCode compacts its own
    conversation once a reply's usage (prompt + completion tokens) reaches context - output."""
    cfg = {"model": f"local/{model}", "small_model": f"local/{model}", "autoupdate": False, "share": "disabled",
           "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
           "provider": {"local": {"npm": "@ai-sdk/openai-compatible", "name": "Local",
                                  "options": {"baseURL": f"{base_url}/v1", "apiKey": api_key},
                                  "models": {model: {"name": model, "limit": {"context": context, "output": output}}}}}}
    if context < 32768:  # a deliberately small window: summarize the whole conversation, keep no tail
        cfg["compaction"] = {"auto": True, "tail_turns": 0}
    return cfg


class OpenCodeAdapter:
    name: ClassVar[str] = "opencode"
    dialect: ClassVar[str] = "openai-chat"
    """Chat Completions, streamed with stream_options.include_usage; a title call comes first."""
    placement: ClassVar[str] = "inside"
    streams: ClassVar[bool] = True
    completion: ClassVar[str] = "exits 0 after a final answer without tool calls; JSON events on stdout"
    version: ClassVar[str] = "1.18.33"
    install: ClassVar[str] = "npm:opencode-ai@1.18.33"

    def __init__(self, context: int = 32768, output: int = 4096):
        self.context = context
        """The model's context window as OpenCode is told it (its `limit.context`): it compacts
        (summarizes its conversation in a call of its own, then goes on from the summary) once a
        reply's usage reaches `context - output`. Below 32768 it also keeps no verbatim tail."""
        self.output = output
        """The model's output limit as OpenCode is told it (`limit.output`)."""

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        return inside_mounts(endpoint, toolchain, npm_parts(self.name))

    def launch(self, launch: Launch) -> HarnessResult:
        require("npm", self.name, self.install.split(":", 1)[1], launch.toolchain)
        ep = launch.endpoint
        x = f"{SANDBOX_SCRATCH}/xdg"
        cfg = opencode_config(ep.model, ep.inside_base_url, ep.api_key, self.context, self.output)
        files = {f"{x}/config/opencode/opencode.json": json.dumps(cfg, indent=1).encode()}
        env = {"XDG_CONFIG_HOME": f"{x}/config", "XDG_DATA_HOME": f"{x}/data", "XDG_CACHE_HOME": f"{x}/cache",
               "XDG_STATE_HOME": f"{x}/state", "HOME": f"{SANDBOX_SCRATCH}/home", "PATH": path_for(self.name),
               "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
               "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
               "OPENCODE_DISABLE_SHARE": "1"}
        argv = ["opencode", "run", "--format", "json", launch.problem_statement]
        run = run_inside(launch, argv, env, files)
        return HarnessResult(classify_exit(run.exit_code, run.timed_out), run.exit_code, _last_step(run.stdout),
                             tail(run.stdout), tail(run.stderr), run.duration_s)


def _last_step(stdout: str) -> str | None:
    """The reason of its last finished step ("stop" after a final answer, "tool-calls", ...)."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("type") == "step_finish":
            return str((event.get("part") or {}).get("reason"))
    return None
