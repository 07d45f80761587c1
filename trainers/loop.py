"""`harnessrl train`: the main job, a short readable loop.

    engine (local CPU engine, or any SGLang server by URL)
      -> proxy + sandboxes + harness (gym.rollout.Rollout), episodes scheduled with bounded
         staleness (gym.scheduler.RolloutScheduler)
      -> trainer.step(batch of complete GRPO groups)
      -> publish (gym.stack.Publisher): weight sync (save -> /update_weights_from_disk with
         weight_version), then the scheduler, then the proxy: later tokens carry the new version

Each suite is loaded once per run (`trainers.prepare.RunTasks`) and handed to the rollouts, the
teacher, the held-out guard and every evaluation point.

`stages = ["sft", "rl"]` first trains on teacher trajectories (`harnessrl collect`; the
masked cross-entropy of `trainers.sft`), checkpoints, pushes those weights, then runs RL.
With `eval.suite` the same held-out tasks are rolled out at each of `eval.points` (before SFT,
after SFT, after RL: `trainers.evaluate`, never trained on); `prepare` makes missing data
first (`trainers.prepare`), and held-out tasks are checked to be in neither SFT nor RL.

One config file (TOML or YAML, `trainers.train_config`), every field documented; a bad field is named in the error.
Each step prints one line (reward mean, success rate, loss, grad norm, KL, logprob mismatch,
staleness, the rollout correction's |log ratio| p99/max and truncated/masked shares, env latency p95) and appends it to metrics.jsonl and TensorBoard; at the end the
run's report (trajectories/s beside the staleness bound, staleness histogram, per-turn env
latency, generator utilization: `trainers.run_report`) goes to report.json and one printed
line, each evaluation point one line, and plots.png (held-out success with 95% intervals, the
RL reward curve, latencies: `trainers.plots`) goes to the run folder.
The cheat rate rides along (`gym.cheat`): per step `tampered_frac`, `tampered/<kind>` and the
canary episodes' count and pass rate; in report.json its "cheat" section. With `canary.rate`
> 0 that share of the groups comes from canary tasks (`gym.canary`), never rewarded.
With `[live]`, each step also trains on rewarded live sessions (`trainers.live`: `harnessrl
serve` recorded them, `harnessrl feedback` rewarded them); the step says which (`live_sessions`).
With several harnesses (`rollout.harnesses`) each group runs through one, drawn by weight with
`rollout.seed` (`gym.harness_mix`); the step line, metrics.jsonl and report.json then carry
each harness's reward, success, tokens and failures (`trainers.harness_figures`), and every
evaluation point each harness's figures.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from harnessrl.gym.canary import CanaryMix, run_canaries
from harnessrl.gym.cheat import step_metrics as cheat_metrics
from harnessrl.gym.harness_mix import HarnessMix
from harnessrl.gym.placement import placement_class
from harnessrl.gym.rollout import Rollout, prewarmed_sandboxes, report
from harnessrl.gym.scheduler import RolloutScheduler
from harnessrl.gym.stack import Publisher
from harnessrl.trainers import evaluate as ev
from harnessrl.trainers.curriculum import Curriculum
from harnessrl.trainers.dynamic_sampling import Selection, outcome, select
from harnessrl.trainers.eval_stats import paired_line, paired_points
from harnessrl.trainers.harness_figures import HarnessTally, step_figures
from harnessrl.trainers.harness_figures import line as harness_line
from harnessrl.trainers.live import LiveSource, step_metrics as live_metrics
from harnessrl.trainers.plots import plot
from harnessrl.trainers.prepare import RunTasks
from harnessrl.trainers.run_report import RunFigures, summary_line
from harnessrl.trainers.train_config import (EPISODE_OVERHEAD_S, ConfigError, SFTConfig, TrainConfig,
                                             documented_config, load_config)

__all__ = ["train", "TrainConfig", "SFTConfig", "ConfigError", "load_config", "documented_config",
           "EPISODE_OVERHEAD_S"]

# -- the loop ---------------------------------------------------------------------------------
def _line(m: dict[str, Any]) -> str:
    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    return (f"step {m['step']:>3} v{m['version']}{'' if m['updated'] or m.get('skipped') else ' (no update)'}  reward {f(m['reward_mean'])}  success {f(m['success_rate'], '.2f')}  "
            f"loss {f(m['loss'], '.4f')}  gnorm {f(m['grad_norm'])}  kl {f(m['kl'], '.4f')}  "
            f"mismatch {f(m['logprob_mismatch_mean'], '.2e')}  stale {m['staleness_max']}/{f(m['staleness_mean'], '.2f')}  "
            + (f"|logr| p99 {f(m['log_ratio_abs_p99'], '.2e')} max {f(m.get('log_ratio_abs_max'), '.2e')}  "
               f"trunc {f(m.get('tis_truncated_frac'), '.3f')}  masked {f(m.get('masked_frac'), '.3f')}  "
               if m.get("log_ratio_abs_p99") is not None else "")
            + f"env_p95 {f(m['env_latency_p95_s'])}s  tampered {f(m.get('tampered_frac'), '.2f')}"
            + (f"  canary {m['canary_passed']}/{m['canary_episodes']}" if m.get("canary_episodes") else "")
            + (f"  zero-var {m['zero_var_groups']}/{m['groups']}" if m.get("groups") else "")
            + (f"  live {len(m['live_sessions'])} (reward {f(m['live_reward_mean'], '.2f')})" if m.get("live_sessions") else "")
            + ("  skipped: no group with a reward spread" if m.get("skipped") else "")
            + (f"  [{harness_line(m['harnesses'])}]" if m.get("harnesses") else "")
            + f"  ({f(m['step_s'], '.1f')}s train, {m['wall_s']:.0f}s total)")


async def train(cfg: TrainConfig, tasks: list | None = None) -> list[dict[str, Any]]:
    """Run the stages; return the RL step metrics (the SFT step metrics for an sft-only run).
    `tasks`: the RL tasks, if the caller loaded them already; every suite is loaded once per run
    (`trainers.prepare.RunTasks`) and handed down."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    t_start = time.monotonic()
    run_tasks = RunTasks(cfg, tasks)
    prepared = await _prepare(cfg, run_tasks)
    context = None
    if "rl" in cfg.stages or cfg.eval.enabled:  # a harness whose first prompt cannot fit is refused now
        from harnessrl.trainers.prepare import check_context

        context = await check_context(cfg, run_tasks, lambda line: print(line, flush=True))
    async with contextlib.AsyncExitStack() as held:  # closed on every way out, a cancellation in start-up too
        history, run, evals = await _stages(cfg, out, t_start, held, run_tasks)
    if run or evals:
        run = run | ({"eval": evals, "eval_paired": paired_points(evals, ev.POINTS)} if evals else {}) | ({"prepare": prepared} if prepared else {}) | (
            {"context": context} if context else {})
        (out / "report.json").write_text(json.dumps(run, indent=2))
    plot(history if "rl" in cfg.stages else [], out / "plots.png", evals)
    if evals:
        print(_eval_report(evals), flush=True)
    return history


