"""`harnessrl engine sglang` against a stand-in SGLang: a real Python whose `sglang` package
records its argv and serves /health over real HTTP (SGLang itself needs a GPU)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.models import ModelNotPrepared
from harnessrl.trainers.engine.sglang_launch import SGLangLaunch, SGLangLaunchError, SGLangServer, command

LAUNCH_SERVER = textwrap.dedent('''
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    argv = sys.argv[1:]
    with open(os.environ["FAKE_SGLANG_ARGV"], "w") as f:
        json.dump(argv, f)
    mode = os.environ.get("FAKE_SGLANG_MODE", "serve")
    if mode == "exit":
        print("fake sglang: no GPU", file=sys.stderr)
        sys.exit(7)
    ready_at = time.monotonic() + float(os.environ.get("FAKE_SGLANG_DELAY", "0"))

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" and mode == "serve" and time.monotonic() >= ready_at
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    ThreadingHTTPServer((host, port), Health).serve_forever()
''')


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    """An executable that is this Python with a stand-in `sglang` package on its path."""
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
    exe = tmp_path / "bin" / "python"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp_path / "site"}" exec "{sys.executable}" "$@"\n')
    exe.chmod(0o755)
    return exe


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("FAKE_SGLANG_ARGV", str(argv_file))
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path / "home"))
    return argv_file


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_command_has_the_contract_flags_then_the_callers_arguments() -> None:
    launch = SGLangLaunch(python="/venv/bin/python", model="/m", weight_version="7", deterministic=True,
                          api_key="k", extra=("--tp", "2"))
    assert command(launch, 31000) == [
        "/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1",
        "--port", "31000", "--weight-version", "7", "--enable-priority-scheduling",
        "--enable-deterministic-inference", "--api-key", "k", "--tp", "2"]
    assert command(SGLangLaunch(python="p"), 5)[4:] == [
        "smollm2-135m", "--host", "127.0.0.1", "--port", "5", "--weight-version", "0",
        "--enable-priority-scheduling"]


def test_prepared_name_becomes_its_folder_and_waits_for_health(fake_python, env, tmp_path, monkeypatch) -> None:
    folder = tmp_path / "home" / "models" / "tiny-llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.setenv("FAKE_SGLANG_DELAY", "1.5")
    t0 = time.monotonic()
    with SGLangServer(SGLangLaunch(python=str(fake_python), model="tiny-llama", port=0)) as server:
        assert time.monotonic() - t0 >= 1.5  # /health said 503 until then
        port = int(server.url.rsplit(":", 1)[1])
        assert server.url == f"http://127.0.0.1:{port}"
        assert httpx.get(server.url + "/health").status_code == 200
        assert json.loads(env.read_text()) == [
            "--model-path", str(folder), "--host", "127.0.0.1", "--port", str(port),
            "--weight-version", "0", "--enable-priority-scheduling"]
    assert server.proc.returncode == -signal.SIGTERM and _closed(port)


def test_clear_errors(fake_python, env, tmp_path, monkeypatch) -> None:
    with pytest.raises(SGLangLaunchError, match=r"^--python /nowhere/python: no such file$"):
        SGLangServer(SGLangLaunch(python="/nowhere/python", model="/m")).start()
    with pytest.raises(SGLangLaunchError, match=r"^--python /bin/false: is not a working Python \(no output\)$"):
        SGLangServer(SGLangLaunch(python="/bin/false", model="/m")).start()
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(SGLangLaunchError, match=r"sglang is not installed there \(in that environment: "
                                                    r"pip install 'sglang==0\.5\.23'\)$"):
            SGLangServer(SGLangLaunch(python=sys.executable, model="/m")).start()
    with pytest.raises(ModelNotPrepared, match="run: harnessrl model prepare smollm2-135m"):
        SGLangServer(SGLangLaunch(python=str(fake_python))).start()
    monkeypatch.setenv("FAKE_SGLANG_MODE", "exit")
    with pytest.raises(SGLangLaunchError, match=r"^sglang exited with status 7 before http://127\.0\.0\.1:\d+/health"):
        SGLangServer(SGLangLaunch(python=str(fake_python), model="/m", port=0)).start()
    monkeypatch.setenv("FAKE_SGLANG_MODE", "sick")
    server = SGLangServer(SGLangLaunch(python=str(fake_python), model="/m", port=0, startup_timeout_s=2))
    with pytest.raises(SGLangLaunchError, match=r"did not answer http://127\.0\.0\.1:\d+/health within 2 s \(stopped it\)$"):
        server.start()
    assert server.proc.returncode == -signal.SIGTERM


def test_cli_prints_the_url_passes_extra_args_and_stops_on_sigterm(fake_python, env, tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "engine", "sglang", "--python", str(fake_python), "--model", "/m",
         "--port", "0", "--weight-version", "v3", "--", "--tp", "2", "--mem-fraction-static", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        url = proc.stdout.readline().strip()
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/health").status_code == 200
        assert json.loads(env.read_text()) == [
            "--model-path", "/m", "--host", "127.0.0.1", "--port", str(port), "--weight-version", "v3",
            "--enable-priority-scheduling", "--tp", "2", "--mem-fraction-static", "0.5"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        assert _closed(port)  # the server went with it
    finally:
        proc.kill()
        proc.wait()
    bad = subprocess.run([sys.executable, "-m", "harnessrl.cli", "engine", "sglang", "--python", "/nowhere/py"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr == "harnessrl engine sglang: --python /nowhere/py: no such file\n"
