"""Gemini CLI 0.61.0, inside the sandbox, Gemini API (`:streamGenerateContent?alt=sse`).

Pointed at the proxy by `GOOGLE_GEMINI_BASE_URL` (the session URL without `/v1beta`; the SDK
appends `/v1beta/models/{model}:...`), the session key as `GEMINI_API_KEY` (sent as
`x-goog-api-key`). Auth is pinned to "gemini-api-key" in `$HOME/.gemini/settings.json`: with
only the base URL set it would pick the "gateway" auth, which non-interactive mode refuses
("Invalid auth method selected"). The same settings turn off what needs the network or slows
an offline run: auto-update and its notice, usage statistics and telemetry, loop detection,
sub-agents and skills, ripgrep. `maxAttempts` is 3: the CLI retries only 429 / 499 / 5xx, so
a weight-update pause is waited out, a dead engine fails in ~15 s and a 400 at once.

The tool set is `tools=` (default `TOOLS`: shell, read, write, list). The CLI's default set
adds web search/fetch, planning, topic and sub-agent tools the sandbox cannot serve, and its
~25k-character system prompt with that set is ~8.7k SmolLM2 tokens, past an 8k context; with
`TOOLS` the first prompt of the built-in task is ~7.6k (`FULL_TOOLS` adds replace, glob and
grep, ~1.3k more). `GEMINI_CLI_TRUST_WORKSPACE` trusts the task's checkout (headless mode
refuses an untrusted folder). `model.maxSessionTurns` is the call budget; past it the CLI
exits 53 (`FatalTurnLimitedError`), a call limit. `--output-format json` prints one object:
`response` after a final answer, `error` (type, message, code) otherwise.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from harnessrl.adapters.base import SANDBOX_SCRATCH, Endpoint, HarnessResult, Launch, Mount, classify_exit, tail
from harnessrl.adapters.inside import inside_mounts, npm_parts, path_for, run_inside
from harnessrl.adapters.toolchain import check_node, node_version, require

TOOLS = ("run_shell_command", "read_file", "write_file", "list_directory")
FULL_TOOLS = ("run_shell_command", "read_file", "write_file", "replace", "list_directory", "glob", "grep_search")
#: The CLI's exit status when `model.maxSessionTurns` is reached.
TURN_LIMIT_EXIT = 53


def gemini_settings(max_turns: int, tools: tuple[str, ...] = TOOLS) -> dict:
    """`~/.gemini/settings.json` for an offline, headless, sandboxed run."""
    return {"security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "maxAttempts": 3,
                        "retryFetchErrors": False},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
            "model": {"maxSessionTurns": max_turns, "disableLoopDetection": True, "skipNextSpeakerCheck": True},
            "tools": {"core": list(tools), "useRipgrep": False},
            "experimental": {"enableAgents": False}, "skills": {"enabled": False}}


class GeminiCliAdapter:
    name: ClassVar[str] = "gemini-cli"
    dialect: ClassVar[str] = "gemini"
    """POST /v1beta/models/{model}:streamGenerateContent?alt=sse, x-goog-api-key header."""
    placement: ClassVar[str] = "inside"
    streams: ClassVar[bool] = True
    completion: ClassVar[str] = ("exits 0 with a JSON `response` after a final answer; exit 53 past "
                                 "model.maxSessionTurns; other errors exit non-zero with a JSON `error`")
    version: ClassVar[str] = "0.61.0"
    install: ClassVar[str] = "npm:@google/gemini-cli@0.61.0"
    node: ClassVar[str] = ">=20"
    """The node its package declares (`engines.node`); checked against the toolchain's at launch."""

    def __init__(self, tools: tuple[str, ...] | list[str] = TOOLS):
        """`tools`: the CLI's built-in tools it may use (`tools.core` in its settings)."""
        if isinstance(tools, str) or not tools or not all(isinstance(t, str) and t for t in tools):
            raise ValueError(f"gemini-cli tools: want a non-empty list of tool names, got {tools!r}")
        self.tools = tuple(tools)

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        return inside_mounts(endpoint, toolchain, npm_parts(self.name))

    def launch(self, launch: Launch) -> HarnessResult:
        require("npm", self.name, self.install.split(":", 1)[1], launch.toolchain)
        check_node(self.node, node_version(launch.toolchain), self.name)
        ep = launch.endpoint
        home = f"{SANDBOX_SCRATCH}/home"
        files = {f"{home}/.gemini/settings.json": json.dumps(gemini_settings(launch.limits.max_calls, self.tools)).encode()}
        env = {"HOME": home, "PATH": path_for(self.name), "GOOGLE_GEMINI_BASE_URL": ep.inside_base_url,
               "GEMINI_API_KEY": ep.api_key, "GEMINI_CLI_TRUST_WORKSPACE": "true", "NO_COLOR": "1",
               "NO_BROWSER": "true"}
        argv = ["gemini", "-p", launch.problem_statement, "--yolo", "-m", ep.model, "--output-format", "json"]
        run = run_inside(launch, argv, env, files)
        status = _status(run.stdout + "\n" + run.stderr)
        reason = classify_exit(run.exit_code, run.timed_out)
        if run.exit_code == TURN_LIMIT_EXIT:
            reason = "call_limit"
        return HarnessResult(reason, run.exit_code, status, tail(run.stdout), tail(run.stderr), run.duration_s)


def _status(out: str) -> str | None:
    """"response" for a final answer, else the JSON error's type (e.g. `FatalTurnLimitedError`)."""
    dec = json.JSONDecoder()
    found = None
    i = out.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(out, i)
        except ValueError:
            i = out.find("{", i + 1)
            continue
        if isinstance(obj, dict) and ("response" in obj or "error" in obj):
            err = obj.get("error")
            found = str(err.get("type") or "error") if isinstance(err, dict) else "response"
        i = out.find("{", end)
    return found
