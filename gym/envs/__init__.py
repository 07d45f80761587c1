"""The gymnasium wing: harnessrl as a `gymnasium.Env` (`env.py`, `harnessrl.gym.make("harnessrl/swe")`)
and the HTTP bridge that lets a policy outside this process answer the harness's calls
(`env_bridge.py`). Here the policy is whoever calls `step()`: the proxy parks each model call
until the caller answers it. Built on the core (`gym.stack`) and the engine-transport wing.
"""
