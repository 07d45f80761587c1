"""Before a run: does each harness's first prompt fit the model's context?

Contract: `first_prompt_tokens(stack, harness, task)` runs one probe episode of `task` through
that harness of the stack, in a fresh sandbox, through a proxy of the run's settings (the
model's own tokenizer and chat template render the prompt, as in every episode) whose
generation backend is this module's probe: it counts the first prompt's token ids, then
cancels the episode (the harness's process tree killed, its sandbox closed, nothing scored)
and refuses the call. No engine is needed and nothing is generated. It returns the count;
a harness that made no model call raises `ContextProbeError` with the episode's ending (e.g.
not installed, and the command that installs it).

`await check_context(cfg, tasks, context)`: the probe for every harness of `cfg` on the task with the
longest statement among `tasks`; the first prompts by harness, or `ContextTooLong` naming
every harness whose first prompt does not fit (n >= context: no room for one sampled token),
with its count and the context. `harnessrl train` runs it before anything starts.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from harnessrl.adapters.cancel import Cancel
from harnessrl.adapters.toolchain import HarnessNotInstalled
from harnessrl.gym.backends.engine_client import EngineError
from harnessrl.gym.backends.inprocess import CallableBackend, TokenReply
from harnessrl.gym.stack import EpisodeStack, cancellable

if TYPE_CHECKING:
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.gym.tasks import Task

PROBED = "context probe: first prompt measured"


class ContextProbeError(RuntimeError):
    """A harness's probe episode made no model call, so its first prompt could not be measured."""


class ContextTooLong(ValueError):
    """A harness's first prompt does not fit the model's context."""


class _Probe:
    """The probe's generation side: the first prompt's length, then the episode cancelled."""

    def __init__(self, cancel: Cancel):
        self.cancel = cancel
        self.tokens: int | None = None

    async def __call__(self, input_ids: list[int], params: dict[str, Any], rid: str) -> TokenReply:
        if self.tokens is None:
            self.tokens = len(input_ids)
            # off the proxy's loop: the cancel kills the harness and closes its sandbox (blocking)
            threading.Thread(target=self.cancel.set, args=(PROBED,), daemon=True).start()
        raise EngineError(f"{PROBED} ({len(input_ids)} tokens); the probe never generates", status_code=400)


def first_prompt_tokens(stack: EpisodeStack, harness: str, task: "Task", cancel: Cancel | None = None) -> int:
    """The token count of `harness`'s first prompt on `task` (module doc); `cancel`: the
    episode's, for a caller that may abandon the probe (the probe sets it itself when done)."""
    cancel = cancel or Cancel()
    probe = _Probe(cancel)
    backend = CallableBackend(probe, name="context-probe")
    with stack.proxy(generation_backend=backend) as proxy:
        from harnessrl.gym.episode import ProxyHandle

        res = stack.run(task, ProxyHandle.of(proxy), cancel=cancel, sandboxes=stack.make_sandbox, harness=harness)
    if probe.tokens is None:
        meta = res.trajectory.metadata
        why = meta.get("ending") or res.error or res.reason
        raise ContextProbeError(f"harness {harness!r}: its probe episode made no model call, so its first prompt "
                                f"could not be measured: {why}")
    return probe.tokens


async def check_context(cfg: "RolloutConfig", tasks: list["Task"], context: int) -> dict[str, int]:
    """Every harness's first prompt on the longest task, or `ContextTooLong` (module doc). Each
    probe runs in a thread of its own; cancelled (the run was stopped), the probe episode is
    cancelled too and its sandbox closed before the cancellation goes on."""
    task = max(tasks, key=lambda t: (len(t.problem_statement), t.instance_id))
    stack = EpisodeStack(cfg.model_copy(update={"sandbox_pool_size": 0}), tasks=[task])
    for adapter in stack.adapters.values():  # a beside Python harness's fork server (the run reuses it)
        warm = getattr(adapter, "warm", None)
        if warm is not None:
            try:
                warm()
            except HarnessNotInstalled:
                pass  # its probe says so, with the command that installs it
    try:
        sizes = {}
        for h in stack.adapters:
            sizes[h] = await cancellable(lambda cancel, h=h: first_prompt_tokens(stack, h, task, cancel),
                                         "the run was stopped while its context was probed")
    finally:
        stack.close()
    over = {h: n for h, n in sizes.items() if n >= context}
    if over:
        raise ContextTooLong(
            "; ".join(f"harness {h!r}: its first prompt is {n} tokens, the context is {context}" for h, n in over.items())
            + f" (task {task.instance_id}, model {cfg.model}): the harness's own system prompt, tools and the task do "
              "not fit; drop it from rollout.harnesses, trim its prompt, or use a model with a longer context")
    return sizes
