"""The one config of the proxy (validation only, no side effects)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harnessrl.gym.backends import BackendName, engine_urls
from harnessrl.gym.proxy.toolcalls import ToolFormatName

ADMIN_TOKEN_ENV = "HARNESSRL_PROXY_ADMIN_TOKEN"
"""The environment variable a proxy process (`python -m harnessrl.gym.proxy`) takes its admin
token from: a command line is readable by every local user, an environment is not."""


class ProxyConfig(BaseModel):
    """How the proxy serves harnesses, reaches the engine and records calls."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    engine_url: str | list[str]
    """Base URL of the engine, e.g. http://127.0.0.1:30000 (SGLang's `/generate` with token ids, or
    vLLM's token-in/token-out routes with `backend="vllm"`), or a list of several such engines
    serving the same model: each session sticks to one of them, a failed one is routed around
    (`gym.backends.router`). SGLang's own router is one URL. Ignored when the proxy is handed a
    backend object (`ProxyServer(config, backend=...)`: a trainer's in-process generation side)."""

    backend: BackendName = "sglang"
    """Which generation backend reaches `engine_url`: "sglang" (also the local engine), "vllm", or
    a "module:Class" path (`harnessrl.gym.backends`)."""

    vllm_route: Literal["generate", "completions"] = "generate"
    """With `backend="vllm"`: vLLM's `/inference/v1/generate` (token ids in and out), or
    `/v1/completions` with a token-id prompt and `return_token_ids`."""

    model: str = "tiny-llama"
    """Prepared model name or folder whose tokenizer and chat template render prompts."""

    served_models: list[str] = Field(default_factory=lambda: ["policy"])
    """Model names harnesses may ask for; any other name gets a 404. Empty list: accept any name."""

    host: str = "127.0.0.1"
    """Interface for the harness-facing API (and the admin API, see `admin_clients`)."""

    admin_clients: Literal["loopback", "any"] = "loopback"
    """Who may use the admin API (always with the admin token): loopback TCP clients only, or
    any client, for env workers on other nodes (e.g. Ray `RolloutWorker`s; bind `host` to an
    address they reach and hand them a `ProxyHandle` with that URL and no `uds_path`)."""

    port: int = Field(0, ge=0, le=65535)
    """TCP port; 0 picks a free one (see `ProxyServer.url`)."""

    uds_path: str | None = None
    """Also serve on this unix-domain socket (harnesses inside containers reach it by a bind mount)."""

    db_path: str = ":memory:"
    """SQLite file of the durable store; ":memory:" keeps records only for the process lifetime."""

    synchronous: str = "NORMAL"
    """SQLite synchronous mode: NORMAL survives a killed proxy, FULL also a power loss (fsync per call)."""

    admin_token: str | None = None
    """Bearer token of the admin API; None generates a random one (`ProxyServer.admin_token`). With
    `admin_clients = "any"` a given token must have at least 16 characters: it is then all that
    stands between the network and the run's rewards."""

    tool_format: ToolFormatName = "hermes"
    """Tool prompt/parse format for templates without tool support (registry name or module:Class)."""

    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Largest request body accepted; larger ones get a 413."""

    admin_max_body_bytes: int = Field(64 * 1024, ge=1024)
    """Largest admin API request body accepted (a session's meta is well under 1 KiB); larger: 413."""

    stream_grace_s: float = Field(1.0, ge=0.0)
    """A streamed call holds its 200 up to this long (at most `keepalive_s`) for the engine's first
    answer, so that a refusal (a prompt longer than the context...) is still an HTTP 4xx and not
    an error event inside a 200 stream."""

    default_max_tokens: int = Field(1024, ge=1)
    """max_new_tokens when the request names none."""

    max_tokens_cap: int = Field(8192, ge=1)
    """Upper bound on max_new_tokens whatever the request asks for (Claude Code asks for 32000)."""

    sampling_policy: Literal["run", "honor"] = "run"
    """Who sets temperature / top_p / top_k (`gym.proxy.sampling`): "run" (default) applies this
    config's values to every call whatever the harness sends, so the behaviour policy is the
    run's; "honor" lets the harness's valid values win (absent ones take this config's). The
    effective values are recorded with every call (`flags["sampling"]`)."""

    temperature: float = Field(1.0, ge=0.0)
    """The run's sampling temperature (RL samples from the policy at 1.0). 0 is greedy: such calls
    are recorded as greedy and no trainer trains on them (a point mass has no importance ratio)."""

    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """The run's nucleus sampling mass; 1.0 is off."""

    top_k: int = Field(-1, ge=-1)
    """The run's top-k; -1 is off (0 is not a value: use -1)."""

    honor_seed: bool = False
    """Pass a harness's `seed` to the engine. Off by default (under either `sampling_policy`): a
    harness that sends one fixed seed would make every member of a GRPO group sample the same
    tokens, so the group's advantages are all zero. Tests that need reproducible samples turn it on."""

    engine_logprobs: Literal["auto", "sampled", "tempered", "raw"] = "auto"
    """Which distribution the engine's logprobs belong to: "sampled" (filtered, renormalized: the
    local engine), "tempered" (temperature applied, top-p/top-k not: SGLang's default), "raw"
    (temperature 1, unfiltered: vLLM's default `raw_logprobs`). "auto" asks
    the engine's /get_model_info once (`logprob_space`; an engine that does not say is "tempered").
    (An SGLang server with SGLANG_RETURN_ORIGINAL_LOGPROB reports temperature-1 logprobs, which
    neither value describes: do not train through one.)"""

    pause_wait_s: float = Field(30.0, ge=0.0)
    """While generation is paused a new call waits this long, then gets a 429 with Retry-After."""

    retry_after_s: int = Field(5, ge=1)
    """Retry-After seconds sent with that 429."""

    staleness_priority: bool = True
    """Send each generation an engine `priority` from its episode's oldest policy version (the
    `start_version` in the session's meta until it has sampled), then its group (`group_id`
    in the meta): -(version * 2^20 + group). When requests wait for a batch slot, the episodes
    closest to their staleness bound generate first (earliest deadline first), and among
    those of one version the oldest group's, the one the trainer's next batch takes first:
    without the group, episodes of one version shared the engine round-robin and the first
    batch waited for all of them. SGLang honours it under `--enable-priority-scheduling`; the
    local engine always does; sessions without a start version send none."""

    max_interruptions: int = Field(100, ge=0)
    """Aborted engine generations resumed per call before the call fails with a 503."""

    engine_stream: bool = False
    """Stream tokens from the engine to streaming harnesses as they are sampled. False (default)
    generates a streamed call in one engine request and sends its events at the end, with
    keep-alives meanwhile: same recorded ids, a fraction of the per-token CPU (RL rollouts
    need whole replies, not time-to-first-token)."""

    keepalive_s: float = Field(10.0, gt=0.0)
    """Seconds between keep-alive events of a buffered stream (engine_stream=False)."""

    max_branches: int = Field(16, ge=1)
    """Live segments per session a new call may extend (side calls such as title requests, and
    sub-agents, several of which may run in parallel, interleave with the main conversation)."""

    engine_connect_timeout_s: float | None = Field(10.0, gt=0.0)
    """Bound on opening a connection to the engine; None: no bound. Like every engine timeout
    below, passing it fails the call (504 to the harness) and records it `engine_error`."""

    engine_first_byte_timeout_s: float | None = Field(300.0, gt=0.0)
    """Streamed engine request (`engine_stream`): bound from sending it to its first chunk."""

    engine_idle_timeout_s: float | None = Field(120.0, gt=0.0)
    """Streamed engine request: bound on the gap between two chunks (a stopped engine)."""

    engine_total_timeout_s: float | None = Field(900.0, gt=0.0)
    """Bound on one whole engine request, streamed or not; the only bound on a non-streamed
    one (its reply comes whole). Size it above the slowest legitimate `max_tokens_cap`
    generation: a policy must not be able to turn a long answer into a masked episode."""

    teacher: str | None = None
    """Record every call as teacher data (`gym.proxy.teacher`): this label goes into each call's
    `flags["teacher"]`, its tokens get logprob NaN and version -1, and no RL trainer takes them.
    For a token-level teacher in the student's tokenizer (the scripted gold policy behind
    `engine_url` or a handed-in backend). None: the calls are the policy's own (default);
    set by `teacher_url` when left out."""

    teacher_url: str | None = None
    """An OpenAI-compatible base URL (ending in /v1) of a teacher model: the proxy forwards each
    harness call there and records the reply rendered in the student's template and tokens
    (pass-through; `engine_url` is then unused)."""

    teacher_model: str = "teacher"
    """The model name sent to `teacher_url`."""

    teacher_api_key: str | None = None
    """Bearer key for `teacher_url` (None: no Authorization header)."""

    @field_validator("engine_url")
    @classmethod
    def _engine_url(cls, v: str | list[str]) -> str | list[str]:
        return engine_urls(v)

    @property
    def engine_urls(self) -> list[str]:
        """`engine_url` as a list (one URL: a list of one)."""
        return list(self.engine_url) if isinstance(self.engine_url, list) else [self.engine_url]

    @model_validator(mode="after")
    def _token_off_loopback(self) -> "ProxyConfig":
        if self.admin_clients == "any" and self.admin_token is not None and len(self.admin_token) < 16:
            raise ValueError(f"admin_token: {len(self.admin_token)} characters is guessable, and admin_clients = "
                             "\"any\" opens the admin API to the network; use at least 16 (None: a random one)")
        return self

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0:
            raise ValueError("0 is not a top_k; -1 turns top-k off")
        return v
