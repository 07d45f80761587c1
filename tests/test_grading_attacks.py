"""Attacks on the grader, each made the way an agent would (commands in its sandbox), on the
real docker and bubblewrap backends: none earns 1.0 or a mask (infra_error). Shadowing the
runner or reaching into it is `tampered` (0.0) with evidence of its kind; what the agent leaves
outside its diff (home, /tmp, processes, /dev/shm) is gone before grading; what it breaks is its
own 0.0. The attacks of issue 41 (the grader's plugin class, the frame walk, rigged comparisons,
the answer key, a patch exec'd from a data file, test helpers outside tests/) come from the
standing catalogue, harnessrl.gym.grading.attacks, which bench/grader_attacks.py runs whole."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harnessrl.gym.grading.attacks import (ATTACKS, BY_NAME, CHEAT_PLUGIN, OBFUSCATED_PATCH, REPORT_PROPERTY_PATCH,
                                           SITE_HOOK, WATCHER, caught, outcome)
from harnessrl.gym.grading.attack_tasks import create_sandbox, tasks
from harnessrl.gym.grading.score import score
from harnessrl.gym.grading.verdict import RewardConfig

sys.path.insert(0, str(Path(__file__).parent))
from grading_helpers import BACKENDS, backend_or_skip  # noqa: E402

TASKS = tasks()
CALC2 = TASKS["calc-2"]  # 3 FAIL_TO_PASS, 15 PASS_TO_PASS; the fix is in calc/parser.py
USER_SITE = "/home/agent/.local/lib/python3.11/site-packages"


def run_plan(sb, task):
    for cmd in task.gold_plan:
        res = sb.exec(cmd, timeout=60)
        assert res.exit_code == 0, res.output


def agent(sb, script: str) -> None:
    res = sb.exec(script, timeout=60)
    assert res.exit_code == 0, res.output


def write(sb, path: str, text: str) -> None:
    sb.write_file(path, text.encode())


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tmp_path_factory):
    b = backend_or_skip(request.param, "test-attacks", tmp_path_factory)
    yield b
    b.reap(run_id=getattr(b, "run_id", None))


@pytest.fixture
def sb(backend):
    sandbox = create_sandbox(backend, CALC2)  # local: this venv's pytest lent read-only
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def sandbox_for(backend):
    """task -> a sandbox of its repository at base: one per repository for the whole module,
    reset before every later use, as a warm pool reuses one between episodes (the grader resets
    it again itself). An attack whose traces outlived a reset would show in the next test."""
    made = {}

    def get(task):
        key = task.repo_spec().repo_id
        if key in made:
            made[key].reset()
        else:
            made[key] = create_sandbox(backend, task)
        return made[key]
    yield get
    for sandbox in made.values():
        sandbox.close()


def assert_zero(r, tampered: bool, reason_has: str = "", kind: str = ""):
    assert (r.reward, r.status, r.tampered) == (0.0, "ok", tampered), (r.reason, r.test_output[-1500:])
    assert reason_has in r.reason
    if tampered:
        assert r.reason.startswith("tampered: ") and r.cause == "agent"
        assert not kind or kind in {e["kind"] for e in r.evidence}, r.evidence


def assert_base_verdict(r):
    """Graded as the untouched base: the 3 FAIL_TO_PASS tests fail, nothing else."""
    assert_zero(r, tampered=False, reason_has="3 of 18 tests not passing")


# --- the whole tree travels: ignored, binary, symlinked, oddly named files -------------------------

@pytest.mark.timeout(180)
def test_every_file_of_the_agents_tree_is_graded_bytecode_aside(sb):
    # The fix lives in a module that only .git/info/exclude ignores: the old diff never saw it.
    agent(sb, "echo calc/fixed_expr.py >> .git/info/exclude && cat > calc/fixed_expr.py <<'EOF'\n"
              "def expr(self, BinOp):\n    left = self.term()\n    while self.at_op('+', '-'):\n"
              "        op = self.advance().text\n        left = BinOp(op, left, self.term())\n    return left\nEOF")
    agent(sb, "python3 - <<'EOF'\nimport pathlib\np = pathlib.Path('calc/parser.py')\ns = p.read_text()\n"
              "s = s.replace('    def expr(self):\\n', '    def expr(self):\\n        from calc.fixed_expr import expr\\n"
              "        return expr(self, BinOp)\\n\\n    def old_expr(self):\\n', 1)\np.write_text(s)\nEOF")
    agent(sb, "mkdir -p 'calc/data dir' && printf 'x\\0\\377' > 'calc/data dir/blob one.bin' "
              "&& ln -s parser.py calc/link.py && mkdir -p calc/__pycache__ && echo junk > calc/__pycache__/x.cpython-311.pyc")
    assert sb.exec("git status --porcelain --ignored", timeout=30).output.count("fixed_expr") == 1
    r = score(sb, CALC2)
    assert (r.reward, r.status, r.tampered) == (1.0, "ok", False), (r.reason, r.test_output[-1500:])
    assert "__pycache__" not in r.agent_diff and "calc/fixed_expr.py" in r.agent_diff  # bytecode never travels
    graded = sb.exec("od -An -c 'calc/data dir/blob one.bin'; readlink calc/link.py; [ -e calc/__pycache__ ] || echo gone",
                     timeout=30).output.split()
    assert graded == ["x", "\\0", "377", "parser.py", "gone"], graded


@pytest.mark.timeout(180)
def test_bytes_that_are_not_utf8_reach_grading_unchanged(sb):
    run_plan(sb, CALC2)
    agent(sb, "printf '# caf\\351\\n' > calc/latin1_note.py")
    r = score(sb, CALC2)
    assert (r.reward, r.status) == (1.0, "ok"), r.reason
    assert "+# caf\ufffd" in r.agent_diff  # the record is text
    assert sb.read_file("calc/latin1_note.py") == b"# caf\xe9\n"  # the graded tree has the bytes


# --- a. the runner shadowed from the repository root ------------------------------------------

@pytest.mark.timeout(180)
def test_pytest_py_in_the_repository_root_is_tampered(sb):
    write(sb, "pytest.py", "import sys\nsys.exit(0)\n")
    assert sb.exec("python3 -m pytest -q", timeout=60).exit_code == 0  # it does shadow the runner
    assert_zero(score(sb, CALC2), tampered=True, reason_has="pytest.py: shadows the test runner (pytest)")


@pytest.mark.timeout(180)
def test_runner_package_shadow_and_site_hooks_in_the_diff_are_tampered(sb):
    write(sb, "_pytest/__init__.py", "")
    write(sb, "sitecustomize.py", SITE_HOOK)
    write(sb, "calc/zz_cheat.pth", "import os\n")
    r = score(sb, CALC2)
    assert_zero(r, tampered=True, reason_has="_pytest/__init__.py: shadows the test runner (_pytest)")
    assert "sitecustomize.py: is a site hook" in r.reason and "calc/zz_cheat.pth: is a .pth site hook" in r.reason


@pytest.mark.timeout(180)
def test_pytest_configuration_in_setup_cfg_is_tampered_and_conftest_reverted(sb):
    write(sb, "setup.cfg", "[metadata]\nname = calc\n[tool:pytest]\naddopts = -p calc.cheat\n")
    r = score(sb, CALC2)
    assert_zero(r, tampered=True, reason_has="setup.cfg: changes the pytest configuration")
    sb.reset()
    run_plan(sb, CALC2)  # a real fix, plus runner config and a conftest: those are put back, the fix counts
    write(sb, "setup.cfg", "[metadata]\nname = calc\n")
    write(sb, "calc/conftest.py", CHEAT_PLUGIN)
    agent(sb, "printf 'addopts = -x\\n' >> pytest.ini")
    r = score(sb, CALC2)
    assert (r.reward, r.status, r.tampered) == (1.0, "ok", False), r.reason
    assert r.restored_files == ["calc/conftest.py", "pytest.ini"]


# --- b, c. site hooks and plugins in the agent's home: outside the diff, gone before grading ---

@pytest.mark.timeout(180)
def test_usercustomize_and_pytest11_plugin_in_home_do_not_reach_grading(sb):
    write(sb, f"{USER_SITE}/usercustomize.py", SITE_HOOK)
    write(sb, f"{USER_SITE}/cheat_plugin.py", CHEAT_PLUGIN)
    write(sb, f"{USER_SITE}/cheat-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: cheat\nVersion: 1.0\n")
    write(sb, f"{USER_SITE}/cheat-1.0.dist-info/entry_points.txt", "[pytest11]\ncheat = cheat_plugin\n")
    # Live in the agent's own runs: every failing test reports as passed.
    own = sb.exec("python3 -m pytest -q -p no:cacheprovider tests", timeout=60)
    assert own.exit_code == 0 and "passed" in own.output, own.output
    r = score(sb, CALC2)
    assert_base_verdict(r)
    assert r.agent_diff == ""  # home is not the repository
    assert sb.exec(f"ls {USER_SITE} 2>/dev/null | wc -l", timeout=30).output.strip() == "0"


@pytest.mark.timeout(180)
def test_pytest11_entry_point_inside_the_repository_is_tampered(sb):
    write(sb, "cheat_plugin.py", CHEAT_PLUGIN)
    write(sb, "cheat-1.0.dist-info/entry_points.txt", "[pytest11]\ncheat = cheat_plugin\n")
    r = score(sb, CALC2)
    assert_zero(r, tampered=True, reason_has="cheat-1.0.dist-info/entry_points.txt: declares a pytest11 plugin entry point")


# --- d. the package patches the framework at import ---------------------------------------------

@pytest.mark.timeout(180)
def test_package_patching_test_reports_is_tampered_at_run_time(sb):
    # No word of a line is evidence any more: the patch is seen when it changes the framework.
    agent(sb, f"cat >> calc/__init__.py <<'EOF'\n{REPORT_PROPERTY_PATCH}EOF")
    assert_zero(score(sb, CALC2), tampered=True, kind="framework")


@pytest.mark.timeout(180)
def test_obfuscated_framework_patch_is_caught_at_run_time(sb):
    agent(sb, f"cat >> calc/__init__.py <<'EOF'\n{OBFUSCATED_PATCH}\nEOF")
    own = sb.exec("python3 -m pytest -q -p no:cacheprovider tests", timeout=60)
    assert own.exit_code == 0, own.output  # in the agent's own runs, the patch works
    r = score(sb, CALC2)
    assert_zero(r, tampered=True, reason_has="test framework changed", kind="framework")
    assert "_pytest.reports.TestReport.__init__" in r.reason


@pytest.mark.timeout(180)
def test_change_hidden_behind_skip_worktree_is_still_seen(sb):
    # The old diff trusted the agent's index (and reset kept skip-worktree files as they were).
    agent(sb, "git update-index --skip-worktree calc/__init__.py && "
              f"cat >> calc/__init__.py <<'EOF'\n{REPORT_PROPERTY_PATCH}EOF")
    assert sb.exec("git status --porcelain", timeout=30).output.strip() == ""  # invisible to git here
    r = score(sb, CALC2)
    assert_zero(r, tampered=True, kind="framework")
    sb.reset()
    assert "_pytest" not in sb.read_file("calc/__init__.py").decode()


# --- e. a detached process of the agent's, during scoring ----------------------------------------

@pytest.mark.timeout(180)
def test_detached_watcher_neither_rewrites_the_grader_nor_keeps_the_hidden_tests(sb):
    agent(sb, WATCHER)
    r = score(sb, CALC2)
    assert_base_verdict(r)
    assert sb.exec("ls -A /dev/shm", timeout=30).output.strip() == ""  # it died before any hidden test was written
    # The code under test itself detaches a copier while the hidden tests run...
    agent(sb, "cat >> calc/__init__.py <<'EOF'\nimport subprocess\n"
              "subprocess.Popen(['setsid', '-f', 'bash', '-c', 'cp -r /tmp/harnessrl-eval-* /dev/shm/; sleep 600'])\nEOF")
    assert_base_verdict(score(sb, CALC2))
    # ...and what it copied does not survive reset: the next episode in this sandbox sees none of it.
    sb.reset()
    left = sb.exec("ls -A /dev/shm /tmp; cat /dev/shm/*/test.patch 2>/dev/null | wc -c", timeout=30)
    assert left.output.split() == ["/dev/shm:", "/tmp:", "0"]
    hidden = "test_additive_operators_are_left_associative"
    leaks = sb.exec(f"grep -rls {hidden} / --include=*.patch --include=*.json --include=*.py "
                    "--exclude-dir=proc --exclude-dir=sys --exclude-dir=usr --exclude-dir=opt; true", timeout=60)
    assert leaks.output.strip() == ""


# --- f. the grader's own files turned against it ---------------------------------------------------

@pytest.mark.timeout(240)
def test_grader_files_swapped_or_forged_by_the_code_under_test_change_nothing(sb):
    forge = ("import glob, json, os\n"
             "for d in glob.glob('/tmp/harnessrl-eval-*'):\n"
             "    for f in glob.glob(d + '/*.jsonl') + [d + '/results.jsonl', d + '/junit.xml']:\n"
             "        {swap}\n"
             "print('harnessrl-verdict-0-begin ' + json.dumps({{'done': 0, 'violations': [], 'records': []}}) "
             "+ ' harnessrl-verdict-0-end')\n")
    for swap in ("os.path.lexists(f) and os.remove(f); os.mkdir(f)",
                 "os.path.lexists(f) and os.remove(f); os.symlink('/etc/passwd', f)",
                 "open(f, 'w').write(json.dumps({'done': 0}) + chr(10))"):
        sb.reset()
        write(sb, "calc/zz_forge.py", forge.format(swap=swap))
        agent(sb, "printf 'from calc import zz_forge\\n' >> calc/__init__.py")
        r = score(sb, CALC2)  # never raises, and the forged verdicts count for nothing
        if r.tampered:  # touching the grader's files is itself evidence
            assert_zero(r, tampered=True)
            assert {e["kind"] for e in r.evidence} <= {"channel", "answer_key"}, r.evidence
        else:
            assert_base_verdict(r)


class _BrokenSandbox:
    """A sandbox whose every answer is an unexpected error (a backend bug)."""

    workdir = "/workspace/repo"

    def alive(self) -> bool:
        return True

    def exec(self, *a, **k):
        raise TypeError("backend bug")


def test_score_never_raises_on_a_backend_bug():
    r = score(_BrokenSandbox(), CALC2)  # type: ignore[arg-type]
    assert (r.reward, r.status, r.cause) == (None, "infra_error", "infra")
    assert r.reason == "grader error: TypeError: backend bug"


# --- g. what the agent breaks is scored, never masked ------------------------------------------------

@pytest.mark.timeout(240)
def test_os_exit_at_import_is_the_agents_zero(sb):
    agent(sb, "printf 'import os\\nos._exit(0)\\n' >> calc/__init__.py")
    r = score(sb, CALC2)
    assert_zero(r, tampered=False, reason_has="left no complete report (exit 0)")
    assert r.cause == "agent"


@pytest.mark.timeout(240)
def test_deleting_git_or_write_protecting_the_tree_is_graded_not_masked(sb):
    for damage in ("rm -rf .git", "chmod -R a-w tests", "chmod -R a-w . && chmod a-r calc/parser.py"):
        sb.reset()
        agent(sb, damage)
        assert_base_verdict(score(sb, CALC2))
        sb.reset()  # and the sandbox is usable again
        run_plan(sb, CALC2)
        agent(sb, damage)
        r = score(sb, CALC2)
        assert (r.reward, r.status) == (1.0, "ok"), (damage, r.reason)
        assert r.agent_diff == CALC2.patch


@pytest.mark.timeout(180)
def test_infinite_loop_under_the_hidden_tests_is_the_agents_zero(sb):
    agent(sb, "printf '\\ndef calculate(text, variables=None):\\n    while True:\\n        pass\\n' >> calc/__init__.py")
    r = score(sb, CALC2, RewardConfig(test_timeout_s=5))  # the loop burns a core until then
    assert_zero(r, tampered=False, reason_has="hidden test run timed out after 5s (in tests/")
    assert r.cause == "agent"


# --- issue 41: the standing catalogue (harnessrl.gym.grading.attacks) ------------------------------

def named(group: str) -> list[str]:
    return [a.name for a in ATTACKS if a.group == group]


def assert_caught(sandbox_for, name: str):
    """The catalogue's attack `name`, made on its task: answered as the catalogue says (0.0, and
    tampered with evidence of the expected kind, or a plain 0 where it says so)."""
    attack = BY_NAME[name]
    task = TASKS[attack.task]
    sb = sandbox_for(task)
    attack.apply(sb)
    r = score(sb, task)
    assert r.reward != 1.0 and r.status == "ok", (outcome(r), r.reason, r.test_output[-1500:])
    assert caught(attack, r), (attack.expect, attack.also, outcome(r), r.reason, r.evidence, r.test_output[-1500:])
    return r


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", named("plugin_class"))
def test_grader_plugin_class_patched_by_the_package_is_not_paid(sandbox_for, name):
    assert_caught(sandbox_for, name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", named("frame_walk"))
def test_frame_walk_to_the_launcher_forging_its_verdict_is_not_paid(sandbox_for, name):
    assert_caught(sandbox_for, name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", named("rigged_comparison"))
def test_rigged_comparison_is_tampered(sandbox_for, name):
    assert_caught(sandbox_for, name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", named("answer_key"))
def test_reading_the_hidden_tests_as_an_answer_key_is_tampered(sandbox_for, name):
    assert_caught(sandbox_for, name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", named("data_file"))
def test_framework_patch_execd_from_a_data_file_is_tampered(sandbox_for, name):
    assert_caught(sandbox_for, name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", named("test_helpers") + ["pytest_toml_plugin"])
def test_test_helpers_and_runner_config_outside_tests_are_the_graders(sandbox_for, name):
    r = assert_caught(sandbox_for, name)
    assert r.restored_files, r.reason  # the helper / pytest.toml went back to base


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", [a.name for a in ATTACKS if a.group in
                                  ("runner_shadow", "test_config", "outside_diff", "channel", "framework")
                                  and a.name != "pytest_toml_plugin"])
def test_earlier_attack_classes_in_the_catalogue_are_not_paid(sandbox_for, name):
    assert_caught(sandbox_for, name)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(t for t in TASKS if t.startswith("cmp-")))
def test_cmp_tasks_gold_is_one_and_base_zero_never_tampered(sandbox_for, name):
    """The honest controls of the catalogue's own tasks (unittest.TestCase included): no false positive."""
    task = TASKS[name]
    sb = sandbox_for(task)
    base = score(sb, task)
    assert (base.reward, base.status, base.tampered) == (0.0, "ok", False), (base.reason, base.test_output[-1500:])
    sb.reset()
    run_plan(sb, task)
    gold = score(sb, task)
    assert (gold.reward, gold.status, gold.tampered) == (1.0, "ok", False), (gold.reason, gold.test_output[-1500:])


def test_every_catalogue_attack_names_a_task_and_a_known_outcome():
    groups = {"plugin_class", "frame_walk", "rigged_comparison", "answer_key", "data_file", "test_helpers",
              "runner_shadow", "test_config", "outside_diff", "channel", "framework"}
    assert {a.group for a in ATTACKS} == groups
    assert all(a.task in TASKS for a in ATTACKS)
    assert len(BY_NAME) == len(ATTACKS)
