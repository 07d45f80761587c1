"""Pre-forked harness launches (adapters/prefork.py): a forked harness sees exactly what a plain
launch gives it, dies as a plain one does, and any doubt about import-time state sends the
launch back to a plain process, with the reason recorded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from harnessrl.adapters import prefork
from harnessrl.adapters.cancel import Cancel
from harnessrl.adapters.prefork import Prefork
from harnessrl.adapters.proc import clean_env, run_host

PROBE = """
import json, os, sys
before = sorted(m for m in ("warm_dep", "bad_dep", "json") if m in sys.modules)
import warm_dep
import atexit
atexit.register(lambda: print("atexit ran", file=sys.stderr, flush=True))
print(json.dumps({"argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "env": dict(os.environ),
                  "stdin": os.readlink("/proc/self/fd/0"), "leader": os.getsid(0) == os.getpid(),
                  "preloaded": "warm_dep" in before, "key": os.environ.get("KEY"), "ppid": os.getppid(),
                  "home": os.path.expanduser("~")}))
sys.exit(int(os.environ.get("CODE", "3")))
"""


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A console script on this interpreter, a preloadable module that counts its imports, and
    a fresh server registry (closed after the test)."""
    monkeypatch.setenv("HARNESSRL_PREFORK", "1")
    prefork.close_all()  # fresh: a worker's earlier tests (a beside harness) may have left a server
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "warm_dep.py").write_text(f"open({str(tmp_path / 'imports')!r}, 'a').write('x')\n")
    script = tmp_path / "probe"
    script.write_text(f"#!{sys.executable}\n{PROBE}")
    script.chmod(0o755)
    yield tmp_path, script, lambda **kw: clean_env({"PYTHONPATH": str(lib), "HOME": str(tmp_path / "h1"), **kw})
    prefork.close_all()


WARM = Prefork(preload=("warm_dep",), late=("KEY", "HOME", "CODE"))


def _probe(run) -> dict:
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_forked_launch_sees_exactly_what_a_plain_one_does(world):
    tmp, script, env = world
    plain = run_host([str(script), "a b", "--c"], env(KEY="k0"), str(tmp), 60)
    first = run_host([str(script), "a b", "--c"], env(KEY="k1", HOME=str(tmp / "h2")), str(tmp), 60, prefork=WARM)
    second = run_host([str(script), "a b", "--c"], env(KEY="k2", CODE="0"), str(tmp), 60, prefork=WARM)
    assert (plain.launch, first.launch, second.launch) == ("plain", "forked", "forked")
    assert (plain.exit_code, first.exit_code, second.exit_code) == (3, 3, 0)
    p, f1, f2 = _probe(plain), _probe(first), _probe(second)
    for f in (f1, f2):
        for field in ("argv", "path", "cwd", "stdin", "leader"):
            assert f[field] == p[field], field
        assert f["preloaded"] and not p["preloaded"]
    assert p["stdin"] == "/dev/null" and p["leader"] and p["path"][0] == str(tmp)
    # The whole environment is the episode's, late keys included, and nothing of the server's.
    assert f1["env"] == dict(env(KEY="k1", HOME=str(tmp / "h2"))) and f1["home"] == str(tmp / "h2")
    assert f2["env"] == dict(env(KEY="k2", CODE="0")) and p["env"] == dict(env(KEY="k0"))
    assert f1["ppid"] == f2["ppid"] != os.getpid()  # one warm server made both
    assert (tmp / "imports").read_text() == "xx"  # the plain launch's import + the server's one
    assert all("atexit ran" in r.stderr for r in (plain, first, second))


def test_exit_codes_signals_and_crashes_read_as_for_a_plain_process(world):
    tmp, _, env = world
    cases = {"raise ValueError('boom')": 1, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)": -15,
             "import sys; sys.exit('bye')": 1, "pass": 0}
    for i, (body, code) in enumerate(cases.items()):
        script = tmp / f"s{i}"
        script.write_text(f"#!{sys.executable}\nimport warm_dep\n{body}\n")
        script.chmod(0o755)
        plain = run_host([str(script)], env(), str(tmp), 60)
        forked = run_host([str(script)], env(), str(tmp), 60, prefork=WARM)
        assert forked.launch == "forked"
        assert forked.exit_code == plain.exit_code == code, body
        assert forked.stderr.splitlines()[-1:] == plain.stderr.splitlines()[-1:]
    assert "ValueError: boom" in run_host([str(tmp / "s0")], env(), str(tmp), 60, prefork=WARM).stderr


