"""bench/async_real.py's policy (bench/async_real_policy.py): seeded latency draws that every η
replays, the sleep-prefixed gold plan, and real engine compute under the gold action's ids,
with per-token versions across a real weight update on the real local engine (tiny-llama)."""
from __future__ import annotations

import asyncio
import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from async_real_policy import (  # noqa: E402
    GoldOverEngine, LatencyDraws, sampled_staleness, sleepy_plan, spread_versions)

pytestmark = pytest.mark.timeout(300)


def test_draws_are_seeded_per_episode_so_every_eta_replays_the_same_sequence():
    a, b = LatencyDraws(3.0, 2.0, seed=7, turns=4), LatencyDraws(3.0, 2.0, seed=7, turns=4)
    assert [a.draws(k) for k in range(50)] == [b.draws(k) for k in range(50)]
    assert b.draws(3) == a.draws(3)  # asked out of order: the same
    assert a.draws(0) != a.draws(1)
    assert LatencyDraws(3.0, 2.0, seed=8, turns=4).draws(0) != a.draws(0)


@pytest.mark.parametrize("cv", [1.0, 2.0])
def test_draws_have_the_mean_and_cv_asked_for_and_are_clipped(cv):
    d = LatencyDraws(2.0, cv, seed=0, turns=10, clip_s=1e9)
    xs = [x for k in range(4000) for x in d.raw(k)]
    mean = statistics.fmean(xs)
    assert mean == pytest.approx(2.0, rel=0.06)
    assert statistics.pstdev(xs) / mean == pytest.approx(cv, rel=0.25)
    clipped = LatencyDraws(2.0, cv, seed=0, turns=10, clip_s=5.0)
    assert max(x for k in range(400) for x in clipped.draws(k)) == 5.0
    assert clipped.draws(1) == [min(round(x, 3), 5.0) for x in d.raw(1)]


def test_sleepy_plan_puts_a_sleep_before_every_command_and_submits_last():
    assert sleepy_plan(["edit"], [1.5, 0.25, 2.0, 0.125]) == [
        "sleep 1.500; edit", "sleep 0.250; git diff --stat", "sleep 2.000; git diff --stat",
        "sleep 0.125; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    assert sleepy_plan(["a", "b", "c"], [1.0, 1.0]) == ["sleep 1.000; a", "sleep 1.000; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]


def test_spread_versions_maps_returned_tokens_onto_the_engine_chunks():
    assert spread_versions([(30, "3"), (10, "4")], 8) == ["3"] * 6 + ["4"] * 2
    assert spread_versions([(5, "1")], 3) == ["1"] * 3
    assert spread_versions([(1, "1"), (1, "2")], 4) == ["1", "1", "2", "2"]


def test_sampled_staleness_counts_the_engine_tokens_mask_would_mask():
    chunks = [(100, "3"), (20, "4"), (80, "5"), (5, "")]
    # Consumed at V = 6 under η = 2: versions < 4 are masked (the scheduler's `v < V - η`).
    assert sampled_staleness(chunks, consumed_at=6, eta=2) == (100, 205)
    assert sampled_staleness(chunks, consumed_at=7, eta=2) == (120, 205)  # 4 < 5 now too
    assert sampled_staleness(chunks, consumed_at=5, eta=2) == (0, 205)  # 3 = V - η: still in
    assert sampled_staleness(chunks, consumed_at=9, eta=0) == (200, 205)  # unversioned: never stale
    assert sampled_staleness([], consumed_at=3, eta=1) == (0, 0)


def _prompt(tok, statement: str) -> list[int]:
    tool = {"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    text = (f"<|im_start|>system\nYou are a helpful assistant.\n<tools>\n{json.dumps(tool)}\n</tools><|im_end|>\n"
            f"<|im_start|>user\n{statement}<|im_end|>\n<|im_start|>assistant\n")
    return tok.encode(text, add_special_tokens=False)


