"""The `harnessrl` command line: the one composition root that may import every layer.

Each subcommand imports what it needs lazily, so `harnessrl --help` stays instant.
"""
from __future__ import annotations

import argparse
import sys

from harnessrl.gym.stopping import Stop, Stopped


def _cmd_doctor(args: argparse.Namespace) -> int:
    from harnessrl.gym.tools.doctor import report, run_checks

    checks = run_checks()
    print(report(checks))
    return 0 if all(c.ok for c in checks) else 1


def _cmd_model(args: argparse.Namespace) -> int:
    from harnessrl.gym.models import MODELS, ModelNotPrepared, resolve_model

    if args.action == "list":
        for name, about in MODELS.items():
            try:
                where = str(resolve_model(name))
            except ModelNotPrepared:
                where = "not prepared (harnessrl model prepare " + name + ")"
            print(f"{name:<14} {where}\n{'':<14} {about}")
        return 0
    from harnessrl.trainers.model_prep import prepare

    for name in args.names or ["smollm2-135m"]:
        print(f"{name}: {prepare(name, force=args.force)}")
    return 0


def _cmd_engine(args: argparse.Namespace) -> int:
    if args.engine_cmd == "sglang":
        from harnessrl.trainers.engine.sglang_launch import run as run_sglang

        return run_sglang(args)
    from harnessrl.trainers.engine.cli import run

    return run(args)


def _cmd_chat(args: argparse.Namespace) -> int:
    """One message through the real path: proxy (OpenAI Chat) -> local engine -> the model."""
    import httpx

    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.trainers.engine import EngineServer

    with EngineServer(model=args.model, port=0, weight_version="0") as engine, \
            ProxyServer(ProxyConfig(engine_url=engine.url, model=args.model, temperature=args.temperature)) as proxy:
        sid, key = proxy.open_session({"harness": "harnessrl-chat"})
        r = httpx.post(f"{proxy.openai_base_url(sid)}/chat/completions", timeout=600,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": "policy", "messages": [{"role": "user", "content": args.message}],
                             "max_tokens": args.max_tokens, "temperature": args.temperature})
        r.raise_for_status()
        print(r.json()["choices"][0]["message"]["content"])
        proxy.set_reward(sid, None, "ok", "chat")
        traj = proxy.trajectory(sid)
        seg = traj.segments[0]
        print(f"-- recorded: {len(seg.token_ids)} tokens, {sum(seg.loss_mask)} sampled, "
              f"policy version {sorted(set(v for v in seg.versions if v >= 0))}, template {traj.chat_template_hash[:12]}",
              file=sys.stderr)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    """The proxy in front of the user's own harness (`gym.live.serve`), until Ctrl-C or SIGTERM."""
    import os
    import signal
    import threading

    from harnessrl.gym.live.serve import Serve, ServeConfig, env_lines

    os.umask(0o077)  # whatever this process writes (the store, its WAL) is the user's alone
    cfg = ServeConfig(model=args.model, host=args.host, port=args.port, admin_clients=args.admin_clients,
                      temperature=args.temperature, **({"store": args.store} if args.store else {}))
    engine = None
    if args.engine_url is None:
        from harnessrl.trainers.engine import EngineServer

        engine = EngineServer(model=args.model, port=0, weight_version=str(args.policy_version)).start()
    done = threading.Event()
    before = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with Serve(cfg, args.engine_url or engine.url) as srv:
            sid, key = srv.new_session(args.label)
            print(f"harnessrl serve: recording into {srv.folder} (0700); proxy at {srv.url}\n"
                  f"# session {sid}: paste into the shell that starts your harness\n{env_lines(srv.url, sid, key)}\n"
                  f"# another harness process: eval \"$(harnessrl sessions new --store {cfg.store} | grep ^export)\"\n"
                  f"# its reward later: harnessrl feedback {sid} --reward 0.8 --store {cfg.store}", flush=True)
            done.wait()
    finally:
        for sig, h in before.items():
            signal.signal(sig, h)
        if engine is not None:
            engine.stop()
    return 0


def _harness_problem(harness: str) -> str | None:
    """Why a harness config cannot run here (not installed, node too old: the message names the
    command that fixes it), checked before any engine starts; None when it can."""
    from harnessrl.adapters import get_adapter

    try:
        check = getattr(get_adapter(harness), "check_installed", None)
        if callable(check):
            check()
    except (ValueError, OSError, RuntimeError) as e:
        return str(e)
    return None


