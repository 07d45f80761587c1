"""Sandboxes: where one episode's copy of a repository lives while a harness works on it."""
