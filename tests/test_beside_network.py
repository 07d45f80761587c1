"""Beside harnesses off the network (adapters/netns.py): a real script launched exactly as a
beside harness is (proc.run_host, plain and from a fork server) tries real connections (a TCP
server on the host's non-loopback address and one on host loopback, a UDP "DNS" server, a unix
socket under the host's /run, name resolution) and all fail, while its calls to a real
ProxyServer succeed and are recorded token-exact; with network "host" the same script reaches
the test servers, and the run says so."""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from harnessrl.adapters import netns, prefork
from harnessrl.adapters.prefork import Prefork
from harnessrl.adapters.proc import clean_env, run_host
from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

sys.path.insert(0, str(Path(__file__).parent))
from proxy_helpers import ServedApp, check_exact, standin  # noqa: E402

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(240)]

PROBE = r'''
import json, os, socket, sys, urllib.request
a = json.loads(sys.argv[1])
out = {}
req = urllib.request.Request(a["proxy"] + "/chat/completions", method="POST",
    data=json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + a["key"], "content-type": "application/json"})
out["proxy"] = json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["message"]["content"]
def attempt(fn):
    try:
        return "reached: " + fn()
    except OSError as e:
        return type(e).__name__
def tcp(addr):
    with socket.create_connection(tuple(addr), timeout=5) as s:
        return s.recv(100).decode()
def unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)
        return s.recv(100).decode()
def udp(addr):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01", tuple(addr))
        return s.recv(100).decode()
for name, addr in a["tcp"].items():
    out[name] = attempt(lambda: tcp(addr))
out["unix"] = attempt(lambda: unix(a["unix"]))
out["dns_server"] = attempt(lambda: udp(a["udp"]))
out["resolve"] = attempt(lambda: str(socket.getaddrinfo("harnessrl-test.example.com", 80)[0][4]))
def escape():  # setns() into the network namespace of a host process (the test's own)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{a['host_pid']}/ns/net", os.O_RDONLY)
    if os.readlink(f"/proc/{a['host_pid']}/ns/net") == os.readlink("/proc/self/ns/net"):
        return "already there"
    if libc.setns(fd, 0x40000000) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return "escaped"
if a["escape"]:
    out["setns"] = attempt(escape)
    out["caps"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
print(json.dumps(out))
'''


