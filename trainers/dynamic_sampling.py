"""Dynamic sampling: groups whose rewards are all equal carry no GRPO signal; do not train on them.

A GRPO advantage is a reward minus its group's mean, so a group whose scored members all got
the same reward (all 0 before the policy can use a tool, all 1 on a task it has mastered) gives
every token advantage 0: the trainer would spend a forward and backward pass on nothing but
the KL term. `SamplingConfig.zero_variance` says what to do with such groups:

- `keep`: train on the batch as it came (today's behaviour; the share is still reported);
- `drop`: leave them out of the update; a step with no informative group left trains nothing
  and says so (`skipped` in the step line), instead of "training" on zeros;
- `refill`: drop them, then take further batches from the scheduler (at most `max_refills`)
  until `groups_per_step` informative groups are in hand (DAPO's dynamic sampling).

What counts as a group's scored members is exactly what the trainer puts in its baseline
(`trainers.samples.baseline_members`): canaries, infrastructure failures and unscored
episodes are not members. A canary group or a group whose every episode the infrastructure
failed carries no signal either, but it is never dropped: the step's metrics (masked
episodes, the cheat rate) must still see it. Reward and success figures of a step are
computed over every scored episode the scheduler handed over, dropped groups included, so a
filter never flatters the curve.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers.samples import SampleConfig, baseline_members, masked


class SamplingConfig(BaseModel):
    """What the loop trains on from each batch the scheduler hands over (module doc)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    zero_variance: Literal["keep", "drop", "refill"] = "drop"
    """Groups whose scored rewards are all equal: train on them anyway (`keep`), leave them out
    (`drop`), or leave them out and take more groups from the scheduler (`refill`)."""
    max_refills: int = Field(2, ge=0)
    """Under `refill`: the most extra batches one step takes before it trains on what it has."""


def group_key(traj: Trajectory) -> object:
    """The scheduler's group (`metadata.group_id`), else the task: what GRPO's baseline compares."""
    gid = traj.metadata.get("group_id")
    return ("group", gid) if gid is not None else ("task", traj.task_id)


@dataclass
class Selection:
    """One step's batches, split into what trains and what only counts."""

    train: list[Trajectory] = field(default_factory=list)
    """The trajectories the trainer steps on (every group, under `keep`)."""
    seen: list[Trajectory] = field(default_factory=list)
    """Every trajectory the scheduler handed over for this step, in order."""
    groups: int = 0
    """Groups that had at least one scored member."""
    zero_variance: int = 0
    """Of those, groups whose scored rewards were all equal (or had one scored member)."""
    dropped: int = 0
    """Zero-variance groups left out of the update."""
    refills: int = 0
    """Extra batches taken from the scheduler under `refill`."""

    @property
    def zero_variance_frac(self) -> float | None:
        return self.zero_variance / self.groups if self.groups else None

    def metrics(self) -> dict[str, float | int | None]:
        """The step line's dynamic-sampling figures."""
        return {"groups": self.groups, "zero_var_groups": self.zero_variance,
                "zero_var_frac": self.zero_variance_frac, "groups_dropped": self.dropped,
                "refills": self.refills, "trained_trajectories": len(self.train)}


def split(batch: list[Trajectory], samples: SampleConfig) -> tuple[list[list[Trajectory]], list[list[Trajectory]], list[list[Trajectory]]]:
    """Groups of `batch` in order: (informative, zero-variance, unscored), each a list of groups.

    Under baseline `none` (REINFORCE) a group is informative when any member's reward is not 0."""
    groups: dict[object, list[Trajectory]] = defaultdict(list)
    for traj in batch:
        groups[group_key(traj)].append(traj)
    informative, flat, unscored = [], [], []
    for members in groups.values():
        rewards = [r for _, r in baseline_members(members, samples)]
        if not rewards:
            unscored.append(members)
        elif (any(r != 0.0 for r in rewards) if samples.baseline == "none"
              else len(rewards) > 1 and max(rewards) != min(rewards)):
            informative.append(members)
        else:
            flat.append(members)
    return informative, flat, unscored


async def select(next_batch: Callable[[], Awaitable[list[Trajectory]]], config: SamplingConfig,
                 samples: SampleConfig, groups_per_step: int) -> Selection:
    """Take one step's data from `next_batch` (the scheduler's) under `config` (module doc)."""
    sel = Selection()
    informative: list[list[Trajectory]] = []
    unscored: list[list[Trajectory]] = []
    while True:
        batch = await next_batch()
        sel.seen.extend(batch)
        good, flat, none = split(batch, samples)
        sel.groups += len(good) + len(flat)
        sel.zero_variance += len(flat)
        if config.zero_variance == "keep":
            sel.train.extend(batch)
            return sel
        sel.dropped += len(flat)
        informative += good
        unscored += none
        if (config.zero_variance == "drop" or len(informative) >= groups_per_step
                or sel.refills >= config.max_refills or not batch):
            break
        sel.refills += 1
    # Unscored groups (canaries, infrastructure failures) ride along with a real update so the
    # trainer counts them; with nothing informative there is no update to ride along with.
    sel.train = [t for g in informative + unscored for t in g] if informative else []
    return sel


def outcome(batch: list[Trajectory], samples: SampleConfig) -> dict[str, float | int | None]:
    """Reward mean, success rate and masked count over every episode of `batch` (canaries out):
    the step's figures whatever was trained on."""
    scored = [float(t.reward) for t in batch if not t.metadata.get("canary") and t.reward is not None
              and t.status != "infra_error"]
    return {"reward_mean": sum(scored) / len(scored) if scored else None,
            "success_rate": sum(r >= samples.success_threshold for r in scored) / len(scored) if scored else None,
            "masked_infra": sum(1 for t in batch if not t.metadata.get("canary") and masked(t, samples))}
