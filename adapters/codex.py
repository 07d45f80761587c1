"""Codex CLI 0.171.0, inside the sandbox, OpenAI Responses API (always streamed).

Configured only through `$CODEX_HOME/config.toml` (recent versions ignore the base-URL env
var), as ../shared/docs/harnesses.md records: a `local` provider with `wire_api =
"responses"`, no approvals, no update check, analytics/feedback/otel off, and
`--disable unbounded_connection_retries` so a dead endpoint ends the run instead of
retrying forever. `codex exec --json` prints JSONL events; it exits 0 after its final answer.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from harnessrl.adapters.base import SANDBOX_SCRATCH, Endpoint, HarnessResult, Launch, Mount, classify_exit, tail
from harnessrl.adapters.inside import inside_mounts, npm_parts, path_for, run_inside
from harnessrl.adapters.toolchain import require

CONFIG = """model = "{model}"
model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"
[analytics]
enabled = false
[feedback]
enabled = false
[otel]
exporter = "none"
[features]
plugins = false
[agents]
enabled = false
[model_providers.local]
name = "Local"
base_url = "{base_url}/v1"
env_key = "LOCAL_API_KEY"
wire_api = "responses"
request_max_retries = 1
stream_max_retries = 1
"""


class CodexAdapter:
    name: ClassVar[str] = "codex"
    dialect: ClassVar[str] = "openai-responses"
    """POST /v1/responses only (wire_api "chat" is rejected by this version)."""
    placement: ClassVar[str] = "inside"
    streams: ClassVar[bool] = True
    completion: ClassVar[str] = ("exits 0 after a final answer without tool calls; JSONL events on stdout "
                                 "(turn.completed / turn.failed / error); non-zero on a failed turn")
    version: ClassVar[str] = "0.171.0"
    install: ClassVar[str] = "npm:@openai/codex@0.171.0"

    def __init__(self, auto_compact_tokens: int | None = None):
        self.auto_compact_tokens = auto_compact_tokens
        """Codex's `model_auto_compact_token_limit`: once a turn's usage (prompt + completion
        tokens) passes it, Codex summarizes its conversation in a call of its own and goes on
        from the summary (None: Codex's default for the model)."""

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        return inside_mounts(endpoint, toolchain, npm_parts(self.name))

    def launch(self, launch: Launch) -> HarnessResult:
        require("npm", self.name, self.install.split(":", 1)[1], launch.toolchain)
        ep = launch.endpoint
        # Codex refuses to put its helper binaries (the apply_patch alias) under /tmp, so its
        # home goes in the sandbox user's own HOME when there is one.
        user_home = launch.sandbox.exec('printf %s "$HOME"', timeout=30).output.strip()
        if not user_home.startswith("/") or user_home.startswith("/tmp") or user_home == "/":
            user_home = f"{SANDBOX_SCRATCH}/home"
        home = f"{user_home}/.codex"
        config = CONFIG.format(model=ep.model, base_url=ep.inside_base_url)
        if self.auto_compact_tokens is not None:  # top-level keys go before the first [table]
            config = f"model_auto_compact_token_limit = {int(self.auto_compact_tokens)}\n" + config
        files = {f"{home}/config.toml": config.encode()}
        env = {"CODEX_HOME": home, "LOCAL_API_KEY": ep.api_key, "HOME": user_home,
               "PATH": path_for(self.name), "NO_COLOR": "1"}
        argv = ["codex", "exec", "--color", "never", "--json", "--disable", "unbounded_connection_retries",
                launch.problem_statement]
        run = run_inside(launch, argv, env, files)
        return HarnessResult(classify_exit(run.exit_code, run.timed_out), run.exit_code, _last_event(run.stdout),
                             tail(run.stdout), tail(run.stderr), run.duration_s)


def _last_event(stdout: str) -> str | None:
    import json
    for line in reversed(stdout.strip().splitlines()):
        try:
            return str(json.loads(line).get("type"))
        except (ValueError, AttributeError):
            continue
    return None
