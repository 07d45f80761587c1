"""The bench-only policy of `bench/async_real.py`: real engine compute, gold-plan content,
environment latency as sleeps inside the sandbox.

`LatencyDraws`: seeded lognormal per-turn environment latencies. Episode k (numbered in the
order its first model call reaches the backend) always gets the same draws, whatever the
staleness η or the scheduling, so every η of one run sees the same latency sequence.

`GoldOverEngine`: a `GenerationBackend` (gym/backends/protocol.py) handed to the real proxy.
Per /generate call it
  1. runs a real generation of `gen_tokens` tokens on the real local engine over the call's
     real prompt ids (ignore_eos, the proxy's sampling parameters and priority): real prefill
     and decode compute that occupies the engine's batch slots; an abort (a weight sync's
     pause) is resumed with prompt + partial output until `gen_tokens` are decoded, and the
     weight version of every chunk is kept;
  2. answers with the scripted gold policy's next action (`ScriptedPolicy`, tokenized with the
     model's tokenizer, ending with eos), whose shell command is prefixed with
     `sleep <draw>;`, so the harness (mini-swe-agent) runs the wait inside the sandbox, where
     it costs no CPU. The episode's plan: the task's gold commands, then `git diff --stat`
     fillers, then the submit command, `turns` commands in all, each with its own sleep.
What is not real: the returned token ids are the gold action's, not the engine's samples;
their logprobs are a constant. Their versions are the engine's: each returned token carries
the weight version that decoded the matching fraction of the engine's tokens, so a call
that straddles a weight update has tokens of both versions, as a sampled reply would.
"""
from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from typing import Any, Iterable

from harnessrl.gym.backends.protocol import SESSION, stream_once
from harnessrl.gym.doubles.scripted import MINI_SUBMIT, ScriptedPolicy
from harnessrl.gym.backends.engine_client import EngineError, EngineTimeouts, GenerateResult

FILLER = "git diff --stat"


class LatencyDraws:
    """Per-turn env latencies of episode k: lognormal(mean, cv), seeded by (seed, k), clipped at `clip_s`."""

    def __init__(self, mean_s: float, cv: float, seed: int, turns: int, clip_s: float = 45.0):
        if mean_s <= 0 or cv <= 0 or turns < 1:
            raise ValueError(f"LatencyDraws: mean_s {mean_s}, cv {cv} must be > 0 and turns {turns} >= 1")
        self.cv, self.seed, self.turns, self.clip_s = cv, seed, turns, clip_s
        self._sigma = math.sqrt(math.log(1 + cv * cv))
        self.set_mean(mean_s)

    def set_mean(self, mean_s: float) -> None:
        """Scale every later draw to this mean (the env following the engine's speed): episode k's
        draws are the same normal variates, so each is the old one times new mean / old mean."""
        if not (mean_s > 0 and math.isfinite(mean_s)):
            raise ValueError(f"LatencyDraws: mean_s {mean_s} must be finite and > 0")
        self.mean_s = mean_s
        self._mu = math.log(mean_s) - self._sigma ** 2 / 2

    def raw(self, k: int) -> list[float]:
        rng = random.Random(self.seed * 1_000_003 + k)
        return [rng.lognormvariate(self._mu, self._sigma) for _ in range(self.turns)]

    def draws(self, k: int) -> list[float]:
        return [round(min(x, self.clip_s), 3) for x in self.raw(k)]


def sleepy_plan(gold: Iterable[str], waits: list[float]) -> list[str]:
    """`len(waits)` commands: gold commands, fillers, the submit last; each after its sleep."""
    cmds = list(gold)[: len(waits) - 1]
    cmds += [FILLER] * (len(waits) - 1 - len(cmds)) + [f"echo {MINI_SUBMIT}"]
    return [f"sleep {w:.3f}; {c}" for w, c in zip(waits, cmds)]


def spread_versions(chunks: list[tuple[int, str]], n: int) -> list[str]:
    """Per-token versions for `n` returned tokens from the engine's (tokens, version) chunks:
    returned token i gets the version that decoded engine token floor(i * total / n)."""
    total = sum(c for c, _ in chunks)
    if total <= 0:
        return [chunks[-1][1] if chunks else ""] * n
    bounds, acc = [], 0
    for c, v in chunks:
        acc += c
        bounds.append((acc, v))
    out = []
    for i in range(n):
        pos = i * total // n
        out.append(next(v for end, v in bounds if pos < end))
    return out


def sampled_staleness(chunks: Iterable[tuple[int, str]], consumed_at: int, eta: int) -> tuple[int, int]:
    """(engine tokens sampled by versions older than `consumed_at - eta`, engine tokens) of
    one episode's calls: what the `mask` policy masks, counted in the tokens the engine
    sampled (each call decodes `gen_tokens`, whatever the length of the scripted reply that
    stands in for them). A chunk without a version (an engine that reports none) counts as
    sampled and never as stale."""
    stale = total = 0
    for n, v in chunks:
        total += n
        if str(v).strip().lstrip("-").isdigit() and int(v) < consumed_at - eta:
            stale += n
    return stale, total


