"""Task suites shipped with harnessrl (see harnessrl.gym.tasks.loaders for the registry)."""