def test_gold_over_engine_runs_real_engine_tokens_and_versions_straddle_a_weight_update(tmp_path):
    from harnessrl.gym.backends.protocol import SESSION
    from harnessrl.gym.doubles.scripted import ScriptedPolicy
    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.gym.models import load_tokenizer, resolve_model
    from harnessrl.gym.tasks.suites.builtin import load
    from harnessrl.trainers.engine import EngineServer

    task = next(t for t in load() if t.difficulty == "trivial")
    tok = load_tokenizer("tiny-llama")
    draws = LatencyDraws(1.0, 1.0, seed=3, turns=3)
    prompt = _prompt(tok, task.problem_statement)
    expected_text = ScriptedPolicy(tok, {task.problem_statement: sleepy_plan(task.gold_plan, draws.draws(0))}).decide(
        tok.decode(prompt, skip_special_tokens=False))[0]
    expected = tok.encode(expected_text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert f"sleep {draws.draws(0)[0]:.3f}; " in expected_text

    with EngineServer(model="tiny-llama", weight_version="0", num_threads=1) as engine:
        backend = GoldOverEngine(engine.url, tok, [task], draws, gen_tokens=400)
        client = EngineClient(engine.url)
        es = engine.state.scheduler

        async def go():
            SESSION.set("episode-a")
            call = asyncio.create_task(backend.generate(prompt, max_new_tokens=4096))
            s0 = es.steps
            while not (es._running and es.steps > s0 + 5):  # decoding has begun
                assert not call.done(), "the generation ended before the weight update"
                await asyncio.sleep(0.005)
            await client.pause(mode="abort")
            await client.update_weights_from_disk(str(resolve_model("tiny-llama")), weight_version="1")
            await client.resume()
            res = await call
            SESSION.set("episode-b")
            await backend.generate(prompt, max_new_tokens=4096)
            await backend.aclose()
            await client.aclose()
            return res

        res = asyncio.run(go())
    assert res.output_ids == expected and res.finish_reason == "stop"
    n0 = res.versions.count("0")
    assert 0 < n0 < len(expected) and res.versions == ["0"] * n0 + ["1"] * (len(expected) - n0)
    first, second = backend.calls
    assert first["engine_tokens"] == 400 and first["versions"] == ["0", "1"] and first["k"] == 0
    assert [v for _, v in first["chunks"]] == ["0", "1"] and sum(n for n, _ in first["chunks"]) == 400
    assert first["chunks"][0][0] >= 1  # decoding had begun under version 0
    assert sampled_staleness(first["chunks"], consumed_at=2, eta=1) == (first["chunks"][0][0], 400)
    assert second["chunks"] == [(400, "1")]
    assert second["engine_tokens"] == 400 and second["versions"] == ["1"] and second["k"] == 1
    assert first["wait_s"] == draws.draws(0)[0] and second["wait_s"] == draws.draws(1)[0]


def test_full_batch_step_is_read_where_taken_else_fitted_over_the_engines_step_curve():
    """async_real's honesty check reads the full-batch turn each run took from the engine's
    `decode_by_rows`: between two readings, the steps at `slots` rows where there are enough,
    else the weighted line through every batch size's mean step."""
    import async_real

    before = {"decode_by_rows": {"1": [10, 0.02], "4": [5, 0.02]}}
    after = {"decode_by_rows": {"1": [110, 0.22], "4": [55, 0.22], "6": [40, 0.2], "8": [3, 0.018]}}
    delta = async_real.rows_delta(before, after)
    assert delta == {1: (100, pytest.approx(0.2)), 4: (50, pytest.approx(0.2)), 6: (40, pytest.approx(0.2)),
                     8: (3, pytest.approx(0.018))}
    # 2 ms + 0.5 ms a row beyond the first: 8 rows (3 steps taken, too few) read off the line
    line = {1: (100, 0.2), 2: (50, 0.125), 5: (10, 0.04)}
    assert async_real.step_at(line, 8) == pytest.approx(0.0055)
    assert async_real.step_at(line, 1) == pytest.approx(0.002)
    assert async_real.step_at({8: (200, 1.0), 1: (100, 0.2)}, 8) == pytest.approx(0.005)  # taken: its own mean
    assert async_real.step_at({8: (20, 0.2)}, 8) == pytest.approx(0.01)  # one size: its mean, however few
    assert async_real.step_at({1: (20, 0.2)}, 8) is None  # nothing to fit a line through
    assert async_real.step_at({}, 8) is None
    # the env tracker's reading: steps taken at the size only, never the line
    assert async_real.step_at(line, 8, fit=False) is None
    assert async_real.step_at({8: (200, 1.0), 1: (100, 0.2)}, 8, fit=False) == pytest.approx(0.005)


def test_draws_follow_a_new_mean_in_proportion_and_stay_seeded():
    """async_real's env follows the engine's speed (`LatencyDraws.set_mean`): after a new mean every
    episode's draws are the same variates scaled by new / old (before the clip), so every η still
    replays one sequence, in units of the generation time."""
    d = LatencyDraws(4.0, 1.0, seed=3, turns=4, clip_s=1e9)
    before = {k: d.raw(k) for k in range(20)}
    d.set_mean(6.0)
    for k, xs in before.items():
        assert d.raw(k) == pytest.approx([x * 1.5 for x in xs], rel=1e-12)
    assert LatencyDraws(6.0, 1.0, seed=3, turns=4, clip_s=1e9).raw(7) == pytest.approx(d.raw(7), rel=1e-12)
    with pytest.raises(ValueError):
        d.set_mean(0.0)
    with pytest.raises(ValueError):
        d.set_mean(float("nan"))


def test_a_child_started_with_die_with_parent_goes_when_the_bench_is_killed():
    """The engine process async_real starts (`preexec_fn=_die_with_parent`) must not outlive a
    bench killed with SIGKILL: a left-behind engine stepped on the core the next run's engine was
    pinned to. A real parent process starts a real child that way and is killed -9; the child
    is gone (or a zombie awaiting its reaper) within seconds."""
    import os
    import signal
    import subprocess
    import time

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    script = ("import sys, subprocess, time; sys.path.insert(0, %r); import async_real; "
              "p = subprocess.Popen(['sleep', '300'], preexec_fn=async_real._die_with_parent); "
              "print(p.pid, flush=True); time.sleep(300)" % bench)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/status") as f:
                return "\nState:\tZ" not in f.read()
        except FileNotFoundError:
            return False

    assert alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
