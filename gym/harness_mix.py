"""Several harnesses in one run: which harness each GRPO group runs through.

Contract: `HarnessMix(weights, seed)` draws one harness per group, by weight, from a
`random.Random(seed)` of its own: the k-th group of a run gets the k-th draw, so the same
weights and seed give the same sequence of harnesses (a requeued group keeps its harness; the
scheduler draws only for new groups). Every episode of a group runs through the harness of
its group, so the group's advantage compares like with like. One harness never consumes
randomness (the one-harness run is what it always was). `peek(n)` is the next n draws
without taking them (the warm pool starts those groups' sandboxes ahead).
"""
from __future__ import annotations

import math
import random
from typing import Mapping


def check_weights(weights: Mapping[str, float], what: str = "rollout.harnesses") -> dict[str, float]:
    """The weights as a dict, or a ValueError naming `what` and the bad entry: at least one
    harness, every weight a finite number > 0."""
    if not weights:
        raise ValueError(f"{what}: empty; name at least one harness (or leave it unset for rollout.harness)")
    for name, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"{what}: weight of {name!r} is {w!r}; every weight must be a finite number > 0")
    return {str(k): float(v) for k, v in weights.items()}


class HarnessMix:
    """Draws the harness of each new group (module doc)."""

    def __init__(self, weights: Mapping[str, float], seed: int = 0):
        self.weights = check_weights(weights)
        self.names = list(self.weights)
        self._rng = random.Random(seed)
        self.drawn: dict[str, int] = {n: 0 for n in self.names}
        """Groups drawn per harness so far."""

    def _draw(self, rng: random.Random) -> str:
        if len(self.names) == 1:
            return self.names[0]
        return rng.choices(self.names, weights=[self.weights[n] for n in self.names])[0]

    def draw(self) -> str:
        """The harness of the next group."""
        name = self._draw(self._rng)
        self.drawn[name] += 1
        return name

    def __call__(self) -> str:
        return self.draw()

    def peek(self, n: int) -> list[str]:
        """The next `n` draws, not taken."""
        rng = random.Random()
        rng.setstate(self._rng.getstate())
        return [self._draw(rng) for _ in range(n)]
