"""bench/gpu_check.sh --dry-run: the GPU check's own code path on CPU with a tiny model.

The real script, run as a GPU box runs it (bash, its python found through $PYTHON, the
working tree on PYTHONPATH as `harnessrl`): a random-init Qwen2 built on the spot, the local
engine and a proxy on loopback, 3 train steps of the built-in trainer with weight syncs
through the proxy, then the fixed-batch logprob mismatch. The test reads its one JSON line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the check runs the torch engine and trainer")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # ~25 s idle, ~70 s on a busy 2-core box
REPO = Path(__file__).resolve().parent.parent
KEYS = {"device", "dtype", "params", "train_tokens_per_s", "mfu", "weight_sync_s", "decode_tokens_per_s",
        "logprob_mismatch", "dry_run", "target_met"}


@pytest.fixture(scope="module")
def dry_run():
    env = {**os.environ, "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--dry-run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=200)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    assert len(lines) == 1, p.stdout  # one JSON line, progress on stderr
    return json.loads(lines[0]), p.stderr


def test_dry_run_prints_one_json_line_with_every_key(dry_run):
    r, _ = dry_run
    assert KEYS <= set(r)
    assert r["dry_run"] is True
    assert (r["device"], r["dtype"], r["engine"]) == ("cpu", "float32", "local")
    assert r["mfu"] is None  # no peak FLOPs for a CPU
    assert set(r["decode_tokens_per_s"]) == {"1", "16", "64"}
    assert all(v > 0 for v in r["decode_tokens_per_s"].values())
    # the tiny config: 2 layers, hidden 64, vocab 512, tied embeddings (counted once)
    assert r["shape"]["num_hidden_layers"] == 2 and r["shape"]["hidden_size"] == 64
    assert r["params"] == 107072
    assert r["train_tokens_per_s"] > 0 and r["weight_sync_s"] > 0 and r["sample_ms_per_row"] > 0


def test_dry_run_trains_syncs_versions_and_matches_logprobs(dry_run):
    r, _ = dry_run
    assert [s["updated"] for s in r["steps"]] == [True, True, True]
    assert r["engine_weight_versions"] == ["1", "2", "3"]  # one bump per sync through the proxy
    assert r["checks"]["generations_carry_version"] is True
    assert r["mismatch_bound"] == 1e-4
    assert r["mismatch_tokens"] > 0
    assert 0 <= r["logprob_mismatch"]["mean"] <= r["logprob_mismatch"]["max"] < 1e-4
    f = r["mismatch_filtered"]  # the same weights, scored under the engine's top-p/top-k filters
    assert (f["temperature"], f["top_p"], f["top_k"]) == (0.7, 0.9, 50)
    assert f["tokens"] > 0 and f["max"] < 1e-4
    c = r["mismatch_correction"]  # float32: nothing for the correction to cut, before == after
    assert (c["tis_cap"], c["seq_mask"]) == (2.0, [0.5, 2.0])
    assert c["tis_truncated_frac"] == c["masked_frac"] == c["seq_masked_frac"] == 0.0
    assert c["before"]["max"] == pytest.approx(r["logprob_mismatch"]["max"]) and c["after"] == c["before"]
    assert c["before"]["p50"] <= c["before"]["p95"] <= c["before"]["p99"] <= c["before"]["max"]
    assert all(s["masked_frac"] == 0.0 and s["log_ratio_abs_p99"] < 1e-4 for s in r["steps"])
    assert r["checks"] == {k: True for k in r["checks"]}
    assert r["target_met"] is True


def test_a_sigterm_still_prints_one_json_line_with_the_error():
    # gpu_check.sh's `timeout 540` sends SIGTERM: the device run must still get its line
    import signal
    import time

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--dry-run"], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:  # wait until the model exists, then stop it
            if "model built" in line:
                break
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 124
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    r = json.loads(lines[0])
    assert r["target_met"] is False and r["dry_run"] is True
    assert r["error"].startswith(f"stopped by signal {int(signal.SIGTERM)} (the time limit)")
    assert (r["device"], r["dtype"], r["engine"]) == ("cpu", "float32", "local")
    assert list(r)[:2] == ["device", "dtype"]  # headline keys first


def test_sglang_engine_without_sglang_says_so_in_its_one_json_line():
    """`--engine sglang` with an interpreter that lacks sglang (this venv's) ends at once: exit
    1, one JSON line naming the engine and why, nothing built or measured."""
    env = {**os.environ, "PYTHON": sys.executable, "SGLANG_PYTHON": sys.executable}
    p = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--dry-run", "--engine", "sglang"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=200)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert p.returncode == 1 and len(lines) == 1, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    report = json.loads(lines[0])
    assert report["engine"] == "sglang" and report["target_met"] is False
    assert report["error"] == (f"SGLangLaunchError: --python {sys.executable}: sglang is not installed there "
                               "(in that environment: pip install 'sglang==0.5.23')")
    assert "params" not in report and "decode_tokens_per_s" not in report
