"""Bridges: harnessrl as the fixed env layer under trainers people already run (verl, SkyRL, Tinker)."""
