"""Inside a beside harness's network namespace: open the proxy's port on the namespace's own
loopback, then become the harness. Stdlib only; run by path (`python netns_launch.py`), so
`relay` (adapters/relay.py, the same relay inside harnesses use) imports from this folder.

    python netns_launch.py --listen tcp:127.0.0.1:PORT --target unix:PATH -- ARGV...

The listening socket is bound before anything else runs, so the harness's first call finds it.
A forked child serves it (it dies with its parent: PR_SET_PDEATHSIG) and stays in the launch's
process group, so `proc.kill_tree` ends it with the harness; this process then execs ARGV.
"""
import ctypes
import os
import signal
import sys

from relay import Relay

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 6 or argv[0] != "--listen" or argv[2] != "--target" or argv[4] != "--":
        sys.stderr.write("usage: netns_launch.py --listen tcp:HOST:PORT --target unix:PATH -- ARGV...\n")
        return 2
    try:
        relay = Relay(argv[1], argv[3])
    except OSError as e:  # e.g. a proxy port below 1024: the namespace has no capabilities
        sys.stderr.write(f"harnessrl netns: cannot listen on {argv[1]} for the proxy: {e}\n")
        return 126
    parent = os.getpid()
    if os.fork() == 0:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent is already gone
            os._exit(0)
        relay.serve_forever()
        os._exit(0)
    relay.server.close()
    try:
        os.execvp(argv[5], argv[5:])
    except OSError as e:  # what a shell reports as 127 / 126
        sys.stderr.write(f"{argv[5]}: {e.strerror}\n")
        return 127 if isinstance(e, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
