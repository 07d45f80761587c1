"""The fixed env layer: proxy, recorder, episodes, tasks, rewards, scheduling.

Imports no torch, ray or sglang, so it loads in milliseconds.
"""
