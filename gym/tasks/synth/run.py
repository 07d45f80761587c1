"""One synthesis run: projects -> screened mutants -> verified SWE-bench-form tasks, split by function or file.

Contract (`synthesize(SynthConfig)`), per project, deterministic for a seed:
1. the clean repository (`source.clean_repo`) and one host test run of it; tests failing there
   are never listed in any task;
2. every mutation candidate of every non-test source file (`mutate.candidates`), shuffled by
   `Random(f"{seed}:{project}")`, screened one by one on the host (`screen`) until the
   project's quota of single-mutation tasks is met: kept when some tests that passed now fail
   and some still pass (FAIL_TO_PASS / PASS_TO_PASS from that run), rejected as equivalent,
   breaks_all, timeout, crashed or duplicate (same mutated tree as a kept one) otherwise;
3. hard tasks: 2..max_mutations kept single mutations in distinct functions on the same side
   of the split, screened again together (same rule);
4. per task a parentless bug commit, gold patch = the diff back to clean, a statement from the
   failing tests (`statement`), a gold_plan of exact string edits (for the scripted policy);
   singles are `trivial` (with `fix_fraction`, where a one-line copyable fix exists: the
   statement gives the exact edit, the plan is one `sed -i`; `fixhint`; with `fix_hint = "prose"`
   the same edit in words, no command, difficulty `easy`), `easy` (statement names file,
   function and wrong expression) or `medium` (tests only), by `easy_fraction`;
   multi-mutation tasks are `hard` (tests only);
5. one bundle per project (`<out>/repos/<project>.bundle`) holding the clean commit and every
   task's bug commit; with `verify` (the default) every task is checked through the real grader
   in a sandbox (`suites.check.check_task`: base 0.0 with FAIL_TO_PASS failing and
   PASS_TO_PASS passing, gold 1.0) and only valid tasks are written (the bundle is rewritten
   with theirs only).
Outputs: `train.jsonl` and `heldout.jsonl` (harnessrl layout; they load with
`task_loaders.load_jsonl`), `meta.jsonl` (per task: split, hint level, mutations, functions,
verification), `manifest.json` (seed, config, clean commits, counts, rejections, seconds).
The task rows carry no extra columns: the loader's harnessrl layout rejects unknown fields,
so mutation metadata lives in meta.jsonl, joined on instance_id.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.tasks.synth import fixhint, mutate, source, split, statement
from harnessrl.gym.tasks.synth.screen import Run, Screener, classify
from harnessrl.gym.tasks import DEFAULT_TEST_COMMAND

__all__ = ["SynthConfig", "synthesize", "expand_projects", "DIFFICULTY"]

#: Difficulty of a single-mutation task by its statement's hint level.
DIFFICULTY = {"fix": "trivial", "prose": "easy", "location": "easy", "tests": "medium"}


class SynthConfig(BaseModel):
    """What to synthesize from, how much, and whether to verify."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    project: str = "builtin"
    """`builtin` (all built-in projects), `builtin:<name>`, or a path to a checkout, bundle or archive."""
    out: str
    """Output folder (train.jsonl, heldout.jsonl, meta.jsonl, manifest.json, repos/)."""
    seed: int = 0
    """Drives candidate order, hint levels, combinations and the split."""
    max_tasks: int | None = Field(default=None, ge=1)
    """Most tasks to screen for (split evenly over projects); None: every candidate."""
    verify: bool = True
    """Check every task through the real grader in a sandbox before writing it."""
    backend: str = "auto"
    """Sandbox backend for verification: auto, docker, local."""
    verify_workers: int = Field(default=2, ge=1)
    """Tasks verified at the same time (one sandbox each)."""
    heldout_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    """Share of functions (not tasks) held out."""
    hard_fraction: float = Field(default=0.25, ge=0.0, lt=1.0)
    """Share of a project's tasks that mutate several functions."""
    easy_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of single-mutation tasks whose statement names the location (easy) rather than tests only (medium)."""
    fix_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of single-mutation tasks with a one-line copyable fix (`fixhint.fix_edit`) whose
    statement gives that exact edit (hint `fix`, difficulty `trivial`; plan: one `sed -i`),
    drawn before easy / medium; 0 leaves a seed's tasks as they were without the level."""
    fix_only: bool = False
    """Only `fix`-level tasks: candidates without a one-line copyable fix are skipped before
    they are screened, there are no multi-mutation tasks (hard_fraction is not used), and every
    kept task gets the `fix` hint. The quick way to a task set for a small model's learning run."""
    fix_hint: Literal["fix", "prose"] = "fix"
    """How a task with a one-line fix (`fix_only`, `fix_fraction`) states it: "fix" shows the
    exact `sed -i` command (difficulty trivial: copying); "prose" names the file, function,
    line and the wrong and right expressions in words, no command (difficulty easy: the agent
    writes the edit itself). The gold plan is the same `sed -i` either way."""
    split_by: Literal["function", "file"] = "function"
    """What is held out whole (`split`): "function" (held-out tasks mutate no function a
    training task mutates, but may share its files) or "file" (`heldout_fraction` of the
    files, every function in them: no held-out file appears in training)."""
    max_mutations: int = Field(default=3, ge=2)
    """Most mutations in one hard task."""
    test_command: str = DEFAULT_TEST_COMMAND
    """The pytest command the tasks carry (and the host screen runs in-process)."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Most seconds of one host test run of a mutant (past it: rejected as timeout); runs get
    10x the clean run's time, at least 5 s, at most this."""


