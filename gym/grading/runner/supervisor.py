"""The hidden-test launcher's entry: runs INSIDE the sandbox as
`python3 -I --check-hash-based-pycs always supervisor.py SPEC` and decides the verdict in a
process the code under test never runs in.

Contract: this process reads the spec (then deletes it), makes itself non-dumpable (no other
process of the same user can read its memory or its file descriptors through /proc), and
forks the worker (worker.py) with: a fresh key for the guard (guard.py), the write end of an
event pipe, and a pipe for its output. The worker holds no copy of this process's stdout, of
the verdict's markers or of the spec's secrets. This process relays the worker's output
(any text that spells the marker is blanked), reads the event pipe, and believes a line only
if the guard's HMAC over it checks out, its sequence number follows the last one, and it
came from the worker itself (a forked copy's lines may only add violations). Once the
worker has exited it writes one verdict block between the markers on its own stdout:
{"done", "collected", "violations", "records"} as a Python literal of exact types.
A line that fails any check is itself a violation (`channel`); a missing `done` is a run
without a report (the grader then asks the pristine base whose failure it was).

stdlib only; the sandbox's own python3 (3.9+).
"""
import ast
import builtins
import hashlib
import hmac
import json
import os
import select
import sys
import time


def _nondumpable():
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError, ImportError):
        pass


def _private_namespace(here, *names):
    """Execute sibling files, in order, into one namespace no module table lists, with its own
    copy of the builtins."""
    space = {"__builtins__": dict(vars(builtins)), "__name__": "harnessrl_guard"}
    for name in names:
        path = os.path.join(here, name + ".py")
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), space)
    return space


def _public_module(here, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location("harnessrl_grader_" + name, os.path.join(here, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class _Guard:
    def __init__(self, space):
        self.install = space["install"]


class Verdict:
    """What the guard's signed lines say, checked line by line."""

    def __init__(self, key, worker):
        self.key, self.worker, self.seq = key, worker, {}
        self.done = self.collected = None
        self.records, self.violations = [], []
        self.buffer = b""

    def feed(self, data):
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self.line(line)

    def channel(self, what):
        if len(self.violations) < 20:
            self.violations.append({"kind": "channel", "what": what, "where": ""})

    def line(self, line):
        body, _, mac = line.rpartition(b" ")
        want = hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()
        if not body or not hmac.compare_digest(mac, want):
            return self.channel("a line on the grader's channel was not signed by the guard: " + repr(line[:80]))
        seq, pid, payload = ast.literal_eval(body.decode())
        if seq != self.seq.get(pid, 0) + 1:
            return self.channel(f"the guard's lines from pid {pid} are out of order ({seq})")
        self.seq[pid] = seq
        if "violation" in payload:
            return self.violations.append(payload["violation"])
        if pid != self.worker:
            return self.channel(f"a copy of the test process (pid {pid}) spoke for the tests")
        if "report" in payload or "collect_error" in payload:
            self.records.append(payload)
        elif "collected" in payload:
            self.collected = payload["collected"]
        elif "done" in payload:
            self.done = payload["done"]

    def block(self):
        if self.buffer:
            self.channel("the grader's channel ended inside a line")
        keep = [r for r in self.records if r.get("when") == "call" or r.get("outcome") != "passed"]
        return repr({"done": self.done, "collected": self.collected, "violations": self.violations,
                     "records": keep})


def _relay(out_r, ev_r, pid, verdict, marker, out_fd):
    """Relay the worker's output (marker blanked) and feed its events until it exits and its
    pipes drain (a process it left holding them gets 0.5 s, not the rest of the timeout)."""
    secret, carry, status, ended = marker.encode(), b"", None, None
    fds = [out_r, ev_r]
    while fds:
        ready, _, _ = select.select(fds, [], [], 0.05)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                fds.remove(fd)
            elif fd == ev_r:
                verdict.feed(chunk)
            else:
                text = (carry + chunk).replace(secret, b"[marker]")
                cut = max(0, len(text) - len(secret))
                text, carry = text[:cut], text[cut:]
                while text:
                    text = text[os.write(out_fd, text):]
        if status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status, ended = code, time.monotonic()
        elif time.monotonic() - ended > 0.5:
            break
    carry = carry.replace(secret, b"[marker]")
    while carry:
        carry = carry[os.write(out_fd, carry):]
    if status is None:
        _, status = os.waitpid(pid, 0)
    return status


def main():
    out_fd = os.dup(1)  # the verdict's channel, taken before anything else runs
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    os.remove(sys.argv[1])
    here = os.path.dirname(os.path.abspath(__file__))
    _nondumpable()
    guard = _private_namespace(here, "pins", "guard")
    unrig = _public_module(here, "unrig")
    worker = _public_module(here, "worker")
    key = os.urandom(32)
    ev_r, ev_w = os.pipe()
    out_r, out_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker: no marker, no stdout of ours, the key only inside the guard
        box = [key]
        del key
        spec.pop("marker")
        os.close(ev_r)
        os.close(out_r)
        os.close(out_fd)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.close(out_w)
        code = 3
        try:
            code = int(worker.run(spec, box, ev_w, _Guard(guard), unrig))
        except BaseException as e:  # a broken grader set-up is reported, not hidden
            print(f"harnessrl grader: the test process failed to start: {type(e).__name__}: {e}", flush=True)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    marker = spec.pop("marker")
    os.close(ev_w)
    os.close(out_w)
    verdict = Verdict(key, pid)
    status = _relay(out_r, ev_r, pid, verdict, marker, out_fd)
    block = ("\n" + marker + "-begin " + verdict.block() + " " + marker + "-end\n").encode()
    while block:
        block = block[os.write(out_fd, block):]
    os._exit(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else 0)


if __name__ == "__main__":
    main()
