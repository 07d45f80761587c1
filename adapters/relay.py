"""A tiny byte relay: accept on one socket, forward each connection to another. Stdlib only.

Why: sandboxes have no network at all, yet a harness inside one must reach the proxy. The
episode's proxy endpoint is a unix socket in a per-episode host directory; a sandbox without a
control-stream tunnel (bubblewrap; Docker tunnels instead, sandboxes/tunnel.py) has it
bind-mounted, and this file is copied into the sandbox and run there with its own python3:

    python3 relay.py --listen tcp:127.0.0.1:18080 --target unix:/run/harnessrl/proxy.sock \
        --ready-file /tmp/harnessrl/relay.ready

so the harness talks plain HTTP to its own loopback. The same `Relay` class runs on the host
(in a thread) to give an episode a private unix socket in front of the proxy's TCP port when
the proxy does not listen on one itself. Bytes are copied verbatim in both directions (HTTP
keep-alive and streaming work unchanged); a half-close on one side is passed on to the other.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading


def parse_addr(spec: str) -> tuple[int, object]:
    """'tcp:HOST:PORT' or 'unix:PATH' -> (family, address)."""
    kind, _, rest = spec.partition(":")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return socket.AF_INET, (host, int(port))
    raise ValueError(f"bad relay address {spec!r}: expected tcp:HOST:PORT or unix:PATH")


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:  # pass the EOF on, keep the other direction open until it ends too
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Relay:
    """Listen on `listen`, forward every accepted connection to `target`."""

    def __init__(self, listen: str, target: str, socket_mode: int = 0o666):
        self.listen_family, self.listen_addr = parse_addr(listen)
        self.target_family, self.target_addr = parse_addr(target)
        self.server = socket.socket(self.listen_family, socket.SOCK_STREAM)
        if self.listen_family == socket.AF_INET:
            self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        elif os.path.exists(self.listen_addr):  # a stale socket from a crashed run
            os.unlink(self.listen_addr)
        self.server.bind(self.listen_addr)
        if self.listen_family == socket.AF_UNIX:
            # The sandbox user (uid 1000) must be able to connect to a socket the host made.
            os.chmod(self.listen_addr, socket_mode)
        self.server.listen(128)
        self._closed = False
        self._thread: threading.Thread | None = None

    def _handle(self, client: socket.socket) -> None:
        upstream = socket.socket(self.target_family, socket.SOCK_STREAM)
        try:
            upstream.connect(self.target_addr)
        except OSError as e:
            sys.stderr.write(f"relay: cannot reach {self.target_addr}: {e}\n")
            client.close()
            upstream.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def serve_forever(self) -> None:
        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                break
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def start(self, name: str = "harnessrl-relay") -> "Relay":
        """Serve in a daemon thread (host side) called `name`."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name=name)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        if self.listen_family == socket.AF_UNIX and os.path.exists(self.listen_addr):
            os.unlink(self.listen_addr)
        if self._thread is not None:
            self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="tcp:HOST:PORT or unix:PATH")
    ap.add_argument("--target", required=True, help="tcp:HOST:PORT or unix:PATH")
    ap.add_argument("--ready-file", help="written once listening (callers poll for it)")
    args = ap.parse_args(argv)
    relay = Relay(args.listen, args.target)
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write(str(os.getpid()))
    relay.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
