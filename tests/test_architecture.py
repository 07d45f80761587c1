"""The floors' import rules (docs/architecture.md), read from the source with `ast`: nothing is
imported or executed, so these tests take milliseconds and need no optional dependency.

- The env layer (`gym/`, `adapters/`, `sandboxes/`) never imports torch, ray or sglang at
  module level (a class body or a module-level `try`/`if` counts as module level: it runs at
  import). Inside a function only where `HEAVY_LAZY` lists it.
- Dependencies point one way: `sandboxes` <- `adapters` <- `gym` <- `trainers`. No module of a
  floor imports a higher floor, at any level, nor names one in a registry string
  ("harnessrl.<floor>.module:Name", which `registry.resolve` imports lazily); no floor imports
  the composition root `harnessrl.cli`. Known exceptions go in `UPWARD`, each with a comment.
- The floors reach each other only as `harnessrl.<floor>`, never as a bare top-level `gym`...
- Code that runs inside a sandbox under `python3 -I` (the grading runner, the sandbox's PID 1)
  imports only the standard library (the runner also pytest), because harnessrl is not there.

Files are found relative to this test file, so a worktree tests its own tree.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Lowest floor first; a floor may import its own and lower floors only.
FLOORS = ("sandboxes", "adapters", "gym", "trainers")
ENV_LAYER = ("sandboxes", "adapters", "gym")
HEAVY = ("torch", "ray", "sglang")
#: harnessrl's top-level modules outside the floors that any floor may import.
SHARED = {"registry"}

#: Function-level imports of a heavy library in the env layer, allowed where they are today:
#: (file, enclosing function's qualified name, library).
HEAVY_LAZY = {
    # Ray placement of episodes sits behind a lazy import (STYLE.md: "Ray placement of episodes
    # can sit behind a lazy import in the scheduler"); local asyncio is the default.
    ("gym/ray_placement.py", "_ray", "ray"),
    ("gym/ray_placement.py", "_EpisodeActor.__init__", "ray"),
}

#: Imports of a higher floor (or of harnessrl.cli) that exist on purpose: (file, scope, target
#: floor). Today there are none; add one only with a comment saying why it cannot point down.
UPWARD: set[tuple[str, str, str]] = set()

#: Files copied into a sandbox and run there without harnessrl: what each may import besides
#: the standard library.
IN_SANDBOX = {
    "sandboxes/sandbox_init.py": set(),
    # run by another interpreter than harnessrl's (a harness's, or in a beside harness's namespace)
    "adapters/exec_client.py": set(), "adapters/netns_launch.py": {"relay"}, "adapters/relay.py": set(),
    **{f"gym/grading/runner/{p.name}": {"pytest", "_pytest"}
       for p in sorted((ROOT / "gym/grading/runner").glob("*.py")) if p.name != "__init__.py"},
}

_REGISTRY_STRING = re.compile(r"harnessrl(\.\w+)+:\w+(\.\w+)*")


@dataclass(frozen=True)
class Import:
    path: str
    """File, relative to the repository root."""
    line: int
    target: str
    """Absolute dotted name imported (relative imports resolved; `from a import b` gives `a.b`)."""
    scope: str
    """"" at module level, else the enclosing function's qualified name ("<string>" for a
    registry string, which is imported lazily)."""
    typing_only: bool = False
    """Under `if TYPE_CHECKING:`: read by type checkers, never run."""
    names: tuple[str, ...] = ()
    """For `from origin import a, b`: the names taken."""


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["harnessrl", *parts])


def imports_of(source: str, rel: Path) -> list[Import]:
    """Every import in `source` (the file at `rel`), with its scope; plus registry strings."""
    mod = module_name(rel)
    package = mod if rel.name == "__init__.py" else mod.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, scope: list[str], in_function: bool, typing_only: bool = False) -> None:
        for child in ast.iter_child_nodes(node):
            where = ".".join(scope) if in_function else ""
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.body, type_ignores=[]), scope, in_function, True)
                visit(ast.Module(body=child.orelse, type_ignores=[]), scope, in_function, typing_only)
                continue
            if isinstance(child, ast.Import):
                found.extend(Import(str(rel), child.lineno, a.name, where, typing_only) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    origin = ".".join(base + ([child.module] if child.module else []))
                else:
                    origin = child.module or ""
                found.extend(Import(str(rel), child.lineno, origin if a.name == "*" else f"{origin}.{a.name}", where,
                                    typing_only, (a.name,))
                             for a in child.names)
            elif (isinstance(child, ast.Constant) and isinstance(child.value, str)
                  and _REGISTRY_STRING.fullmatch(child.value)):
                found.append(Import(str(rel), child.lineno, child.value.partition(":")[0], "<string>"))
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, [*scope, child.name], True, typing_only)
            elif isinstance(child, ast.ClassDef):
                visit(child, [*scope, child.name], in_function, typing_only)
            else:
                visit(child, scope, in_function, typing_only)

    visit(ast.parse(source, str(rel)), [], False)
    return found


def floor_files(floor: str) -> list[Path]:
    return sorted(p.relative_to(ROOT) for p in (ROOT / floor).rglob("*.py"))


def all_imports(floors: tuple[str, ...]) -> list[Import]:
    return [i for f in floors for rel in floor_files(f) for i in imports_of((ROOT / rel).read_text(), rel)]


def floor_of(target: str) -> str | None:
    """The floor (or "cli") a dotted name belongs to; None outside harnessrl's floors."""
    parts = target.split(".")
    if parts[0] == "harnessrl" and len(parts) > 1 and (parts[1] in FLOORS or parts[1] == "cli"):
        return parts[1]
    return None


