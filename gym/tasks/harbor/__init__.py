"""Harbor task directories (Terminal-Bench 2's format) as a harnessrl suite.

A folder of task folders (or one task folder) loads as Tasks (`loader.load_dir`), through the
same suite path as every other task file (`harnessrl tasks list|check DIR`, `rollout`,
`train`, `collect`): `instruction.md` is the problem statement, `task.toml` the timeouts and
limits (`spec.HarborSpec`), `environment/Dockerfile` the image (built offline by the docker
backend), `tests/test.sh` the verifier (`verify.score_harbor`, reached through
`gym.grading.score`), `solution/solve.sh` the gold plan (`oracle.check_harbor`, reached through
`gym.tasks.suites.check`). The core reaches this package only by name, through the task-format
registries (`gym.tasks.SPECS`, `gym.tasks.loaders.FOLDERS`, `gym.grading.score.GRADERS`,
`gym.tasks.suites.check.CHECKS`), so no module this package imports imports it back.
"""
