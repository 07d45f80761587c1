"""Continuous batching: one thread owns the model and steps every running request together.

Loop, between two decode steps: run queued commands (pause, weight update, ...), apply
aborts, admit waiting requests (prefilled alone, or short cold prompts packed into one
forward, `packed_prefill`; then padded into the batch, see `kv.BatchKV`), then one decode
step over the whole batch. A request that joins does not wait for the others to finish; a
finished one leaves at once.

Requests talk back through `Req.sink(Delta)`, called on this thread; the HTTP layer
forwards it to its event loop. Streaming requests get a delta every step, the others one
at the end. A decode step of a Llama-style model on CPU runs `fast_decode.FastDecoder`
(the same operations without HF's per-layer overhead); other models use HF's forward.
Pause modes: `abort` finishes every running and waiting request with finish
reason abort (partial output kept); `in_place` keeps the running ones and their KV cache;
`retract` drops their KV cache and recomputes it (prompt + output so far) on continue,
so that tokens after a weight update attend over KV from the new weights. While paused,
new requests queue.

Prefix cache (`prefix_cache.PrefixCache`, off when its budget is 0): a request whose ids
start like a cached sequence prefills only the rest; each request's prefilled KV, and a
finished request's whole KV, are kept. Every weight load (`weights_changed`) drops the
cache, and a request that began under older weights (in-place pause) is never kept.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

import torch
from transformers import DynamicCache

from harnessrl.trainers.engine.fast_decode import FastDecoder
from harnessrl.trainers.engine.kv import BatchKV, ConcatKV
from harnessrl.trainers.engine.packed_prefill import MAX_PROMPT, MAX_TOTAL, packed_forward
from harnessrl.trainers.engine.prefix_cache import PrefixCache
from harnessrl.trainers.engine.request import Delta, Req
from harnessrl.trainers.engine.sampling import LogprobSpace, sample
from harnessrl.trainers.engine.speculate import MIN_NGRAM, PromptLookup

log = logging.getLogger("harnessrl.engine")


class Scheduler:
    """Owns `model`; thread-safe `submit`, `abort`, `call`."""

    def __init__(self, model, tokenizer, eos_ids: set[int], *, weight_version: str, max_running: int,
                 max_prefill_per_step: int, max_context: int, random_seed: int = 0,
                 num_threads: int | None = None, logprob_space: LogprobSpace = "sampled",
                 prefix_cache_bytes: int = 0, kv_preallocate: bool = True, fast_decode: bool = True,
                 cpu_matvec: str = "auto", prompt_lookup_ngram: int = 0):
        self.model, self.tokenizer, self.eos_ids = model, tokenizer, eos_ids
        self.weight_version = weight_version
        self.max_running, self.max_prefill = max_running, max_prefill_per_step
        self.max_context = max_context
        self.num_threads = num_threads
        self.logprob_space: LogprobSpace = logprob_space
        self.default_gen = torch.Generator().manual_seed(random_seed)
        self.paused: str | None = None  # None or the pause mode
        self.steps = 0
        self.native_tid: int | None = None
        """The OS thread id of the loop that steps the model (for pinning it to a core of its own:
        `sandboxes.limits.CoreReservation`), set when the loop starts."""
        # wall seconds this thread spent in prefills and in decode steps (where a call's time goes);
        # busy_s: loop iterations that ended with rows running (their admission included), and
        # slot_s: the same seconds each weighted by the rows running (a generator's occupancy is
        # slot_s / (wall * max_running)). Read by `/get_model_info` for benches in another process.
        self.timing = {"prefill_s": 0.0, "decode_s": 0.0, "busy_s": 0.0, "slot_s": 0.0}
        self.decode_by_rows: dict[int, list] = {}
        """Rows running -> [plain decode steps, their seconds] (speculative verifies are in
        `spec_stats`): the engine's step time as a function of its batch (a CPU engine's grows
        with every row, a GPU's barely), which a bench fits to know what a full-batch turn costs
        on the machine as it runs, not only at a calibration."""
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.lookup_ngram = prompt_lookup_ngram
        # speculative steps (`_speculative_step`): verify passes, draft tokens proposed and accepted
        self.spec_stats = {"verify_steps": 0, "drafted": 0, "accepted": 0, "tokens": 0}
        self._cond = threading.Condition()
        self._waiting: deque[Req] = deque()
        self._running: list[Req] = []
        self._kv = BatchKV() if kv_preallocate else ConcatKV()
        # HF's forward per step unless the model fits the fast path (needs the preallocated KV)
        self._fast = FastDecoder.build(model, cpu_matvec) if kv_preallocate and fast_decode else None
        self._commands: deque[tuple[Callable[["Scheduler"], Any], Future]] = deque()
        self._abort_rids: set[str] = set()
        self._abort_all = False
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="harnessrl-engine", daemon=True)

    # ---- thread-safe API ----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, req: Req) -> None:
        with self._cond:
            self._waiting.append(req)
            self._cond.notify_all()

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        with self._cond:
            if abort_all:
                self._abort_all = True
            elif rid:
                self._abort_rids.add(rid)
            self._cond.notify_all()

    def call(self, fn: Callable[["Scheduler"], Any]) -> Future:
        """Run `fn(self)` on the scheduler thread between two steps; its result in the future."""
        fut: Future = Future()
        with self._cond:
            self._commands.append((fn, fut))
            self._cond.notify_all()
        return fut

    def load(self) -> dict[str, int]:
        with self._cond:
            return {"running": len(self._running), "waiting": len(self._waiting)}

    # ---- commands (run on the scheduler thread via `call`) ------------------------
    def pause(self, mode: str) -> int:
        """Pause; returns how many requests were aborted (mode abort) or held."""
        if mode == "abort":
            n = self._abort_everything("paused (mode abort)")
        elif mode == "retract":
            n = len(self._running)
            # back to the queue's front in their order; KV is recomputed on admission
            for r in reversed(self._running):
                self._waiting.appendleft(r)
            self._running = []
            self._kv.clear()
        else:
            n = len(self._running)
        self.paused = mode
        return n

    def resume(self) -> None:
        self.paused = None

    def weights_changed(self) -> None:
        """Called on this thread right after the model's weights changed (or for a flush):
        no cached KV of the old weights may be served again."""
        self.prefix_cache.invalidate()

    # ---- the loop -----------------------------------------------------------------
    def _has_work(self) -> bool:
        return bool(self._commands or self._abort_rids or self._abort_all
                    or (self.paused is None and (self._waiting or self._running)))

    def _loop(self) -> None:
        self.native_tid = threading.get_native_id()
        torch.set_grad_enabled(False)  # grad mode is per thread
        if self.num_threads:
            # OpenMP's thread count is per calling thread: set it on the thread that runs the model
            torch.set_num_threads(self.num_threads)
        while True:
            with self._cond:
                while not (self._stop or self._has_work()):
                    self._cond.wait()
                if self._stop:
                    break
                commands = list(self._commands)
                self._commands.clear()
            for fn, fut in commands:
                if not fut.set_running_or_notify_cancel():
                    continue  # its caller gave up (a timeout, a dropped connection)
                try:
                    fut.set_result(fn(self))
                except BaseException as e:  # the caller gets the error, the engine goes on
                    fut.set_exception(e)
            self._apply_aborts()
            if self.paused is not None:
                continue
            try:
                ta = time.perf_counter()
                self._admit()
                if self._running:
                    rows = len(self._running)
                    verified = self.spec_stats["verify_steps"]
                    t0 = time.perf_counter()
                    self._decode_step()
                    t1 = time.perf_counter()
                    self.timing["decode_s"] += t1 - t0
                    self.timing["busy_s"] += t1 - ta
                    self.timing["slot_s"] += rows * (t1 - ta)
                    if self.spec_stats["verify_steps"] == verified:  # a plain step (a verify is not one)
                        per = self.decode_by_rows.setdefault(rows, [0, 0.0])
                        per[0] += 1
                        per[1] += t1 - t0
            except Exception as e:  # a failed forward must not kill the server
                log.error("engine step failed: %s", traceback.format_exc())
                self._fail_running(f"engine error: {type(e).__name__}: {e}")
        self._abort_everything("engine shut down")

    def _apply_aborts(self) -> None:
        with self._cond:
            rids, everything = self._abort_rids, self._abort_all
            self._abort_rids, self._abort_all = set(), False
        if everything:
            self._abort_everything("aborted by abort_request(abort_all)")
            return
        if not rids:
            return
        with self._cond:
            hit = [r for r in self._waiting if r.rid in rids]
            for r in hit:
                self._waiting.remove(r)
        for r in hit:
            self._finish(r, {"type": "abort", "message": "aborted by abort_request"})
        if any(r.rid in rids for r in self._running):
            for r in self._running:
                if r.rid in rids:
                    self._finish(r, {"type": "abort", "message": "aborted by abort_request"})
            self._drop_finished()

    def _abort_everything(self, why: str) -> int:
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        victims = self._running + waiting
        for r in victims:
            self._finish(r, {"type": "abort", "message": why})
        self._running = []
        self._kv.clear()
        return len(victims)

    def _fail_running(self, why: str) -> None:
        for r in self._running:
            if r.finish is None:
                self._finish(r, {"type": "abort", "message": why, "status_code": 500})
        self._running = []
        self._kv.clear()

    # ---- admission and prefill ----------------------------------------------------
    def _admit(self) -> None:
        """Admit up to `max_prefill` waiting requests, most urgent first. Consecutive cold short
        prompts are prefilled together in one packed forward (`packed_prefill`), the others alone,
        in admission order."""
        admitted, packed = 0, []
        while admitted < self.max_prefill and len(self._running) + len(packed) < self.max_running:
            with self._cond:
                if not self._waiting:
                    break
                r = max(self._waiting, key=lambda w: w.priority)  # the first of the most urgent: FIFO among equals
                self._waiting.remove(r)
            admitted += 1
            matched = None
            if self._packable(r, sum(len(q.input_ids) for q, _ in packed)):
                matched = self.prefix_cache.match(r.input_ids)
                if matched[0] == 0:
                    packed.append((r, matched))
                    continue
            self._run_prefill(packed)
            packed = []
            self._run_prefill([(r, matched)])
        self._run_prefill(packed)

    def _packable(self, r: Req, packed_tokens: int) -> bool:
        return (self.max_prefill > 1 and not r.output_ids and r.logprob_start_len < 0 and r.params.max_new_tokens > 0
                and len(r.input_ids) <= MAX_PROMPT and packed_tokens + len(r.input_ids) <= MAX_TOTAL)

    def _run_prefill(self, batch: list[tuple[Req, tuple | None]]) -> None:
        """Prefill each request with its prefix-cache lookup if done (one: alone; more: packed).
        A failure fails those that did not join the decode batch; the batch goes on."""
        if not batch:
            return
        reqs = [r for r, _ in batch]
        t0 = time.perf_counter()
        try:
            if len(batch) == 1:
                self._prefill(*batch[0])
            else:
                self._prefill_packed(reqs)
        except Exception as e:  # e.g. out of memory
            log.error("prefill of %s failed: %s", [r.rid for r in reqs], traceback.format_exc())
            for r in reqs:
                if r not in self._running:
                    self._finish(r, {"type": "abort", "message": f"engine error: {type(e).__name__}: {e}",
                                     "status_code": 500})
        finally:
            self.timing["prefill_s"] += time.perf_counter() - t0

    def _prefill(self, r: Req, matched: tuple | None = None) -> None:
        resumed = bool(r.output_ids)  # retracted: recompute KV of prompt + output so far
        wants_input_lp = r.logprob_start_len >= 0 and r.input_logprobs is None
        if r.params.max_new_tokens == 0 and not wants_input_lp:
            self._finish(r, {"type": "length", "length": 0})
            return
        seq = r.input_ids + r.output_ids[:-1] if resumed else r.input_ids
        hit, past = (0, None) if wants_input_lp else matched or self.prefix_cache.match(seq)
        cache = DynamicCache(ddp_cache_data=past) if past is not None else DynamicCache()
        r.epoch = self.prefix_cache.epoch
        if not resumed:
            r.cached_tokens = hit
        self.prefix_cache.stats["prefill_tokens"] += len(seq) - hit
        out = self.model(input_ids=torch.tensor([seq[hit:]], device=self.model.device), past_key_values=cache,
                         use_cache=True, logits_to_keep=0 if wants_input_lp else 1)
        if wants_input_lp:
            r.input_logprobs = self._input_logprobs(out.logits[0].float().cpu(), r)
        self._join(r, out.logits[:, -1, :], out.past_key_values, seq, resumed)

    def _prefill_packed(self, reqs: list[Req]) -> None:
        logits, caches = packed_forward(self.model, [r.input_ids for r in reqs])
        for r, last, cache in zip(reqs, logits, caches):
            r.epoch, r.cached_tokens = self.prefix_cache.epoch, 0
            self.prefix_cache.stats["prefill_tokens"] += len(r.input_ids)
            self._join(r, last[None], cache, r.input_ids, resumed=False)

    def _join(self, r: Req, last_logits: torch.Tensor, cache: DynamicCache, seq: list[int], resumed: bool) -> None:
        """After `r`'s prefill (KV of `seq` in `cache`, logits [1, vocab] of its last position):
        keep the KV in the prefix cache, sample the first token, join the decode batch."""
        if self.prefix_cache.enabled:
            self.prefix_cache.insert(seq, [(layer.keys, layer.values) for layer in cache.layers], r.epoch)
        if r.params.max_new_tokens == 0:
            self._finish(r, {"type": "length", "length": 0})
            return
        if not resumed:
            ids, lps, tops = sample(last_logits.float().cpu(), [r.row()], self.default_gen,
                                    r.top_logprobs_num, self.logprob_space)
            self._append(r, ids[0], lps[0], tops[0] if tops else None)
            if r.finish is not None:
                return
        self._kv.add(cache)
        self._running.append(r)
        if r.stream and not resumed:
            self._emit(r)

    def _input_logprobs(self, logits: torch.Tensor, r: Req) -> list[float | None]:
        """log_softmax(raw logits) of each prompt token from logprob_start_len (first: None)."""
        ids = torch.tensor(r.input_ids)
        lps = torch.log_softmax(logits[:-1].float(), dim=-1).gather(1, ids[1:, None])[:, 0].tolist()
        full: list[float | None] = [None] + lps
        return full[r.logprob_start_len:]

    # ---- decode -------------------------------------------------------------------
    def _decode_step(self) -> None:
        if self._fast is not None and self.lookup_ngram >= MIN_NGRAM and len(self._running) == 1 \
                and self._fast.can_verify(self._kv):
            r = self._running[0]
            if r.lookup is None:
                r.lookup = PromptLookup(self.lookup_ngram)
            p = r.params
            room = min(p.max_new_tokens - len(r.output_ids),
                       self.max_context - len(r.input_ids) - len(r.output_ids)) - 1
            draft = r.lookup.draft(r.input_ids, r.output_ids, room)
            if draft:
                self._speculative_step(r, draft)
                return
        input_ids = torch.tensor([[r.output_ids[-1]] for r in self._running], device=self.model.device)
        if self._fast is not None:
            logits = self._fast.step(input_ids, self._kv)
        else:
            out = self.model(input_ids=input_ids, **self._kv.step_inputs())
            self._kv.cache = out.past_key_values
            logits = out.logits[:, -1, :]
        top_n = max(r.top_logprobs_num for r in self._running)
        # sampling runs on CPU: seeded CPU generators draw the same tokens on every device
        ids, lps, tops = sample(logits.float().cpu(), [r.row() for r in self._running],
                                self.default_gen, top_n, self.logprob_space)
        self.steps += 1
        for i, r in enumerate(self._running):
            self._append(r, ids[i], lps[i], tops[i][: r.top_logprobs_num] if tops else None)
            if r.stream and r.finish is None:
                self._emit(r)
        self._drop_finished()

    def _speculative_step(self, r: Req, draft: list[int]) -> None:
        """One pass of the model over the last token and `draft` (the one running row, in C:
        `FastDecoder.verify`), then the row's tokens drawn one position at a time exactly as
        plain steps would draw them: the same `sample` call with the same generator on logits
        equal bit for bit to a one-row step's, stopping after the first token that is not the
        draft's (or that finishes the request). So the output (ids, logprobs, top lists and the
        generator's state after) is that of plain decoding; the pass yields accepted + 1 tokens,
        and a stream still gets one chunk per token.
        The rejected positions' KV is dropped (`BatchKV.truncate`)."""
        tokens = [r.output_ids[-1]] + draft
        logits = self._fast.verify(tokens, self._kv)
        used = 0
        for t in range(len(tokens)):
            ids, lps, tops = sample(logits[t:t + 1], [r.row()], self.default_gen, r.top_logprobs_num,
                                    self.logprob_space)
            self._append(r, ids[0], lps[0], tops[0][: r.top_logprobs_num] if tops else None)
            used = t + 1  # the KV of tokens[:t + 1] is what the output so far (but its last token) needs
            if r.stream and r.finish is None:
                self._emit(r)  # a stream still gets one chunk per token, as from plain steps
            if r.finish is not None or t == len(draft) or ids[0] != draft[t]:
                break
        self._kv.truncate(len(tokens) - used)
        if r.finish is None:
            r.lookup.feedback(len(draft), used - 1)
        self.steps += 1
        st = self.spec_stats
        st["verify_steps"] += 1
        st["drafted"] += len(draft)
        st["accepted"] += used - 1
        st["tokens"] += used
        self._drop_finished()

    def _drop_finished(self) -> None:
        keep = [i for i, r in enumerate(self._running) if r.finish is None]
        if len(keep) != len(self._running):
            if self.prefix_cache.enabled:
                self._keep_finished(set(keep))
            self._running = [self._running[i] for i in keep]
            self._kv.keep(keep)

    def _keep_finished(self, keep: set[int]) -> None:
        """Put the KV of rows that just finished into the prefix cache: prompt + output but the
        last token (never fed), copied out of the batch (a view would pin the whole batch)."""
        kv = self._kv
        L = kv.mask.shape[1]
        layers = [(layer.keys, layer.values) for layer in kv.cache.layers]
        for i, r in enumerate(self._running):
            if i in keep or r.epoch != self.prefix_cache.epoch or (r.finish or {}).get("status_code"):
                continue
            seq = r.input_ids + r.output_ids[:-1]
            n = int(kv.lengths[i])
            if n != len(seq):  # not the row we think it is: keep nothing rather than wrong KV
                log.warning("prefix cache: row %s holds %d positions, expected %d", r.rid, n, len(seq))
                continue
            self.prefix_cache.insert(seq, [(k[i:i + 1, :, L - n:].clone(), v[i:i + 1, :, L - n:].clone())
                                           for k, v in layers], r.epoch)

    def _append(self, r: Req, token: int, logprob: float, top: list | None) -> None:
        r.output_ids.append(token)
        r.logprobs.append(logprob)
        if top is not None and r.top_logprobs_num:
            r.top_logprobs.append(top)
        p = r.params
        if not p.ignore_eos and token in self.eos_ids:
            self._finish(r, {"type": "stop", "matched": token})
        elif p.stop_token_ids and token in p.stop_token_ids:
            self._finish(r, {"type": "stop", "matched": token})
        elif (matched := self._stop_string(r)) is not None:
            self._finish(r, {"type": "stop", "matched": matched})
        elif len(r.output_ids) >= p.max_new_tokens:
            self._finish(r, {"type": "length", "length": p.max_new_tokens})
        elif len(r.input_ids) + len(r.output_ids) >= self.max_context:
            self._finish(r, {"type": "length", "length": len(r.output_ids)})

    def _stop_string(self, r: Req) -> str | None:
        stops = r.params.stop_strings
        if not stops:
            return None
        # only the tail can hold a new match; a token decodes to at least one character
        tail = self.tokenizer.decode(r.output_ids[-(max(map(len, stops)) + 8):],
                                     skip_special_tokens=r.params.skip_special_tokens)
        return next((s for s in stops if s in tail), None)

    # ---- output -------------------------------------------------------------------
    def _finish(self, r: Req, reason: dict) -> None:
        if r.finish is not None:
            return
        r.finish = reason
        self._emit(r)

    def _emit(self, r: Req) -> None:
        start, r.emitted = r.emitted, len(r.output_ids)
        delta = Delta(
            ids=r.output_ids[start:],
            logprobs=r.logprobs[start:],
            top_logprobs=r.top_logprobs[start:] if r.top_logprobs_num else [],
            finish=r.finish,
            weight_version=self.weight_version,
            input_logprobs=r.input_logprobs if start == 0 else None,
            cached_tokens=r.cached_tokens,
        )
        try:
            r.sink(delta)
        except Exception:  # a gone client must not stop the batch
            log.warning("could not deliver output of %s", r.rid)


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Poll `pred` until true or timeout (start-up and test helper)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return pred()
