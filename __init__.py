"""harnessrl: RL post-training for coding agents inside the harness they are deployed in.

The repository root is this package: ``gym/`` (env layer), ``adapters/`` (one module per
real harness), ``sandboxes/`` (where a repository lives during an episode) and
``trainers/`` (engines, weight sync, losses, trainers) import as ``harnessrl.<folder>``.
"""

__version__ = "0.1.0"
