"""Trajectory formats of the field: ATIF (atif.py) and the run exports (export.py)."""
