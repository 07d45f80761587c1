"""The hidden-test runner that runs inside the sandbox (stdlib + pytest): supervisor.py is its
entry, guard.py, worker.py and unrig.py its siblings. gym/grading/hidden_tests.py copies these files into
the sandbox; nothing here is imported by the host."""