def upward(imports: list[Import]) -> list[tuple[Import, str]]:
    """Imports that point to a higher floor or to the composition root, with that target floor."""
    out = []
    for i in imports:
        own, to = i.path.split("/")[0], floor_of(i.target)
        if to == "cli" or (to is not None and FLOORS.index(to) > FLOORS.index(own)):
            out.append((i, to))
    return out


def heavy(imports: list[Import]) -> list[Import]:
    return [i for i in imports if i.target.split(".")[0] in HEAVY]


def test_the_scan_sees_the_whole_house():
    for floor in FLOORS:
        assert len(floor_files(floor)) >= 5, f"{floor}/ looks empty from {ROOT}"
    assert set(IN_SANDBOX) >= {"sandboxes/sandbox_init.py", "gym/grading/runner/supervisor.py"}


def test_env_layer_never_imports_torch_ray_or_sglang_at_module_level():
    bad = [i for i in heavy(all_imports(ENV_LAYER)) if i.scope in ("", "<string>")]
    assert not bad, "the env layer must import in milliseconds without torch/ray/sglang: " + "; ".join(
        f"{i.path}:{i.line} imports {i.target} at module level" for i in bad)


def test_env_layer_imports_torch_ray_or_sglang_in_functions_only_where_listed():
    lazy = {(i.path, i.scope, i.target.split(".")[0]) for i in heavy(all_imports(ENV_LAYER)) if i.scope}
    assert not lazy - HEAVY_LAZY, f"new lazy imports of a heavy library in the env layer: {sorted(lazy - HEAVY_LAZY)}"
    assert not HEAVY_LAZY - lazy, f"HEAVY_LAZY lists imports that no longer exist; remove: {sorted(HEAVY_LAZY - lazy)}"


def test_no_floor_imports_a_higher_floor_or_the_cli():
    found = upward(all_imports(FLOORS))
    bad = [(i, to) for i, to in found if (i.path, i.scope, to) not in UPWARD]
    assert not bad, "dependencies point sandboxes <- adapters <- gym <- trainers; cli.py composes them: " + "; ".join(
        f"{i.path}:{i.line} ({i.scope or 'module level'}) imports {i.target}" for i, _ in bad)
    gone = UPWARD - {(i.path, i.scope, to) for i, to in found}
    assert not gone, f"UPWARD lists arrows that no longer exist; remove: {sorted(gone)}"


def test_floors_are_imported_as_harnessrl_packages_only():
    bare = [i for i in all_imports(FLOORS)
            if i.target.split(".")[0] in FLOORS or (i.target.startswith("harnessrl.")
                                                     and i.target.split(".")[1] not in (*FLOORS, "cli", *SHARED)
                                                     and i.target != "harnessrl.__version__")]
    assert not bare, "a floor is `harnessrl.<floor>`, never a bare top-level package: " + "; ".join(
        f"{i.path}:{i.line} imports {i.target}" for i in bare)


@pytest.mark.parametrize("rel", sorted(IN_SANDBOX))
def test_code_that_runs_in_the_sandbox_imports_only_the_standard_library(rel):
    allowed = set(sys.stdlib_module_names) | IN_SANDBOX[rel]
    bad = [i for i in imports_of((ROOT / rel).read_text(), Path(rel)) if i.target.split(".")[0] not in allowed]
    assert not bad, f"{rel} runs in the sandbox under python3 -I, without harnessrl: " + "; ".join(
        f"line {i.line} imports {i.target}" for i in bad)


