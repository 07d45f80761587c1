"""The fixed env layer: proxy, recorder, episodes, tasks, rewards, scheduling.

Imports no torch, ray or sglang, so it loads in milliseconds.
"""


def make(env_id: str = "harnessrl/swe", **kwargs):
    """`gymnasium.make` for harnessrl's envs, registering them first (imports gymnasium lazily)."""
    from harnessrl.gym.envs.env import register

    register()
    import gymnasium

    return gymnasium.make(env_id, **kwargs)
