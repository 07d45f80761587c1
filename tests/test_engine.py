"""The local engine over real HTTP on loopback, with the real tokenizer and model files.

Most tests use tiny-llama (a real 2-layer Llama file, random init, SmolLM2's tokenizer);
the `model` ones use the real SmolLM2-135M-Instruct, where eos actually ends answers.
References are HF `model.generate` and a plain forward pass on a separately loaded copy.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from harnessrl.gym.backends.engine_client import EngineClient
from harnessrl.gym.models import load_tokenizer, resolve_model
from harnessrl.trainers.engine import EngineServer, EngineStartupError

pytestmark = pytest.mark.timeout(300)


def _load(name: str):
    return AutoModelForCausalLM.from_pretrained(str(resolve_model(name)), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def hf():
    return _load("tiny-llama")


@pytest.fixture(scope="module")
def engine():
    with EngineServer(model="tiny-llama") as server:
        yield server


@pytest.fixture(scope="module")
def http(engine):
    with httpx.Client(base_url=engine.url, timeout=120) as client:
        yield client


def _prompts(tok, n: int) -> list[list[int]]:
    topics = ["a parser", "git bisect", "unit tests", "a race condition", "sorting", "HTTP retries",
              "a memory leak", "type hints", "docker layers", "regex escapes"]
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Explain {topics[i % len(topics)]} " + "in detail, " * i}],
            add_generation_prompt=True, return_dict=False,
        )
        for i in range(n)
    ]


@torch.no_grad()
def _greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=n, pad_token_id=2)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def _ref_logprobs(model, prompt: list[int], out: list[int], temperature: float = 1.0) -> list[float]:
    logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1: len(prompt) + len(out) - 1]
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


def _gen(http, prompt, **sp) -> dict:
    extra = {k: sp.pop(k) for k in list(sp) if k in ("rid", "return_logprob", "logprob_start_len",
                                                     "top_logprobs_num", "stream")}
    r = http.post("/generate", json={"input_ids": prompt, "sampling_params": sp, "return_logprob": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _ids(body: dict) -> list[int]:
    return [e[1] for e in body["meta_info"]["output_token_logprobs"]]


async def _until(pred, what: str, timeout: float = 60.0):
    """Wait for a server-side condition (not a speed assertion: a generous deadline)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# ---- correctness of generation ------------------------------------------------------------

def test_greedy_equals_hf_generate_and_logprobs_equal_forward(http, tok, hf):
    for prompt in _prompts(tok, 3):
        body = _gen(http, prompt, max_new_tokens=24, temperature=0)
        ref = _greedy(hf, prompt, 24)
        assert body["output_ids"] == ref
        assert _ids(body) == ref
        meta = body["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": 24}
        assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == 24
        assert meta["weight_version"] == "default"
        got = [e[0] for e in meta["output_token_logprobs"]]
        assert got == pytest.approx(_ref_logprobs(hf, prompt, ref), abs=1e-4)
        assert body["text"] == tok.decode(ref, skip_special_tokens=True)


def test_sampled_logprobs_are_tempered_log_softmax(http, tok, hf):
    prompt = _prompts(tok, 1)[0]
    body = _gen(http, prompt, max_new_tokens=16, temperature=0.7, sampling_seed=1234)
    out = _ids(body)
    got = [e[0] for e in body["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(_ref_logprobs(hf, prompt, out, temperature=0.7), abs=1e-4)
    # same seed, same tokens; another seed, other tokens (tiny-llama is near uniform)
    assert _ids(_gen(http, prompt, max_new_tokens=16, temperature=0.7, sampling_seed=1234)) == out
    assert _ids(_gen(http, prompt, max_new_tokens=16, temperature=0.7, sampling_seed=99)) != out


def test_top_k_one_and_tiny_top_p_are_greedy(http, tok, hf):
    prompt = _prompts(tok, 2)[1]
    ref = _greedy(hf, prompt, 12)
    assert _ids(_gen(http, prompt, max_new_tokens=12, temperature=1.0, top_k=1, sampling_seed=5)) == ref
    assert _ids(_gen(http, prompt, max_new_tokens=12, temperature=1.0, top_p=1e-9, sampling_seed=5)) == ref


def test_input_logprobs_from_start_len(http, tok, hf):
    prompt = _prompts(tok, 1)[0]
    body = _gen(http, prompt, max_new_tokens=0, logprob_start_len=2)
    entries = body["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == prompt[2:]
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], dim=-1)
    want = [lp[i - 1, prompt[i]].item() for i in range(2, len(prompt))]
    assert [e[0] for e in entries] == pytest.approx(want, abs=1e-4)
    assert body["output_ids"] == [] and body["meta_info"]["finish_reason"]["type"] == "length"


def test_stop_token_ids_and_stop_strings(http, tok, hf):
    prompt = _prompts(tok, 1)[0]
    ref = _greedy(hf, prompt, 20)
    stop_id = ref[6]
    body = _gen(http, prompt, max_new_tokens=20, temperature=0, stop_token_ids=[stop_id])
    first = ref.index(stop_id)
    assert _ids(body) == ref[: first + 1]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    stop_text = tok.decode(ref[8:10])
    body = _gen(http, prompt, max_new_tokens=20, temperature=0, stop=stop_text)
    out = _ids(body)
    assert out == ref[: len(out)] and body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_text}
    assert stop_text in tok.decode(out) and stop_text not in body["text"]