ENDING = """
import atexit, os, sys, threading, time
import warm_dep
out = sys.argv[1]
def late():
    time.sleep(0.3)
    open(out + ".thread", "w").write("joined")
threading.Thread(target=late).start()  # not a daemon: the exit waits for it
atexit.register(lambda: open(out + ".atexit", "w").write(
    "after the thread" if os.path.exists(out + ".thread") else "before the thread"))
f = open(out + ".unclosed", "w")  # never closed: the interpreter's exit flushes it
f.write("kept")
print("buffered stdout, no newline", end="")
"""


@pytest.mark.parametrize("tail,code", [("", 0), ("raise ValueError('boom')", 1), ("raise KeyboardInterrupt", -2),
                                       ("sys.exit(256)", 0), ("sys.exit(-1)", 255), ("sys.exit(['a', 1])", 1)])
def test_a_forked_child_ends_as_a_plain_process_does(world, tail, code):
    """The end of a plain interpreter, step by step: status (or signal), the traceback as the
    script's own, non-daemon threads joined before atexit handlers, unclosed files and stdout
    flushed. The forked child then leaves without tearing down the server's heap."""
    tmp, _, env = world
    script = tmp / "ending"
    script.write_text(f"#!{sys.executable}\n{ENDING}{tail}\n")
    script.chmod(0o755)
    got = {}
    for how in ("plain", "forked"):
        out = tmp / how
        run = run_host([str(script), str(out)], env(), str(tmp), 60, prefork=WARM if how == "forked" else None)
        assert run.launch == how
        files = {ext: Path(f"{out}.{ext}").read_text() for ext in ("thread", "atexit", "unclosed")}
        got[how] = (run.exit_code, run.stdout, run.stderr.replace(str(out), "OUT"), files)
    assert got["forked"] == got["plain"]
    exit_code, stdout, stderr, files = got["plain"]
    assert exit_code == code and stdout == "buffered stdout, no newline"
    assert files == {"thread": "joined", "atexit": "after the thread", "unclosed": "kept"}
    if "ValueError" in tail:
        assert stderr.startswith("Traceback (most recent call last):\n") and f'File "{script}"' in stderr
        assert "runpy" not in stderr and "prefork_server" not in stderr
    if "['a', 1]" in tail:
        assert stderr == "['a', 1]\n"


@pytest.mark.parametrize("tail", ["raise ValueError('boom')", "sys.exit('a message')"])
def test_on_one_pipe_buffered_stdout_comes_before_the_traceback_or_message_as_in_python(world, tail):
    """Python flushes stdout before it prints an uncaught exception or SystemExit's message, so a
    harness whose stdout and stderr share one pipe reads them in that order; so does a forked one."""
    tmp, _, env = world
    script = tmp / "merged"
    script.write_text(f"#!{sys.executable}\nimport os, sys\nos.dup2(1, 2)\n"
                      f"print('buffered stdout', end='')\n{tail}\n")
    script.chmod(0o755)
    got = {}
    for how in ("plain", "forked"):
        run = run_host([str(script)], env(), str(tmp), 60, prefork=WARM if how == "forked" else None)
        assert run.launch == how
        got[how] = (run.exit_code, run.stdout, run.stderr)
    assert got["forked"] == got["plain"]
    exit_code, stdout, stderr = got["plain"]
    assert exit_code == 1 and stderr == ""
    assert stdout.startswith("buffered stdout")  # flushed first, then the traceback or message
    assert stdout.endswith("ValueError: boom\n" if "ValueError" in tail else "buffered stdouta message\n")


def test_the_forked_child_skips_the_teardown_of_the_heap_it_shares_with_the_server(world):
    """What os._exit skips, and only that: finalizers of objects still alive at exit. An
    object the server preloaded writes a file in `__del__`; a plain interpreter's teardown
    runs it, the forked child does not (it would touch, so copy, every page of the heap)."""
    tmp, _, env = world
    torn = tmp / "torn"
    (tmp / "lib" / "del_dep.py").write_text(
        f"class D:\n    def __del__(self, _open=open):\n        _open({str(torn)!r}, 'a').write('torn down')\n"
        "d = D()\n")
    script = tmp / "del"
    script.write_text(f"#!{sys.executable}\nimport del_dep\n")
    script.chmod(0o755)
    plain = run_host([str(script)], env(), str(tmp), 60)
    assert (plain.launch, plain.exit_code, torn.read_text()) == ("plain", 0, "torn down")
    torn.unlink()
    forked = run_host([str(script)], env(), str(tmp), 60, prefork=Prefork(("del_dep",), ("HOME",)))
    assert (forked.launch, forked.exit_code, torn.exists()) == ("forked", 0, False)


