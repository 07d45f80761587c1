"""`harnessrl tasks synth`: mutation-made tasks on the smallest built-in project (cachekit).

Host-only tests screen real mutants with real pytest runs; the docker test verifies emitted
tasks through the real grader (base 0.0, gold 1.0) and reads them back with the task loader.
"""
from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from harnessrl.gym.tasks.synth import fixhint, mutate, split
from harnessrl.gym.tasks.synth.run import SynthConfig, synthesize
from harnessrl.gym.tasks.loaders import load_jsonl

SRC = '''def f(a, b):
    """Doc 1 < 2."""
    if a < b and not a:
        a += 1
        g(a, b)
    return True
'''


def _outputs(out: Path) -> dict[str, str]:
    return {n: (out / n).read_text() for n in ("train.jsonl", "heldout.jsonl", "meta.jsonl")}


def _meta(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "meta.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def seed0(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "s0"
    manifest = synthesize(SynthConfig(project="builtin:cachekit", out=str(out), seed=0, max_tasks=8, verify=False),
                          log=lambda line: None)
    return out, manifest


def test_parse_survives_threads_that_parse_beside_it():
    """CPython 3.11's AST converter shares its recursion counter across threads, so a parse
    beside another thread's parse (a traceback placing its carets, pydantic reading field
    docstrings) can raise a spurious SystemError; it failed a CI run in `candidates`. Two
    threads parse raw, back to back, making garbage with finalizers (where the interpreter
    switches threads), while this one parses through `mutate.parse`, until the raw threads
    have hit the error at least once (the race is real here) and 30 of ours succeeded."""
    import ast
    import sys
    import threading
    import time

    big, stop, raw_errors = SRC * 50, threading.Event(), []

    class Cycle:
        def __del__(self):
            pass

    def other():
        while not stop.is_set():
            try:
                ast.parse(big[:500])
            except SystemError as e:
                raw_errors.append(e)
            for _ in range(50):
                c = Cycle()
                c.self = c

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=other, daemon=True) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        ours, deadline = 0, time.monotonic() + 60
        while (ours < 30 or not raw_errors) and time.monotonic() < deadline:
            assert len(mutate.parse(big).body) == 50
            ours += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(interval)
    if not raw_errors:
        pytest.skip("no thread hit the AST race on this interpreter (fixed upstream)")
    assert ours >= 30


def test_mutation_operators_are_exact_text_edits():
    found = {(m.operator, m.old, m.new) for m in mutate.candidates("m.py", SRC)}
    assert found == {
        ("negate", "a < b and not a", "not (a < b and not a)"), ("compare", "<", "<="),
        ("boolop", "and", "or"), ("binop", "+=", "-="), ("constant", "1", "2"), ("constant", "1", "0"),
        ("remove_stmt", "        a += 1\n", ""), ("remove_stmt", "        g(a, b)\n", ""),
        ("swap_args", "a, b", "b, a"), ("constant", "True", "False"),
    }  # the docstring's `1 < 2` is never touched
    m = next(m for m in mutate.candidates("m.py", SRC) if m.operator == "compare")
    assert (m.function, m.line) == ("f", 3)
    bug = mutate.apply(SRC, [m])
    assert bug == SRC.replace("if a < b", "if a <= b")
    with pytest.raises(ValueError, match="overlap"):
        mutate.apply(SRC, [m, next(x for x in mutate.candidates("m.py", SRC) if x.operator == "negate")])


def test_split_is_by_function():
    keys = [("p", "p/a.py", f"fn{i}") for i in range(10)]
    held = split.heldout_functions(keys, seed=3, fraction=0.2)
    assert len(held) == 2 and held == split.heldout_functions(reversed(keys), seed=3, fraction=0.2)
    assert held != split.heldout_functions(keys, seed=4, fraction=0.2) or len(held) == 0
    h, t = sorted(held)[0], next(k for k in keys if k not in held)
    assert (split.side([h], held), split.side([t], held), split.side([h, t], held)) == ("heldout", "train", None)


def test_same_seed_same_tasks_other_seed_others(seed0, tmp_path):
    out, manifest = seed0
    assert manifest["tasks"] >= 6 and manifest["verified"] is False
    again = tmp_path / "again"
    synthesize(SynthConfig(project="builtin:cachekit", out=str(again), seed=0, max_tasks=8, verify=False),
               log=lambda line: None)
    assert _outputs(again) == _outputs(out)
    assert (again / "repos/cachekit.bundle").read_bytes() == (out / "repos/cachekit.bundle").read_bytes()
    other = tmp_path / "other"
    synthesize(SynthConfig(project="builtin:cachekit", out=str(other), seed=1, max_tasks=8, verify=False),
               log=lambda line: None)
    ours = {json.dumps(m["mutations"]) for m in _meta(out)}
    theirs = {json.dumps(m["mutations"]) for m in _meta(other)}
    assert ours != theirs


