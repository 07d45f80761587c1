"""harnessrl's OpenAI/Anthropic/Gemini-compatible proxy: one session per episode, token-exact
recording through the engine contract (token ids in, token ids out).

    from harnessrl.gym.proxy import ProxyConfig, ProxyServer
    with ProxyServer(ProxyConfig(engine_url=engine.url, db_path="runs/x/calls.db")) as proxy:
        sid, key = proxy.open_session({"harness": "codex", "task_id": "t1"})
        base = proxy.openai_base_url(sid)        # {url}/s/{sid}/v1 ; Anthropic, Gemini: {url}/s/{sid}
        ...                                      # the harness runs with base + key
        proxy.set_reward(sid, 1.0, "ok", "submitted")
        traj = proxy.trajectory(sid)             # harnessrl.gym.trajectory.Trajectory

Modules: app (routes, auth, admin), core (the call pipeline), call (a call's state), reply
(generated ids -> the reply: stop strings, tool calls), streamtext (a streamed reply's text), openai_chat /
openai_responses / anthropic_messages / gemini (one per dialect; `dialects` resolves a
dialect's name from `harnessrl.registry.DIALECTS` to its module), render (chat template +
incremental suffix), identity (tokenizer and template hashes), toolcalls (Hermes/Qwen format,
registry), recorder (segments; where a plan renders), sampling (a call's engine params),
generation (interruptible), store (SQLite WAL, JSONL/Parquet export), engine_http (lean
/generate path and transport under EngineClient), wire (JSON and SSE over HTTP), server. (The stand-in engine lives with the other test
doubles, in `harnessrl.gym.doubles.standin`.)
"""
from __future__ import annotations

from .config import ProxyConfig
from .server import ProxyServer
from .store import Store

__all__ = ["ProxyConfig", "ProxyServer", "Store"]
