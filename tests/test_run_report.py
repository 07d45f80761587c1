"""The run report and `harnessrl compare`: figures from hand-built records, real files, the real CLI."""
from __future__ import annotations

import json
from pathlib import Path

from harnessrl.cli import main
from harnessrl.gym.trajectory import CallRecord, Trajectory
from harnessrl.trainers.run_report import RunFigures, compare, summary_line


def _traj(sid: str, reward: float | None, calls: list[tuple[float | None, float, float]], status: str = "ok") -> Trajectory:
    """calls: (env_s, gen_s, finished_at)."""
    recs = [CallRecord(call_id=f"{sid}-{i}", session_id=sid, index=i, dialect="openai_chat", prompt_prefix_len=0, new_prompt_ids=[1],
                       completion_ids=[2], logprobs=[-0.1], versions=[0], finish_reason="stop", segment=0,
                       queue_s=0.5, gen_s=gen, env_s=env, finished_at=fin)
            for i, (env, gen, fin) in enumerate(calls)]
    return Trajectory(session_id=sid, segments=[], reward=reward, status=status, task_id="t", calls=recs)


def test_run_figures_keep_numbers_and_report_them() -> None:
    f = RunFigures()
    f.add([_traj("a", 1.0, [(None, 1.0, 10.0), (2.0, 1.0, 13.0)]), _traj("b", 0.0, [(None, 2.0, 12.0)])])
    f.add([_traj("c", None, [(None, 1.0, 20.0)], status="infra_error")])
    r = f.report(wall_s=20.0, steps=2, staleness=2, over_staleness="mask",
                 scheduler={"staleness_hist": {"1": 5, "0": 7}, "started": 4, "masked_tokens": 3, "env_latency_s": [1]})
    assert r["trajectories"] == 3 and r["trajectories_per_s"] == 0.15
    assert r["reward_mean"] == 0.5  # the infra failure is not a 0
    assert r["staleness_bound"] == 2 and r["staleness_hist"] == {0: 7, 1: 5}
    assert r["env_latency_s"] == {"p50": 2.0, "p95": 2.0, "p99": 2.0, "n": 1}
    assert r["model_call_latency_s"]["n"] == 4 and r["model_call_latency_s"]["p50"] == 1.5
    # generation spans [9,10] [12,13] [10,12] [19,20]: busy 5 s of the 11 s window
    assert r["generator_utilization"] == round(5 / 11, 4)
    assert r["scheduler"] == {"started": 4, "masked_tokens": 3}
    held = f.report(wall_s=20.0, steps=2, staleness=2, over_staleness="wait", scheduler={"wait_timeouts": 2})
    assert held["scheduler"] == {"wait_timeouts": 2}  # batches that went on without their stragglers
    assert "0.150 traj/s at staleness bound η=2 (mask)" in summary_line(r)


def _run(root: Path, name: str, eta: int, tps: float, steps: int = 2, hold: dict | None = None) -> Path:
    d = root / name
    d.mkdir()
    f = RunFigures()
    f.add([_traj(f"{name}{i}", 1.0, [(None, 1.0, 1.0)]) for i in range(int(tps * 10))])
    (d / "report.json").write_text(json.dumps(f.report(wall_s=10.0, steps=steps, staleness=eta, over_staleness="wait",
                                                       scheduler={"staleness_hist": {str(eta): 3}})))
    (d / "config.json").write_text(json.dumps({"steps": steps, "out_dir": str(d),
                                               "scheduler": {"staleness": eta, "over_staleness": "wait",
                                                             **(hold or {})}}))
    return d


def test_compare_gives_the_ratio_against_the_sync_run(tmp_path: Path, capsys) -> None:
    sync, fast = _run(tmp_path, "sync", 0, 0.4), _run(tmp_path, "eta2", 2, 1.2)
    assert main(["compare", str(fast), str(sync)]) == 0
    out = capsys.readouterr().out.splitlines()
    got = json.loads(out[-1])
    assert got["sync_run"] == str(sync) and got["config_differs_in"] == []
    assert [(r["staleness_bound"], r["ratio_vs_sync"], r["max_lag"]) for r in got["rows"]] == [(2, 3.0, 2), (0, 1.0, 0)]
    assert any("3.00" in line and "eta2" in line for line in out)

    other = _run(tmp_path, "longer", 1, 0.8, steps=5)  # differs in more than staleness: said so
    got = compare([sync, other])
    assert got["config_differs_in"] == ["steps"] and got["rows"][1]["ratio_vs_sync"] == 2.0
    assert compare([other])["sync_run"] is None and compare([other])["rows"][0]["ratio_vs_sync"] is None
    # the bounded hold and the admission slack are staleness settings: a run differing in them alone compares cleanly
    held = _run(tmp_path, "held", 2, 1.0, hold={"max_wait_s": 9.5, "admission_slack": 2})
    assert compare([sync, held])["config_differs_in"] == []


def test_compare_names_a_folder_without_a_report(tmp_path: Path, capsys) -> None:
    assert main(["compare", str(tmp_path)]) == 2
    assert f"{tmp_path}: no report.json" in capsys.readouterr().err
