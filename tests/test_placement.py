"""Where episodes run (`gym.placement`, `gym.ray_workers`) without a cluster: the config's
placement and Ray section, the engine probe a worker keeps, and a worker's loopback door to a
proxy on another address (a real HTTP server, real sockets)."""
from __future__ import annotations

import http.server
import socket
import threading

import httpx
import pytest

from harnessrl.gym.placement import LocalPlacement, placement_class
from harnessrl.gym.proxy_admin import ProxyHandle
from harnessrl.gym.ray_workers import is_loopback, loopback_door, worker_handle
from harnessrl.trainers.train_config import ConfigError, TrainConfig, documented_config, load_config


def test_the_train_config_names_a_placement_and_its_ray_section(tmp_path):
    cfg = TrainConfig.model_validate({"placement": "ray", "ray": {
        "address": "127.0.0.1:6379", "num_workers": 4, "resources": [{"node_a": 1}, {"node_b": 0.5}]}})
    assert (cfg.placement, cfg.ray.address, cfg.ray.num_workers) == ("ray", "127.0.0.1:6379", 4)
    assert cfg.ray.resources == [{"node_a": 1.0}, {"node_b": 0.5}]
    assert TrainConfig().placement == "local" and placement_class("local") is LocalPlacement
    assert placement_class("ray").__name__ == "RayRun" and placement_class("ray").episodes_here is False
    bad = tmp_path / "bad.toml"
    bad.write_text('placement = "kubernetes"\n')
    with pytest.raises(ConfigError, match=r"placement: .*unknown placement 'kubernetes'; known: local, ray"):
        load_config(bad)
    bad.write_text('placement = "ray"\n[ray]\npoll_s = 0.05\n')  # versions are pushed now: no poll interval
    with pytest.raises(ConfigError, match=r"ray.poll_s: Extra inputs are not permitted"):
        load_config(bad)
    text = documented_config(cfg)
    assert 'placement = "ray"' in text and "[ray]" in text
    assert 'resources = [{node_a = 1.0}, {node_b = 0.5}]' in text


def test_a_worker_off_the_drivers_host_does_not_probe_the_drivers_loopback_engine():
    h = ProxyHandle("http://10.0.0.5:8000", "tok", engine_url="http://127.0.0.1:30000")
    assert worker_handle(h, "driver", here="driver") is h  # same host: its loopback is the engine's
    far = worker_handle(h, "driver", here="node-b")
    assert (far.url, far.admin_token, far.engine_url) == ("http://10.0.0.5:8000", "tok", None)
    routable = ProxyHandle("http://10.0.0.5:8000", "tok", engine_url="http://10.0.0.9:30000")
    assert worker_handle(routable, "driver", here="node-b") is routable
    assert [is_loopback(u) for u in ("http://localhost:1", "http://127.0.0.2:1", "http://[::1]:1", "http://0.0.0.0:1",
                                     "http://10.0.0.5:1", "http://engine.internal:1", None)] == [
        True, True, True, True, False, False, False]


def _routable_ip() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outbound interface
        return s.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback IPv4 interface on this machine")
    finally:
        s.close()


def test_a_worker_reaches_a_proxy_on_another_address_through_its_loopback_door():
    ip = _routable_ip()
    if ip.startswith("127."):
        pytest.skip("no non-loopback IPv4 interface on this machine")

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = f"{self.path} from {self.client_address[0]}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer((ip, 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        far = ProxyHandle(f"http://{ip}:{server.server_address[1]}", "tok", engine_url=None, uds_path="/x.sock")
        near, door = loopback_door(far)
        try:
            assert near.url.startswith("http://127.0.0.1:") and near.url != far.url and near.uds_path is None
            assert (near.admin_token, near.engine_url) == ("tok", None)
            r = httpx.get(f"{near.url}/s/abc/v1/models", timeout=10)
            assert (r.status_code, r.text) == (200, f"/s/abc/v1/models from {ip}")  # the proxy sees the worker's host
        finally:
            door.close()
        local = ProxyHandle("http://127.0.0.1:9", "tok", engine_url=None)
        assert loopback_door(local) == (local, None)  # a proxy on loopback needs no door
    finally:
        server.shutdown()
        server.server_close()