def _reward_config(args: argparse.Namespace):
    """The rollout's RewardConfig: with --judge-url, the judge of judge-rewarded tasks."""
    from harnessrl.gym.grading.judge import JudgeConfig
    from harnessrl.gym.grading.verdict import RewardConfig

    if args.judge_url is None:
        return RewardConfig()
    return RewardConfig(judge=JudgeConfig(base_url=args.judge_url, model=args.judge_model,
                                          api_key_env=args.judge_key_env))


def _judge_url(value: str) -> str:
    """--judge-url: an http(s) URL (argparse names the flag when it is not)."""
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL, got {value!r}")
    return value


def _cmd_rollout(args: argparse.Namespace) -> int:
    import json

    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.rollout import RolloutConfig, run_rollout

    from harnessrl.gym.tasks.loaders import TaskFileError

    cfg = RolloutConfig(harness=args.harness, suite=args.suite, source_root=args.source_root, model=args.model, tasks=args.tasks,
                        sandbox=args.sandbox, max_new_tokens=args.max_new_tokens, proxies=args.proxies,
                        sampling_policy=args.sampling_policy, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, episode=EpisodeConfig(max_calls=args.max_calls, wall_time_s=args.wall_time,
                                                                reward=_reward_config(args)))
    try:  # task-file problems are one line each, before any engine starts
        from harnessrl.gym.stack import load_suite_tasks

        tasks = load_suite_tasks(cfg)
    except TaskFileError as e:
        print("\n".join(f"harnessrl rollout: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    problem = _harness_problem(cfg.harness)
    if problem:
        print(f"harnessrl rollout: {problem}", file=sys.stderr)
        return 2
    engine = None
    if args.engine_url is None:
        from harnessrl.trainers.engine import EngineServer

        engine = EngineServer(model=args.model, port=0, weight_version="0").start()
    try:
        rep = _run(run_rollout(cfg, args.engine_url or engine.url, args.out, episodes=args.episodes,
                               concurrency=args.concurrency, tasks=tasks))
    finally:
        if engine is not None:
            engine.stop()
    print(json.dumps(rep, indent=2))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from harnessrl.trainers.loop import ConfigError, load_config, train

    if args.print_config:
        from harnessrl.trainers.loop import documented_config

        print(documented_config(), end="")
        return 0
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"harnessrl train: {e}", file=sys.stderr)
        return 2
    if args.steps is not None:
        cfg = cfg.model_copy(update={"steps": args.steps})
    if args.out is not None:
        cfg = cfg.model_copy(update={"out_dir": args.out})
    if args.resume is not None:
        cfg = cfg.model_copy(update={"resume_from": args.resume})
    if args.source_root is not None:
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"source_root": args.source_root})})
    from harnessrl.gym.stack import load_suite_tasks
    from harnessrl.gym.tasks.loaders import TaskFileError

    tasks = None  # loaded once here and handed to the run (prepared ones are made first, then loaded)
    try:  # task-file problems are one line each, before any engine starts
        if cfg.prepare.tasks_dir is None:
            tasks = load_suite_tasks(cfg.rollout)
    except TaskFileError as e:
        print("\n".join(f"harnessrl train: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    for harness in cfg.rollout.harness_weights:  # every harness of the run
        problem = _harness_problem(harness)
        if problem:
            print(f"harnessrl train: {problem}", file=sys.stderr)
            return 2
    from harnessrl.gym.context_probe import ContextProbeError, ContextTooLong
    from harnessrl.trainers.evaluate import LeakError
    from harnessrl.trainers.prepare import PrepareError

    try:
        history = _run(train(cfg, tasks))
    except (LeakError, PrepareError, TaskFileError, ContextTooLong, ContextProbeError) as e:
        print("\n".join(f"harnessrl train: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    print(f"done: {len(history)} steps; metrics in {cfg.out_dir}/metrics.jsonl, run report in "
          f"{cfg.out_dir}/report.json, plots in {cfg.out_dir}/plots.png")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import json

    from harnessrl.trainers.run_report import compare

    try:
        out = compare(args.runs)
    except FileNotFoundError as e:
        print(f"harnessrl compare: {e}", file=sys.stderr)
        return 2

    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    print(f"{'run':<40} {'η':>3} {'policy':<10} {'traj/s':>8} {'x sync':>7} {'gen util':>8} {'env p95':>8} {'max lag':>7}")
    for r in out["rows"]:
        print(f"{r['run'][-40:]:<40} {r['staleness_bound']:>3} {r['over_staleness']:<10} {f(r['trajectories_per_s']):>8} "
              f"{f(r['ratio_vs_sync'], '.2f'):>7} {f(r['generator_utilization'], '.2f'):>8} {f(r['env_latency_p95_s']):>8} "
              f"{'-' if r['max_lag'] is None else r['max_lag']:>7}")
    if out["sync_run"] is None:
        print("(no η = 0 run among these: no ratio against the synchronous baseline)")
    if out["config_differs_in"]:
        print(f"note: the runs also differ in {', '.join(out['config_differs_in'])}")
    print(json.dumps(out))
    return 0


_SOURCE_ROOT_HELP = ("folder holding the repositories a task file names (owner__name, name or name.bundle: "
                     "checkouts, .bundle or .tar.gz)")


def _sandbox(value: str) -> str:
    """`--sandbox`: "auto", a sandbox backend's name or a "module:Class" path (`sandboxes.BACKENDS`)."""
    from harnessrl.sandboxes import sandbox_arg

    return sandbox_arg(value)


def _harness(value: str) -> str:
    """`--harness`: an adapter's name, a "module:Class" path or a command-adapter config file."""
    from harnessrl.adapters import harness_arg

    return harness_arg(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harnessrl", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version", help="print the version")
    sub.add_parser("doctor", help="check Docker, base image, models, node/npm, bwrap; say how to fix each")
    p = sub.add_parser("model", help="list or prepare the offline models")
    p.add_argument("action", choices=["list", "prepare"])
    p.add_argument("names", nargs="*", help="models to prepare (default: smollm2-135m)")
    p.add_argument("--force", action="store_true", help="rebuild even when prepared")
    p = sub.add_parser("engine", help="run the local CPU engine (SGLang's native HTTP API)")
    esub = p.add_subparsers(dest="engine_cmd", required=True)
    from harnessrl.trainers.engine.cli import add_arguments

    add_arguments(esub.add_parser("serve", help="serve until Ctrl-C"))
    from harnessrl.trainers.engine.sglang_launch import add_arguments as add_sglang_arguments

    add_sglang_arguments(esub.add_parser("sglang", help="run SGLang from its own Python (--python PATH); "
                                                        "print its URL once healthy"))
    p = sub.add_parser("chat", help="one message through the proxy and the local engine")
    p.add_argument("message")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p = sub.add_parser("rollout", help="run a harness on a suite and write trajectories + a report")
    p.add_argument("--harness", default="mini-swe-agent", type=_harness, help="adapter name or command-adapter config file")
    p.add_argument("--suite", default="builtin")
    p.add_argument("--source-root", default=None, metavar="DIR", help=_SOURCE_ROOT_HELP)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tasks", nargs="*", default=None, help="instance ids (default: all)")
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--proxies", type=int, default=1,
                   help="proxies serving the run: this process's and N-1 proxy processes, each with its own store")
    p.add_argument("--max-calls", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--sampling-policy", default="run", choices=["run", "honor"],
                   help="run: every call samples at --temperature/--top-p/--top-k; honor: the harness's values win")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--wall-time", type=float, default=600.0)
    p.add_argument("--sandbox", default="auto", type=_sandbox, help="auto, a sandbox backend name or module:Class")
    p.add_argument("--engine-url", default=None, action="append",
                   help="an SGLang-contract engine (repeat for several: sticky per episode, a failed one routed "
                        "around); default: start the local one")
    p.add_argument("--judge-url", default=None, metavar="URL", type=_judge_url,
                   help="OpenAI-compatible API root (…/v1) of the judge of tasks whose reward kind asks one")
    p.add_argument("--judge-model", default="judge", help="the judge's model name")
    p.add_argument("--judge-key-env", default=None, metavar="VAR", help="environment variable holding the judge's key")
    p.add_argument("--out", default="runs/rollout")
    p = sub.add_parser("train", help="the main job: rollouts -> trainer -> weight sync (default: embedded CPU run)")
    p.add_argument("--config", default=None, help="TOML or YAML config (see examples/train.toml); default: embedded")
    p.add_argument("--steps", type=int, default=None, help="override the config's steps")
    p.add_argument("--out", default=None, help="override the config's out_dir")
    p.add_argument("--print-config", action="store_true", help="print the default config, every field documented")
    p.add_argument("--resume", default=None, metavar="CHECKPOINT",
                   help="go on from a checkpoint folder of an earlier run (e.g. runs/train/checkpoints/last)")
    p.add_argument("--source-root", default=None, metavar="DIR", help=_SOURCE_ROOT_HELP + " (overrides rollout.source_root)")
    p = sub.add_parser("serve", help="record your own harness's sessions through the proxy (learning from live use)")
    p.add_argument("--store", default=None, help="private store folder (default: $HARNESSRL_HOME/live)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--engine-url", default=None, action="append",
                   help="an SGLang-contract engine (repeat for several: sticky per episode, a failed one routed "
                        "around); default: start the local one")
    p.add_argument("--policy-version", type=int, default=0,
                   help="the policy version the local engine's weights are (recorded with every token)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8421)
    p.add_argument("--admin-clients", choices=["loopback", "any"], default="loopback")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--label", default="", help="a name for the first session's harness")
    p = sub.add_parser("compare", help="training runs side by side: traj/s and the ratio against the η = 0 run")
    p.add_argument("runs", nargs="+", help="run folders (each with the report.json a finished train run writes)")
    sub.add_parser("sessions", help="live sessions: list, show, new (env lines for one more harness), delete",
                   add_help=False)
    sub.add_parser("feedback", help="a live session's reward: feedback SID --reward R [--note N]", add_help=False)
    for name, (_, about) in PASSTHROUGH.items():
        sub.add_parser(name, help=about, add_help=False)
    return parser


#: Subcommands whose module parses its own arguments.
PASSTHROUGH = {
    "tasks": ("harnessrl.gym.tasks.suites.check", "list or check a task suite (gold -> 1.0, base -> 0.0 in a real sandbox); "
                                         "synth: make tasks by mutating a repository"),
    "collect": ("harnessrl.gym.tools.collect", "record teacher episodes (scripted gold plans or an OpenAI-compatible URL) "
                                         "for the sft stage; keeps the successful ones"),
    "check-adapter": ("harnessrl.gym.tools.check_adapter", "run the contract checks on a harness adapter or config file"),
    "harness": ("harnessrl.adapters.install", "harness install CONFIG|NAME: install a harness config's `install` "
                                              "spec (npm/pip, stamped, cached) into the toolchain"),
    "proxy": ("harnessrl.gym.proxy.__main__", "serve the proxy in front of an engine (--engine-url URL)"),
    "sandbox": ("harnessrl.sandboxes.__main__", "reap leftover sandboxes, build the base image, show the backend"),
    "export": ("harnessrl.gym.tools.formats.export", "write a run's trajectories as ATIF (validated), JSONL or Parquet"),
    "view": ("harnessrl.gym.tools.viewer.cli", "a local web viewer of runs: curves, episodes, conversation and token view"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["tasks", "synth"]:  # mutation-made tasks (harnessrl.gym.tasks.synth)
        from harnessrl.gym.tasks.synth.cli import main as synth_main

        return synth_main(argv[2:])
    if argv and argv[0] in ("sessions", "feedback"):  # live sessions (harnessrl.gym.live)
        from harnessrl.gym.live.sessions import main as live_main

        return live_main(argv)
    if argv and argv[0] in PASSTHROUGH:
        import importlib

        module = importlib.import_module(PASSTHROUGH[argv[0]][0])
        return module.main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.cmd == "version":
        from harnessrl import __version__

        print(__version__)
        return 0
    handlers = {"doctor": _cmd_doctor, "model": _cmd_model, "engine": _cmd_engine, "chat": _cmd_chat,
                "rollout": _cmd_rollout, "train": _cmd_train, "compare": _cmd_compare, "serve": _cmd_serve}
    global _STOP
    _STOP = Stop(args.cmd) if args.cmd in ("train", "rollout") else None
    try:
        return handlers[args.cmd](args)
    except (FileNotFoundError, KeyError) as e:  # missing model / unknown name: one clear line
        print(f"harnessrl {args.cmd}: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except Stopped as e:
        print(f"harnessrl {args.cmd}: stopped by {e.how}; its sandboxes and engine were shut down, finished "
              f"trajectories are in the run's store", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:  # a second Ctrl-C while unwinding: out now
        print(f"harnessrl {args.cmd}: interrupted twice; stopped without finishing the shut-down "
              f"(`harnessrl sandbox reap` removes leftover sandboxes)", file=sys.stderr)
        return 130
    finally:
        if _STOP is not None:
            _STOP.restore()


_STOP: Stop | None = None


def _run(coro):
    """The command's coroutine, under `Stop` when the command has one."""
    import asyncio

    return _STOP.run(coro) if _STOP is not None else asyncio.run(coro)


if __name__ == "__main__":
    sys.exit(main())