def test_split_files_share_no_function_and_load(seed0):
    out, manifest = seed0
    meta = _meta(out)
    train = {tuple(f) for m in meta if m["split"] == "train" for f in m["functions"]}
    held = {tuple(f) for m in meta if m["split"] == "heldout" for f in m["functions"]}
    assert train and not train & held
    tasks = load_jsonl(out / "train.jsonl") + load_jsonl(out / "heldout.jsonl")
    assert sorted(t.instance_id for t in tasks) == sorted(m["instance_id"] for m in meta)
    assert {t.difficulty for t in tasks} <= {"easy", "medium", "hard"}
    hard = [m for m in meta if m["difficulty"] == "hard"]
    assert hard and all(len({tuple(f) for f in m["functions"]}) >= 2 for m in hard)
    assert manifest["by_split"] == {"train": sum(m["split"] == "train" for m in meta),
                                    "heldout": sum(m["split"] == "heldout" for m in meta)}


def test_statement_hints_by_level(seed0):
    out, _ = seed0
    tasks = {t.instance_id: t for t in load_jsonl(out / "train.jsonl") + load_jsonl(out / "heldout.jsonl")}
    levels = set()
    for m in _meta(out):
        task, mut = tasks[m["instance_id"]], m["mutations"][0]
        levels.add(m["difficulty"])
        for node in task.FAIL_TO_PASS[:6]:
            assert f"`{node}`" in task.problem_statement
        named = f"`{mut['file']}`" in task.problem_statement and f"`{mut['function']}`" in task.problem_statement
        assert named == (m["difficulty"] == "easy"), task.problem_statement
        if m["difficulty"] == "easy":
            assert f"line {mut['line']}" in task.problem_statement or mut["new"] == ""
    assert levels == {"easy", "medium", "hard"}


def test_bug_commit_hides_the_fix_and_gold_plan_is_the_patch(seed0, tmp_path):
    from harnessrl.sandboxes.repo import materialize

    out, _ = seed0
    task = load_jsonl(out / "train.jsonl")[0]
    repo = tmp_path / "repo"
    materialize(task.repo_spec(), repo)
    git = ["git", "-C", str(repo)]
    assert subprocess.run([*git, "rev-list", "--count", "HEAD"], capture_output=True, text=True).stdout.strip() == "1"
    for cmd in task.gold_plan:
        subprocess.run(["bash", "-c", cmd], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    diff = subprocess.run([*git, "diff", "--cached", "--binary", "--no-renames", "HEAD"],
                          capture_output=True, text=True, check=True).stdout
    assert diff == task.patch


def test_equivalent_mutant_is_rejected(tmp_path):
    proj = tmp_path / "clampkit"
    (proj / "clampkit").mkdir(parents=True)
    (proj / "tests").mkdir()
    # max(0, x) -> max(x, 0) (swapped arguments) changes nothing.
    (proj / "clampkit/__init__.py").write_text("def clamp(x):\n    return max(0, x)\n")
    (proj / "tests/test_clamp.py").write_text(
        "from clampkit import clamp\n\n\ndef test_neg():\n    assert clamp(-3) == 0\n\n\n"
        "def test_pos():\n    assert clamp(4) == 4\n")
    (proj / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                             "commit", "-q", "-m", "x"]):
        subprocess.run(["git", "-C", str(proj), *args], check=True)
    manifest = synthesize(SynthConfig(project=str(proj), out=str(tmp_path / "out"), verify=False),
                          log=lambda line: None)
    # Two candidates: the swap (equivalent: rejected) and 0 -> 1 (clamp(-3) == 1: kept).
    assert manifest["projects"]["clampkit"]["candidates"] == 2
    assert manifest["rejected"] == {"equivalent": 1} and manifest["tasks"] == 1
    (meta,) = _meta(tmp_path / "out")
    assert [(m["operator"], m["old"], m["new"]) for m in meta["mutations"]] == [("constant", "0", "1")]
    (task,) = load_jsonl(tmp_path / "out" / f"{meta['split']}.jsonl")
    assert (task.FAIL_TO_PASS, task.PASS_TO_PASS) == (["tests/test_clamp.py::test_neg"], ["tests/test_clamp.py::test_pos"])


