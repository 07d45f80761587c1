"""The tunnel carries connections from inside a network-less Docker sandbox to a host address
over PID 1's attach stream: no socket, no host path, no network in the container.

Real parts: a real Docker sandbox (network none, uid 1000, read-only root, nothing mounted);
its own python3 as the client; real HTTP servers on the host on a unix socket and on loopback
TCP; bytes checked by sha256, streamed replies chunk by chunk.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import socketserver
import tempfile
import threading

import pytest

from harnessrl.sandboxes import RepoSpec, SandboxError
from harnessrl.sandboxes.base import Tunnels

pytestmark = pytest.mark.docker

CLIENT = r"""
import hashlib, http.client, json, socket, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
out = {}
def one(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = bytes((i * 7 + k) % 251 for k in range(200_000 + i))
    c.request("POST", f"/s/{i}", body=body, headers={"Authorization": f"Bearer k{i}"})
    r = c.getresponse()
    chunks = r.read().decode().split("\n\n")
    c.request("GET", f"/again/{i}")  # keep-alive: a second request on the same connection
    again = json.loads(c.getresponse().read())
    out[i] = [chunks[:-1], hashlib.sha256(body).hexdigest(), again]
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(out))
"""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):  # streamed, as SSE replies are
            chunk = f"data: {i} {hashlib.sha256(data).hexdigest()} {self.headers['Authorization']}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        sock, _ = super().get_request()
        return sock, ("unix", 0)


@pytest.fixture(scope="module")
def docker_sb(tmp_path_factory):
    from tests.test_sandboxes import _backend, _git

    d = tmp_path_factory.mktemp("src") / "r"
    d.mkdir()
    _git(d, "init", "-q", "-b", "main")
    (d / "a.txt").write_text("a\n")
    _git(d, "add", "-A")
    _git(d, "commit", "-qm", "base")
    try:
        backend = _backend("docker")
        sb = backend.create(RepoSpec("tunnel-test", str(d), _git(d, "rev-parse", "HEAD")))
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"docker backend unavailable here: {e}")
    yield sb
    sb.close()


@pytest.fixture
def unix_server():
    d = tempfile.mkdtemp(prefix="tunnel-")
    path = os.path.join(d, "proxy.sock")
    srv = _UnixServer(path, _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield path
    srv.shutdown()
    srv.server_close()


def _run_client(sb, port: int, n: int) -> dict:
    sb.write_file("/tmp/client.py", CLIENT.encode())
    res = sb.exec(["python3", "/tmp/client.py", str(port), str(n)], timeout=120)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_concurrent_streamed_keepalive_calls_cross_the_tunnel_byte_for_byte(docker_sb, unix_server):
    assert isinstance(docker_sb, Tunnels)
    with docker_sb.tunnel("tcp:127.0.0.1:18080", f"unix:{unix_server}") as t:
        out = _run_client(docker_sb, 18080, 6)
        assert t.opened == 6
    for i in range(6):
        chunks, sha, again = out[str(i)]
        # what the server hashed is what the client sent (200 kB each, verbatim), in three chunks
        assert [c.split("\r\n", 1)[-1] for c in chunks] == [f"data: {k} {sha} Bearer k{i}" for k in range(3)]
        assert again == {"path": f"/again/{i}"}
    # closed: nothing listens in the sandbox any more
    res = docker_sb.exec("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 18080), 5)'")
    assert res.exit_code == 1 and "ConnectionRefusedError" in res.output


def test_tcp_target_and_a_unix_listener_inside(docker_sb):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with docker_sb.tunnel("unix:/tmp/p.sock", f"tcp:127.0.0.1:{srv.server_address[1]}"):
            res = docker_sb.exec(["python3", "-c", (
                "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/p.sock');"
                "s.sendall(b'GET /x HTTP/1.1\\r\\nHost: h\\r\\nConnection: close\\r\\n\\r\\n');"
                "s.shutdown(socket.SHUT_WR); d = b''\n"
                "while True:\n c = s.recv(65536)\n if not c: break\n d += c\n"
                "print(d.split(b'\\r\\n\\r\\n', 1)[1].decode())")])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output) == {"path": "/x"}
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_unreachable_target_aborts_that_connection_only(docker_sb, unix_server):
    with docker_sb.tunnel("tcp:127.0.0.1:18081", "unix:/nonexistent/proxy.sock"):
        res = docker_sb.exec(["python3", "-c", (
            "import socket; s = socket.create_connection(('127.0.0.1', 18081), 10); s.sendall(b'x');"
            "print(repr(s.recv(10)))")])
    # the host could not connect: the sandbox's connection is closed, with nothing read
    # (an end of file, or a reset when the byte sent was still unread as PID 1 closed it)
    assert (res.exit_code, res.output.strip()) == (0, "b''") or "ConnectionResetError" in res.output, res.output
    with docker_sb.tunnel("tcp:127.0.0.1:18081", f"unix:{unix_server}") as t:  # the sandbox still tunnels
        out = _run_client(docker_sb, 18081, 1)
        assert out["0"][2] == {"path": "/again/0"} and t.opened == 1


def test_connections_past_the_cap_are_closed_and_the_open_ones_keep_working(docker_sb, unix_server):
    from harnessrl.sandboxes.tunnel import MAX_CONNS

    script = (
        "import http.client, json, socket\n"
        f"held = [http.client.HTTPConnection('127.0.0.1', 18083, timeout=60) for _ in range({MAX_CONNS})]\n"
        "for i, c in enumerate(held):\n"
        "    c.request('GET', f'/held/{i}'); assert json.loads(c.getresponse().read()) == {'path': f'/held/{i}'}\n"
        "s = socket.create_connection(('127.0.0.1', 18083), 30); s.sendall(b'GET /over HTTP/1.1\\r\\nHost: h\\r\\n\\r\\n')\n"
        "try:\n    over = s.recv(100)\nexcept ConnectionResetError:\n    over = b''\n"
        "held[0].request('GET', '/again'); again = json.loads(held[0].getresponse().read())\n"
        "print(json.dumps([over.decode(), again]))\n")
    docker_sb.write_file("/tmp/cap.py", script.encode())
    with docker_sb.tunnel("tcp:127.0.0.1:18083", f"unix:{unix_server}") as t:
        res = docker_sb.exec(["python3", "/tmp/cap.py"], timeout=120)
        assert res.exit_code == 0, res.output
        assert json.loads(res.output) == ["", {"path": "/again"}]
        assert (t.opened, t.refused) == (MAX_CONNS, 1)


def test_a_port_taken_in_the_sandbox_is_refused_with_the_reason(docker_sb, unix_server):
    with docker_sb.tunnel("tcp:127.0.0.1:18082", f"unix:{unix_server}"):
        with pytest.raises(SandboxError, match="could not listen on tcp:127.0.0.1:18082: .*Address already in use"):
            docker_sb.tunnel("tcp:127.0.0.1:18082", f"unix:{unix_server}")
    with pytest.raises(ValueError, match="bad tunnel address 'udp:1'"):
        docker_sb.tunnel("udp:1", f"unix:{unix_server}")
