"""Synthetic SWE-bench-form tasks from any Python repository whose tests pass (SWE-smith's idea,
offline): mutate the code, keep mutants that fail some tests and pass the rest, verify each task
in a sandbox, split train / held-out by function.

Modules: `mutate` (AST operators as exact text edits), `screen` (host test runs of mutants),
`statement` (issue text from the failing tests), `split` (by function), `source` (clean and bug
commits, bundles), `run` (the pipeline, `synthesize`), `emit` (verification and output files),
`cli` (`harnessrl tasks synth`).
"""
from __future__ import annotations

__all__ = ["SynthConfig", "synthesize"]


def __getattr__(name: str):
    if name in __all__:
        from harnessrl.gym.tasks.synth import run

        return getattr(run, name)
    raise AttributeError(name)
