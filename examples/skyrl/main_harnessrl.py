"""Train with SkyRL on harnessrl episodes: SkyRL's PPO/GRPO loop, vLLM engines and FSDP
workers; harnessrl's sandboxes, unmodified harness, proxy and hidden tests as the generator.

`HarnessrlExp` is SkyRL's `BasePPOExp` with one override, `get_generator`, which returns the
bridge's `HarnessrlGenerator` over SkyRL's own inference engine client. Bridge settings live
under `harnessrl.*` (fields of `harnessrl.trainers.bridges.skyrl.SkyRLBridgeConfig`, e.g.
`harnessrl.harness=mini-swe-agent harnessrl.max_concurrency=16 harnessrl.episode.max_calls=30`);
everything else is SkyRL's config. The dataset is one row per task (`prepare_dataset.py`):
its `task_id` / `suite` columns reach the generator as `env_extras`.

    python examples/skyrl/prepare_dataset.py --suite builtin --out $HOME/data/harnessrl/train.jsonl
    python examples/skyrl/main_harnessrl.py data.train_data="['$HOME/data/harnessrl/train.jsonl']" \\
        trainer.policy.model.path=Qwen/Qwen3-8B \\
        generator.step_wise_trajectories=true \\
        trainer.algorithm.advantage_estimator=grpo trainer.algorithm.loss_reduction=token_mean \\
        trainer.algorithm.max_seq_len=32768 generator.n_samples_per_prompt=8 \\
        generator.sampling_params.max_generate_length=4096 harnessrl.harness=mini-swe-agent

Step-wise rows are the episode's segments by default (what SkyRL's `merge_stepwise_output`
would make of per-call rows); `harnessrl.step_rows=call` gives Harbor's one row per model call,
to be merged with `generator.merge_stepwise_output=true`. `run_harnessrl.sh` holds a full
command for one 8-GPU node.
"""
import sys
from dataclasses import dataclass, field
from typing import Any, Dict

from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp


@dataclass
class HarnessrlSkyRLConfig(SkyRLTrainConfig):
    """SkyRL's config plus the bridge's (`harnessrl.*`, validated by SkyRLBridgeConfig)."""

    harnessrl: Dict[str, Any] = field(default_factory=dict)


def bridge_config(cfg: Any) -> Any:
    """The bridge's config from `cfg.harnessrl`; `max_seq_len` defaults to SkyRL's
    `trainer.algorithm.max_seq_len`."""
    from harnessrl.trainers.bridges.skyrl import SkyRLBridgeConfig

    raw = dict(getattr(cfg, "harnessrl", None) or {})
    raw.setdefault("max_seq_len", getattr(cfg.trainer.algorithm, "max_seq_len", None))
    return SkyRLBridgeConfig.model_validate(raw)


class HarnessrlExp(BasePPOExp):
    def get_generator(self, cfg, tokenizer, inference_engine_client):
        """SkyRL's hook: harnessrl episodes instead of SkyRL-Gym environments."""
        from skyrl.backends.skyrl_train.inference_servers.utils import resolve_policy_model_name

        from harnessrl.trainers.bridges.skyrl import HarnessrlGenerator

        return HarnessrlGenerator(cfg.generator, tokenizer, inference_engine_client, bridge_config(cfg),
                                  policy_model_name=resolve_policy_model_name(cfg))


def main(argv: list[str] | None = None) -> None:
    import ray
    from skyrl.train.utils import validate_cfg
    from skyrl.train.utils.utils import initialize_ray

    cfg = HarnessrlSkyRLConfig.from_cli_overrides(sys.argv[1:] if argv is None else argv)
    bridge_config(cfg)  # a bad harnessrl.* field fails here, before Ray starts
    validate_cfg(cfg)
    initialize_ray(cfg)

    @ray.remote(num_cpus=1)
    def skyrl_entrypoint(cfg):  # the training loop runs on a worker, not the head node (as SkyRL's own)
        HarnessrlExp(cfg).run()

    ray.get(skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