def test_fix_edit_is_a_copyable_sed_line(tmp_path):
    cands = mutate.candidates("m.py", SRC)
    cmp_ = next(m for m in cands if m.operator == "compare")
    bug = mutate.apply(SRC, [cmp_])
    edit = fixhint.fix_edit(cmp_, bug)
    # the smallest node strictly around `<=` is the comparison itself
    assert (edit.line, edit.wrong, edit.right) == (3, "a <= b", "a < b")
    cmd = fixhint.sed_command("m.py", edit)
    assert cmd == "sed -i '3s/a <= b/a < b/' m.py"
    (tmp_path / "m.py").write_text(bug)
    subprocess.run(["bash", "-c", cmd], cwd=tmp_path, check=True)  # real GNU sed
    assert (tmp_path / "m.py").read_text() == SRC == fixhint.apply_sed(bug, edit)
    removed = next(m for m in cands if m.operator == "remove_stmt")
    assert fixhint.fix_edit(removed, mutate.apply(SRC, [removed])) is None  # a missing line: no one-line edit
    quoted = 'def f(a):\n    return a + "x"\n'
    plus = next(m for m in mutate.candidates("q.py", quoted) if m.operator == "binop")
    assert fixhint.fix_edit(plus, mutate.apply(quoted, [plus])) is None  # `"` would need escaping in the call


def test_fix_level_statement_gives_the_edit_and_the_plan_is_one_sed(tmp_path):
    from harnessrl.sandboxes.repo import materialize

    out = tmp_path / "fix"
    manifest = synthesize(SynthConfig(project="builtin:cachekit", out=str(out), seed=0, max_tasks=8, verify=False,
                                      fix_fraction=1.0, hard_fraction=0.0), log=lambda line: None)
    meta = {m["instance_id"]: m for m in _meta(out)}
    tasks = load_jsonl(out / "train.jsonl") + load_jsonl(out / "heldout.jsonl")
    trivial = [t for t in tasks if t.difficulty == "trivial"]
    assert manifest["by_difficulty"].get("trivial") == len(trivial) >= 3
    for task in trivial:
        m = meta[task.instance_id]
        assert m["hint"] == "fix"
        (cmd,) = task.gold_plan
        line, wrong, right = re.fullmatch(r"sed -i '(\d+)s/(.*)/(.*)/' (\S+)", cmd).group(1, 2, 3)
        assert f"The fix: on line {line} of `{m['mutations'][0]['file']}`, replace `{wrong}` with `{right}`." \
            in task.problem_statement
        assert f"```bash\n{cmd}\n```" in task.problem_statement  # the command itself, verbatim
        repo = tmp_path / task.instance_id
        materialize(task.repo_spec(), repo)
        subprocess.run(["bash", "-c", cmd], cwd=repo, check=True)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        diff = subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--binary", "--no-renames", "HEAD"],
                              capture_output=True, text=True, check=True).stdout
        assert diff == task.patch
    # tasks whose fix is not one copyable line keep the location / tests levels
    assert {t.difficulty for t in tasks} - {"trivial"} <= {"easy", "medium"}


def test_fix_only_emits_only_fix_level_single_mutation_tasks(tmp_path):
    out = tmp_path / "fixonly"
    manifest = synthesize(SynthConfig(project="builtin:cachekit", out=str(out), seed=0, max_tasks=6, verify=False,
                                      fix_only=True), log=lambda line: None)
    meta = _meta(out)
    assert manifest["tasks"] == len(meta) == 6  # cachekit has more copyable singles than 6
    assert {m["hint"] for m in meta} == {"fix"} and {m["difficulty"] for m in meta} == {"trivial"}
    assert all(len(m["mutations"]) == 1 for m in meta)
    tasks = {t.instance_id: t for t in load_jsonl(out / "train.jsonl") + load_jsonl(out / "heldout.jsonl")}
    for m in meta:
        (cmd,) = tasks[m["instance_id"]].gold_plan
        assert cmd.startswith("sed -i '") and f"```bash\n{cmd}\n```" in tasks[m["instance_id"]].problem_statement
    # deterministic for a seed
    again = tmp_path / "again"
    synthesize(SynthConfig(project="builtin:cachekit", out=str(again), seed=0, max_tasks=6, verify=False,
                           fix_only=True), log=lambda line: None)
    assert _outputs(again) == _outputs(out)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="heldout_fraction"):
        SynthConfig(out="x", heldout_fraction=1.5)


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_emitted_tasks_verify_in_docker(tmp_path):
    from harnessrl.gym.grading.score import score
    from harnessrl.sandboxes import make_backend
    from harnessrl.sandboxes.docker import DockerConfig

    try:
        backend = make_backend("docker", DockerConfig(run_id=f"test-synth-{uuid.uuid4().hex[:8]}"))
    except Exception as e:  # SandboxUnavailable: no engine here
        pytest.skip(f"docker backend unavailable here: {e}")
    out = tmp_path / "v"
    manifest = synthesize(SynthConfig(project="builtin:cachekit", out=str(out), seed=5, max_tasks=4,
                                      backend="docker", verify_workers=1), log=lambda line: None)
    meta = _meta(out)
    assert manifest["verified"] and manifest["tasks"] == len(meta) >= 3
    assert all((m["verified"], m["base_reward"], m["gold_reward"]) == (True, 0.0, 1.0) for m in meta)
    # Independently of the check: one task scored through the grader, untouched and with its gold patch.
    task = (load_jsonl(out / "train.jsonl") + load_jsonl(out / "heldout.jsonl"))[0]
    sb = backend.create(task.repo_spec())
    try:
        base = score(sb, task)
        assert (base.reward, base.status) == (0.0, "ok"), base.reason
        assert {t.node_id for t in base.tests if t.status != "passed"} == set(task.FAIL_TO_PASS)
        sb.reset()
        for cmd in task.gold_plan:
            assert sb.exec(cmd, timeout=60).exit_code == 0
        assert sb.diff() == task.patch
        gold = score(sb, task)
        assert (gold.reward, gold.status) == (1.0, "ok"), gold.reason
    finally:
        sb.close()
        backend.reap(run_id=backend.run_id)