def expand_projects(project: str) -> list[str]:
    if project == "builtin":
        return [f"builtin:{n}" for n in source.BUILTIN_PROJECTS]
    return [project]


@dataclass
class _Kept:
    mutations: list[mutate.Mutation]
    f2p: list[str]
    p2p: list[str]
    messages: dict[str, str]
    functions: list[split.FunctionKey] = field(default_factory=list)


class _Project:
    """One project's clean repository, its candidates and its screener."""

    def __init__(self, project: str, work: Path, cfg: SynthConfig):
        self.name, self.origin = source.project_name(project), project
        self.repo = work / self.name
        self.clean = source.clean_repo(project, self.repo)
        self.texts = {f: (self.repo / f).read_text() for f in source.source_files(self.repo)}
        self.candidates = [m for f, t in self.texts.items() for m in mutate.candidates(f, t)]
        self.screener = Screener(self.repo, cfg.test_command, timeout_s=cfg.timeout_s)
        self.base = self.screener.run()
        if self.base.timed_out or self.base.crashed or not any(s == "passed" for s, _ in self.base.results.values()):
            raise RuntimeError(f"{project}: no test passes at the clean commit "
                               f"(timed out: {self.base.timed_out}, crashed: {self.base.crashed})")
        # A mutant that loops must not cost the full limit when the clean run takes a second.
        self.screener.timeout_s = min(cfg.timeout_s, max(5.0, 10 * self.base.seconds))
        self.failing_at_clean = sorted(n for n, (s, _) in self.base.results.items() if s != "passed")

    def key(self, m: mutate.Mutation) -> split.FunctionKey:
        return (self.name, m.file, m.function)

    def mutated(self, mutations: list[mutate.Mutation]) -> dict[str, str]:
        files: dict[str, list[mutate.Mutation]] = {}
        for m in mutations:
            files.setdefault(m.file, []).append(m)
        return {f: mutate.apply(self.texts[f], ms) for f, ms in files.items()}

    def screen(self, mutations: list[mutate.Mutation]) -> tuple[Run | None, str, dict[str, str]]:
        try:
            texts = self.mutated(mutations)
        except (ValueError, SyntaxError):
            return None, "invalid", {}
        try:
            for f, t in texts.items():
                (self.repo / f).write_text(t)
            return self.screener.run(), "", texts
        finally:
            for f in texts:
                (self.repo / f).write_text(self.texts[f])


def _fingerprint(texts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(texts.items())).encode()).hexdigest()


def _edits(bug: str, clean: str) -> list[tuple[str, str]]:
    """(old, new) replacements, each `old` found exactly once when applied in order, turning
    `bug` into `clean`: one per differing hunk, grown by context lines until unique."""
    cur, edits = bug, []
    while cur != clean:
        a, b = cur.splitlines(keepends=True), clean.splitlines(keepends=True)
        _, i1, i2, j1, j2 = next(o for o in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
                                 if o[0] != "equal")
        before = after = 0
        while True:
            old = "".join(a[i1 - before:i2 + after])
            if old and cur.count(old) == 1:
                break
            if i1 - before > 0:
                before += 1
            elif i2 + after < len(a):
                after += 1
            else:
                break
        new = "".join(a[i1 - before:i1] + b[j1:j2] + a[i2:i2 + after])
        edits.append((old, new))
        cur = cur.replace(old, new, 1) if old else new + cur
    return edits


