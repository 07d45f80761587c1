"""Task suites shipped with harnessrl (see harnessrl.gym.task_loaders for the registry)."""
