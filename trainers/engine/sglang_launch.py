"""`harnessrl engine sglang`: SGLang as its own server process, from its own Python.

SGLang pins its own torch and transformers (sglang 0.5.23: torch 2.14.1, transformers
5.19.0), so it never shares harnessrl's environment: `--python` names the interpreter of a
venv where `pip install 'harnessrl[gpu]'` (or `sglang==0.5.23`) was done. The contract:

- the command is `PYTHON -m sglang.launch_server --model-path M --host H --port P
  --weight-version V --enable-priority-scheduling [--enable-deterministic-inference]
  [--api-key K] EXTRA...`: the flags sglang-contract.md relies on (the weight version every
  reply reports; the `priority` the engine client sends, higher first, is honoured only with
  priority scheduling), then the caller's own SGLang arguments unchanged;
- a prepared model's short name becomes its folder (no hub download); anything else goes
  to SGLang as given (a folder or a hub id);
- the launcher waits until GET /health answers 200, prints the URL on stdout, and then
  lives as long as the server does; Ctrl-C or SIGTERM stops the server's process group;
- a missing interpreter, one without sglang, a server that exits early or never turns
  healthy is one line on stderr naming the cause (`SGLangLaunchError`), exit status 2.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

#: What `--python` must be able to import; checked before anything starts.
PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sglang') else 3)"


class SGLangLaunchError(RuntimeError):
    """SGLang could not be started or never became healthy; the message names why."""


@dataclass(frozen=True)
class SGLangLaunch:
    """One SGLang server to start (the flags of `harnessrl engine sglang`)."""

    python: str
    """Interpreter of the environment that has sglang installed."""
    model: str = "smollm2-135m"
    """A prepared model's short name (its folder is used), a folder, or a hub id."""
    host: str = "127.0.0.1"
    """Interface SGLang listens on."""
    port: int = 30000
    """TCP port; 0 picks a free one."""
    weight_version: str = "0"
    """Version SGLang reports in every reply until the first weight update."""
    deterministic: bool = False
    """Pass --enable-deterministic-inference (batch-invariant kernels; slower)."""
    api_key: str | None = None
    """Require this bearer key (SGLang's --api-key)."""
    extra: tuple[str, ...] = field(default=())
    """Further SGLang arguments, passed as given after ours."""
    startup_timeout_s: float = 1800.0
    """How long to wait for /health (loading and warming a large model takes minutes)."""


def model_arg(model: str) -> str:
    """A prepared short name as its folder (an error if not prepared); anything else as is."""
    from harnessrl.gym.models import MODELS, resolve_model

    return str(resolve_model(model)) if model in MODELS else model


def check_python(python: str) -> None:
    """Raise SGLangLaunchError unless `python` runs and can import sglang."""
    path = Path(python)
    if not path.exists():
        raise SGLangLaunchError(f"--python {python}: no such file")
    if not os.access(path, os.X_OK) or path.is_dir():
        raise SGLangLaunchError(f"--python {python}: not an executable file")
    try:
        probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except OSError as e:
        raise SGLangLaunchError(f"--python {python}: cannot run it ({e.strerror or e})") from None
    except subprocess.TimeoutExpired:
        raise SGLangLaunchError(f"--python {python}: did not answer a version probe in 120 s") from None
    if probe.returncode == 3:
        raise SGLangLaunchError(f"--python {python}: sglang is not installed there "
                                "(in that environment: pip install 'sglang==0.5.23')")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise SGLangLaunchError(f"--python {python}: is not a working Python ({last})")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def command(launch: SGLangLaunch, port: int) -> list[str]:
    """The argv that starts the server (model already resolved by the caller)."""
    argv = [launch.python, "-m", "sglang.launch_server", "--model-path", launch.model,
            "--host", launch.host, "--port", str(port), "--weight-version", launch.weight_version,
            "--enable-priority-scheduling"]
    if launch.deterministic:
        argv.append("--enable-deterministic-inference")
    if launch.api_key:
        argv += ["--api-key", launch.api_key]
    return argv + list(launch.extra)


def url_of(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{shown}:{port}"


class SGLangServer:
    """A started SGLang process; `url` is set once /health answered 200."""

    def __init__(self, launch: SGLangLaunch) -> None:
        self.launch = launch
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> SGLangServer:
        check_python(self.launch.python)
        model = model_arg(self.launch.model)
        port = self.launch.port or free_port(self.launch.host)
        argv = command(replace(self.launch, model=model), port)
        url = url_of(self.launch.host, port)
        # its own session, so stop() reaches the scheduler and detokenizer processes it forks
        self.proc = subprocess.Popen(argv, start_new_session=True)
        self._wait_healthy(url)
        self.url = url
        return self

    def _wait_healthy(self, url: str) -> None:
        deadline = time.monotonic() + self.launch.startup_timeout_s
        headers = {"Authorization": f"Bearer {self.launch.api_key}"} if self.launch.api_key else {}
        with httpx.Client(timeout=5) as http:  # one client for the polls: a new one loads the CA bundle (~34 ms)
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise SGLangLaunchError(f"sglang exited with status {code} before {url}/health answered "
                                            "(its output is above)")
                try:
                    if http.get(f"{url}/health", headers=headers).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise SGLangLaunchError(f"sglang did not answer {url}/health within "
                                            f"{self.launch.startup_timeout_s:g} s (stopped it)")
                time.sleep(0.5)

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--python", required=True, help="interpreter of the environment with sglang installed")
    parser.add_argument("--model", default="smollm2-135m", help="prepared model name, folder or hub id")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default loopback)")
    parser.add_argument("--port", type=int, default=30000, help="TCP port (default 30000; 0 picks a free one)")
    parser.add_argument("--weight-version", default="0", help="version reported before any update (default 0)")
    parser.add_argument("--deterministic", action="store_true", help="pass --enable-deterministic-inference")
    parser.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    parser.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds to wait for /health")
    parser.add_argument("sglang_args", nargs=argparse.REMAINDER,
                        help="after --: further sglang.launch_server arguments, passed as given")
    return parser


def launch_from_args(args: argparse.Namespace) -> SGLangLaunch:
    extra = list(args.sglang_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return SGLangLaunch(python=args.python, model=args.model, host=args.host, port=args.port,
                        weight_version=args.weight_version, deterministic=args.deterministic,
                        api_key=args.api_key, extra=tuple(extra), startup_timeout_s=args.startup_timeout)


def run(args: argparse.Namespace) -> int:
    """Start, print the URL, serve until the server exits or we are told to stop."""
    from harnessrl.gym.models import ModelNotPrepared

    server = SGLangServer(launch_from_args(args))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds to finally: stops the server
    try:
        try:
            server.start()
        except (SGLangLaunchError, ModelNotPrepared) as e:
            print(f"harnessrl engine sglang: {e}", file=sys.stderr)
            return 2
        print(server.url, flush=True)
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="harnessrl engine sglang", description=__doc__))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
