"""The host's end of a Docker sandbox's PID 1 (sandbox_init.py) over `docker attach`.

One attach stream per sandbox carries JSON lines both ways: requests with an `id` whose
replies are matched on a reader thread (so commands of one sandbox may overlap), and tunnel
traffic (sandboxes/tunnel.py: messages with a connection id `c`), routed to its handler on
that same thread. The stream is the only way in or out of the container.
"""
from __future__ import annotations

import itertools
import json
import queue
import socket
import struct
import threading
from typing import Callable


class Channel:
    """The host's end of PID 1's attach stream (sandbox_init.py): JSON lines out, JSON lines
    back, matched by id on a reader thread, so commands of one sandbox may overlap."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.ready = threading.Event()
        self.warm = False
        """PID 1 said its warm-up held (sandbox_init.py): warm python runs fork from it."""
        self.closed: str | None = None  # why the stream ended, once it has
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[int, queue.SimpleQueue] = {}
        self._streams: dict[int, Callable[[dict | None], None]] = {}
        """Tunnel connections (sandboxes/tunnel.py) by id: their messages, then None when the stream ends."""
        self._listeners: dict[int, Callable[[dict | None], None]] = {}
        """Tunnel listeners by request id: their replies, on the reader thread (so a connection's
        handler is in place before its first bytes are read)."""
        self._ids = itertools.count(1)
        threading.Thread(target=self._read, daemon=True, name="sandbox-ctl").start()

    def request(self, msg: dict) -> tuple[int, queue.SimpleQueue]:
        """Send msg under a fresh id; its replies arrive on the queue, then None if the stream
        ends first. Raises ConnectionError when it has ended already."""
        q: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            if self.closed:
                raise ConnectionError(self.closed)
            rid = next(self._ids)
            self._waiting[rid] = q
        try:
            self.send({**msg, "id": rid})
        except OSError as e:
            self.done(rid)
            raise ConnectionError(f"attach stream: {e}") from e
        return rid, q

    def subscribe(self, msg: dict, handler: Callable[[dict | None], None]) -> int:
        """Send msg under a fresh id; every reply to it is handed to `handler` on the reader
        thread (it must not block), then None if the stream ends."""
        with self._lock:
            if self.closed:
                raise ConnectionError(self.closed)
            rid = next(self._ids)
            self._listeners[rid] = handler
        try:
            self.send({**msg, "id": rid})
        except OSError as e:
            self.unsubscribe(rid)
            raise ConnectionError(f"attach stream: {e}") from e
        return rid

    def unsubscribe(self, rid: int) -> None:
        with self._lock:
            self._listeners.pop(rid, None)

    def stream(self, cid: int, handler: Callable[[dict | None], None] | None) -> None:
        """Route the messages of tunnel connection `cid` to `handler` (None: stop routing)."""
        with self._lock:
            if handler is None:
                self._streams.pop(cid, None)
            elif self.closed:
                handler(None)
            else:
                self._streams[cid] = handler

    def send(self, msg: dict) -> None:
        with self._send_lock:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def done(self, rid: int) -> None:
        with self._lock:
            self._waiting.pop(rid, None)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass

    def _read(self) -> None:
        buf, why = b"", "attach stream closed"
        try:
            while True:  # non-tty attach: frames of [type, 0, 0, 0, size(4, BE)] + payload
                kind, size = struct.unpack(">BxxxL", self._recv_exact(8))
                payload = self._recv_exact(size)
                if kind != 1:
                    continue
                buf += payload
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if "c" in msg:
                        with self._lock:
                            handler = self._streams.get(msg["c"])
                        if handler is not None:
                            handler(msg)
                        continue
                    if msg.get("ready"):
                        self.warm = bool(msg.get("warm"))
                        self.ready.set()
                        continue
                    with self._lock:
                        q = self._waiting.get(msg.get("id"))
                        listener = self._listeners.get(msg.get("id"))
                    if q is not None:
                        q.put(msg)
                    elif listener is not None:
                        listener(msg)
        except Exception as e:  # noqa: BLE001 - any end of the stream ends every request on it
            why = f"attach stream ended: {type(e).__name__}: {e}"
        with self._lock:
            self.closed = why
            waiting, self._waiting = list(self._waiting.values()), {}
            ended = [*self._listeners.values(), *self._streams.values()]
            self._listeners, self._streams = {}, {}
        for q in waiting:
            q.put(None)
        for handler in ended:
            handler(None)
        self.ready.set()

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the daemon")
            buf += chunk
        return buf