def _gold_plan(bug: dict[str, str], clean: dict[str, str]) -> list[str]:
    """Shell commands applying the fix as exact string edits (what the scripted policy runs)."""
    from harnessrl.gym.tasks.suites.builtin.build import gold_plan

    return gold_plan({path: _edits(bug[path], clean[path]) for path in sorted(bug)})


def _hint(k: _Kept, p: _Project, u: float, cfg: SynthConfig) -> str:
    """The hint level of a kept task from one uniform draw `u` (the same draw as before the
    `fix` level, so fix_fraction 0 reproduces a seed's earlier tasks)."""
    if len(k.mutations) > 1:
        return "tests"
    if cfg.fix_only:  # every candidate was checked to have the edit before it was screened
        return cfg.fix_hint
    m = k.mutations[0]
    if cfg.fix_fraction and u < cfg.fix_fraction and _has_fix(p, m):
        return cfg.fix_hint
    v = u / cfg.fix_fraction if u < cfg.fix_fraction else (u - cfg.fix_fraction) / (1 - cfg.fix_fraction or 1)
    return "location" if v < cfg.easy_fraction else "tests"


def _has_fix(p: _Project, m: mutate.Mutation) -> bool:
    """`m` applies and has a one-line copyable fix (static: nothing is run)."""
    try:
        return fixhint.fix_edit(m, p.mutated([m])[m.file]) is not None
    except (ValueError, SyntaxError):
        return False


def _fix_plan(k: _Kept, p: _Project) -> list[str]:
    """One `sed -i` built from the strings the statement shows, checked to give the clean file."""
    m = k.mutations[0]
    bug = p.mutated([m])[m.file]
    edit = fixhint.fix_edit(m, bug)
    if fixhint.apply_sed(bug, edit) != p.texts[m.file]:
        raise RuntimeError(f"{m.file}:{m.line}: the fix-level sed edit does not restore the clean file")
    return [fixhint.sed_command(m.file, edit)]


def _screen_singles(p: _Project, order: list[mutate.Mutation], quota: int | None,
                    rejected: Counter, log) -> list[_Kept]:
    kept: list[_Kept] = []
    seen: set[str] = set()
    before = sum(rejected.values())
    for m in order:
        if quota is not None and len(kept) >= quota:
            break
        run, why, texts = p.screen([m])
        fp = _fingerprint(texts) if texts else ""
        if not why and fp in seen:
            why = "duplicate"
        if not why:
            f2p, p2p, why = classify(p.base, run)
        if why:
            rejected[why] += 1
            continue
        seen.add(fp)
        kept.append(_Kept([m], f2p, p2p, {n: run.results.get(n, ("", "not run"))[1] for n in f2p},
                          [p.key(m)]))
    log(f"{p.name}: {len(kept)} single-mutation tasks kept of {sum(rejected.values()) - before + len(kept)} screened")
    return kept


def _screen_combos(p: _Project, singles: list[_Kept], quota: int, held: set, cfg: SynthConfig,
                   rng: random.Random, rejected: Counter, log) -> list[_Kept]:
    """Hard tasks: several kept single mutations in distinct functions, all on one split side."""
    by_side: dict[bool, dict[split.FunctionKey, list[_Kept]]] = {True: {}, False: {}}
    for k in singles:
        by_side[k.functions[0] in held].setdefault(k.functions[0], []).append(k)
    kept: list[_Kept] = []
    tried: set[tuple] = set()
    for _ in range(quota * 4):
        if len(kept) >= quota:
            break
        side = rng.random() < cfg.heldout_fraction
        funcs = sorted(by_side[side]) if len(by_side[side]) >= 2 else sorted(by_side[not side])
        if len(funcs) < 2:
            break
        n = rng.randint(2, min(cfg.max_mutations, len(funcs)))
        chosen = rng.sample(funcs, n)
        group = by_side[side] if len(by_side[side]) >= 2 else by_side[not side]
        muts = [rng.choice(group[f]).mutations[0] for f in chosen]
        ident = tuple(sorted(m.key() for m in muts))
        if ident in tried:
            continue
        tried.add(ident)
        run, why, _ = p.screen(muts)
        if not why:
            f2p, p2p, why = classify(p.base, run)
        if why:
            rejected[f"hard_{why}"] += 1
            continue
        muts = sorted(muts, key=lambda m: (m.file, m.start))
        kept.append(_Kept(muts, f2p, p2p, {n: run.results.get(n, ("", "not run"))[1] for n in f2p},
                          sorted({p.key(m) for m in muts})))
    log(f"{p.name}: {len(kept)} multi-mutation tasks kept")
    return kept


