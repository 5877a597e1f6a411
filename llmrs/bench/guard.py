"""The process between `llmrs bench` and a server it starts: the server never outlives the bench.

    python -m llmrs.bench.guard FD -- SERVER ARGV...

The bench starts this guard as the leader of a new session (process group), with the read end FD of a pipe whose
write end only the bench holds. The guard runs the server command in its own group, so the server, its engine
core and whatever workers they spawn share one process group, then waits for one of two things:

- the server exits (the bench stopped it by signalling the group, or it failed): the guard waits up to DRAIN_S for
  the rest of the group (an engine core shutting down, multiprocessing's resource tracker unlinking semaphores),
  kills what is left, and exits with the server's status (128 + N for a server killed by signal N);
- the pipe reaches EOF: the bench is gone, however it ended (SIGKILL included: the kernel closes its end). The
  guard sends SIGTERM to the group (a graceful stop), gives the server STOP_GRACE_S, then drains the group as
  above and kills what is left with SIGKILL.

SIGINT, SIGTERM and SIGHUP reach the guard with the rest of the group when the bench stops the server (or a
terminal closes): they are caught and do nothing here (caught, not ignored, so the server does not inherit
SIG_IGN across exec). Only the standard library is imported: the guard starts in tens of ms.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

STOP_GRACE_S = 10.0  # the server's time to stop after the bench died, before SIGKILL
DRAIN_S = 10.0  # the group's time to finish after the server exited
POLL_S = 0.2
GROUP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


def group_members(pgid: int, exclude: int | None = None) -> list[int] | None:
    """Live processes of process group `pgid` (zombies left out), from /proc; None where there is no /proc."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    out = []
    for pid in pids:
        if pid == exclude:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after its last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            out.append(pid)
    return out


def drain(pgid: int, me: int, wait_s: float) -> None:
    """Waits up to wait_s for the other members of group `pgid` to exit, then SIGKILLs those left."""
    deadline = time.monotonic() + wait_s
    while True:
        left = group_members(pgid, exclude=me)
        if left is None:  # no /proc to list the group by: a moment for it, no more
            time.sleep(min(1.0, wait_s))
            return
        if not left:
            return
        if time.monotonic() > deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return
        time.sleep(POLL_S)


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m llmrs.bench.guard FD -- COMMAND...", file=sys.stderr)
        return 2
    fd, cmd = int(argv[0]), argv[2:]
    for s in GROUP_SIGNALS:
        signal.signal(s, lambda *_: None)
    me, pgid = os.getpid(), os.getpgrp()
    try:
        proc = subprocess.Popen(cmd)
    except OSError as e:
        print(f"cannot start {cmd[0]}: {e}", file=sys.stderr)
        return 127
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], POLL_S)
        except InterruptedError:
            ready = []
        code = proc.poll()
        if code is not None:
            drain(pgid, me, DRAIN_S)
            return _status(code)
        if ready and not os.read(fd, 64):  # EOF: the bench is gone
            break
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        pass
    try:
        code = proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        code = None
    drain(pgid, me, DRAIN_S if code is not None else 0.0)
    if code is None:
        proc.kill()
        code = proc.wait()
    return _status(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
