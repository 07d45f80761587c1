"""Harbor task directories (Terminal-Bench 2's format) as a harnessrl suite.

A folder of task folders (or one task folder) loads as Tasks (`loader.load_dir`), through the
same suite path as every other task file (`harnessrl tasks list|check DIR`, `rollout`,
`train`, `collect`): `instruction.md` is the problem statement, `task.toml` the timeouts and
limits (`spec.HarborSpec`), `environment/Dockerfile` the image (built offline by the docker
backend), `tests/test.sh` the verifier (`verify.score_harbor`, reached through
`gym.grading.score`), `solution/solve.sh` the gold plan. This package's `__init__` imports
nothing, so `gym.tasks` can import `spec` without a cycle.
"""