async def _stages(cfg: TrainConfig, out: Path, t_start: float, held: contextlib.AsyncExitStack, tasks: RunTasks
                  ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, dict[str, Any]]]:
    """Start the warm pool, the engine and the trainer (each registered on `held` as soon as it
    exists), then run the stages; returns the step metrics, the run report and the evaluations."""
    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.gym.backends.fleet import EngineFleet
    from harnessrl.trainers.base import trainer_class
    from harnessrl.trainers.lora_sync import AdapterWeightSync
    from harnessrl.trainers.weight_sync import DiskWeightSync

    evaluating = cfg.eval.enabled
    sc = cfg.scheduler  # the warm pool starts the first groups' sandboxes now, while the engine and trainer load
    # The curriculum draws the RL tasks; the warm pool starts the sandboxes of its first draws.
    curriculum = Curriculum([t.instance_id for t in tasks.rl], cfg.curriculum) if "rl" in cfg.stages else None
    here = placement_class(cfg.placement).episodes_here  # episodes elsewhere: no warm pool on the driver
    sandboxes = (prewarmed_sandboxes(cfg.rollout, curriculum.peek(sc.groups_per_step * (1 + sc.staleness)),
                                     tasks.rl) if "rl" in cfg.stages and here else None)
    if sandboxes is not None:  # the rollout closes it too (idempotent); this covers a stop before it takes it
        held.callback(sandboxes.close)
    # The trainer the config names (`TRAINERS`); one with its own `backend` samples there too
    # (the Tinker bridge: no local engine, and its sync only reports the version).
    trainer = await asyncio.to_thread(trainer_class(cfg.trainer_name).for_run, cfg)  # may load a model, or call an SDK
    samples_itself = getattr(trainer, "backend", None) is not None
    if samples_itself:
        engine_url, client = "", trainer.weight_sync()
        sync = client
    else:
        engine = None
        if cfg.engine_url is None and ("rl" in cfg.stages or evaluating):  # an sft-only run samples nothing
            from harnessrl.trainers.engine import EngineServer

            engine = EngineServer(model=cfg.model, port=0, weight_version="0", num_threads=cfg.engine_threads).start()
            held.callback(engine.stop)
        engine_url = cfg.engine_url or (engine.url if engine is not None else "")
        # several engines: every sync and pause fanned out to all of them (gym.backends.fleet)
        client = EngineFleet(engine_url) if isinstance(engine_url, list) else EngineClient(engine_url)
        sync = DiskWeightSync(client, out / "weights")
        if cfg.trainer.lora is not None:  # the adapter alone (or merged weights, `lora.sync`); once loaded,
            # the proxy names it in every generation (`lora_path`), as SGLang serves it only to those
            sync = AdapterWeightSync(client, out / "weights", adapters=cfg.trainer.lora.sync == "adapter")
    held.push_async_callback(client.aclose)
    writer = _tb_writer(out) if cfg.tensorboard else None
    if writer:
        held.callback(writer.close)
    if cfg.resume_from is not None:
        trainer.load_checkpoint(cfg.resume_from)
        await sync.push(trainer)  # the engine samples with the restored policy from the first call
    rollout_cfg = cfg.rollout.model_copy(update={"model": cfg.model})
    evals: dict[str, dict[str, Any]] = {}

    async def evaluate(point: str) -> None:
        if evaluating and point in cfg.eval.points_for(cfg.stages):
            s = await ev.evaluate(point, cfg.eval, rollout_cfg, engine_url, out, episode_timeout_s=sc.episode_timeout_s,
                                  generation_backend=getattr(trainer, "backend", None), tasks=tasks.held)
            evals[point] = s | {"version": trainer.version}
            print(ev.line(s), flush=True)

    history: list[dict[str, Any]] = []
    run: dict[str, Any] = {}
    await evaluate("pre_sft")
    if "sft" in cfg.stages:
        history = await _sft_stage(cfg, trainer, out, writer)
        trainer.save_checkpoint(out / "checkpoints" / "sft")
        if engine_url or samples_itself:
            await sync.push(trainer)  # RL and evaluation sample from the SFT policy (the trainer's version)
        await evaluate("post_sft")
    if "rl" in cfg.stages:
        history, run = await _rl_stage(cfg, trainer, sync, engine_url, rollout_cfg, sandboxes, tasks.rl, curriculum,
                                       out, writer,
                                       t_start)
        await evaluate("post_rl")
    trainer.save_checkpoint(out / "checkpoints" / "last")
    return history, run, evals


