"""The user tools wing: the commands a user runs around training, built on the core, the proxy,
the tasks wing and the test doubles; nothing below imports them.

- `doctor.py`: what this machine has and lacks for each sandbox, engine and harness;
- `collect.py`: teacher trajectories for SFT (`harnessrl collect`);
- `check_adapter.py`: a harness adapter's ten checks with a scripted policy (`harnessrl check-adapter`);
- `viewer/`: `harnessrl view`, the browser view of runs and episodes;
- `formats/`: ATIF and other export formats of the trajectory record.
"""
