#!/usr/bin/env python3
"""harnessrl-exec: run one shell command in the episode's sandbox through the exec bridge
(adapters/exec_bridge.py), from a harness beside the sandbox. Stdlib only, any Python >= 3.8:
the command adapter copies it into the run's scratch dir as `harnessrl-exec` (template
variable `${exec_client}`), so a harness uses it as its shell instead of a hand-written
forwarder:

    harnessrl-exec -c 'pytest -q'             # what `sh -c CMD` would be
    harnessrl-exec [--cwd DIR] [--timeout S] -- CMD...   # the words joined by spaces

The socket is `$HARNESSRL_EXEC_SOCKET`; `$HARNESSRL_EXEC_CWD` is the default cwd. The
command's output (stdout and stderr interleaved, as the sandbox gives them) goes to stdout
byte for byte and its exit status is this one's; a command killed for its timeout exits 124,
a bridge or sandbox failure 125, each with a line on stderr.
"""
import argparse
import json
import os
import socket
import sys


def call(sock_path, request):
    """One exchange with the bridge: the reply as a dict."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(sock_path)
        s.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="harnessrl-exec", description=__doc__.splitlines()[0])
    ap.add_argument("-c", dest="script", help="the command line, as for sh -c")
    ap.add_argument("--cwd", default=os.environ.get("HARNESSRL_EXEC_CWD") or None)
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("words", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    words = args.words[1:] if args.words[:1] == ["--"] else args.words
    command = args.script if args.script is not None else " ".join(words)
    sock = os.environ.get("HARNESSRL_EXEC_SOCKET")
    if not sock:
        sys.stderr.write("harnessrl-exec: HARNESSRL_EXEC_SOCKET is not set\n")
        return 125
    try:
        reply = call(sock, {"command": command, "cwd": args.cwd, "timeout": args.timeout})
    except (OSError, ValueError) as e:
        sys.stderr.write(f"harnessrl-exec: bridge {sock}: {type(e).__name__}: {e}\n")
        return 125
    if "error" in reply:
        sys.stderr.write(f"harnessrl-exec: {reply['error']}\n")
        return 125
    sys.stdout.buffer.write(reply["output"].encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
    if reply.get("timed_out"):
        sys.stderr.write(f"harnessrl-exec: timed out after {args.timeout or 'the default'} s\n")
        return 124
    return int(reply["returncode"]) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
