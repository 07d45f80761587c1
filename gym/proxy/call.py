"""One model call's state as it goes through `ProxyCore.run`: what the HTTP side hands the
core (`Prepared`), and what the pipeline's steps hand each other (`Call`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .canonical import ChatRequest
from .generation import Generation
from .recorder import Plan, Session
from .rows import CallRow


@dataclass
class Prepared:
    session: Session
    req: ChatRequest
    arrived: float
    disconnected: Callable[[], Awaitable[bool]] | None = None
    """True once a plain call's client is gone (`app.disconnect_probe`): its reply is then undelivered."""


@dataclass
class Call:
    """One call while it runs: what `ProxyCore.run`'s steps hand each other."""

    p: Prepared
    pl: Plan
    """The rendered prompt and where it goes (`recorder.plan`)."""
    cid: str
    created: int
    gen: Generation
    writer: Any
    """The dialect's Stream of a streamed call; None for a plain one."""
    markers: list[str]
    """Where streamed text is held back: the stop strings and the tool-call start."""
    params: dict[str, Any]
    ignored: list[str]
    rec: CallRow
    sent: str = ""
    """The text a streamed call has sent so far."""
