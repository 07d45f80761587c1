"""`harnessrl view` in a real browser: headless Debian Chromium (chromium-driver, Selenium)
opens the viewer on a real recorded run and the test asserts on the DOM.

The run: mini-swe-agent (unmodified, in Docker) solves a built-in task with the scripted gold
policy through the real proxy, which records it in its SQLite store, and the hidden tests
grade it (`run_rollout`, as `harnessrl rollout` does); then a second session goes through a
restarted proxy on the same store with two calls whose histories differ (the client edited
the assistant's reply), so the record holds a segment split; then tiny-llama on the local
engine samples one more episode (real logprobs). The page must show the
episode's messages and tool calls, highlight exactly as many sampled tokens as the record's
loss masks sum to, colour each by its own logprob, show the split reason, the agent's patch
and the hidden tests' output,
filter the episodes table server-side, click through from the table to an episode, and
compare two runs. Screenshots are saved under pytest's tmp dir and at
runs/test-artifacts/viewer-*.png (docs/viewer-episode.png in the README is one of these).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from harnessrl.adapters.toolchain import installed_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from adapter_helpers import docker_backend  # noqa: E402

TASK = "harnessrl-builtin__cachekit-2"
ARTIFACTS = Path(__file__).resolve().parents[1] / "runs" / "test-artifacts"
pytestmark = [pytest.mark.docker, pytest.mark.harness, pytest.mark.browser]


def _browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no chromium/chromedriver on PATH: scripts/setup.sh installs Debian's chromium and chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[dev]'")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)  # a given driver: no Selenium Manager fetch


def _chat(proxy, sid: str, key: str, messages: list[dict]) -> str:
    r = httpx.post(f"{proxy.openai_base_url(sid)}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "policy", "messages": messages, "max_tokens": 32}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(run folder, the solved episode's record, the split session's record, the task, the
    record of an episode tiny-llama sampled)."""
    docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.rollout import RolloutConfig, run_rollout
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tasks.loaders import load_suite
    from harnessrl.gym.trajectory import Trajectory

    out = tmp_path_factory.mktemp("viewer-run")
    task = next(t for t in load_suite("builtin") if t.instance_id == TASK)
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks([task], gold=True)
    cfg = RolloutConfig(harness="mini-swe-agent", tasks=[TASK], model="tiny-llama", sandbox="docker",
                        episode=EpisodeConfig(max_calls=8, wall_time_s=240))
    with ServedApp(engine.app()) as served:
        rep = asyncio.run(run_rollout(cfg, served.url, out, episodes=1, concurrency=1, progress=False))
        assert rep["success_rate"] == 1.0, rep
        with ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama",
                                     db_path=str(out / "trajectories.db"))) as proxy:
            sid, key = proxy.open_session({"task_id": "history-edit", "harness": "openai-client"})
            msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
            reply = _chat(proxy, sid, key, msgs)
            _chat(proxy, sid, key, msgs + [{"role": "assistant", "content": reply + " (edited by the client)"},
                                           {"role": "user", "content": "Another one."}])
            proxy.set_reward(sid, 0.0, "ok", "harness_exited")
            split = proxy.trajectory(sid)
    # and one episode sampled by a real model on the local engine (tiny-llama: real logprobs)
    from harnessrl.trainers.engine import EngineServer

    sampled_cfg = cfg.model_copy(update={"max_new_tokens": 48, "episode": EpisodeConfig(max_calls=2, wall_time_s=240)})
    with EngineServer(model="tiny-llama", port=0, weight_version="0") as engine:
        asyncio.run(run_rollout(sampled_cfg, engine.url, out, episodes=1, concurrency=1, progress=False))
    solved, sampled = [Trajectory.from_dict(json.loads(x)) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert solved.reward == 1.0 and solved.metadata["grading"]["agent_diff"]
    assert [s.split_reason for s in split.segments] == [None, "assistant_edited"]
    assert sampled.status in ("ok", "truncated") and sum(sum(s.loss_mask) for s in sampled.segments) > 0
    return out, solved, split, task, sampled


def _open(driver, url: str, timeout: float = 120):
    driver.get(url)
    _ready(driver, timeout)


def _ready(driver, timeout: float = 120):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.execute_script("return document.body.dataset.ready || ''"))
    assert driver.execute_script("return document.body.dataset.ready") != "error", \
        driver.find_element("id", "main").text


