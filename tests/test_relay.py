"""The relay carries HTTP from a network-less container to a host server, byte for byte.

Real parts: a real Docker container (network none, uid 1000, read-only root) running
adapters/relay.py with the image's own python3; real HTTP servers on the host, on a unix
socket and on loopback TCP (behind the host-side Relay, as the episode runner uses it).
"""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import socketserver
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

import harnessrl.adapters.relay as relay_mod
from harnessrl.adapters.relay import Relay, parse_addr

REPO = Path(__file__).resolve().parents[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # keep test output clean
        pass

    def do_GET(self):
        body = json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        # Stream the answer in chunks, as SSE responses are.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(5):
            chunk = f"data: {i} {hashlib.sha256(data).hexdigest()} {len(data)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) client address
        sock, _ = super().get_request()
        return sock, ("unix", 0)


CLIENT = r"""
import hashlib, json, urllib.request
base = "http://127.0.0.1:18080"
r = urllib.request.urlopen(urllib.request.Request(base + "/s/abc/v1/models",
    headers={"Authorization": "Bearer k1"}), timeout=20)
print("GET", r.read().decode())
payload = bytes(range(256)) * 4096
r = urllib.request.urlopen(urllib.request.Request(base + "/s/abc/v1/chat/completions",
    data=payload, method="POST"), timeout=20)
print("POST", json.dumps(r.read().decode()), hashlib.sha256(payload).hexdigest())
"""


def _base_image() -> str:
    tag = subprocess.run(["bash", str(REPO / "sandboxes" / "base_image.sh"), "--print-tag"],
                         capture_output=True, text=True).stdout.strip()
    try:
        import docker
        docker.from_env().images.get(tag)
    except Exception as e:  # noqa: BLE001 - any failure means: cannot run here
        pytest.skip(f"docker base image {tag!r} unavailable ({e}); run scripts/build_base_image.sh")
    return tag


def _run_in_container(image: str, sock_dir: str) -> str:
    import docker
    script = ("python3 /opt/relay.py --listen tcp:127.0.0.1:18080 --target unix:/run/harnessrl/proxy.sock "
              "--ready-file /tmp/ready & "
              "for i in $(seq 100); do [ -e /tmp/ready ] && break; sleep 0.05; done; "
              f"python3 -c '{CLIENT}'")
    client = docker.from_env()
    out = client.containers.run(
        image, ["bash", "-c", script], remove=True, network_mode="none", user="1000:1000",
        read_only=True, tmpfs={"/tmp": ""},
        volumes={relay_mod.__file__: {"bind": "/opt/relay.py", "mode": "ro"},
                 sock_dir: {"bind": "/run/harnessrl", "mode": "rw"}},
        stdout=True, stderr=True)
    return out.decode()


def _check_output(out: str) -> None:
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    got = json.loads(lines["GET"])
    assert got == {"path": "/s/abc/v1/models", "auth": "Bearer k1"}
    body, sha = lines["POST"].rsplit(" ", 1)
    body = json.loads(body)
    expected = "".join(f"data: {i} {sha} {256 * 4096}\n\n" for i in range(5))
    assert body == expected


def test_parse_addr_errors_name_the_problem():
    assert parse_addr("unix:/a/b") == (socket.AF_UNIX, "/a/b")
    assert parse_addr("tcp:127.0.0.1:9") == (socket.AF_INET, ("127.0.0.1", 9))
    with pytest.raises(ValueError, match="bad relay address 'udp:x'"):
        parse_addr("udp:x")


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_container_without_network_reaches_host_unix_socket():
    image = _base_image()
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        path = os.path.join(d, "proxy.sock")
        server = _UnixHTTPServer(path, _Handler)
        os.chmod(path, 0o666)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            _check_output(_run_in_container(image, d))
        finally:
            server.shutdown()
            server.server_close()


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_container_reaches_host_tcp_server_through_host_relay():
    """container relay (tcp->unix) -> host Relay (unix->tcp) -> HTTP server on loopback TCP."""
    image = _base_image()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        host_relay = Relay(f"unix:{d}/proxy.sock", f"tcp:127.0.0.1:{server.server_address[1]}").start()
        assert oct(os.stat(f"{d}/proxy.sock").st_mode & 0o777) == "0o666"
        try:
            _check_output(_run_in_container(image, d))
        finally:
            host_relay.close()
            server.shutdown()
            server.server_close()
        assert not os.path.exists(f"{d}/proxy.sock")
