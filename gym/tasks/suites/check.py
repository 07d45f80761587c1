"""Validate a task suite in real sandboxes before training on it.

Contract: a task is valid when its format's check (`CHECKS`, by `Task.format`) says so: for a
hidden-tests task (`gym.tasks.suites.gold`), scored by `gym.grading.score`, the untouched base gives
0.0 with every FAIL_TO_PASS test failing and every PASS_TO_PASS test passing, and the gold
`patch` (written as a file, then `git apply`-ed) gives 1.0; Harbor tasks and canaries have their
own. One sandbox per repository serves all of its tasks through reset(). Infra errors are
reported as such, not as invalid.

    harnessrl tasks list builtin
    harnessrl tasks check builtin --backend docker
    harnessrl tasks check swe.jsonl --source-root repos/
    harnessrl tasks check gym/tasks/suites/harbor/        # a folder of Harbor task folders

Per task one line on stdout: gold reward, empty (untouched base) reward, seconds, and why an
invalid task is invalid; then a JSON summary. Loading problems are one line each on stderr.
Nothing is ever a traceback: a grading that says `tampered` (at base or with the gold), an
infra error, a gold patch that does not apply, and any exception raised while one task is
checked are that task's one line (`problem`), and the other tasks are checked on.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from harnessrl.gym.failures import describe
from harnessrl.gym.grading.verdict import RewardConfig
from harnessrl.gym.tasks import Task
from harnessrl.registry import resolve
from harnessrl.sandboxes import sandbox_arg
from harnessrl.sandboxes.base import SandboxError


#: Task formats (`Task.format`) and their gold checks: "module:function" taking (sandbox, task,
#: config, out) and returning `out` filled (`gym.tasks.suites.gold`).
CHECKS: dict[str, str] = {
    "hidden_tests": "harnessrl.gym.tasks.suites.gold:check_hidden_tests",
    "canary": "harnessrl.gym.tasks.synth.canary:check_canary",  # valid when base and gold both score 0
    "harbor": "harnessrl.gym.tasks.harbor.oracle:check_harbor",  # graded by its test.sh, gold is solve.sh
}


def check_task(sb: Any, task: Task, config: RewardConfig | None = None) -> dict[str, Any]:
    """{"instance_id", "valid", "problem", "base_reward", "gold_reward", "seconds"} for one task,
    by its format's check (`CHECKS`)."""
    out: dict[str, Any] = {"instance_id": task.instance_id, "valid": False, "problem": "",
                           "base_reward": None, "gold_reward": None}
    started = time.monotonic()
    try:
        return resolve(CHECKS, task.format, "task format")(sb, task, config, out)
    except SandboxError as e:  # the sandbox died under this task's check: the infra's, named
        out["valid"], out["problem"] = False, f"infra_error: {describe(e)}"
        return out
    except Exception as e:  # a bug or a task nobody foresaw: this task's problem, not the run's
        out["valid"], out["problem"] = False, f"check failed: {describe(e)}"
        return out
    finally:
        out["seconds"] = round(time.monotonic() - started, 2)