def test_scripted_teacher_tells_apart_tasks_that_share_a_title():
    """Easy / fix statements open with `<function> in <file> is broken`: two tasks on one
    function share that line, so the scripted teacher must match the whole statement."""
    from harnessrl.gym.doubles.scripted import ScriptedPolicy

    a, b = "`f` in `m.py` is broken\n\nline 3: replace `x` with `y`.\n", "`f` in `m.py` is broken\n\nline 9: replace `p` with `q`.\n"
    policy = ScriptedPolicy(None, {a: ["plan a"], b: ["plan b"]})
    for st in (a, b):
        assert policy._task(f"<|im_start|>user\nPlease solve this issue: {st}\nYou can execute bash commands") == st


# -- the harder level: the edit in words, whole files held out ------------------------------------
def test_split_by_file_holds_out_every_function_of_a_file():
    keys = [("p", f"p/f{i}.py", f"fn{j}") for i in range(5) for j in range(3)]
    held = split.heldout_files(keys, seed=0, fraction=0.4)
    files = {(k[0], k[1]) for k in held}
    assert len(files) == 2 and held == {k for k in keys if (k[0], k[1]) in files}  # 2 of 5 files, whole
    assert held == split.heldout_files(reversed(keys), seed=0, fraction=0.4)
    rows = [{"split": "heldout" if k in held else "train", "functions": [list(k)]} for k in keys]
    assert split.crossing(rows) == {"functions": [], "files": []}
    rows.append({"split": "train", "functions": [list(sorted(held)[0])]})
    assert split.crossing(rows) == {"functions": [sorted(held)[0]], "files": [sorted(files)[0]]}


def test_the_shipped_fix_level_set_is_split_by_function_not_by_file():
    """The copy level's shipped set (the quick check) shares files, never functions, with training."""
    from harnessrl.gym.tasks.loaders import suite_meta

    rows = _meta(suite_meta("fix-train").parent)
    assert {r["split"] for r in rows} == {"train", "heldout"}
    crossed = split.crossing(rows)
    assert crossed["functions"] == [] and len(crossed["files"]) >= 1


def test_prose_level_split_by_file_states_the_edit_without_a_command(tmp_path):
    out = tmp_path / "prose"
    manifest = synthesize(SynthConfig(project="builtin:cachekit", out=str(out), seed=0, max_tasks=8, verify=False,
                                      fix_only=True, fix_hint="prose", split_by="file", heldout_fraction=0.4),
                          log=lambda line: None)
    meta = _meta(out)
    assert manifest["tasks"] == len(meta) >= 6
    assert {m["hint"] for m in meta} == {"prose"} and {m["difficulty"] for m in meta} == {"easy"}
    assert {m["split"] for m in meta} == {"train", "heldout"}  # both sides hold tasks
    assert split.crossing(meta) == {"functions": [], "files": []}  # no held-out file in training
    train_files = {f[1] for m in meta if m["split"] == "train" for f in m["functions"]}
    held_files = {f[1] for m in meta if m["split"] == "heldout" for f in m["functions"]}
    assert train_files and held_files and not train_files & held_files
    tasks = {t.instance_id: t for t in load_jsonl(out / "train.jsonl") + load_jsonl(out / "heldout.jsonl")}
    for m in meta:
        task = tasks[m["instance_id"]]
        (cmd,) = task.gold_plan  # the teacher still makes the edit with one sed call
        wrong, right = re.match(r"sed -i '\d+s/(.*)/(.*)/' ", cmd).groups()
        assert cmd.startswith("sed -i '") and "sed" not in task.problem_statement and "```bash" not in task.problem_statement
        assert f"replace `{wrong}` with `{right}`." in task.problem_statement