async def _prepare(cfg: TrainConfig, tasks: RunTasks) -> dict[str, Any]:
    """Missing data made (`trainers.prepare`), then the held-out guard: the tasks evaluated are
    neither RL tasks nor in the SFT data, by id, gold patch or mutated function."""
    from harnessrl.trainers.prepare import prepare_data

    made = await prepare_data(cfg, log=lambda line: print(line, flush=True), tasks=tasks)
    if cfg.eval.enabled:
        held_ids = set(ev.eval_task_ids(cfg.eval, cfg.rollout, tasks.held))
        held = [t for t in tasks.held if t.instance_id in held_ids]
        sft_ids: list[str] = []
        if "sft" in cfg.stages and cfg.sft.data and Path(cfg.sft.data).exists():
            sft_ids = [json.loads(x).get("task_id", "") for x in Path(cfg.sft.data).read_text().splitlines() if x.strip()]
        ev.guard_disjoint(tasks.rl if "rl" in cfg.stages else [], held, sft_ids,
                          ev.meta_beside(cfg.rollout.suite), ev.meta_beside(cfg.eval.suite))
    return made


def _engine_metrics(sync: Any, proxy: Any) -> dict[str, Any]:
    """With several engines: `engine_version`, the minimum weight version across the engines in
    service; `engines_behind`, each engine the last sync left out (url, the version it holds,
    why); `engines_out`, each engine the proxy routes around now (url, why)."""
    fleet = getattr(sync, "client", None)
    if getattr(fleet, "behind", None) is None:
        return {}
    routed = proxy.stats().get("engines", [])
    return {"engine_version": fleet.version, "engines_behind": fleet.behind(),
            "engines_out": [{"url": e["url"], "reason": e["reason"]} for e in routed if not e["in_service"]]}