MODELS = """
from typing import Optional
from pydantic import BaseModel, ConfigDict

class Item(BaseModel):
    model_config = ConfigDict(defer_build=True)
    name: str
    child: Optional["Item"] = None
    price: "Price"

Price = float

class Dangling(BaseModel):
    model_config = ConfigDict(defer_build=True)
    x: "NotDefinedYet"

class Eager(BaseModel):
    y: int
"""


def test_deferred_pydantic_models_are_built_once_in_the_server_and_validate_as_in_a_plain_launch(world):
    """`complete_models`: the deferred schemas of the named packages' models are built in the
    server (each child gets them ready); forward references resolve from the model's own
    module; one that cannot resolve yet stays deferred and fails in the child exactly as it
    does in a plain launch."""
    tmp, _, env = world
    (tmp / "lib" / "models_dep.py").write_text(MODELS)
    script = tmp / "models"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""
        import json, models_dep as m
        ready = {n: getattr(m, n).__dict__.get("__pydantic_complete__") for n in ("Item", "Dangling", "Eager")}
        item = m.Item.model_validate({"name": "a", "price": "2.5", "child": {"name": "b", "price": 1}})
        try:
            m.Dangling(x=1)
            dangling = "built"
        except Exception as e:
            dangling = type(e).__name__
        print(json.dumps({"ready": ready, "item": item.model_dump(), "dangling": dangling}))
    """))
    script.chmod(0o755)
    warm = Prefork(("models_dep",), ("HOME",), complete_models=("models_dep",))
    plain = _probe(run_host([str(script)], env(), str(tmp), 60))
    runs = [run_host([str(script)], env(), str(tmp), 60, prefork=warm) for _ in range(2)]
    assert [r.launch for r in runs] == ["forked", "forked"]
    forked = [_probe(r) for r in runs]
    assert plain["ready"] == {"Item": False, "Dangling": False, "Eager": True}
    for f in forked:
        assert f["ready"] == {"Item": True, "Dangling": False, "Eager": True}
        assert f["item"] == plain["item"] == {"name": "a", "child": {"name": "b", "child": None, "price": 1.0},
                                              "price": 2.5}
        assert f["dangling"] == plain["dangling"] == "PydanticUserError"
    # Not named: nothing is built ahead.
    prefork.close_all()
    cold = run_host([str(script)], env(), str(tmp), 60, prefork=Prefork(("models_dep",), ("HOME",)))
    assert cold.launch == "forked" and _probe(cold)["ready"]["Item"] is False


TREE = """
import os, subprocess, sys, time
a = subprocess.Popen(["sleep", "86400"])
b = subprocess.Popen(["setsid", "sleep", "86400"])
open(sys.argv[1], "w").write(f"{os.getpid()} {a.pid} {b.pid}")
print("started", flush=True)
time.sleep(86400)
"""


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_timeout_and_cancel_kill_the_whole_forked_tree(world, how):
    tmp, _, env = world
    script, pids = tmp / "tree", tmp / "pids"
    script.write_text(f"#!{sys.executable}\n{TREE}")
    script.chmod(0o755)
    cancel = Cancel()
    if how == "cancel":
        def later():
            while not pids.exists() or len(pids.read_text().split()) < 3:
                time.sleep(0.05)
            cancel.set("scheduler timeout")
        threading.Thread(target=later, daemon=True).start()
    run = run_host([str(script), str(pids)], env(), str(tmp), 4 if how == "timeout" else 3600, cancel, WARM)
    assert run.launch == "forked" and run.exit_code is None and "started" in run.stdout
    assert (run.timed_out, run.cancelled) == ((True, False) if how == "timeout" else (False, True))
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _refusal(tmp, script, env, module_src: str) -> str:
    prefork.close_all()  # a fresh server for each version of the module
    (tmp / "lib" / "bad_dep.py").write_text(module_src)
    run = run_host([str(script)], env(KEY="k"), str(tmp), 60, prefork=Prefork(("bad_dep",), ("KEY", "HOME")))
    assert run.exit_code == 3 and _probe(run)["key"] == "k"  # it still ran, plainly
    return run.launch


def test_doubtful_import_time_state_sends_the_launch_back_to_plain(world, monkeypatch):
    tmp, script, env = world
    assert _refusal(tmp, script, env, "import os\nKEY = os.environ.get('KEY')\n") == \
        "plain (late keys read at import: KEY read by bad_dep)"
    assert _refusal(tmp, script, env, "import os\nCFG = os.path.expanduser('~/.cfg')\n") == \
        "plain (late keys read at import: HOME read by bad_dep)"
    assert _refusal(tmp, script, env, "import threading, time\n"
                    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n") == \
        "plain (the preload started threads (2): forking would be unsafe)"
    assert _refusal(tmp, script, env, "raise ImportError('no such thing')\n") == \
        "plain (preload 'bad_dep' failed: ImportError: no such thing)"
    # The stdlib's user-site lookup from HOME is the one read allowed (and redone in the child).
    assert _refusal(tmp, script, env, "import site\nsite.getuserbase()\n") == "forked"
    other = tmp / "other"
    other.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    other.chmod(0o755)
    r = run_host([str(other)], env(), str(tmp), 60, prefork=WARM)
    assert r.exit_code == 0 and r.launch.startswith("plain (") and "#!/abs/path/python" in r.launch
    monkeypatch.setenv("HARNESSRL_PREFORK", "0")
    assert run_host([str(script)], env(), str(tmp), 60, prefork=WARM).launch == "plain"


def test_optional_preloads_are_skipped_when_absent_and_checked_like_the_rest_when_present(world):
    """An optional module the venv lacks is skipped (the launch still forks, the server says
    which); one that is present is imported once by the server and arrives preloaded; one that
    is present but fails (a dependency of its own missing), reads a late key or starts a
    thread sends the launch back to plain, as a required one does."""
    tmp, script, env = world
    lib = tmp / "lib"
    (lib / "opt_dep.py").write_text(f"open({str(tmp / 'opt_imports')!r}, 'a').write('x')\n")
    probe = "import sys\nprint('opt' if 'opt_dep' in sys.modules else 'cold')\n"
    script.write_text(f"#!{sys.executable}\n{probe}")
    warm = Prefork(("warm_dep",), ("KEY", "HOME"), optional=("no_such_module_here", "opt_dep", "no_such_pkg.sub"))
    runs = [run_host([str(script)], env(KEY=f"k{i}"), str(tmp), 60, prefork=warm) for i in range(2)]
    assert [(r.launch, r.exit_code, r.stdout.strip()) for r in runs] == [("forked", 0, "opt")] * 2
    server = next(iter(prefork._servers.values()))
    assert server.skipped == ["no_such_module_here", "no_such_pkg.sub"]
    assert (tmp / "opt_imports").read_text() == "x"  # the server's one import served both
    for name, src, why in (
            ("bad_opt1", "import no_such_dependency_of_it\n",
             "plain (preload 'bad_opt1' failed: ModuleNotFoundError: No module named 'no_such_dependency_of_it')"),
            ("bad_opt2", "import os\nK = os.environ.get('KEY')\n", "plain (late keys read at import: KEY read by bad_opt2)"),
            ("bad_opt3", "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
             "plain (the preload started threads (2): forking would be unsafe)")):
        prefork.close_all()
        (lib / f"{name}.py").write_text(src)
        run = run_host([str(script)], env(KEY="k"), str(tmp), 60,
                       prefork=Prefork(("warm_dep",), ("KEY", "HOME"), optional=(name,)))
        assert (run.launch, run.exit_code, run.stdout.strip()) == (why, 0, "cold")


def test_concurrent_launches_each_get_their_own_environment_and_servers_split_by_env(world):
    tmp, script, env = world
    runs: dict[int, object] = {}

    def one(i):
        runs[i] = run_host([str(script), str(i)], env(KEY=f"k{i}"), str(tmp), 120, prefork=WARM)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = {i: _probe(r) for i, r in runs.items()}
    assert all(runs[i].launch == "forked" and got[i]["key"] == f"k{i}" and got[i]["argv"][1] == str(i) for i in got)
    assert len({g["ppid"] for g in got.values()}) == 1
    # A server that died is replaced by a fresh one, not left to fail every launch.
    os.kill(got[0]["ppid"], 9)
    psutil.Process(got[0]["ppid"]).wait(10)
    again = run_host([str(script)], env(KEY="k"), str(tmp), 60, prefork=WARM)
    assert again.launch == "forked" and _probe(again)["ppid"] != got[0]["ppid"]
    # A non-late key that differs (it could shape import-time state) gets a server of its own.
    other = run_host([str(script)], env(KEY="k", LANG="C"), str(tmp), 60, prefork=WARM)
    assert other.launch == "forked" and _probe(other)["ppid"] != got[0]["ppid"]


def test_launchers_that_vanish_or_send_garbage_do_not_take_the_server_down(world):
    import socket
    import struct
    tmp, script, env = world
    first = run_host([str(script)], env(KEY="a"), str(tmp), 60, prefork=WARM)
    server = next(iter(prefork._servers.values()))
    payload = json.dumps({"argv": [str(script)], "env": dict(env(KEY="gone")), "cwd": str(tmp)}).encode()
    for _ in range(3):  # a launch whose launcher is gone before the pid comes back
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(server.socket_path)
        out = os.open(os.devnull, os.O_WRONLY)
        socket.send_fds(c, [struct.pack("!Q", len(payload))], [out, out, out])
        c.sendall(payload)
        os.close(out)
        c.close()
    for junk in (b"nonsense", struct.pack("!Q", 5) + b"{bad"):  # no fds, then a broken request
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(server.socket_path)
        c.sendall(junk)
        assert b"error" in c.recv(4096)
        c.close()
    again = run_host([str(script)], env(KEY="b"), str(tmp), 60, prefork=WARM)
    assert again.launch == "forked" and _probe(again)["ppid"] == _probe(first)["ppid"] == server.pid


def test_the_server_and_its_children_die_with_their_owner(world):
    tmp, script, env = world
    sleeper = tmp / "sleeper"
    sleeper.write_text(f"#!{sys.executable}\nimport os, time\nprint(os.getpid(), flush=True)\ntime.sleep(86400)\n")
    sleeper.chmod(0o755)
    owner = textwrap.dedent(f"""
        import json, os, sys
        from harnessrl.adapters.prefork import Prefork, server_for
        env = {dict(env())!r}
        s = server_for({sys.executable!r}, Prefork(("warm_dep",)), env)
        child = s.spawn([{str(sleeper)!r}], env, {str(tmp)!r}, sys.stdout.fileno(), sys.stderr.fileno())
        print(json.dumps([s.pid, child.pid, os.getpgid(child.pid)]), flush=True)
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", owner], capture_output=True, text=True, timeout=120)
    # the first line: the sleeper may print its pid after it
    server_pid, child_pid, child_group = json.loads(out.stdout.strip().splitlines()[0])
    # the child leads its group before its pid is handed out, so the owner's exit right after
    # `spawn` kills it (a child still in the server's group was missed by killpg)
    assert child_group == child_pid
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in (server_pid, child_pid)):
        time.sleep(0.1)
    assert not _alive(server_pid) and not _alive(child_pid)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("name", ["mini-swe-agent", "aider"])
