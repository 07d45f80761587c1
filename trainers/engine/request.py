"""One generation request as the scheduler holds it (`Req`), and what it sends back (`Delta`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from harnessrl.trainers.engine.protocol import SamplingParams
from harnessrl.trainers.engine.sampling import RowParams
from harnessrl.trainers.engine.speculate import PromptLookup


@dataclass
class Delta:
    """New output of one request since its previous delta."""

    ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[float, int]]]
    finish: dict | None
    weight_version: str
    input_logprobs: list[float | None] | None = None
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (SGLang's `meta_info.cached_tokens`)."""


@dataclass
class Req:
    """One generation request as the scheduler sees it."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    sink: Callable[[Delta], None]
    stream: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # >= 0: also return input logprobs from this position
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    finish: dict | None = None
    emitted: int = 0
    generator: torch.Generator | None = None
    priority: int = 0
    """SGLang's priority scheduling: a waiting request with a higher value is admitted first."""
    epoch: int = -1
    """The weights epoch its KV was computed in (set at prefill)."""
    cached_tokens: int = 0
    lookup: PromptLookup | None = None
    """Its n-gram index for speculative drafts (made at its first speculative step)."""

    def row(self) -> RowParams:
        p = self.params
        return RowParams(p.temperature, p.top_p, p.top_k, self.generator)
