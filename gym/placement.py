"""Where a run's episodes run: the placements of `harnessrl train` (`TrainConfig.placement`).

Contract: a placement class (`PLACEMENTS`, by name; `placement_class`) has `for_run(run_config)`
building it from the run's config, a class variable `episodes_here` (do episodes run in this
process: is a warm pool here worth starting?), and:
- `start() -> dict`: connect to where episodes run; returns the `ProxyConfig` fields the run's
  proxy needs so its episodes reach it (local: none);
- `episodes(rollout, config) -> episode_fn`: the `RolloutScheduler` episode function over a
  started `gym.rollout.Rollout` (its proxy and tasks; `config`: the episodes' `RolloutConfig`);
- `publish(version)` (async): the version told to wherever episodes run (`gym.stack.Publisher`
  calls it last, after the scheduler and the proxy);
- `close()`: everything it started stopped.
"local" runs episodes in threads of this process (`Rollout.episode`); "ray" on Ray actors over a
cluster's nodes (`gym.ray_placement.RayRun`).
"""
from __future__ import annotations

from typing import Any

from harnessrl.registry import choice, resolve

#: Placements by name -> "module:Class".
PLACEMENTS: dict[str, str] = {
    "local": "harnessrl.gym.placement:LocalPlacement",
    "ray": "harnessrl.gym.ray_placement:RayRun",
}

#: A config field naming a placement (validated against `PLACEMENTS`, importing nothing).
PlacementName = choice(PLACEMENTS, "placement")


def placement_class(name: str) -> Any:
    """The placement class `name` stands for; an unknown name lists the valid ones."""
    return resolve(PLACEMENTS, name, "placement")


class LocalPlacement:
    """Episodes in threads of this process, each through the run's proxy on loopback."""

    episodes_here = True
    """Episodes run here: the driver's warm pool serves them."""

    @classmethod
    def for_run(cls, run_config: Any) -> "LocalPlacement":
        return cls()

    def start(self) -> dict[str, Any]:
        return {}

    def episodes(self, rollout: Any, config: Any) -> Any:
        return rollout.episode

    async def publish(self, version: int) -> None:
        """The proxy, told by the publisher, is what local episodes read."""

    def close(self) -> None:
        """Nothing of its own to stop."""