def test_real_harnesses_warm_the_server_their_launches_use_and_it_accepts_their_preload(name):
    """`warm()` (called when a rollout starts) starts the very server a launch will pick (same
    key), and the real harness's preload passes the server's checks: a refusal would make
    every episode pay litellm's import again, silently."""
    from harnessrl.adapters import aider, get_adapter, mini_swe_agent
    from harnessrl.adapters.toolchain import installed_spec, toolchain_root

    adapter = get_adapter(name)
    if installed_spec("venvs", name) != adapter.install.split(":", 1)[1]:
        pytest.skip(f"{name} is not installed (scripts/install_harnesses.sh)")
    script = str(toolchain_root() / "venvs" / name / "bin" / ("mini" if name == "mini-swe-agent" else "aider"))
    if name == "mini-swe-agent":
        launch_env = mini_swe_agent._env(Path("/tmp/some-episode"), "episode-key")
    else:
        launch_env = clean_env({**aider.BASE_ENV, "HOME": "/tmp/h", "OPENAI_API_BASE": "http://x/v1",
                                "OPENAI_API_KEY": "episode-key"})
    prefork.close_all()
    try:
        adapter.warm()
        assert len(prefork._servers) == 1
        warmed = next(iter(prefork._servers.values()))
        own = (mini_swe_agent if name == "mini-swe-agent" else aider).PREFORK
        # the launch's key: also whether it runs off the network (adapters/netns.py; the default)
        assert adapter.network == "proxy-only"
        assert prefork.server_for(prefork.interpreter_of(script), own, launch_env, True) is warmed
        warmed.wait_ready()
        assert warmed.refusal is None
        assert warmed.skipped == []  # every optional module still exists in the pinned release
    finally:
        prefork.close_all()

