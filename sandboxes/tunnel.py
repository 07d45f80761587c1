"""Tunnels: a listener inside a sandbox whose connections reach a host address over the
sandbox's own control stream, so the sandbox needs no network, no socket and no host path.

Contract. `Tunnel(channel, listen, target)` asks the sandbox's PID 1 (sandbox_init.py, op
`listen`) to listen on `listen` (tcp:127.0.0.1:PORT or unix:PATH, inside the sandbox); each
connection accepted there is connected on the host to `target` (tcp:HOST:PORT or unix:PATH,
e.g. the episode's relay socket in front of the proxy) and its bytes are copied verbatim both
ways (HTTP keep-alive and streaming work unchanged); a half-close on one side is passed on to
the other, and a failed connect or reset on either side aborts that connection only. The
sandbox end cannot choose the target: it only sends bytes on connections the host opened for
it, and at most MAX_CONNS at once. `close()` stops the listener and every connection on it; so does the end of the stream
(the container stopped).

Per connection the host runs two threads: one writes what the sandbox sent (in order, from a
queue, so the attach stream's reader never waits on the target), one reads the target and
sends its bytes to the sandbox.
"""
from __future__ import annotations

import base64
import queue
import socket
import threading
from typing import Any

from harnessrl.sandboxes.attach import Channel

CHUNK = 1 << 16
#: Most connections open at once on one tunnel; past it a new one is closed at once (each costs
#: the host two threads and a connection to the target: a sandbox must not exhaust them).
MAX_CONNS = 64


def parse_addr(spec: str) -> tuple[int, Any]:
    """'tcp:HOST:PORT' or 'unix:PATH' -> (family, address); ValueError naming the spec."""
    kind, _, rest = spec.partition(":")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return socket.AF_INET, (host, int(port))
    raise ValueError(f"bad tunnel address {spec!r}: expected tcp:HOST:PORT or unix:PATH")


class _Conn:
    """One tunnelled connection's host end."""

    def __init__(self, tunnel: "Tunnel", cid: int):
        self.tunnel, self.cid = tunnel, cid
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # bytes, b"" at the sandbox's EOF, None: abort
        self.sock: socket.socket | None = None
        self.closed = False
        self._lock = threading.Lock()
        self._ends = 0  # directions that ended; at 2 the socket is closed
        threading.Thread(target=self._write, daemon=True, name=f"tunnel-w{cid}").start()

    def on_message(self, msg: dict | None) -> None:
        """On the channel's reader thread: queue, never block."""
        if msg is None or msg.get("close"):
            self.inbox.put(None)
        elif "d" in msg:
            self.inbox.put(base64.b64decode(msg["d"]))
        elif msg.get("eof"):
            self.inbox.put(b"")

    def _send(self, msg: dict) -> bool:
        try:
            self.tunnel.channel.send({"c": self.cid, **msg})
            return True
        except OSError:
            return False

    def _write(self) -> None:
        family, addr = self.tunnel.target
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect(addr)
        except OSError:
            sock.close()
            self._send({"close": 1})
            self.abort()
            return
        with self._lock:
            if self.closed:
                sock.close()
                return
            self.sock = sock
        threading.Thread(target=self._read, daemon=True, name=f"tunnel-r{self.cid}").start()
        while True:
            data = self.inbox.get()
            if data is None:
                self.abort()
                return
            try:
                if data:
                    sock.sendall(data)
                    continue
                sock.shutdown(socket.SHUT_WR)  # the sandbox side ended writing
            except OSError:
                self._send({"close": 1})
                self.abort()
                return
            self._ended()
            return

    def _read(self) -> None:
        sock, ended = self.sock, False
        try:
            while not ended:
                data = sock.recv(CHUNK)
                if not data:
                    break
                while len(data) < CHUNK:  # what else has come is one message, not several
                    try:
                        more = sock.recv(CHUNK - len(data), socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        break
                    if not more:
                        ended = True
                        break
                    data += more
                if not self._send({"d": base64.b64encode(data).decode()}):
                    self.abort()
                    return
        except OSError:
            if not self.closed:
                self._send({"close": 1})
                self.abort()
            return
        self._send({"eof": 1})
        self._ended()

    def _ended(self) -> None:
        with self._lock:
            self._ends += 1
            done = self._ends == 2
        if done:
            self.abort()

    def abort(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            sock = self.sock
        self.tunnel._forget(self.cid)
        self.inbox.put(None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class Tunnel:
    """Listen on `listen` in the sandbox behind `channel`; connect each connection to `target`
    on the host (see the module docstring). Raises ConnectionError when PID 1 refuses."""

    def __init__(self, channel: Channel, listen: str, target: str, timeout: float = 30.0):
        parse_addr(listen)
        self.target = parse_addr(target)
        self.channel, self.listen = channel, listen
        self.conns: dict[int, _Conn] = {}
        self.opened = 0
        """Connections accepted so far (a figure for tests and benchmarks)."""
        self.refused = 0
        """Connections closed at once because MAX_CONNS were open."""
        self._lock = threading.Lock()
        self._reply: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.rid = channel.subscribe({"op": "listen", "addr": listen}, self._on_message)
        try:
            first = self._reply.get(timeout=timeout)
        except queue.Empty:
            first = {"rc": -1, "err": f"no answer in {timeout:.0f} s"}
        if first is None or first.get("rc") != 0:
            self.close()
            why = channel.closed if first is None else first.get("err")
            raise ConnectionError(f"the sandbox could not listen on {listen}: {why}")

    def _on_message(self, msg: dict | None) -> None:
        if msg is not None and "conn" in msg:
            with self._lock:
                full = len(self.conns) >= MAX_CONNS
                self.refused += full
            if full:
                try:
                    self.channel.send({"c": int(msg["conn"]), "close": 1})
                except OSError:
                    pass
                return
            conn = _Conn(self, int(msg["conn"]))
            with self._lock:
                self.conns[conn.cid] = conn
                self.opened += 1
            self.channel.stream(conn.cid, conn.on_message)
            return
        if msg is None:
            for conn in self._take_all():
                conn.abort()
        self._reply.put(msg)

    def _forget(self, cid: int) -> None:
        with self._lock:
            self.conns.pop(cid, None)
        self.channel.stream(cid, None)

    def _take_all(self) -> list[_Conn]:
        with self._lock:
            conns, self.conns = list(self.conns.values()), {}
        return conns

    def close(self) -> None:
        """Stop listening and end every connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.channel.unsubscribe(self.rid)
        try:
            self.channel.send({"op": "unlisten", "of": self.rid, "id": 0})
        except OSError:
            pass
        for conn in self._take_all():
            conn.abort()

    def __enter__(self) -> "Tunnel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
