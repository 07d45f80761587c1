"""Test doubles: small classes that satisfy harnessrl's contracts without a model, kept
apart from the env layer's own modules so that nothing real depends on a fake.

- `scripted`: `ScriptedEngine`, a policy behind SGLang's `/generate` that plays tasks' gold
  plans as real tokenizer ids (end-to-end episodes, `harnessrl check-adapter`);
  `ScriptedPolicy` (the decision alone), `search_replace_blocks` (gold patch -> aider edits).
- `standin`: `StandinEngine`, an instant contract-speaking engine (prompt-derived or
  scripted ids, pause/abort, incremental or cumulative streams, an OpenAI chat endpoint),
  for proxy tests and benchmarks; `python -m harnessrl.gym.doubles.standin --port N`.
- `judge`: `ScriptedJudge`, an OpenAI-compatible chat endpoint answering as a judge would
  (complying, obeying injections naively, failing), for the judge reward's tests.
- `sim`: `SimEngine`, an in-process batching engine on a clock (no HTTP), with simulated
  episodes and `run_simulation`, for sizing env pools and testing the scheduler.

The two HTTP doubles write their `/generate` bodies with `harnessrl.gym.backends.encode`,
the one encoder of the SGLang reply shape. Import the submodule you need; this package
imports nothing, so the env layer never pays for starlette or the scheduler through it.
"""
