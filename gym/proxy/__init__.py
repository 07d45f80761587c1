"""harnessrl's OpenAI/Anthropic-compatible proxy: one session per episode, token-exact
recording through the engine contract. Public API: `ProxyConfig`, `ProxyServer`, `Store`."""
from __future__ import annotations

from .config import ProxyConfig
from .server import ProxyServer
from .store import Store

__all__ = ["ProxyConfig", "ProxyServer", "Store"]
