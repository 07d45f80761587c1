"""`harnessrl serve`: the proxy in front of a user's own harness, recording into a private store.

    with Serve(ServeConfig(store="~/.cache/harnessrl/live"), engine_url) as srv:
        sid, key = srv.new_session("my-codex")
        print(env_lines(srv.url, sid, key))     # OPENAI_BASE_URL=..., ANTHROPIC_BASE_URL=..., ...

Contract: the store folder is private (`privacy`), its database the proxy's own store format
(`gym.proxy.Store`): a finished call is committed before its reply's last byte leaves, so a
killed server loses no finished call, and a restarted one serves feedback and deletion for the
sessions it finds. Each harness process gets its own session (its key is in the env lines);
a session's meta says `live: true` and the tokenizer hash, so `trainers.live` can refuse
records of another tokenizer. While it runs, `serve.json` (0600) in the folder holds the URL
and admin token that `harnessrl sessions` / `harnessrl feedback` use; it is removed on exit.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.models import home
from harnessrl.gym.proxy.config import ProxyConfig
from harnessrl.gym.proxy.identity import tokenizer_hash
from harnessrl.gym.proxy.server import ProxyServer
from harnessrl.gym.live.privacy import DB_NAME, SERVER_FILE, private_dir, write_private


def default_store() -> str:
    """$HARNESSRL_HOME/live (default ~/.cache/harnessrl/live)."""
    return str(home() / "live")


class ServeConfig(BaseModel):
    """How `harnessrl serve` records a user's own harness sessions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    store: str = Field(default_factory=default_store)
    """Private folder (0700) of the session store (calls.db, 0600) and of serve.json while running."""
    model: str = "smollm2-135m"
    """Prepared model name or folder whose tokenizer and chat template render prompts (the engine's model)."""
    host: str = "127.0.0.1"
    """Interface the harness-facing API listens on (loopback: only this machine's harnesses)."""
    port: int = Field(8421, ge=0, le=65535)
    """TCP port (0: a free one)."""
    admin_clients: Literal["loopback", "any"] = "loopback"
    """Who may call the admin API (feedback, deletion, new sessions): loopback clients only, or any
    client that reaches `host`; always with the admin token (serve.json)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature of every call (> 0: greedy data has no importance ratio and is never trained)."""
    max_tokens_cap: int = Field(8192, ge=1)
    """Upper bound on the tokens one reply may have, whatever the harness asks for."""


def env_lines(url: str, sid: str, key: str) -> str:
    """The lines to paste into the shell that starts one harness process, per dialect."""
    base = f"{url}/s/{sid}"
    return "\n".join([
        "# OpenAI Chat Completions / Responses (Codex CLI, OpenCode, aider, mini-swe-agent, ...):",
        f"export OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY={key}",
        "# Anthropic Messages (Claude Code, ...):",
        f"export ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY={key} ANTHROPIC_AUTH_TOKEN={key}",
        "# Gemini API (Gemini CLI, ...):",
        f"export GOOGLE_GEMINI_BASE_URL={base} GEMINI_API_KEY={key}",
    ])


class Serve:
    """The proxy over the private store, serve.json written while it runs."""

    def __init__(self, config: ServeConfig, engine_url: str | list[str], admin_token: str | None = None):
        self.config = config
        self.folder = private_dir(config.store)
        self.proxy = ProxyServer(ProxyConfig(
            engine_url=engine_url, model=config.model, host=config.host, port=config.port,
            admin_clients=config.admin_clients, admin_token=admin_token, db_path=str(self.folder / DB_NAME),
            served_models=[], temperature=config.temperature, max_tokens_cap=config.max_tokens_cap))
        self.tokenizer_hash = tokenizer_hash(self.proxy.core.renderer.tok)

    @property
    def url(self) -> str:
        return self.proxy.url

    def start(self) -> "Serve":
        self.proxy.start()
        write_private(self.folder / SERVER_FILE, json.dumps(self.server_info()))
        return self

    def server_info(self) -> dict[str, Any]:
        """What serve.json holds: how the other commands reach this server, and what it records with."""
        return {"url": self.url, "admin_token": self.proxy.admin_token, "pid": os.getpid(),
                "model": self.config.model, "chat_template_hash": self.proxy.core.renderer.template_hash,
                "tokenizer_hash": self.tokenizer_hash}

    def new_session(self, label: str = "") -> tuple[str, str]:
        """A session for one harness process: (id, key)."""
        return self.proxy.open_session(live_meta(label, self.tokenizer_hash))

    def stop(self) -> None:
        """Every open session closed (its record is final), serve.json removed, the proxy stopped."""
        for sid, s in list(self.proxy.core.sessions.items()):
            if not s.closed:
                self.proxy.close_session(sid)
        (self.folder / SERVER_FILE).unlink(missing_ok=True)
        self.proxy.stop()

    def __enter__(self) -> "Serve":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def live_meta(label: str, tok_hash: str) -> dict[str, Any]:
    """The meta of a live session: marked live, labelled, with the tokenizer hash it records with."""
    return {"live": True, "harness": label or "live", "tokenizer_hash": tok_hash}


def server_file(store: str | Path) -> Path:
    return Path(store).expanduser() / SERVER_FILE
