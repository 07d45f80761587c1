"""Harness adapters: one small module per real agent harness, plus `command` for any CLI.

`get_adapter(name_or_path, **kwargs)` resolves a short registry name or a full
"package.module:Class" path, importing lazily so that listing adapters imports nothing.
A `.toml`/`.yaml` path builds a `CommandAdapter` from that config file.
"""
from __future__ import annotations

from typing import Any

from harnessrl.registry import arg_type, choice, resolve

REGISTRY: dict[str, str] = {
    "mini-swe-agent": "harnessrl.adapters.mini_swe_agent:MiniSweAgentAdapter",
    "codex": "harnessrl.adapters.codex:CodexAdapter",
    "claude-code": "harnessrl.adapters.claude_code:ClaudeCodeAdapter",
    "claude-code-agents": "harnessrl.adapters.claude_code:ClaudeCodeAgentsAdapter",
    "opencode": "harnessrl.adapters.opencode:OpenCodeAdapter",
    "aider": "harnessrl.adapters.aider:AiderAdapter",
    "gemini-cli": "harnessrl.adapters.gemini_cli:GeminiCliAdapter",
    "command": "harnessrl.adapters.command:CommandAdapter",
}


#: A harness as a config field: a `REGISTRY` name, a "module:Class" path or a command-adapter
#: config file (.toml/.yaml), refused at validation time otherwise, with the valid names.
HarnessName = choice(REGISTRY, "harness", files=(".toml", ".yaml", ".yml"))
#: The same check for a `--harness` flag: a one-line error listing the valid names.
harness_arg = arg_type(REGISTRY, "harness", files=(".toml", ".yaml", ".yml"))


def adapter_class(name: str) -> type:
    """The adapter class for a registry name or a "module:Class" path."""
    return resolve(REGISTRY, name, "harness", hint=", or a command-adapter config file (.toml/.yaml)")


def check_options(name: str, options: dict[str, Any]) -> None:
    """Refuse, naming the option and listing the valid ones, keyword arguments that harness
    `name`'s adapter does not take (a command-adapter config file takes none: its file is its
    configuration)."""
    import inspect

    if not options:
        return
    if name.endswith((".toml", ".yaml", ".yml")):
        raise ValueError(f"{name} is a command-adapter config: set its options in that file, not here")
    params = {p.name: p for p in inspect.signature(adapter_class(name)).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ValueError(f"{name}: no option {unknown[0]!r}; its adapter takes {sorted(params) or 'none'}")


def get_adapter(name: str, **kwargs: Any) -> Any:
    """An adapter instance; a path ending in .toml/.yaml/.yml is a command-adapter config."""
    if name.endswith((".toml", ".yaml", ".yml")):
        from harnessrl.adapters.command import CommandAdapter
        return CommandAdapter.from_file(name)
    return adapter_class(name)(**kwargs)