def _severe(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _shot(driver, tmp_path: Path, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"viewer-{name}.png"
    assert driver.save_screenshot(str(path))
    shutil.copyfile(path, ARTIFACTS / path.name)
    assert path.stat().st_size > 10_000
    return path


def _picture(driver, tmp_path: Path, name: str) -> Path:
    """The page's top with the first reply and the first sampled tokens in view."""
    driver.set_window_size(1500, 1250)
    driver.execute_script("""
        const scrollTo = (pane, el) => { if (el) pane.scrollTop = el.offsetTop - pane.offsetTop - 160; };
        scrollTo(document.getElementById('token-view'), document.querySelector('#token-view .tok.sampled'));
        scrollTo(document.getElementById('conversation'), document.querySelector('#conversation .msg.reply'));
        window.scrollTo(0, 0);""")
    path = _shot(driver, tmp_path, name)
    driver.set_window_size(1500, 1000)
    return path


@pytest.mark.timeout(900)
def test_viewer_renders_a_real_run_in_headless_chromium(recorded, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tools.viewer import RunIndex
    from harnessrl.gym.tools.viewer.app import build_app

    run, solved, split, task, sampled = recorded
    driver = _browser()
    try:
        with ServedApp(build_app([RunIndex(run, name="rollout")])) as served:
            # the runs page: figures and both episodes, from the store
            _open(driver, f"{served.url}/#/run/0")
            rows = driver.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
            assert {r.get_attribute("data-sid") for r in rows} == {solved.session_id, split.session_id,
                                                                   sampled.session_id}
            assert len(driver.find_elements(By.CSS_SELECTOR, ".charts svg.chart")) == 4
            assert driver.find_element(By.CSS_SELECTOR, ".charts svg.line-chart path.series[data-series=reward]")
            # the filter goes to the server: only the split session matches "history"
            box = driver.find_element(By.CSS_SELECTOR, "#episode-filters input[name=task]")
            box.send_keys("history")
            driver.find_element(By.CSS_SELECTOR, "#episode-filters button").click()
            WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 1)
            assert driver.find_element(By.CSS_SELECTOR, "#episodes tbody tr").get_attribute("data-sid") == \
                split.session_id
            box.clear()
            driver.find_element(By.CSS_SELECTOR, "#episode-filters button").click()
            WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 3)
            # sorting is the server's too: by sampled tokens, ascending then descending
            order = {}
            for direction in ("asc", "desc"):
                driver.find_element(By.CSS_SELECTOR, "#episodes th[data-sort=sampled]").click()
                WebDriverWait(driver, 60).until(lambda d: d.find_element(
                    By.CSS_SELECTOR, "#episodes th[data-sort=sampled]").get_attribute("data-dir") == direction)
                order[direction] = [r.get_attribute("data-sid")
                                    for r in driver.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")]
            by_sampled = sorted((solved, split, sampled), key=lambda t: -sum(sum(s.loss_mask) for s in t.segments))
            assert order["desc"] == [t.session_id for t in by_sampled] == order["asc"][::-1]
            _shot(driver, tmp_path, "run")
            # the per-harness table: each harness's episodes; a harness's name filters the table to it
            per = {r.get_attribute("data-harness"): [td.text for td in r.find_elements(By.CSS_SELECTOR, "td")]
                   for r in driver.find_elements(By.CSS_SELECTOR, "#harnesses tbody tr")}
            assert sorted(per) == ["mini-swe-agent", "openai-client"]
            assert (per["mini-swe-agent"][1], per["openai-client"][1]) == ("2", "1")  # episodes
            assert per["mini-swe-agent"][6] == "0" and per["openai-client"][2] == "1"  # infra errors; scored
            driver.find_element(By.CSS_SELECTOR, "#harnesses tr[data-harness=openai-client] a.harness-filter").click()
            rows_now = "return [...document.querySelectorAll('#episodes tbody tr')].map(r => r.dataset.sid)"
            WebDriverWait(driver, 60).until(lambda d: d.execute_script(rows_now) == [split.session_id])  # one read
            from selenium.webdriver.support.ui import Select

            picked = Select(driver.find_element(By.CSS_SELECTOR, "#episode-filters select[name=harness]"))
            assert picked.first_selected_option.get_attribute("value") == "openai-client"
            picked.select_by_value("")
            driver.find_element(By.CSS_SELECTOR, "#episode-filters button").click()
            WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 3)

            # click through from the table to the solved episode
            driver.execute_script("document.body.dataset.ready = ''")
            driver.find_element(By.CSS_SELECTOR, f"#episodes tr[data-sid='{solved.session_id}'] a.episode-link").click()
            _ready(driver)
            WebDriverWait(driver, 120).until(
                lambda d: d.find_element(By.ID, "token-view").get_attribute("data-loaded") == "true")
            assert driver.execute_script("return location.hash") == f"#/run/0/episode/{solved.session_id}"
            roles = [e.get_attribute("data-role") for e in driver.find_elements(By.CSS_SELECTOR, "#conversation .msg")]
            assert roles[:2] == ["system", "user"] and "assistant" in roles
            statement = task.problem_statement.strip().splitlines()[0].strip()
            user = driver.find_elements(By.CSS_SELECTOR, "#conversation .msg[data-role=user] .content")
            assert any(statement in u.get_attribute("textContent") for u in user)
            shown = " ".join(e.get_attribute("textContent") for e in
                             driver.find_elements(By.CSS_SELECTOR, "#conversation .tool-call pre"))
            for command in task.gold_plan:
                assert json.dumps(command)[1:-1] in shown or command in shown, command
            calls = driver.find_elements(By.CSS_SELECTOR, "#conversation .call")
            assert len(calls) == len(solved.calls)
            bars = [sorted(s.get_attribute("data-part") for s in c.find_elements(By.CSS_SELECTOR, ".timebar span"))
                    for c in calls]  # where each turn's time went: env before it (none on the first), queue, gen
            assert bars == [sorted(k for k, v in (("env", c.env_s), ("queue", c.queue_s), ("gen", c.gen_s)) if v)
                            for c in sorted(solved.calls, key=lambda c: c.index)]
            marked = driver.find_elements(By.CSS_SELECTOR, "#token-view .tok.sampled")
            assert len(marked) == sum(sum(s.loss_mask) for s in solved.segments)
            assert len(driver.find_elements(By.CSS_SELECTOR, "#token-view .tok")) == \
                sum(len(s.token_ids) for s in solved.segments)
            assert driver.find_element(By.ID, "patch").get_attribute("textContent") == \
                solved.metadata["grading"]["agent_diff"]
            assert driver.find_element(By.ID, "test-output").get_attribute("textContent") == \
                solved.metadata["grading"]["test_output"]
            tests = solved.metadata["grading"]["tests"]
            assert tests and {t["status"] for t in tests} == {"passed"}
            assert [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in
                    driver.find_elements(By.CSS_SELECTOR, "#tests tr")] == \
                [[t["node_id"], t["kind"], t["status"]] for t in tests]
            _picture(driver, tmp_path, "solved")

            # the episode tiny-llama sampled: each sampled token's heat is its own logprob
            _open(driver, f"{served.url}/#/run/0/episode/{sampled.session_id}")
            WebDriverWait(driver, 120).until(
                lambda d: d.find_element(By.ID, "token-view").get_attribute("data-loaded") == "true")
            heats = driver.execute_script("return [...document.querySelectorAll('#token-view .tok.sampled')]"
                                          ".map(e => [e.title, e.style.getPropertyValue('--heat')])")
            lps = [lp for s in sampled.segments for lp, m in zip(s.logprobs, s.loss_mask) if m]
            assert len(heats) == len(lps)
            shown = [float(t.split("logprob ")[1].split()[0]) for t, _ in heats]  # printed to 3 decimals
            assert all(abs(a - b) <= 0.0005 + 1e-9 for a, b in zip(shown, lps)), (shown[:5], lps[:5])
            hues = [float(h.split("(")[1].split(",")[0]) for _, h in heats]  # the page's log-scale heat
            assert all(abs(hue - 120 * min(1.0, max(0.0, 1 + lp / 12))) <= 0.05 + 1e-9 for hue, lp in zip(hues, lps))
            assert len(set(hues)) > 1  # a real model's logprobs differ, and so do the colours
            _picture(driver, tmp_path, "episode")

            # the split session: its reason is shown where the segment starts
            _open(driver, f"{served.url}/#/run/0/episode/{split.session_id}")
            WebDriverWait(driver, 120).until(
                lambda d: d.find_element(By.ID, "token-view").get_attribute("data-loaded") == "true")
            reasons = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".split-reason")]
            assert reasons == ["assistant_edited", "assistant_edited"]  # call banner, segment head
            assert len(driver.find_elements(By.CSS_SELECTOR, "#token-view .segment")) == 2
            assert len(driver.find_elements(By.CSS_SELECTOR, "#token-view .tok.sampled")) == \
                sum(sum(s.loss_mask) for s in split.segments)
            second = driver.find_elements(By.CSS_SELECTOR, "#conversation .call")[1]
            assert "(edited by the client)" in second.get_attribute("textContent")
            _shot(driver, tmp_path, "split")
            assert _severe(driver) == []
            # nothing came from anywhere but this server (no CDN, no font, no network fetch)
            fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            assert fetched and all(u.startswith(served.url + "/") for u in fetched), fetched
    finally:
        driver.quit()


