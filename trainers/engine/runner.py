"""Starting the local engine: blocking `serve(...)`, or `EngineServer` in a background thread.

Start-up failures (model not prepared, port taken, unusable model) raise `EngineStartupError`
whose message is one line that says what to do; the command line prints just that line.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading

from harnessrl.trainers.engine.config import EngineConfig

log = logging.getLogger("harnessrl.engine")


class EngineStartupError(RuntimeError):
    """The engine cannot start; the message is one line with the fix."""


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise EngineStartupError(
                f"port {port} on {host} is already in use; stop the process using it or pass --port N "
                "(0 picks a free port)") from None
        raise EngineStartupError(f"cannot listen on {host}:{port}: {e.strerror}; pass another --host/--port") from None
    sock.listen(128)
    return sock


def build_state(config: EngineConfig):
    """Load tokenizer and model, start the scheduler thread; the routes' shared state. The
    calling thread gets its torch thread count back: `num_threads` is the scheduler thread's
    (it sets it on itself), and an in-process engine (`harnessrl train`, `EngineServer`) must not
    change the count of the thread that started it (its trainer, a test worker)."""
    import torch

    caller = torch.get_num_threads()
    try:
        return _build_state(config)
    finally:
        if torch.get_num_threads() != caller:
            torch.set_num_threads(caller)


def _build_state(config: EngineConfig):
    from harnessrl.gym.models import ModelNotPrepared, load_tokenizer, resolve_model
    from harnessrl.trainers.engine.attention import use_gqa_sdpa
    from harnessrl.trainers.engine.scheduler import Scheduler
    from harnessrl.trainers.engine.server import EngineState
    from harnessrl.trainers.engine.weights import WeightLoadError, eos_token_ids, load_model

    import torch

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineStartupError(f"device {config.device!r}: torch sees no CUDA device here; use device 'cpu'")
    try:
        path = resolve_model(config.model)
        tokenizer = load_tokenizer(str(path))
        model = load_model(path, dtype=getattr(torch, config.dtype), device=config.device)
        if config.gqa_attention:
            use_gqa_sdpa(model)  # CPU: attention over the grouped KV heads, no repeated copy per step
    except (ModelNotPrepared, KeyError) as e:
        raise EngineStartupError(str(e.args[0] if e.args else e)) from None
    except WeightLoadError as e:
        raise EngineStartupError(str(e)) from None
    except (OSError, ValueError) as e:
        raise EngineStartupError(
            f"cannot load model from {config.model!r}: {e}; prepare it with: harnessrl model prepare NAME"
        ) from None
    text_cfg = model.config.get_text_config(decoder=True)
    max_context = int(getattr(text_cfg, "max_position_embeddings", 0) or 32768)
    sched = Scheduler(
        model, tokenizer, eos_token_ids(model, tokenizer),
        weight_version=config.weight_version,
        max_running=config.max_running_requests,
        max_prefill_per_step=config.max_prefill_per_step,
        max_context=max_context,
        random_seed=config.random_seed,
        num_threads=config.num_threads,
        logprob_space=config.logprob_space,
        prefix_cache_bytes=config.prefix_cache_mb << 20,
        kv_preallocate=config.kv_preallocate,
        fast_decode=config.fast_decode,
        cpu_matvec=config.cpu_matvec,
        prompt_lookup_ngram=config.prompt_lookup_ngram,
    )
    sched.start()
    return EngineState(config=config, scheduler=sched, tokenizer=tokenizer, model_path=str(path),
                       tokenizer_path=str(path), vocab_size=int(text_cfg.vocab_size), max_context=max_context)


class EngineServer:
    """The engine on loopback in a background thread: `with EngineServer(model="tiny-llama") as s: s.url`."""

    def __init__(self, config: EngineConfig | None = None, **overrides):
        base = config or EngineConfig(port=0)
        self.config = EngineConfig.model_validate({**base.model_dump(), **overrides})
        self._server = None
        self._thread: threading.Thread | None = None
        self.state = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> "EngineServer":
        import uvicorn

        from harnessrl.trainers.engine.server import build_app

        sock = _bind(self.config.host, self.config.port)
        try:
            self.state = build_state(self.config)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        app = build_app(self.state)
        # keep-alive well past httpx's 5 s pool expiry: the client drops an idle connection
        # first, never writes a request onto one the server is closing (a ReadError)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                timeout_graceful_shutdown=5, timeout_keep_alive=75))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="harnessrl-engine-http", daemon=True)
        self._thread.start()
        from harnessrl.trainers.engine.scheduler import wait_until

        if not wait_until(lambda: self._server.started or not self._thread.is_alive(), timeout=60):
            self.stop()
            raise EngineStartupError("the engine's HTTP server did not start within 60 s")
        if not self._server.started:
            raise EngineStartupError("the engine's HTTP server exited during start-up (see the log above)")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.state is not None:
            self.state.scheduler.stop()

    def __enter__(self) -> "EngineServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(model: str, host: str = "127.0.0.1", port: int = 30000, **config) -> None:
    """Run the engine in the foreground until interrupted (Ctrl-C)."""
    import uvicorn

    from harnessrl.trainers.engine.server import build_app

    cfg = EngineConfig(model=model, host=host, port=port, **config)
    sock = _bind(cfg.host, cfg.port)
    state = build_state(cfg)
    bound = sock.getsockname()[1]
    print(f"harnessrl engine: {state.model_path} on http://{cfg.host}:{bound} "
          f"(weight_version {cfg.weight_version})", flush=True)
    try:
        uvicorn.Server(uvicorn.Config(build_app(state), log_level="warning", lifespan="off",
                                      timeout_graceful_shutdown=5, timeout_keep_alive=75)).run(sockets=[sock])
    finally:
        state.scheduler.stop()