def check_suite(tasks: list[Task], backend: Any, config: RewardConfig | None = None,
                on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """check_task for every task, grouped so each repository gets one sandbox."""
    results = []
    by_repo: dict[tuple[str, str | None, str], list[Task]] = {}
    for t in tasks:
        by_repo.setdefault((t.repo, t.source, t.base_commit), []).append(t)
    for group in by_repo.values():
        started = time.monotonic()
        try:
            sb = backend.create(group[0].repo_spec())
        except Exception as e:  # no image, bad source, a backend bug: each task says so, no traceback
            why = f"infra_error: no sandbox: {e}" if isinstance(e, (SandboxError, ValueError)) \
                else f"check failed: no sandbox: {describe(e)}"
            for task in group:
                results.append({"instance_id": task.instance_id, "valid": False, "base_reward": None,
                                "gold_reward": None, "seconds": round(time.monotonic() - started, 2),
                                "problem": why})
                if on_result:
                    on_result(results[-1])
            continue
        try:
            for task in group:
                results.append(check_task(sb, task, config))
                if on_result:
                    on_result(results[-1])
        finally:
            try:
                sb.close()
            except Exception as e:  # the verdicts stand; a sandbox left behind is reaped later
                print(f"harnessrl tasks: closing the sandbox of {group[0].repo!r} failed: {describe(e)}",
                      file=sys.stderr)
    return results


def _line(r: dict[str, Any]) -> str:
    """One task's verdict: `ok|INVALID  id  gold=R empty=R  S.SSs  [why invalid]`."""
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    problem = " ".join(str(r["problem"]).split())  # one line, whatever a reason held
    return (f"{'ok     ' if r['valid'] else 'INVALID'} {r['instance_id']}  gold={f(r['gold_reward'])} "
            f"empty={f(r['base_reward'])}  {r.get('seconds', 0.0):.2f}s" + (f"  {problem}" if problem else ""))


def main(argv: list[str] | None = None) -> int:
    """`harnessrl tasks list|check SUITE`: exit 0 when every checked task is valid."""
    from harnessrl.gym.tasks.loaders import TaskFileError, load_suite, require_sources

    parser = argparse.ArgumentParser(prog="harnessrl tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["list", "check"])
    parser.add_argument("suite", nargs="?", default="builtin", help="suite name or .jsonl/.parquet path")
    parser.add_argument("--task", action="append", help="only these instance ids (repeatable)")
    parser.add_argument("--backend", default="auto", type=sandbox_arg,
                        help="sandbox backend for check: auto, a backend name or module:Class")
    parser.add_argument("--source-root", default=None, metavar="DIR",
                        help="folder holding the repositories of a task file (owner__name, name or name.bundle: "
                             "checkouts, .bundle or .tar.gz)")
    args = parser.parse_args(argv)
    try:
        tasks = load_suite(args.suite, source_root=args.source_root)
        if args.action == "check":
            require_sources(tasks)
    except (TaskFileError, ValueError) as e:  # one line per problem, never a traceback
        for line in str(e).splitlines():
            print(f"harnessrl tasks: {line}", file=sys.stderr)
        return 2
    except Exception as e:  # an unreadable file of a kind nobody foresaw: still one line
        print(f"harnessrl tasks: cannot load {args.suite!r}: {describe(e)}", file=sys.stderr)
        return 2
    if args.task:
        tasks = [t for t in tasks if t.instance_id in set(args.task)]
    if args.action == "list":
        for t in tasks:
            tests = "harbor\ttest.sh" if t.harbor else f"{len(t.FAIL_TO_PASS)} f2p\t{len(t.PASS_TO_PASS)} p2p"
            print(f"{t.instance_id}\t{t.difficulty or '-'}\t{tests}\t"
                  f"{t.problem_statement.splitlines()[0] if t.problem_statement else ''}")
        return 0
    from harnessrl.sandboxes import make_backend

    try:
        backend = make_backend(args.backend)
    except (SandboxError, ValueError) as e:
        print(f"harnessrl tasks: {e}", file=sys.stderr)
        return 2
    imaged = [t.instance_id for t in tasks if t.image and not t.harbor]  # Harbor tasks: refused by name
    if imaged and getattr(backend, "name", "") != "docker":
        print(f"harnessrl tasks: note: {len(imaged)} task(s) name a Docker image (e.g. {imaged[0]!r}); the "
              f"{getattr(backend, 'name', args.backend)} backend runs them without it (use --backend docker)",
              file=sys.stderr)
    results = check_suite(tasks, backend, on_result=lambda r: print(_line(r), flush=True))
    invalid = [r["instance_id"] for r in results if not r["valid"]]
    print(json.dumps({"checked": len(results), "valid": len(results) - len(invalid), "invalid": invalid}))
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