def _outside_ipv4() -> str:
    """An address of this host that is not loopback (docker0, eth0, ...)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.skip("this host has no non-loopback IPv4 address")


class Banner:
    """Servers that answer "banner" to whoever connects: TCP on `addr`, UDP on `addr`, unix on `path`."""

    def __init__(self, host: str, unix_path: str | None = None):
        self.socks = []
        self.tcp = self._serve(socket.socket(socket.AF_INET), (host, 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((host, 0))
        self.socks.append(self.udp)
        threading.Thread(target=self._udp_loop, daemon=True).start()
        if unix_path:
            self._serve(socket.socket(socket.AF_UNIX), unix_path)

    def _serve(self, s: socket.socket, addr):
        s.bind(addr)
        s.listen(8)
        self.socks.append(s)

        def loop():
            while True:
                try:
                    c, _ = s.accept()
                except OSError:
                    return
                c.sendall(b"banner")
                c.close()
        threading.Thread(target=loop, daemon=True).start()
        return s.getsockname()

    def _udp_loop(self):
        while True:
            try:
                _, peer = self.udp.recvfrom(512)
                self.udp.sendto(b"banner", peer)
            except OSError:
                return

    def close(self):
        for s in self.socks:
            s.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("beside-net")
    tok = load_tokenizer("tiny-llama")
    eng, script = standin(tok)
    run_dir = Path("/run") / f"harnessrl-test-{uuid.uuid4().hex[:8]}"  # a host socket dir never mounted
    run_dir.mkdir()
    outside = Banner(_outside_ipv4(), str(run_dir / "daemon.sock"))
    local = Banner("127.0.0.1")
    probe = tmp / "probe"
    probe.write_text(f"#!{sys.executable}\n{PROBE}")
    probe.chmod(0o755)
    cfg = ProxyConfig(engine_url="", db_path=str(tmp / "calls.db"))
    try:
        with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
            yield SimpleNamespace(proxy=p, eng=eng, script=script, probe=probe, tmp=tmp, outside=outside, local=local,
                                  unix=str(run_dir / "daemon.sock"))
    finally:
        outside.close()
        local.close()
        prefork.close_all()
        for f in run_dir.iterdir():
            f.unlink()
        run_dir.rmdir()


def _run(w, network: str, forked: bool):
    sid, key = w.proxy.open_session({})
    w.script.say(f"reply-{sid[:6]}")
    args = {"proxy": w.proxy.openai_base_url(sid), "key": key, "unix": w.unix, "udp": list(w.outside.udp.getsockname()),
            "tcp": {"outside": list(w.outside.tcp), "loopback": list(w.local.tcp)},
            "escape": network == "proxy-only", "host_pid": os.getpid()}
    n0 = len(w.eng.calls)
    env = clean_env({"HOME": str(w.tmp)})
    run = run_host([str(w.probe), json.dumps(args)], env, str(w.tmp), 120,
                   prefork=Prefork(("json",), ("HOME",)) if forked else None,
                   network=network, proxy_url=w.proxy.url + f"/s/{sid}")
    assert run.exit_code == 0, run.stderr
    assert run.launch == ("forked" if forked else "plain") and run.network == network
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["proxy"] == f"reply-{sid[:6]}"
    check_exact(w.proxy.trajectory(sid), w.eng.calls[n0:])  # the relayed call is recorded token-exact
    return out


@pytest.mark.parametrize("forked", [False, True], ids=["plain", "forked"])
def test_proxy_only_reaches_the_proxy_and_nothing_else(world, forked, monkeypatch):
    monkeypatch.setenv("HARNESSRL_PREFORK", "1")
    out = _run(world, "proxy-only", forked)
    assert out["outside"] in ("OSError", "ConnectionRefusedError"), out  # ENETUNREACH: no route at all
    assert out["loopback"] == "ConnectionRefusedError", out  # the namespace's own loopback: nobody there
    assert out["unix"] == "FileNotFoundError", out  # /run is an empty tmpfs
    assert out["dns_server"] in ("OSError", "TimeoutError", "ConnectionRefusedError"), out
    assert out["resolve"] == "gaierror", out
    assert out["setns"] == "PermissionError", out  # no way back into the host's namespace
    assert int(out["caps"], 16) == 0, out  # no capabilities at all, even when this runs as root


@pytest.mark.parametrize("forked", [False, True], ids=["plain", "forked"])
def test_host_network_opt_out_reaches_the_test_servers(world, forked, monkeypatch):
    monkeypatch.setenv("HARNESSRL_PREFORK", "1")
    out = _run(world, "host", forked)
    assert (out["outside"], out["loopback"], out["unix"], out["dns_server"]) == ("reached: banner",) * 4, out


def test_proxy_only_needs_a_loopback_proxy_url_and_a_known_network():
    with pytest.raises(ValueError, match="network must be one of"):
        run_host(["true"], {}, "/", 10, network="open")
    with pytest.raises(ValueError, match="needs proxy_url"):
        run_host(["true"], {}, "/", 10, network="proxy-only")
    with pytest.raises(ValueError, match="http://127.0.0.1:PORT"):
        netns.proxy_port("http://10.0.0.5:8000/s/x")


def test_unavailable_namespaces_fail_loudly_naming_the_opt_out(monkeypatch):
    monkeypatch.setattr(netns, "_checked", "bwrap (bubblewrap) is not installed")
    with pytest.raises(netns.NetnsUnavailable, match='network = "host"'):
        run_host(["true"], {}, "/", 10, network="proxy-only", proxy_url="http://127.0.0.1:9/s/x")
