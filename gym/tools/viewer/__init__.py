"""`harnessrl view`: a local web viewer over recorded runs (no CDN, no network fetch).

Layers, each its own module: `run_index` finds what a run folder holds and answers paged,
filtered, sorted queries over its episodes from the SQLite store; `curves` the run-level
figures (reward curve, staleness, latency histograms, the report); `episode_view` turns one
trajectory into the conversation per call and the token view (decoded with the run's own
tokenizer); `app` serves them as a JSON API plus the static page in `static/`; `cli` is the
command. Reads records only: no torch, nothing written into the run folder.
"""
from harnessrl.gym.tools.viewer.run_index import RunFolderError, RunIndex

__all__ = ["RunFolderError", "RunIndex"]