@pytest.mark.timeout(600)
def test_view_a_b_compares_two_runs(recorded, tmp_path):
    """`view A B`: the rollout beside a collect-style folder that kept only the solved episode."""
    from selenium.webdriver.common.by import By

    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tools.viewer import RunIndex
    from harnessrl.gym.tools.viewer.app import build_app

    run, solved, split, _, sampled = recorded
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "trajectories.jsonl").write_text(solved.to_json() + "\n")
    driver = _browser()
    try:
        with ServedApp(build_app([RunIndex(run, name="rollout"), RunIndex(kept, name="kept")])) as served:
            _open(driver, f"{served.url}/#/compare")
            assert len(driver.find_elements(By.CSS_SELECTOR, ".charts svg path.series")) == 2
            cells = {r.get_attribute("data-task"): [c.text for c in r.find_elements(By.TAG_NAME, "td")[1:]]
                     for r in driver.find_elements(By.CSS_SELECTOR, "#compare-tasks tbody tr")}
            wins = 1 + (sampled.reward >= 1.0)
            mean = (solved.reward + sampled.reward) / 2
            shown = str(int(mean)) if mean.is_integer() else f"{mean:.2f}"  # as the page formats it
            assert cells == {TASK: [f"{wins}/2 · {shown}", "1/1 · 1"], "history-edit": ["0/1 · 0", "-"]}
            _shot(driver, tmp_path, "compare")
            assert _severe(driver) == []
    finally:
        driver.quit()


