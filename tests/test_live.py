"""Learning from live use (`harnessrl serve`, `gym.live`, `trainers.live`): real HTTP on loopback,
the real tokenizer and chat template, the stand-in engine (so every engine input is known) or
the local engine over the tiny model, real harness request shapes from tests/fixtures."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.live.privacy import modes
from harnessrl.gym.live.serve import Serve, ServeConfig
from harnessrl.gym.live.sessions import main as live_main
from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from proxy_helpers import ServedApp, check_exact, fill_placeholders, fixture_requests, standin  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _exports(text: str) -> dict[str, str]:
    """The variables of the `export A=B C=D` lines serve prints."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            out.update(dict(kv.split("=", 1) for kv in line[7:].split()))
    return out


def _admin(srv: Serve, method: str, path: str, *, token: bool = True, base: str | None = None, **kw):
    h = {"Authorization": f"Bearer {srv.proxy.admin_token}"} if token else {}
    return httpx.request(method, f"{base or srv.url}{path}", headers=h, timeout=60, **kw)


def _chat(env: dict[str, str], call: int = 0) -> httpx.Response:
    """mini-swe-agent's recorded request (placeholders filled) to the env lines' OpenAI base."""
    body = fill_placeholders(fixture_requests("mini-swe-agent.jsonl")[call]["body"])
    return httpx.post(f"{env['OPENAI_BASE_URL']}/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {env['OPENAI_API_KEY']}"})


