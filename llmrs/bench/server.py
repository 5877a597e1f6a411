"""Start a server command, wait until it answers GET /health, stop it afterwards.

One machinery for every engine: `--server-cmd "vllm serve M --port {port}"` (or any command), and the default
when neither --url nor --server-cmd is given: our own `python -m llmrs serve [MODEL] --host 127.0.0.1 --port
{port}`. `{port}` is replaced by a free 127.0.0.1 port; a command without it names its port with `--port N`
(else 8000, vLLM's default). The server runs in its own session (process group) with output in a log file,
so stopping it (SIGINT, then SIGTERM, then SIGKILL) reaches its children too (engine core, workers) and nothing
else. Between the bench and the server sits llmrs.bench.guard, which holds the read end of a pipe only the bench
writes to: when the bench dies in any way (SIGKILL included), the guard stops the server's whole group.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llmrs.errors import UserError

HEALTH_POLL_S = 0.25
WAIT_NOTE_S = 15.0  # how often a start-up that takes long says it is still waiting (ManagedServer.on_wait)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llmrs_serve_argv(model: str | None, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The command for our own server (`extra`: more `llmrs serve` options); `{port}` is filled in at start."""
    return [sys.executable, "-m", "llmrs", "serve", *([model] if model else []), *extra, "--host", "127.0.0.1",
            "--port", "{port}"]


def _port_of(argv: list[str]) -> int:
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--port=") and a[7:].isdigit():
            return int(a[7:])
    return 8000


@dataclass(slots=True)
class ManagedServer:
    """A server process this bench started (and must stop). Use as a context manager."""

    argv: list[str]
    log_path: Path
    startup_timeout: float = 600.0
    url: str = ""
    proc: subprocess.Popen | None = None  # the guard (llmrs.bench.guard), leader of the server's process group
    started_s: float = 0.0  # seconds until /health answered 200
    command: str = field(default="")
    lifeline: int | None = None  # the pipe's write end: the guard sees EOF when this process ends
    on_wait: Callable[[float], None] | None = None  # called every note_every_s while /health does not answer
    note_every_s: float = WAIT_NOTE_S

    @classmethod
    def from_command(cls, cmd: str | list[str], log_path: Path, startup_timeout: float = 600.0) -> ManagedServer:
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise UserError("--server-cmd is empty")
        if any("{port}" in a for a in argv):
            port = free_port()
            argv = [a.replace("{port}", str(port)) for a in argv]
        else:
            port = _port_of(argv)
        return cls(argv, log_path, startup_timeout, f"http://127.0.0.1:{port}", command=shlex.join(argv))

    def start(self) -> None:
        """Starts the server (behind the guard) and waits for /health; anything that ends the wait (a timeout, the
        server's exit, an interrupt) stops it first."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child; closed in stop()
        r, w = os.pipe()  # (not inheritable: no other child of the bench holds the write end)
        guard = [sys.executable, "-m", "llmrs.bench.guard", str(r), "--", *self.argv]
        try:
            self.proc = subprocess.Popen(guard, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, pass_fds=(r,))
        except OSError as e:
            os.close(w)
            raise UserError(f"cannot start server command {self.command!r}: {e}") from e
        finally:
            log.close()
            os.close(r)
        self.lifeline = w
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        t0 = time.monotonic()
        deadline, note = t0 + self.startup_timeout, t0 + self.note_every_s
        with httpx.Client(timeout=5.0, trust_env=False) as c:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise UserError(f"server command exited with code {code} before /health answered; log: {self.log_path}\n{self.log_tail()}")
                try:
                    if c.get(f"{self.url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                now = time.monotonic()
                if now > deadline:
                    raise UserError(f"server did not answer {self.url}/health within {self.startup_timeout:g}s; log: {self.log_path}")
                if self.on_wait is not None and now > note:
                    self.on_wait(now - t0)
                    note = now + self.note_every_s
                time.sleep(HEALTH_POLL_S)
        self.started_s = time.monotonic() - t0

    def stop(self, grace_s: float = 15.0) -> int | None:
        """Stops the server's process group: SIGINT (graceful), then SIGTERM, then SIGKILL; an interrupt meanwhile
        (a second Ctrl-C) goes straight to SIGKILL and is raised once the group is dead. Returns the exit status."""
        p = self.proc
        if p is None:
            return None
        hurry: BaseException | None = None
        steps = [(signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)]
        while steps and p.poll() is None:
            sig, wait = steps.pop(0)
            try:
                os.killpg(p.pid, sig)  # the guard's session: pgid == its pid
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            except KeyboardInterrupt as e:  # (llmrs.bench.bench.Interrupted too)
                hurry, steps = e, steps[-1:] if steps else [(signal.SIGKILL, 5.0)]
        if self.lifeline is not None:  # (a guard still alive after SIGKILL, in the kernel's hands: it acts on EOF)
            os.close(self.lifeline)
            self.lifeline = None
        if hurry is not None:
            raise hurry
        return p.returncode

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
