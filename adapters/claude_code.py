"""Claude Code 2.1.332, inside the sandbox, Anthropic Messages API (always streamed).

Run in print mode with the settings ../shared/docs/harnesses.md records: base URL without
`/v1`, nonessential traffic / telemetry / autoupdate / error reporting / experimental betas
off, one retry (a dead endpoint otherwise hangs for minutes), `--max-turns` from the limits,
and the explicit tool list `Bash,Read,Edit,Write,Glob,Grep` (the full default set makes it
put role:"system" entries inside `messages`). `claude-code-agents` (`ClaudeCodeAgentsAdapter`)
also offers Claude Code's sub-agent tool `Agent`, whose conversations the proxy records as
spawned segments of the same episode. `--output-format json` prints one result
object whose `subtype` says how it ended (`success`, `error_max_turns`, ...).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from harnessrl.adapters.base import SANDBOX_SCRATCH, Endpoint, HarnessResult, Launch, Mount, classify_exit, tail
from harnessrl.adapters.inside import inside_mounts, npm_parts, path_for, run_inside
from harnessrl.adapters.toolchain import require

TOOLS = "Bash,Read,Edit,Write,Glob,Grep"
NPM_NAME = "claude-code"
"""The toolchain's npm prefix (shared by both registry names)."""


class ClaudeCodeAdapter:
    name: ClassVar[str] = "claude-code"
    dialect: ClassVar[str] = "anthropic"
    """POST /v1/messages?beta=true (after a HEAD /), x-api-key header."""
    placement: ClassVar[str] = "inside"
    streams: ClassVar[bool] = True
    completion: ClassVar[str] = ("exits 0 with result subtype `success` after a final answer; exit 1 with "
                                 "subtype `error_max_turns` past --max-turns; result JSON on stdout")
    version: ClassVar[str] = "2.1.332"
    install: ClassVar[str] = "npm:@anthropic-ai/claude-code@2.1.332"
    toolchain_dir: ClassVar[str] = NPM_NAME
    """The toolchain folder it runs from (check-adapter's `installed` check looks there)."""

    def __init__(self, tools: str = TOOLS):
        self.tools = tools
        """The `--tools` list Claude Code offers the model."""

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        return inside_mounts(endpoint, toolchain, npm_parts(NPM_NAME))

    def launch(self, launch: Launch) -> HarnessResult:
        require("npm", NPM_NAME, self.install.split(":", 1)[1], launch.toolchain)
        ep = launch.endpoint
        env = {
            "IS_SANDBOX": "1", "CLAUDE_CONFIG_DIR": f"{SANDBOX_SCRATCH}/claude", "HOME": f"{SANDBOX_SCRATCH}/home",
            "ANTHROPIC_BASE_URL": ep.inside_base_url, "ANTHROPIC_API_KEY": ep.api_key, "ANTHROPIC_MODEL": ep.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
            "MAX_THINKING_TOKENS": "0", "CLAUDE_CODE_MAX_RETRIES": "1", "PATH": path_for(NPM_NAME),
        }
        argv = ["claude", "-p", launch.problem_statement, "--dangerously-skip-permissions", "--output-format",
                "json", "--max-turns", str(launch.limits.max_calls), "--tools", self.tools]
        run = run_inside(launch, argv, env, {})
        subtype = _subtype(run.stdout)
        reason = classify_exit(run.exit_code, run.timed_out)
        if subtype == "error_max_turns":
            reason = "call_limit"
        return HarnessResult(reason, run.exit_code, subtype, tail(run.stdout), tail(run.stderr), run.duration_s)


def _subtype(stdout: str) -> str | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "subtype" in obj:
            return str(obj["subtype"])
    return None


class ClaudeCodeAgentsAdapter(ClaudeCodeAdapter):
    """Claude Code with its sub-agent tool: `--tools Bash,Read,Edit,Write,Glob,Grep,Agent`."""

    name: ClassVar[str] = "claude-code-agents"

    def __init__(self) -> None:
        super().__init__(TOOLS + ",Agent")