def _task_row(p: _Project, k: _Kept, index: int, hint: str, difficulty: str, cfg: SynthConfig) -> tuple[dict, str]:
    bug_texts = p.mutated(k.mutations)
    bug = source.bug_commit(p.repo, p.clean, bug_texts)
    row = {
        "instance_id": f"harnessrl-synth__{p.name}-s{cfg.seed}-{index:04d}",
        "repo": f"harnessrl-synth/{p.name}", "base_commit": bug,
        "problem_statement": statement.write(p.name, hint, k.mutations, bug_texts, k.f2p, k.messages),
        "hints_text": "", "patch": source.gold_patch(p.repo, bug, p.clean), "test_patch": "",
        "FAIL_TO_PASS": k.f2p, "PASS_TO_PASS": k.p2p, "environment_setup_commit": p.clean,
        "version": "synth-1", "created_at": "2025-01-01T00:00:00Z",
        "source": f"repos/{p.name}.bundle", "difficulty": difficulty, "test_command": cfg.test_command,
        "gold_plan": _fix_plan(k, p) if hint in ("fix", "prose") else _gold_plan(bug_texts, {f: p.texts[f] for f in bug_texts}),
    }
    return row, bug


def synthesize(cfg: SynthConfig, log=lambda line: print(line, file=sys.stderr)) -> dict:
    """Run the whole pipeline; return the manifest (also written to <out>/manifest.json)."""
    from harnessrl.gym.tasks.synth.emit import emit

    started = time.monotonic()
    out = Path(cfg.out)
    projects = expand_projects(cfg.project)
    rejected: Counter = Counter()
    work = Path(tempfile.mkdtemp(prefix="harnessrl-synth-"))
    try:
        loaded = [_Project(project, work, cfg) for project in projects]
        universe = {p.key(m) for p in loaded for m in p.candidates}
        pick = split.heldout_files if cfg.split_by == "file" else split.heldout_functions
        held = pick(universe, cfg.seed, cfg.heldout_fraction)
        per_project = None if cfg.max_tasks is None else -(-cfg.max_tasks // len(loaded))
        staged: list[tuple[_Project, dict, str, dict]] = []
        for p in loaded:
            rng = random.Random(f"{cfg.seed}:{p.name}")
            order = sorted(p.candidates, key=lambda m: m.key())
            rng.shuffle(order)
            hard_fraction = 0.0 if cfg.fix_only else cfg.hard_fraction
            if cfg.fix_only:
                order = [m for m in order if _has_fix(p, m)]
            single_quota = None if per_project is None else per_project - round(per_project * hard_fraction)
            singles = _screen_singles(p, order, single_quota, rejected, log)
            hard_quota = (round(per_project * hard_fraction) if per_project is not None
                          else round(len(singles) * hard_fraction / (1 - hard_fraction)))
            combos = _screen_combos(p, singles, hard_quota, held, cfg, rng, rejected, log)
            for k in [*singles, *combos]:
                hint = _hint(k, p, rng.random(), cfg) if len(k.mutations) == 1 else "tests"
                difficulty = "hard" if len(k.mutations) > 1 else DIFFICULTY[hint]
                which = split.side(k.functions, held)
                if which is None:
                    rejected["split_mixed"] += 1
                    continue
                row, bug = _task_row(p, k, len(staged), hint, difficulty, cfg)
                meta = {"instance_id": row["instance_id"], "split": which, "hint": hint, "difficulty": difficulty,
                        "project": p.name, "seed": cfg.seed, "functions": [list(f) for f in k.functions],
                        "mutations": [m.as_dict() for m in k.mutations],
                        "size": {"mutations": len(k.mutations), "files": len({m.file for m in k.mutations}),
                                 "functions": len(k.functions), "fail_to_pass": len(k.f2p)}}
                staged.append((p, row, bug, meta))
        manifest = emit(cfg, out, loaded, staged, rejected, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest["seconds"] = round(time.monotonic() - started, 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