def test_batch_input_equals_single_requests(http, tok, hf):
    prompts = _prompts(tok, 3)
    r = http.post("/generate", json={"input_ids": prompts, "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert r.status_code == 200, r.text
    assert [b["output_ids"] for b in r.json()] == [_greedy(hf, p, 8) for p in prompts]


def test_model_info_names_the_thread_that_steps_the_model(http, tok):
    """`scheduler_tid` is the OS id of the thread whose CPU time grows with decoding (what a
    bench pins to a core of its own): a thread of this process (the engine runs in-process
    here), and the one that gained the most CPU over a 48-token generation."""
    tid = http.get("/get_model_info").json()["scheduler_tid"]
    assert str(tid) in os.listdir("/proc/self/task")

    def cpu() -> dict[int, int]:
        out = {}
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(t)] = int(fields[11]) + int(fields[12])  # utime + stime, in ticks
            except OSError:
                pass
        return out

    c0 = cpu()
    r = http.post("/generate", json={"input_ids": _prompts(tok, 4), "sampling_params": {
        "max_new_tokens": 48, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    c1 = cpu()
    gained = {t: c1[t] - c0.get(t, 0) for t in c1}
    assert max(gained, key=gained.get) == tid, gained


def test_model_info_counts_steps_and_busy_seconds_weighted_by_rows(http, tok):
    """The counters a bench in another process reads: steps, busy seconds, and busy seconds
    weighted by the rows running (one row: equal to busy; three rows: between 1x and 3x)."""
    def counters():
        i = http.get("/get_model_info").json()
        return i["steps"], i["timing"]

    s0, t0 = counters()
    _gen(http, _prompts(tok, 1)[0], max_new_tokens=8, temperature=0)
    s1, t1 = counters()
    busy = t1["busy_s"] - t0["busy_s"]
    assert 1 <= s1 - s0 <= 7  # the first token comes with the prefill; speculation may fold steps
    assert busy > 0 and t1["prefill_s"] > t0["prefill_s"] and t1["decode_s"] > t0["decode_s"]
    assert t1["slot_s"] - t0["slot_s"] == pytest.approx(busy, rel=1e-9)  # one row all along
    r = http.post("/generate", json={"input_ids": _prompts(tok, 3), "sampling_params": {
        "max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    s2, t2 = counters()
    busy, slots = t2["busy_s"] - t1["busy_s"], t2["slot_s"] - t1["slot_s"]
    assert s2 - s1 >= 23 and busy >= t2["decode_s"] - t1["decode_s"]  # busy = decode + the admissions
    assert 1.0 * busy < slots <= 3 * busy + 1e-9


def test_model_info_splits_decode_steps_by_rows_running(http, tok):
    """`decode_by_rows`: plain decode steps and their seconds per batch size, the engine's step
    curve a bench fits. Three greedy rows of 24 tokens joined together: every plain step of the
    call is counted under the rows it ran, the counts add up to the plain steps taken, and the
    seconds to at most the decode seconds (a speculative verify is neither)."""
    def counters():
        i = http.get("/get_model_info").json()
        return i["steps"], i["timing"], i["speculative"]["verify_steps"], i["decode_by_rows"]

    s0, t0, v0, d0 = counters()
    r = http.post("/generate", json={"input_ids": _prompts(tok, 3), "sampling_params": {
        "max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    s1, t1, v1, d1 = counters()
    delta = {int(n): (c - d0.get(n, [0, 0.0])[0], x - d0.get(n, [0, 0.0])[1]) for n, (c, x) in d1.items()}
    delta = {n: v for n, v in delta.items() if v[0]}
    assert set(delta) <= {1, 2, 3} and delta.get(3, (0, 0))[0] >= 20, delta  # the rows decode together
    assert sum(c for c, _ in delta.values()) == (s1 - s0) - (v1 - v0)
    secs = sum(x for _, x in delta.values())
    assert 0 < secs <= t1["decode_s"] - t0["decode_s"] + 1e-9


def test_a_command_whose_caller_gave_up_is_skipped_and_the_loop_goes_on(engine, http, tok):
    """`Scheduler.call` futures are cancelled when their caller stops waiting (a timeout around
    `/get_model_info`'s counters, a dropped connection): the loop skips them instead of dying
    on the cancelled future, and the next command and generation are served."""
    import threading

    sched = engine.state.scheduler
    hold, ran = threading.Event(), []
    first = sched.call(lambda s: hold.wait(30))  # holds the loop while the second one is queued
    second = sched.call(lambda s: ran.append(1))
    assert second.cancel()  # not started yet: the loop is still inside the first
    hold.set()
    assert first.result(timeout=30) is True
    assert sched.call(lambda s: s.native_tid).result(timeout=30) == sched.native_tid
    assert ran == [] and sched.alive
    assert len(_ids(_gen(http, _prompts(tok, 1)[0], max_new_tokens=4, temperature=0, ignore_eos=True))) == 4


def test_streamed_chunks_concatenate_to_the_non_streamed_result(http, tok):
    prompt = _prompts(tok, 2)[1]
    whole = _gen(http, prompt, max_new_tokens=20, temperature=0)
    chunks = []
    with http.stream("POST", "/generate", json={"input_ids": prompt, "stream": True, "return_logprob": True,
                                                "sampling_params": {"max_new_tokens": 20, "temperature": 0}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[5:]) for ln in lines[:-1]]
    assert len(chunks) == 20  # one chunk per generated token
    # SGLang's default stream is cumulative: each chunk holds all output so far
    assert [len(c["output_ids"]) for c in chunks] == list(range(1, 21))
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]
    assert chunks[-1]["text"] == whole["text"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * 19


# ---- batching -------------------------------------------------------------------------------

def test_concurrent_requests_return_the_sequential_ids(engine, http, tok, hf):
    prompts = _prompts(tok, 8)
    lengths = [30, 5, 17, 150, 9, 25, 12, 33]  # rows leave the batch at different steps
    sequential = [_ids(_gen(http, p, max_new_tokens=n, temperature=0)) for p, n in zip(prompts, lengths)]
    assert sequential[0] == _greedy(hf, prompts[0], 30)

    async def go():
        async with EngineClient(engine.url) as c:
            # a long request first; once it is decoding, the rest join its running batch
            first = c.generate_stream(prompts[3], max_new_tokens=150, temperature=0).__aiter__()
            first_ids = (await first.__anext__()).output_ids
            rest = asyncio.gather(*(c.generate(p, max_new_tokens=n, temperature=0)
                                    for i, (p, n) in enumerate(zip(prompts, lengths)) if i != 3))
            async for chunk in first:
                first_ids += chunk.output_ids
            rest = [r.output_ids for r in await rest]
            return rest[:3] + [first_ids] + rest[3:]

    assert asyncio.run(go()) == sequential


async def _running(client: EngineClient, n: int) -> bool:
    return (await client.model_info())["running"] >= n


# ---- abort, pause, weights -----------------------------------------------------------------

def test_abort_returns_the_partial_ids(engine, tok, hf):
    prompt = _prompts(tok, 1)[0]

    async def go():
        async with EngineClient(engine.url) as c:
            task = asyncio.create_task(c.generate(prompt, max_new_tokens=5000, temperature=0, rid="long-1"))
            await _until(lambda: _running(c, 1), "the request to be decoding")
            await c.abort("long-1")
            return await task

    res = asyncio.run(go())
    assert res.finish_reason == "abort"
    assert 1 <= len(res.output_ids) < 5000
    assert res.output_ids == _greedy(hf, prompt, len(res.output_ids))
    assert len(res.logprobs) == len(res.output_ids)


def test_abort_of_a_stream_ends_it_with_abort(engine, tok):
    prompt = _prompts(tok, 1)[0]

    async def go():
        async with EngineClient(engine.url) as c:
            got, reasons = [], []
            async for ch in c.generate_stream(prompt, max_new_tokens=5000, temperature=0, rid="s-1"):
                got += ch.output_ids
                reasons.append(ch.finish_reason)
                if len(got) == 3:
                    await c.abort("s-1")
            return got, reasons

    got, reasons = asyncio.run(go())
    assert reasons[-1] == "abort" and set(reasons[:-1]) <= {""}
    assert 3 <= len(got) < 5000


def test_pause_abort_returns_partials_and_continue_runs_new_requests(engine, tok, hf):
    prompts = _prompts(tok, 3)

    async def go():
        async with EngineClient(engine.url) as c:
            a = asyncio.create_task(c.generate(prompts[0], max_new_tokens=5000, temperature=0))
            b = asyncio.create_task(c.generate(prompts[1], max_new_tokens=5000, temperature=0))
            await _until(lambda: _running(c, 2), "two requests decoding")
            await c.pause("abort")
            ra, rb = await a, await b
            late = asyncio.create_task(c.generate(prompts[2], max_new_tokens=6, temperature=0))

            async def queued():
                info = await c.model_info()
                return info["waiting"] == 1 and info["running"] == 0

            await _until(queued, "the new request to wait while paused")
            assert not late.done()
            await c.resume()
            return ra, rb, await late

    ra, rb, late = asyncio.run(go())
    for res, prompt in ((ra, prompts[0]), (rb, prompts[1])):
        assert res.finish_reason == "abort" and 1 <= len(res.output_ids) < 5000
        assert res.output_ids == _greedy(hf, prompt, len(res.output_ids))
    assert late.finish_reason == "length" and late.output_ids == _greedy(hf, prompts[2], 6)


def test_pause_retract_resumes_the_same_greedy_output(engine, tok, hf):
    prompt = _prompts(tok, 1)[0]

    async def go():
        async with EngineClient(engine.url) as c, httpx.AsyncClient(base_url=engine.url) as http:
            stream = c.generate_stream(prompt, max_new_tokens=200, temperature=0).__aiter__()
            ids = (await stream.__anext__()).output_ids
            paused = (await http.post("/pause_generation", json={"mode": "retract"})).json()
            await c.resume()
            async for chunk in stream:
                ids += chunk.output_ids
                reason = chunk.finish_reason
            return paused, ids, reason

    paused, ids, reason = asyncio.run(go())
    assert paused["num_paused_requests"] == 1  # it was running, its KV cache was dropped and recomputed
    assert reason == "length" and ids == _greedy(hf, prompt, 200)


def test_weight_update_changes_outputs_and_version(engine, http, tok, hf, tmp_path):
    prompt = _prompts(tok, 1)[0]
    before = _gen(http, prompt, max_new_tokens=12, temperature=0)
    perturbed = _load("tiny-llama")
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in perturbed.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    perturbed.save_pretrained(tmp_path / "v2")
    want = _greedy(perturbed, prompt, 12)

    async def update(path, version):
        async with EngineClient(engine.url) as c:
            return await c.update_weights_from_disk(str(path), version)

    reply = asyncio.run(update(tmp_path / "v2", "v2"))
    assert reply["success"] is True
    after = _gen(http, prompt, max_new_tokens=12, temperature=0)
    assert after["output_ids"] == want != before["output_ids"]
    assert after["meta_info"]["weight_version"] == "v2"
    assert http.get("/get_model_info").json()["weight_version"] == "v2"
    got = [e[0] for e in after["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(_ref_logprobs(perturbed, prompt, want), abs=1e-4)

    # a folder without weights is refused and changes nothing
    (tmp_path / "empty").mkdir()
    r = http.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "empty"), "weight_version": "x"})
    assert r.status_code == 400 and r.json()["success"] is False and "safetensors" in r.json()["message"]
    assert _gen(http, prompt, max_new_tokens=12, temperature=0)["meta_info"]["weight_version"] == "v2"

    asyncio.run(update(resolve_model("tiny-llama"), "v3"))  # back to the original weights
    again = _gen(http, prompt, max_new_tokens=12, temperature=0)
    assert again["output_ids"] == before["output_ids"] and again["meta_info"]["weight_version"] == "v3"


# ---- bad input and operations --------------------------------------------------------------

BAD = [
    (b"", "body"),
    (b"not json", "body"),
    (b"[1, 2]", "body"),
    (json.dumps({"sampling_params": {"max_new_tokens": 4}}).encode(), "input_ids"),
    (json.dumps({"input_ids": []}).encode(), "input_ids"),
    (json.dumps({"input_ids": "hello"}).encode(), "input_ids"),
    (json.dumps({"input_ids": [1, 2.5]}).encode(), "input_ids[1]"),
    (json.dumps({"input_ids": [1, -4]}).encode(), "input_ids[1]"),
    (json.dumps({"input_ids": [1, 49152]}).encode(), "input_ids[1]"),
    (json.dumps({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}).encode(),
     "sampling_params.max_new_tokens"),
    (json.dumps({"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}}).encode(),
     "sampling_params.max_new_tokens"),
    (json.dumps({"input_ids": [1], "sampling_params": {"temperature": -0.5}}).encode(),
     "sampling_params.temperature"),
    (json.dumps({"input_ids": [1], "sampling_params": {"top_p": 0}}).encode(), "sampling_params.top_p"),
    (json.dumps({"input_ids": [1], "sampling_params": {"top_k": 0}}).encode(), "sampling_params.top_k"),
    (json.dumps({"input_ids": [1], "sampling_params": {"temprature": 0}}).encode(), "sampling_params.temprature"),
    (json.dumps({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}).encode(),
     "sampling_params.frequency_penalty"),
    (json.dumps({"input_ids": [1], "text": "hi"}).encode(), "text"),
    (json.dumps({"input_ids": [1], "sampling_params": {"stop_token_ids": [99999]}}).encode(),
     "sampling_params.stop_token_ids"),
    (json.dumps({"input_ids": [1], "stream": "yes"}).encode(), "stream"),
    (json.dumps({"input_ids": [[1, 2], [3, 99999]]}).encode(), "[1].input_ids[1]"),
]


@pytest.mark.parametrize("raw,field", BAD, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD)])
def test_malformed_generate_gets_400_naming_the_field(http, raw, field):
    r = http.post("/generate", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith(f"{field}: "), message


def test_server_keeps_serving_after_bad_input(http, tok, hf):
    for raw, _ in BAD:
        http.post("/generate", content=raw, headers={"content-type": "application/json"})
    for path, body in (("/update_weights_from_disk", {}), ("/pause_generation", {"mode": "sideways"}),
                       ("/abort_request", {})):
        r = http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
    prompt = _prompts(tok, 1)[0]
    assert _gen(http, prompt, max_new_tokens=5, temperature=0)["output_ids"] == _greedy(hf, prompt, 5)
    assert http.get("/health").status_code == 200


def test_missing_model_and_taken_port_fail_with_one_clear_line():
    with pytest.raises(EngineStartupError, match="harnessrl model prepare"):
        EngineServer(model="/nonexistent/model").start()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(EngineStartupError, match=f"port {port} .* already in use.*--port"):
            EngineServer(model="tiny-llama", port=port).start()
        proc = subprocess.run([sys.executable, "-m", "harnessrl.trainers.engine", "--model", "tiny-llama",
                               "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0], proc.stderr


def test_an_in_process_engine_leaves_the_thread_count_of_its_starter_alone():
    """`num_threads` is the scheduler thread's own: the thread that starts an in-process engine
    (`harnessrl train`, a test worker) keeps its torch thread count. It once took the engine's:
    a test worker then ran every later test's torch work on the engine's count of spinning
    OpenMP threads (a decode test at 59 s of CPU, 9.4 s alone)."""
    before = torch.get_num_threads()
    try:
        with EngineServer(model="tiny-llama", num_threads=before + 1) as server:
            assert torch.get_num_threads() == before
            r = httpx.post(server.url + "/generate", json={
                "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}, timeout=60)
            assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
    finally:
        torch.set_num_threads(before)


# ---- the real SmolLM2-135M ---------------------------------------------------------------

@pytest.mark.model
def test_smollm2_greedy_stops_at_eos_like_hf_and_batches_exactly():
    tok = load_tokenizer("smollm2-135m")
    hf = _load("smollm2-135m")
    questions = ["What is 2+2? Answer with one number.", "Say hello.", "Name a primary color."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False)
               for q in questions]
    refs = [_greedy(hf, p, 48) for p in prompts]
    with EngineServer(model="smollm2-135m", max_running_requests=4) as server:
        async def go():
            async with EngineClient(server.url) as c:
                return await asyncio.gather(*(c.generate(p, max_new_tokens=48, temperature=0) for p in prompts))

        results = asyncio.run(go())
        with httpx.Client(base_url=server.url, timeout=120) as http:
            ignore = _gen(http, prompts[1], max_new_tokens=len(refs[1]) + 3, temperature=0, ignore_eos=True)
    for res, ref, prompt in zip(results, refs, prompts):
        assert res.output_ids == ref
        assert res.logprobs == pytest.approx(_ref_logprobs(hf, prompt, ref), abs=1e-4)
    short = [r for r, ref in zip(results, refs) if ref[-1] == 2]
    assert short, "SmolLM2 should end at least one short answer with <|im_end|>"
    assert all(r.finish_reason == "stop" for r in short)
    # ignore_eos generates through the eos token
    assert _ids(ignore)[: len(refs[1])] == refs[1] and len(_ids(ignore)) == len(refs[1]) + 3


def test_a_client_that_goes_away_frees_its_batch_slot(engine, http, tok):
    prompt = _prompts(tok, 1)[0]

    async def go():
        async with httpx.AsyncClient(base_url=engine.url, timeout=60) as raw, EngineClient(engine.url) as c:
            body = {"input_ids": prompt, "stream": True,
                    "sampling_params": {"max_new_tokens": 5000, "temperature": 0, "ignore_eos": True}}
            async with raw.stream("POST", "/generate", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        break  # one chunk, then hang up
            await _until(lambda: _idle(c), "the abandoned stream to be aborted")

    asyncio.run(go())


async def _idle(client: EngineClient) -> bool:
    info = await client.model_info()
    return info["running"] == 0 and info["waiting"] == 0


def test_an_engine_failure_is_a_500_and_the_engine_goes_on(engine, http, tok, hf, tmp_path):
    """Real failure: NaN weights make sampling raise inside the engine (multinomial on NaN)."""
    prompt = _prompts(tok, 1)[0]
    broken = _load("tiny-llama")
    with torch.no_grad():
        broken.model.norm.weight.fill_(float("nan"))
    broken.save_pretrained(tmp_path / "nan")
    r = http.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "nan"), "weight_version": "nan"})
    assert r.status_code == 200, r.text
    try:
        r = http.post("/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 500 and "engine error" in r.json()["error"]["message"], r.text
    finally:
        r = http.post("/update_weights_from_disk",
                      json={"model_path": str(resolve_model("tiny-llama")), "weight_version": "restored"})
        assert r.status_code == 200, r.text
    body = _gen(http, prompt, max_new_tokens=6, temperature=0)
    assert body["output_ids"] == _greedy(hf, prompt, 6) and body["meta_info"]["weight_version"] == "restored"
    assert http.get("/health").status_code == 200


def test_waiting_requests_are_admitted_by_priority(tok):
    """SGLang's priority scheduling direction: with one batch slot, the waiting request with
    the higher `priority` is admitted first, FIFO among equals (the proxy sends minus the
    episode's oldest version, so the stalest episode generates first)."""
    prompt = _prompts(tok, 1)[0]

    async def go():
        with EngineServer(model="tiny-llama", max_running_requests=1) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
                await http.post("/pause_generation", json={"mode": "in_place"})
                order: list[str] = []

                async def one(name, priority):
                    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                            "rid": name, **({} if priority is None else {"priority": priority})}
                    r = await http.post("/generate", json=body)
                    assert r.status_code == 200, r.text
                    order.append(name)

                tasks = []
                for name, prio in (("old-none", None), ("v3", -3), ("v1", -1), ("v1-later", -1), ("v0", 0)):
                    tasks.append(asyncio.create_task(one(name, prio)))
                    await _until(lambda n=len(tasks): _waiting(http, n), f"{name} queued")
                await http.post("/continue_generation", json={})
                await asyncio.gather(*tasks)
                bad = await http.post("/generate", json={"input_ids": prompt, "priority": "high"})
                return order, bad.status_code, bad.text

    order, status, text = asyncio.run(go())
    assert order == ["old-none", "v0", "v1", "v1-later", "v3"]
    assert status == 400 and "priority" in text


async def _waiting(http, n: int) -> bool:
    return (await http.get("/get_model_info")).json()["waiting"] == n