async def _rl_stage(cfg: TrainConfig, trainer, sync, engine_url: str | list[str], rollout_cfg, sandboxes, tasks: list,
                    curriculum: Curriculum, out: Path,
                    writer, t_start: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`cfg.steps` GRPO steps through the harness; returns the step metrics and the run report."""
    from tqdm import tqdm

    history: list[dict[str, Any]] = []
    samples = _sample_config(trainer)
    placement = placement_class(cfg.placement).for_run(cfg)
    driver_cfg = rollout_cfg if placement.episodes_here else rollout_cfg.model_copy(update={"sandbox_pool_size": 0})
    with _started(placement) as proxy_fields, \
            Rollout(driver_cfg, engine_url, out / "rollouts", generation_backend=getattr(trainer, "backend", None),
                    sandboxes=sandboxes, tasks=tasks, proxy_fields=proxy_fields) as ro:
        canaries = run_canaries(cfg.canary, list(ro.tasks.values()), out, cfg.rollout.source_root,
                                log=lambda line: print(line, flush=True))
        draws = CanaryMix(curriculum, [c.instance_id for c in canaries], cfg.canary.rate)
        ro.tasks.update({c.instance_id: c for c in canaries})  # the rollout runs them like any task
        mix = HarnessMix(ro.stack.harness_weights, cfg.rollout.seed)  # one harness per group
        mixed = len(mix.names) > 1
        episodes = placement.episodes(ro, rollout_cfg)  # after the canaries joined the run's tasks
        sched = RolloutScheduler(cfg.scheduler, episodes, draws, harness_for=mix)
        publisher = Publisher(sched, ro.proxies, sync, placement)  # weight updates pause every proxy's admission too
        await publisher.publish(trainer.version)  # 0, the SFT policy's, or the resumed checkpoint's
        await sched.start()
        bar = tqdm(total=cfg.steps, unit="step", disable=not cfg.progress, dynamic_ncols=True)
        figures, per_harness = RunFigures(), HarnessTally(mix.names, samples)
        live = _live_source(cfg, bar.write)
        try:
            for _ in range(cfg.steps):
                sel = await select(sched.next_batch, cfg.sampling, samples, cfg.scheduler.groups_per_step)
                figures.add(sel.seen)
                per_harness.add(sel.seen)
                curriculum.observe(sel.seen)
                taken = live.take(trainer.version) if live is not None else []
                sel.train.extend(taken)  # beside the groups, after dynamic sampling: they have none
                m = await _train_on(sel, trainer, publisher, samples, history) | live_metrics(taken)
                batch_report = report(sel.seen)
                m |= cheat_metrics(sel.seen) | {
                    "env_latency_p95_s": batch_report["env_latency_s"]["p95"], "sync_s": round(sync.last_sync_s, 3),
                    **_engine_metrics(sync, ro.proxies),
                    "wall_s": time.monotonic() - t_start, "scheduler": sched.stats.as_dict(),
                    "batch_report": batch_report}
                if mixed:
                    m["harnesses"] = step_figures(sel.seen, samples, mix.names)
                history.append(m)
                _record(out, m, writer)
                bar.write(_line(m))
                bar.update(1)
                if cfg.checkpoint_every and m["step"] % cfg.checkpoint_every == 0:
                    trainer.save_checkpoint(out / "checkpoints" / f"step{m['step']}")
            run = figures.report(wall_s=time.monotonic() - t_start, steps=len(history),
                                 staleness=cfg.scheduler.staleness, over_staleness=cfg.scheduler.over_staleness,
                                 scheduler=sched.stats.as_dict())
            run |= {"dynamic_sampling": _sampling_totals(history, cfg.sampling.zero_variance),
                    "curriculum": curriculum.report()}
            if live is not None:
                run["live"] = {"trained": live.used, "refused": live.refused}
            if mixed:
                run["harnesses"] = {h: x | {"weight": mix.weights[h], "groups_drawn": mix.drawn[h]}
                                    for h, x in per_harness.totals().items()}
            bar.write(summary_line(run))
            bar.write(curriculum.line())
        finally:
            bar.close()
            await sched.close()
    return history, run


@contextlib.contextmanager
def _started(placement):
    """The placement started (e.g. Ray: the cluster joined) for the block, closed after it;
    yields the proxy fields its episodes need (e.g. a host its workers reach)."""
    try:
        yield placement.start()
    finally:
        placement.close()


async def _train_on(sel: Selection, trainer, publisher: Publisher, samples, history: list[dict[str, Any]]
                    ) -> dict[str, Any]:
    """One RL step on what dynamic sampling kept: train and publish, or say the step had nothing.
    Reward, success and masked counts are over every episode handed over (`dynamic_sampling.outcome`)."""
    if sel.train:
        metrics = await asyncio.to_thread(trainer.step, sel.train)
        if metrics.updated:  # no trainable token (all masked or zero advantage): same weights
            await publisher.push(trainer)
        m = metrics.to_dict() | {"skipped": False}
    else:  # every group's rewards were equal: no signal, no forward or backward pass
        from harnessrl.trainers.base import StepMetrics

        m = {f.name: None for f in dataclasses.fields(StepMetrics)} | {
            "step": history[-1]["step"] if history else getattr(trainer, "step_count", 0), "version": trainer.version,
            "updated": False, "skipped": True, "tokens": 0, "samples": 0, "trajectories": 0, "staleness_max": 0}
    return m | outcome(sel.seen, samples) | sel.metrics()


def _live_source(cfg: TrainConfig, log) -> LiveSource | None:
    """The run's live-session source (`[live]`), with the run's tokenizer to check records against."""
    if cfg.live is None:
        return None
    from harnessrl.gym.models import load_tokenizer

    return LiveSource(cfg.live, cfg.model, load_tokenizer(cfg.model), log=log)


def _sample_config(trainer):
    """The trainer's rule for turning trajectories into samples (`SampleConfig`), else the default."""
    from harnessrl.trainers.samples import SampleConfig

    found = getattr(getattr(trainer, "config", None), "samples", None)
    return found if isinstance(found, SampleConfig) else SampleConfig()


def _sampling_totals(history: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The run report's dynamic-sampling section: zero-variance groups and skipped steps over the run."""
    groups = sum(m.get("groups") or 0 for m in history)
    flat = sum(m.get("zero_var_groups") or 0 for m in history)
    return {"mode": mode, "groups": groups, "zero_var_groups": flat,
            "zero_var_frac": flat / groups if groups else None,
            "groups_dropped": sum(m.get("groups_dropped") or 0 for m in history),
            "refills": sum(m.get("refills") or 0 for m in history),
            "skipped_steps": sum(1 for m in history if m.get("skipped"))}


def _eval_report(evals: dict[str, dict[str, Any]]) -> str:
    """The end-of-run held-out table: one line per point, then the changes between points."""
    names = [p for p in ev.POINTS if p in evals]
    lines = ["held-out evaluation (same tasks at every point):"] + ["  " + ev.line(evals[p]) for p in names]
    rated = [p for p in names if evals[p]["success_rate"] is not None]
    for a, b in zip(rated, rated[1:]):
        d = 100 * (evals[b]["success_rate"] - evals[a]["success_rate"])
        lines.append(f"  {a} -> {b}: {d:+.1f} points")
    for name, c in paired_points(evals, ev.POINTS).items():
        lines.append("  " + paired_line(name, c))
        lines += [f"    {h}: " + paired_line(name, x) for h, x in (c.get("by_harness") or {}).items()]
    return "\n".join(lines)


async def _sft_stage(cfg: TrainConfig, trainer, out: Path, writer) -> list[dict[str, Any]]:
    """`sft.steps` SFT steps over the teacher file (module `trainers.sft`), one line each."""
    from harnessrl.trainers.sft import load_teacher_file, sft_batches

    data = load_teacher_file(cfg.sft.data)
    seed = cfg.trainer.seed if cfg.sft.shuffle else None  # the sft stage runs on the built-in trainer only
    history = []
    for picks in sft_batches(len(data), cfg.sft.batch_size, cfg.sft.steps, seed):
        m = await asyncio.to_thread(trainer.sft_step, [data[i] for i in picks], cfg.sft.min_reward, cfg.sft.lr)
        history.append(m)
        _record(out, m, writer)
        print(f"sft {m['step']:>3} v{m['version']}  loss {m['loss'] if m['loss'] is None else format(m['loss'], '.4f')}  "
              f"gnorm {m['grad_norm'] if m['grad_norm'] is None else format(m['grad_norm'], '.3f')}  "
              f"tokens {m['tokens']}  trajectories {m['trajectories']}  ({m['step_s']:.1f}s)", flush=True)
    return history


def _tb_writer(out: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: JSONL still has everything
        return None
    return SummaryWriter(str(out / "tb"))


def _record(out: Path, m: dict[str, Any], writer) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(m, default=str) + "\n")
    if writer is not None:
        for k, v in m.items():
            if isinstance(v, (int, float)) and v is not None:
                writer.add_scalar(k, v, m["step"])
        writer.flush()