@pytest.mark.timeout(600)
def test_a_train_run_shows_its_cheat_rate(recorded, tmp_path):
    """A train folder (the recorded rollout as its rollouts, two steps of metrics with the cheat
    rate): the page draws the per-step cheat curve and the totals table, every kind listed."""
    from selenium.webdriver.common.by import By

    from harnessrl.gym.cheat import from_steps
    from harnessrl.gym.grading import TAMPER_KINDS
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tools.viewer import RunIndex
    from harnessrl.gym.tools.viewer.app import build_app

    run = tmp_path / "train"
    shutil.copytree(recorded[0], run / "rollouts")
    zeros = {f"tampered/{k}": 0 for k in TAMPER_KINDS}
    steps = [{"step": 1, "reward_mean": 0.5, "graded_episodes": 4, "tampered_episodes": 1, "tampered_frac": 0.25,
              **zeros, "tampered/framework": 1, "canary_episodes": 0, "canary_passed": 0, "canary_pass_rate": None},
             {"step": 2, "reward_mean": 0.5, "graded_episodes": 4, "tampered_episodes": 0, "tampered_frac": 0.0,
              **zeros, "canary_episodes": 2, "canary_passed": 1, "canary_pass_rate": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    (run / "report.json").write_text(json.dumps({"cheat": from_steps(steps)}))
    driver = _browser()
    try:
        with ServedApp(build_app([RunIndex(run, name="train")])) as served:
            _open(driver, f"{served.url}/#/run/0")
            assert len(driver.find_elements(By.CSS_SELECTOR, ".charts svg.chart")) == 5
            assert driver.find_element(By.CSS_SELECTOR, ".charts svg.line-chart path.series[data-series=tampered]")
            rows = {r.get_attribute("data-key"): r.find_element(By.TAG_NAME, "td").text
                    for r in driver.find_elements(By.CSS_SELECTOR, "#cheat tr")}
            assert rows == {"tampered episodes": "1/8 graded (0.13)", "canaries passed": "1/2 (0.50)",
                            **{f"tampered: {k}": str(int(k == "framework")) for k in TAMPER_KINDS}}
            _shot(driver, tmp_path, "cheat")
            assert _severe(driver) == []
    finally:
        driver.quit()