class GoldOverEngine:
    """See the module doc. `tasks`: Task objects (problem statement, gold plan)."""

    def __init__(self, engine_url: str, tokenizer: Any, tasks: Iterable[Any], draws: LatencyDraws,
                 gen_tokens: int, logprob: float = -0.125):
        self.base_url = f"gold-over-engine:{engine_url}"
        self.engine_url = engine_url
        self.timeouts = EngineTimeouts(connect_s=None, first_byte_s=None, idle_s=None)
        self.tokenizer, self.draws, self.gen_tokens, self.logprob = tokenizer, draws, gen_tokens, logprob
        self.gold = {t.problem_statement: list(t.gold_plan) for t in tasks}
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._lock = threading.Lock()
        self.episodes: dict[str, int] = {}
        """proxy session id -> episode number k (order of first call)."""
        self.calls: list[dict] = []
        """Per call: session, k, step, engine seconds, engine tokens, versions, the engine's
        (tokens, weight version) chunks, wait injected."""
        self._http = None

    def reset(self) -> None:
        """Start numbering episodes from 0 again (a new η run replays the same draws)."""
        with self._lock:
            self.episodes.clear()
            self.calls.clear()

    def _episode(self, session: str | None) -> int:
        with self._lock:
            return self.episodes.setdefault(session or "?", len(self.episodes))

    def _statement(self, prompt: str) -> str | None:
        for s in self.gold:
            key = s.strip().splitlines()[0].strip() if s.strip() else ""
            if key and key in prompt:
                return s
        return None

    async def _engine(self, input_ids: list[int], temperature: float, top_p: float, top_k: int,
                      rid: str, priority: int | None) -> list[tuple[int, str]]:
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=httpx.Limits(max_connections=256))
        ctx, chunks, left, attempt = list(input_ids), [], self.gen_tokens, 0
        while left > 0:
            body = {"input_ids": ctx, "rid": f"{rid}-{attempt}", "stream": False,
                    "sampling_params": {"max_new_tokens": left, "temperature": temperature, "top_p": top_p,
                                        "top_k": top_k, "ignore_eos": True}}
            if priority is not None:
                body["priority"] = int(priority)
            resp = await self._http.post(self.engine_url + "/generate", json=body)
            if resp.status_code >= 400:
                raise EngineError(f"engine answered HTTP {resp.status_code}: {resp.text[:200]}", resp.status_code)
            reply = resp.json()
            out, meta = reply["output_ids"], reply["meta_info"]
            if out:
                chunks.append((len(out), str(meta.get("weight_version") or "")))
            ctx += out
            left -= len(out)
            attempt += 1
            if (meta.get("finish_reason") or {}).get("type") != "abort":
                break
            if not out:
                await asyncio.sleep(0.02)  # paused for a weight update: the retry queues behind it
        return chunks

    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int = -1, stop_token_ids: list[int] | None = None,
                       rid: str | None = None, seed: int | None = None,
                       priority: int | None = None) -> GenerateResult:
        session = SESSION.get()
        k = self._episode(session)
        prompt = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        statement = self._statement(prompt)
        waits = self.draws.draws(k)
        plan = sleepy_plan(self.gold.get(statement, []), waits) if statement is not None else []
        policy = ScriptedPolicy(self.tokenizer, {statement: plan} if statement is not None else {})
        text, _, step = policy.decide(prompt)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_id]
        finish = "stop"
        if len(ids) > max_new_tokens:
            ids, finish = ids[:max_new_tokens], "length"
        t0 = time.monotonic()
        chunks = await self._engine(input_ids, temperature, top_p, top_k, rid or f"g{k}-{step}", priority)
        t1 = time.monotonic()
        versions = spread_versions(chunks, len(ids))
        with self._lock:
            self.calls.append({"session": session, "k": k, "step": step, "t0": t0, "t1": t1,
                               "engine_tokens": sum(c for c, _ in chunks), "versions": sorted({v for _, v in chunks}),
                               "chunks": chunks,
                               "wait_s": waits[step] if statement is not None and step < len(waits) else None})
        return GenerateResult(ids, [self.logprob] * len(ids), finish, versions[0] if versions else "",
                              len(input_ids), text=text, versions=versions)

    def generate_stream(self, input_ids: list[int], **kw: Any):
        return stream_once(self, input_ids, **kw)

    async def health(self) -> bool:
        return True

    async def model_info(self) -> dict[str, Any]:
        return {"logprob_space": "sampled", "backend": self.base_url}

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
