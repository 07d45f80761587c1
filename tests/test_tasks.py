"""Task model and task loaders: every layout, JSON-string test lists, errors naming line and
field, the suite registry, and the shipped built-in suite's integrity (real git, no sandbox)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from harnessrl.gym.grading.diff import is_test_path

from harnessrl.gym.grading.hidden_tests import patch_files
from harnessrl.gym.tasks.suites import builtin
from harnessrl.gym.tasks.loaders import (SUITES, TaskFileError, detect_layout, load_jsonl, load_parquet,
                                        load_suite, load_tasks, reverse_patch)
from harnessrl.gym.tasks import Task

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull}


def git(cwd: Path, *args: str, input: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env=GIT_ENV, input=input).stdout


def swebench_row(**over):
    row = {
        "instance_id": "acme__widgets-101", "repo": "acme/widgets", "base_commit": "a" * 40,
        "problem_statement": "Widgets break on Tuesdays", "hints_text": "", "created_at": "2024-05-01T00:00:00Z",
        "patch": "diff --git a/w.py b/w.py\n", "test_patch": "diff --git a/tests/test_w.py b/tests/test_w.py\n",
        "FAIL_TO_PASS": json.dumps(["tests/test_w.py::test_tuesday"]),
        "PASS_TO_PASS": json.dumps(["tests/test_w.py::test_monday", "tests/test_w.py::test_param[a-b]"]),
        "environment_setup_commit": "b" * 40, "version": "1.2",
    }
    row.update(over)
    return row


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# --- the model --------------------------------------------------------------------------------

def test_task_accepts_json_string_and_list_test_ids():
    a = Task(**swebench_row())
    b = Task(**swebench_row(FAIL_TO_PASS=["tests/test_w.py::test_tuesday"]))
    assert a.FAIL_TO_PASS == b.FAIL_TO_PASS == ["tests/test_w.py::test_tuesday"]
    assert a.PASS_TO_PASS == ["tests/test_w.py::test_monday", "tests/test_w.py::test_param[a-b]"]
    assert a.test_files() == ["tests/test_w.py"]


def test_task_rejects_bad_test_lists_and_unknown_fields():
    with pytest.raises(ValidationError, match="FAIL_TO_PASS"):
        Task(**swebench_row(FAIL_TO_PASS="[not json"))
    with pytest.raises(ValidationError, match="FAIL_TO_PASS"):
        Task(**swebench_row(FAIL_TO_PASS=[1, 2]))
    with pytest.raises(ValidationError, match="colour"):
        Task(**swebench_row(colour="blue"))


def test_repo_spec_sanitises_repo_id_and_needs_a_source(tmp_path):
    task = Task(**swebench_row(source=str(tmp_path), setup_commands=["pip install -e ."]))
    spec = task.repo_spec()
    assert spec.repo_id == "acme__widgets"
    assert (spec.source, spec.base_commit, spec.setup_commands) == (str(tmp_path), "a" * 40, ("pip install -e .",))
    with pytest.raises(ValueError, match="acme__widgets-101.*no `source`"):
        Task(**swebench_row()).repo_spec()


def test_public_view_hides_the_answer():
    view = Task(**swebench_row()).public_view()
    assert view["problem_statement"] == "Widgets break on Tuesdays"
    assert not {"patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "gold_plan"} & view.keys()


# --- layouts ----------------------------------------------------------------------------------

def test_swebench_jsonl_with_source_root(tmp_path):
    (tmp_path / "repos" / "acme__widgets").mkdir(parents=True)
    extra = swebench_row(instance_id="acme__widgets-102", text="prompt column", meta={"x": 1},
                         difficulty="15 min - 1 hour")
    path = write_jsonl(tmp_path / "swe.jsonl", [swebench_row(), "", extra])
    tasks = load_jsonl(path, source_root=tmp_path / "repos")
    assert [t.instance_id for t in tasks] == ["acme__widgets-101", "acme__widgets-102"]
    assert tasks[0].source == str((tmp_path / "repos" / "acme__widgets").resolve())
    assert tasks[1].difficulty == "15 min - 1 hour"
    assert tasks[0].FAIL_TO_PASS == ["tests/test_w.py::test_tuesday"]


def test_swegym_parquet_with_list_columns(tmp_path):
    rows = [swebench_row(FAIL_TO_PASS=["t.py::a"], PASS_TO_PASS=["t.py::b", "t.py::c"]),
            swebench_row(instance_id="acme__widgets-7", FAIL_TO_PASS=["t.py::z"], PASS_TO_PASS=[])]
    for r in rows:
        r.pop("environment_setup_commit")  # SWE-Gym rows may lack it
    path = tmp_path / "swegym.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_tasks(path, layout="swegym")
    assert [t.FAIL_TO_PASS for t in tasks] == [["t.py::a"], ["t.py::z"]]
    assert tasks[0].PASS_TO_PASS == ["t.py::b", "t.py::c"] and tasks[1].PASS_TO_PASS == []
    assert tasks[0].environment_setup_commit == ""


def _repo_with_bug(tmp_path: Path) -> tuple[Path, str, str]:
    """A repo whose main is clean and whose branch `inst-1` introduces a bug; returns the bug patch."""
    repo = tmp_path / "owner__proj"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "m.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "gone.py").write_text("X = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "clean")
    clean_tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    git(repo, "checkout", "-qb", "inst-1")
    (repo / "m.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "gone.py").unlink()
    (repo / "extra.py").write_text("Y = 2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bug")
    bug = git(repo, "diff", "main", "inst-1")
    return repo, bug, clean_tree


def test_swesmith_layout_reverses_the_bug_patch(tmp_path):
    repo, bug, clean_tree = _repo_with_bug(tmp_path)
    row = {"instance_id": "inst-1", "repo": "swesmith/owner__proj.abc123", "patch": bug,
           "FAIL_TO_PASS": ["test_m.py::test_add"], "PASS_TO_PASS": ["test_m.py::test_other"],
           "image_name": "swebench/swesmith.x86_64.owner__proj.abc123", "problem_statement": "add() subtracts"}
    assert detect_layout(row) == "swesmith"
    path = tmp_path / "smith.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    (task,) = load_parquet(path)
    assert task.base_commit == "inst-1" and task.image == row["image_name"]
    # The derived gold patch, applied at the buggy branch, gives back the clean tree.
    (tmp_path / "gold.patch").write_text(task.patch)
    git(repo, "checkout", "-q", "inst-1")
    git(repo, "apply", str(tmp_path / "gold.patch"))
    git(repo, "add", "-A")
    assert git(repo, "write-tree").strip() == clean_tree
    assert reverse_patch(reverse_patch(bug)) == bug


def _r2e_row(repo: Path) -> dict:
    fix = {"old_commit_hash": "inst-1", "new_commit_hash": "f" * 40, "file_diffs": [
        {"header": {"file": {"path": "m.py"}}, "is_binary_file": False, "hunks": [{
            "descriptor": {"old_range": {"start": 1, "length": 2}, "new_range": {"start": 1, "length": 2},
                           "section": ""},
            "line_group": {"all_lines": [
                {"type": "context", "content": "def add(a, b):"},
                {"type": "deleted", "content": "    return a - b"},
                {"type": "added", "content": "    return a + b"}]}}]},
        {"header": {"file": {"path": "tests/test_m.py"}}, "hunks": [{
            "descriptor": {"old_range": {"start": 0, "length": 0}, "new_range": {"start": 1, "length": 1}},
            "line_group": {"all_lines": [{"type": "added", "content": "x = 1"}]}}]},
    ]}
    execution = {
        "repo_name": "proj", "new_commit_hash": "f" * 40,
        "test_file_names": ["test_1.py"], "test_file_codes": ["from m import add\n\ndef test_add():\n    assert add(1, 2) == 3"],
        "old_commit_res_stdout": "=== short test summary info ===\nPASSED r2e_tests/test_1.py::test_sub\n"
                                 "FAILED r2e_tests/test_1.py::test_add - assert -1 == 3\n",
        "new_commit_res_stdout": "=== short test summary info ===\nPASSED r2e_tests/test_1.py::test_sub\n"
                                 "PASSED r2e_tests/test_1.py::test_add\n",
    }
    return {"repo_name": "proj", "docker_image": "namanjain12/proj_final:" + "f" * 40, "commit_hash": "f" * 40,
            "problem_statement": "[ISSUE]add subtracts[/ISSUE]", "parsed_commit_content": json.dumps(fix),
            "execution_result_content": json.dumps(execution), "expected_output_json": "{}",
            "modified_files": ["m.py"], "prompt": "p", "num_non_test_files": 1}


def test_r2e_layout_builds_patches_and_test_lists(tmp_path):
    repo, _, _ = _repo_with_bug(tmp_path)
    path = write_jsonl(tmp_path / "r2e.jsonl", [_r2e_row(repo)])
    (task,) = load_jsonl(path)
    assert task.instance_id == "r2e__proj-ffffffffffff" and task.repo == "proj"
    assert task.base_commit == "inst-1" and task.image.startswith("namanjain12/proj_final")
    assert task.FAIL_TO_PASS == ["r2e_tests/test_1.py::test_add"]
    assert task.PASS_TO_PASS == ["r2e_tests/test_1.py::test_sub"]
    assert patch_files(task.patch) == ["m.py"]  # the commit's own test edits are not the fix
    assert patch_files(task.test_patch) == ["r2e_tests/test_1.py"]
    git(repo, "checkout", "-q", "inst-1")
    (tmp_path / "fix.patch").write_text(task.patch)
    (tmp_path / "tests.patch").write_text(task.test_patch)
    git(repo, "apply", str(tmp_path / "fix.patch"), str(tmp_path / "tests.patch"))
    assert (repo / "m.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (repo / "r2e_tests" / "test_1.py").read_text().endswith("assert add(1, 2) == 3")


# --- bad files name the line (or row) and the field -------------------------------------------

def test_invalid_json_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [swebench_row(), "{not json"])
    with pytest.raises(TaskFileError, match=r"t\.jsonl:2: invalid JSON"):
        load_jsonl(path)


def test_missing_field_names_line_and_field(tmp_path):
    bad = swebench_row(instance_id="x-2")
    del bad["problem_statement"]
    path = write_jsonl(tmp_path / "t.jsonl", [swebench_row(), "", bad])
    with pytest.raises(TaskFileError, match=r"t\.jsonl:3: field 'problem_statement': Field required"):
        load_jsonl(path)


def test_bad_test_list_names_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [swebench_row(PASS_TO_PASS="[oops")])
    with pytest.raises(TaskFileError, match=r"t\.jsonl:1: field 'PASS_TO_PASS': .*not a JSON list"):
        load_jsonl(path)


def test_bad_parquet_row_names_row_and_field(tmp_path):
    rows = [swebench_row(), swebench_row(instance_id="x-9", base_commit="")]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TaskFileError, match=r"t\.parquet row 1: field 'base_commit'"):
        load_parquet(path)


def test_bad_r2e_row_names_the_field(tmp_path):
    row = _r2e_row(tmp_path)
    row["execution_result_content"] = "{truncated"
    path = write_jsonl(tmp_path / "r.jsonl", [row])
    with pytest.raises(TaskFileError, match=r"r\.jsonl:1: field 'execution_result_content': not valid JSON"):
        load_jsonl(path)


def test_unknown_field_in_our_layout_and_duplicates(tmp_path):
    path = write_jsonl(tmp_path / "ours.jsonl", [swebench_row(source="x.bundle", gold_plnn=["true"])])
    with pytest.raises(TaskFileError, match=r"ours\.jsonl:1: field 'gold_plnn': Extra inputs"):
        load_jsonl(path)
    path = write_jsonl(tmp_path / "dup.jsonl", [swebench_row(), swebench_row()])
    with pytest.raises(TaskFileError, match="duplicate instance_id 'acme__widgets-101'"):
        load_jsonl(path)


def test_missing_repository_under_source_root(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [swebench_row()])
    with pytest.raises(TaskFileError, match=r"t\.jsonl:1: field 'repo': no repository for 'acme/widgets'"):
        load_jsonl(path, source_root=tmp_path)


# --- the registry -----------------------------------------------------------------------------

def test_suite_registry(tmp_path):
    assert SUITES["builtin"] == "harnessrl.gym.tasks.suites.builtin:load"
    with pytest.raises(ValueError, match="unknown suite 'nope'; valid: builtin"):
        load_suite("nope")
    path = write_jsonl(tmp_path / "mine.jsonl", [swebench_row()])
    assert [t.instance_id for t in load_suite(str(path))] == ["acme__widgets-101"]
    assert len(load_suite("harnessrl.gym.tasks.suites.builtin:load")) == len(load_suite("builtin"))
    with pytest.raises(TaskFileError, match="does not exist"):
        load_suite(str(tmp_path / "absent.jsonl"))


# --- the shipped built-in suite ---------------------------------------------------------------

def test_builtin_suite_shape():
    tasks = load_suite("builtin")
    assert len(tasks) >= 30
    assert len({t.repo for t in tasks}) >= 4
    assert {t.difficulty for t in tasks} == {"trivial", "easy", "medium", "hard"}
    for t in tasks:
        assert t.FAIL_TO_PASS and t.gold_plan and Path(t.source).is_file()
        assert all(not is_test_path(p) for p in patch_files(t.patch)), t.instance_id
        assert all(is_test_path(p) for p in patch_files(t.test_patch)), t.instance_id
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
    # multi-file tasks exist, and the trivial ones really are tiny
    assert any(len(patch_files(t.patch)) >= 3 for t in tasks)
    trivial = [t for t in tasks if t.difficulty == "trivial"]
    assert all(sum(1 for line in t.patch.splitlines() if line.startswith("+") and not line.startswith("+++")) == 1
               for t in trivial)


def test_builtin_bundles_hold_only_the_base_commit(tmp_path):
    by_repo = {}
    for t in load_suite("builtin"):
        by_repo.setdefault(t.source, set()).add(t.base_commit)
    for source, bases in by_repo.items():
        assert len(bases) == 1  # one base per project: one sandbox serves all its tasks
        clone = tmp_path / Path(source).stem
        git(tmp_path, "clone", "-q", source, str(clone))
        assert git(clone, "rev-list", "--all").split() == list(bases)
        hidden = [t for t in load_suite("builtin") if t.source == source]
        for t in hidden:  # no hidden test exists at base
            for node in t.FAIL_TO_PASS:
                name = node.split("::")[-1].split("[")[0]
                found = subprocess.run(["git", "grep", "-q", f"def {name}("], cwd=clone)
                assert found.returncode == 1, f"{t.instance_id}: hidden test {name} is in the base tree"


def test_builtin_base_commits_are_reproducible(tmp_path):
    from harnessrl.gym.tasks.suites.builtin.build import make_repo

    for project in ("calc", "textkit"):
        expected = {t.base_commit for t in builtin.load() if t.repo.endswith("/" + project)}
        assert {make_repo(project, tmp_path / project)} == expected