@pytest.mark.parametrize("source, rel, target, scope, flagged", [
    ("from ..trainers.losses import x", "gym/rollout.py", "harnessrl.trainers.losses.x", "", True),
    ("from ... import trainers", "gym/proxy/app.py", "harnessrl.trainers", "", True),
    ("from . import core", "gym/proxy/__init__.py", "harnessrl.gym.proxy.core", "", False),
    ("from harnessrl import cli", "trainers/loop.py", "harnessrl.cli", "", True),
    ("import harnessrl.gym.trajectory", "adapters/base.py", "harnessrl.gym.trajectory", "", True),
    ("def f():\n    from harnessrl.adapters import base", "sandboxes/x.py", "harnessrl.adapters.base", "f", True),
    ("R = {'t': 'harnessrl.trainers.torch_trainer:TorchTrainer'}", "gym/x.py",
     "harnessrl.trainers.torch_trainer", "<string>", True),
    ("class A:\n    import torch", "gym/x.py", "torch", "", True),
    ("try:\n    import sglang\nexcept ImportError:\n    pass", "gym/x.py", "sglang", "", True),
    ("class A:\n    def f(self):\n        import ray", "gym/x.py", "ray", "A.f", True),
    ("import json", "gym/x.py", "json", "", False),
])
def test_the_scanner_reads_imports_as_python_resolves_them(source, rel, target, scope, flagged):
    (i,) = imports_of(source, Path(rel))
    assert (i.target, i.scope) == (target, scope)
    assert bool(upward([i]) or heavy([i])) is flagged


def test_task_formats_are_reached_by_name_only():
    """The core reaches a self-grading task format (Harbor) only through the task-format
    registries' strings (`GRADERS`, `CHECKS`, `FOLDERS`, `SPECS`), so nothing it imports
    imports it back: no import circle between `gym/tasks/harbor/` and the core."""
    bad = [i for i in all_imports(FLOORS) if not i.path.startswith("gym/tasks/harbor/") and i.scope != "<string>"
           and (i.target + ".").startswith("harnessrl.gym.tasks.harbor.")]
    assert not bad, "reach gym/tasks/harbor through a registry entry, not an import: " + "; ".join(
        f"{i.path}:{i.line} imports {i.target}" for i in bad)


def _modules() -> dict[str, Path]:
    """Every module of the floors, the shared top-level modules and the CLI, by dotted name."""
    rels = [rel for f in FLOORS for rel in floor_files(f)] + [Path(f"{m}.py") for m in (*SHARED, "cli")]
    return {module_name(rel): rel for rel in rels if "grading/runner" not in str(rel)}


def _owner(target: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted import target lands in (`a.b.c` is module `a.b` when `c` is a name)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def import_graph() -> dict[str, set[str]]:
    """Module -> modules it imports when it runs: module level and in functions; not `TYPE_CHECKING`
    blocks, and not registry strings (a registry names its implementations, which import the
    registry's protocol module: a name resolved on demand, the plugin pattern, not a circle).
    Importing a submodule is not counted as importing its package."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, rel in modules.items():
        for i in imports_of((ROOT / rel).read_text(), rel):
            to = _owner(i.target, modules)
            if to is not None and to != mod and not i.typing_only and i.scope != "<string>":
                graph[mod].add(to)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_circles():
    """No module reaches itself through imports that run (lazy ones included)."""
    assert cycles(import_graph()) == []


def test_the_circle_finder_finds_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harnessrl.gym.x import Y\nimport harnessrl.gym.z\n"
    got = imports_of(src, Path("gym/w.py"))
    assert [(i.target, i.typing_only) for i in got] == [("typing.TYPE_CHECKING", False), ("harnessrl.gym.x.Y", True),
                                                        ("harnessrl.gym.z", False)]


def test_no_private_name_is_imported_across_modules():
    """`from module import _name` outside the module's own package is a contract nobody wrote
    down: make the name public or keep it at home. Tests may reach in; library code may not."""
    modules = _modules()
    found = []
    for mod, rel in modules.items():
        for i in imports_of((ROOT / rel).read_text(), rel):
            if any(n.startswith("_") and not n.startswith("__") for n in i.names) and _owner(i.target, modules) != mod:
                found.append(f"{i.path}:{i.line} {i.target}")
    assert found == []