def _claude(env: dict[str, str]) -> httpx.Response:
    """Claude Code's first Messages request (streamed) to the env lines' Anthropic base."""
    req = next(r for r in fixture_requests("claude-code.jsonl") if r["method"] == "POST"
               and r["path"].startswith("/v1/messages") and "count_tokens" not in r["path"])
    return httpx.post(f"{env['ANTHROPIC_BASE_URL']}{req['path']}", json=fill_placeholders(req["body"]), timeout=60,
                      headers={"x-api-key": env["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"})


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture()
def served(tmp_path, tok):
    """A stand-in engine (its inputs logged) and `Serve` on a fresh private store."""
    engine, _ = standin(tok)
    with ServedApp(engine.app()) as eng, Serve(ServeConfig(store=str(tmp_path / "live"), model="tiny-llama",
                                                           port=0), eng.url) as srv:
        yield srv, engine


def test_env_lines_reach_their_session_and_record_it_token_exact(served) -> None:
    from harnessrl.gym.live.serve import env_lines

    srv, engine = served
    sid, key = srv.new_session("my-agent")
    env = _exports(env_lines(srv.url, sid, key))
    assert env["OPENAI_BASE_URL"] == f"{srv.url}/s/{sid}/v1" and env["OPENAI_API_KEY"] == key
    assert env["ANTHROPIC_BASE_URL"] == f"{srv.url}/s/{sid}" and env["GEMINI_API_KEY"] == key
    r = _chat(env)
    assert r.status_code == 200, r.text
    r = _claude(env)
    assert r.status_code == 200 and "message_stop" in r.text
    traj = srv.proxy.trajectory(sid)
    check_exact(traj, engine.calls)  # prompts and completions are exactly the engine's ids
    assert [c.dialect for c in traj.calls] == ["openai_chat", "anthropic_messages"]
    assert traj.harness == "my-agent" and traj.model == "tiny-llama" and traj.reward is None
    assert traj.metadata == {"live": True, "harness": "my-agent", "tokenizer_hash": srv.tokenizer_hash}
    assert traj.chat_template_hash == srv.proxy.core.renderer.template_hash
    # each harness process its own session: another key does not reach this one
    other, other_key = srv.new_session("second")
    bad = httpx.post(f"{srv.url}/s/{sid}/v1/chat/completions", json={"model": "x", "messages": []},
                     headers={"Authorization": f"Bearer {other_key}"}, timeout=30)
    assert bad.status_code == 401


def test_the_store_is_private(served) -> None:
    srv, _ = served
    sid, key = srv.new_session()
    assert _chat({"OPENAI_BASE_URL": f"{srv.url}/s/{sid}/v1", "OPENAI_API_KEY": key}).status_code == 200
    assert modes(srv.folder) == {".": "0o700", "calls.db": "0o600", "calls.db-shm": "0o600",
                                 "calls.db-wal": "0o600", "serve.json": "0o600"}
    info = json.loads((srv.folder / "serve.json").read_text())
    assert info["url"] == srv.url and info["admin_token"] == srv.proxy.admin_token
    assert info["tokenizer_hash"] == srv.tokenizer_hash


def test_feedback_endpoint_validates_every_field_and_closes_the_session(served) -> None:
    srv, _ = served
    sid, key = srv.new_session()
    env = {"OPENAI_BASE_URL": f"{srv.url}/s/{sid}/v1", "OPENAI_API_KEY": key}
    assert _chat(env).status_code == 200
    path = f"/admin/sessions/{sid}/feedback"

    def refused(status: int, param: str, **kw) -> str:
        r = _admin(srv, "POST", path, **kw)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err.get("param") == param, err
        return err["message"]

    assert "[0, 1]" in refused(400, "reward", json={"reward": 1.5})
    assert "[0, 1]" in refused(400, "reward", json={"reward": -0.1})
    refused(400, "reward", json={"reward": True})
    refused(400, "reward", json={"reward": "0.8"})
    assert "missing" in refused(400, "reward", json={"note": "good"})
    assert "unknown field" in refused(400, "score", json={"reward": 0.5, "score": 1})
    refused(400, "note", json={"reward": 0.5, "note": 7})
    r = _admin(srv, "POST", path, json=[0.5])
    assert r.status_code == 400 and "must be a JSON object" in r.json()["error"]["message"]
    r = _admin(srv, "POST", path, content=b'{"reward": 0.5')
    assert r.status_code == 400  # malformed JSON
    r = _admin(srv, "POST", "/admin/sessions/feedc0de00000000/feedback", json={"reward": 0.5})
    assert r.status_code == 404 and "'feedc0de00000000'" in r.json()["error"]["message"]
    assert _admin(srv, "POST", path, token=False, json={"reward": 0.5}).status_code == 401
    assert srv.proxy.trajectory(sid).reward is None  # nothing refused was recorded

    r = _admin(srv, "POST", path, json={"reward": 0.8, "note": "fixed the bug"})
    assert r.status_code == 200 and r.json()["reward"] == 0.8
    traj = srv.proxy.trajectory(sid)
    assert (traj.reward, traj.status, traj.termination) == (0.8, "ok", "feedback")
    assert traj.metadata["feedback"]["note"] == "fixed the bug" and traj.metadata["feedback"]["reward"] == 0.8
    assert _chat(env).status_code == 404  # the reward ends the session: nothing joins it later


def _own_address() -> str | None:
    """An address of this machine that is not loopback (the route out), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


@pytest.mark.parametrize("clients", ["loopback", "any"])
def test_admin_from_another_address_needs_any_and_the_token(tmp_path, tok, clients: str) -> None:
    ip = _own_address()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    engine, _ = standin(tok)
    cfg = ServeConfig(store=str(tmp_path / "live"), model="tiny-llama", port=0, host="0.0.0.0", admin_clients=clients)
    with ServedApp(engine.app()) as eng, Serve(cfg, eng.url) as srv:
        sid, _ = srv.new_session()
        base = f"http://{ip}:{srv.url.rsplit(':', 1)[1]}"
        path = f"/admin/sessions/{sid}/feedback"
        no_token = _admin(srv, "POST", path, base=base, token=False, json={"reward": 1.0})
        with_token = _admin(srv, "POST", path, base=base, json={"reward": 1.0})
        if clients == "loopback":
            assert no_token.status_code == 403 and with_token.status_code == 403
            assert "loopback" in with_token.json()["error"]["message"]
            assert srv.proxy.trajectory(sid).reward is None
        else:
            assert no_token.status_code == 401 and with_token.status_code == 200
            assert srv.proxy.trajectory(sid).reward == 1.0


def test_sessions_commands_and_verified_deletion(served, capsys) -> None:
    srv, _ = served
    store = str(srv.folder)
    assert live_main(["sessions", "new", "--store", store, "--label", "codex-here"]) == 0
    env = _exports(capsys.readouterr().out)
    sid = env["OPENAI_BASE_URL"].split("/s/")[1].split("/")[0]
    assert _chat(env).status_code == 200
    keep, keep_key = srv.new_session("kept")
    assert _chat({"OPENAI_BASE_URL": f"{srv.url}/s/{keep}/v1", "OPENAI_API_KEY": keep_key}).status_code == 200

    assert live_main(["feedback", sid, "--reward", "2", "--store", store]) == 2
    assert "reward: must be a number in [0, 1], got 2.0" in capsys.readouterr().err
    assert live_main(["feedback", "0000000000000000", "--reward", "1", "--store", store]) == 2
    assert "unknown session '0000000000000000'" in capsys.readouterr().err
    assert live_main(["feedback", sid, "--reward", "0.25", "--note", "meh", "--store", store]) == 0
    assert srv.proxy.trajectory(sid).reward == 0.25
    capsys.readouterr()
    assert live_main(["sessions", "list", "--store", store]) == 0
    listed = capsys.readouterr().out
    assert re.search(rf"^{sid} .* 1 +0\.25 ok +codex-here$", listed, re.M), listed
    assert live_main(["sessions", "show", sid, "--store", store]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["calls"] == 1 and shown["meta"]["feedback"]["note"] == "meh" and shown["sampled_tokens"] == 6

    # deletion through the running server: gone from every file of the store, verified
    st = Store(str(srv.folder / "calls.db"))
    assert st.files_holding(sid.encode())  # before: it is on disk
    assert live_main(["sessions", "delete", sid, "--store", store]) == 0
    assert "deleted (1 calls); verified: its id is in no file of the store" in capsys.readouterr().out
    assert st.files_holding(sid.encode()) == [] and sid not in st.session_ids()
    with pytest.raises(KeyError):
        st.trajectory(sid)
    assert _admin(srv, "GET", f"/admin/sessions/{sid}/trajectory").status_code == 404
    assert st.session_ids()[-1] == keep and st.call_count(keep) == 1  # the others are untouched
    st.close()
    assert live_main(["sessions", "delete", sid, "--store", store]) == 2
    assert f"unknown session {sid!r}" in capsys.readouterr().err


def _serve_cli(eng_url: str, store: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    """The real `harnessrl serve` command in its own process, and the env lines it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "serve", "--engine-url", eng_url, "--model", "tiny-llama",
         "--port", "0", "--store", str(store), "--label", "first"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    while not any(x.startswith("# its reward later") for x in lines):
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError(proc.stderr.read())
        lines.append(line)
    return proc, _exports("".join(lines))


def test_a_killed_serve_keeps_its_finished_calls_and_feedback_works_without_it(tmp_path, tok, capsys) -> None:
    """The real `harnessrl serve` command, killed with SIGKILL: the finished call is on disk,
    feedback and deletion then act on the store file, and serve.json's dead URL is ignored."""
    engine, _ = standin(tok)
    store = tmp_path / "live"
    with ServedApp(engine.app()) as eng:
        proc, env = _serve_cli(eng.url, store)
        try:
            assert _chat(env).status_code == 200
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    sid = env["OPENAI_BASE_URL"].split("/s/")[1].split("/")[0]
    assert (store / "serve.json").exists()  # left behind by the kill
    assert live_main(["feedback", sid, "--reward", "1", "--store", str(store)]) == 0
    st = Store(str(store / "calls.db"))
    traj = st.trajectory(sid)
    assert len(traj.calls) == 1 and traj.calls[0].completion_ids == engine.calls[0]["output_ids"]
    assert (traj.reward, traj.status, traj.harness) == (1.0, "ok", "first")
    st.close()
    assert live_main(["sessions", "delete", sid, "--store", str(store)]) == 0
    assert "verified" in capsys.readouterr().out
    assert modes(store)["calls.db"] == "0o600"


def test_sigterm_stops_serve_with_its_sessions_closed_and_its_token_file_gone(tmp_path, tok) -> None:
    engine, _ = standin(tok)
    store = tmp_path / "live"
    with ServedApp(engine.app()) as eng:
        proc, env = _serve_cli(eng.url, store)
        assert _chat(env).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert not (store / "serve.json").exists()  # the admin token does not outlive the server
    (row,) = Store(str(store / "calls.db")).summaries()
    assert row["closed"] is not None and row["calls"] == 1 and row["reward"] is None  # final, not yet rewarded


def test_purge_deletes_the_sessions_past_retention(served, capsys) -> None:
    srv, _ = served
    old, _ = srv.new_session("old")
    new, _ = srv.new_session("new")
    st = Store(str(srv.folder / "calls.db"))
    st._db.execute("UPDATE sessions SET created = created - 10 * 86400 WHERE id = ?", (old,))  # made 10 days ago
    assert live_main(["sessions", "purge", "--older-than-days", "7", "--store", str(srv.folder)]) == 0
    assert "purged 1 sessions created over 7 days ago; verified" in capsys.readouterr().out
    assert st.session_ids() == [new] and st.files_holding(old.encode()) == []
    st.close()


@pytest.mark.harness
@pytest.mark.timeout(300)
def test_a_real_mini_swe_agent_on_the_host_through_the_env_lines(tmp_path, tok, capsys) -> None:
    """mini-swe-agent 2.4.6 (its own venv, its local environment: no sandbox, as a user runs it)
    pointed at serve by the env lines: it runs the scripted command in its folder, submits, and
    its two calls are recorded token-exact in one segment; feedback then rewards the session."""
    from harnessrl.adapters.toolchain import installed_spec, toolchain_root
    from harnessrl.gym.live.serve import env_lines

    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    engine, script = standin(tok)

    def bash(cmd: str) -> str:
        return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": cmd}}) + "\n</tool_call>"
    script.say(bash("echo live-hello > note.txt"), bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"))
    work = tmp_path / "work"
    work.mkdir()
    with ServedApp(engine.app()) as eng, Serve(ServeConfig(store=str(tmp_path / "live"), model="tiny-llama",
                                                           port=0), eng.url) as srv:
        sid, key = srv.new_session("mini-swe-agent")
        env = _exports(env_lines(srv.url, sid, key))
        run_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "MSWEA_CONFIGURED": "true",
                   "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_SILENT_STARTUP": "1",
                   "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "cfg"),
                   "OPENAI_API_KEY": env["OPENAI_API_KEY"], "OPENAI_BASE_URL": env["OPENAI_BASE_URL"]}
        argv = [str(toolchain_root() / "venvs" / "mini-swe-agent" / "bin" / "mini"), "-m", "openai/policy",
                "-t", "write a note", "-y", "--exit-immediately", "-o", str(tmp_path / "mini.traj.json"),
                "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={env['OPENAI_BASE_URL']}",
                "-c", "agent.step_limit=4", "-c", "agent.cost_limit=0", "-c", f"environment.cwd={work}"]
        out = subprocess.run(argv, env=run_env, cwd=work, capture_output=True, text=True, timeout=240)
        assert (work / "note.txt").read_text() == "live-hello\n", out.stdout[-2000:] + out.stderr[-2000:]
        assert json.loads((tmp_path / "mini.traj.json").read_text())["info"]["exit_status"] == "Submitted"
        traj = srv.proxy.trajectory(sid)
        check_exact(traj, engine.calls)
        assert len(traj.calls) == 2 and len(traj.segments) == 1  # the second call extends the first
        assert live_main(["feedback", sid, "--reward", "1", "--note", "wrote it", "--store", str(srv.folder)]) == 0
        assert srv.proxy.trajectory(sid).reward == 1.0
