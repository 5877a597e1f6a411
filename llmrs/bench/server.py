"""Start a server command, wait until it is ready, stop it afterwards.

One machinery for every engine: `--server-cmd "vllm serve M --port {port}"` (or any command), and the default
when neither --url nor --server-cmd is given: our own `python -m llmrs serve [MODEL] --host 127.0.0.1 --port
{port}`. `{port}` is replaced by a free 127.0.0.1 port; a command without it names its port with `--port N`, else
it listens on its program's default (`DEFAULT_PORTS`: vLLM and llama-cpp-python 8000, SGLang 30000, llama-server
8080, TGI's launcher 3000). Ready means GET /health answers 200 (vLLM, SGLang, llama-server after its 503s while
loading, TGI, llmrs); a server without that route (404: llama-cpp-python) is ready once GET /v1/models answers 200.
The server runs in its own session (process group) with output in a log file,
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


# Each server program's port when its command names none, by what `_program` calls it
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000, "llama-server": 8080, "llama-cpp-python": 8000, "tgi": 3000,
                 "llmrs": 8000}
# Each program's name in a command: an executable's file name, or the module after `python -m`
_PROGRAMS = {"vllm": "vllm", "sglang.launch_server": "sglang", "sglang": "sglang", "llama-server": "llama-server",
             "llama_cpp.server": "llama-cpp-python", "text-generation-launcher": "tgi", "llmrs": "llmrs"}
_LAUNCHERS = ("python", "env", "uv", "run", "exec", "nohup", "taskset", "numactl")


def _program(argv: list[str]) -> str | None:
    """Which known server program a command starts (DEFAULT_PORTS' keys), or None: the first word that is not a
    launcher (`python`, `env VAR=...`, `uv run`, an interpreter option), or the module after `-m`."""
    for i, a in enumerate(argv):
        if i and argv[i - 1] == "-m":
            return _PROGRAMS.get(a)
        name = Path(a).name
        if name in _PROGRAMS:
            return _PROGRAMS[name]
        if not (name.startswith(_LAUNCHERS) or a.startswith("-") or "=" in a):
            return None
    return None


def _port_of(argv: list[str]) -> int:
    """The port a command listens on: its --port N (TGI's launcher: -p N too), else its program's default."""
    prog = _program(argv)
    flags = ("--port", "-p") if prog == "tgi" else ("--port",)
    for i, a in enumerate(argv):
        if a in flags and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--port=") and a[7:].isdigit():
            return int(a[7:])
    return DEFAULT_PORTS.get(prog or "", 8000)


@dataclass(slots=True)
class ManagedServer:
    """A server process this bench started (and must stop). Use as a context manager."""

    argv: list[str]
    log_path: Path
    startup_timeout: float = 600.0
    url: str = ""
    proc: subprocess.Popen | None = None  # the guard (llmrs.bench.guard), leader of the server's process group
    started_s: float = 0.0  # seconds until it was ready (`ready_route` answered 200)
    ready_route: str = "/health"  # the route that told readiness: /health, or /v1/models where /health is 404
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

    def _ready(self, c: httpx.Client) -> bool:
        """GET /health answers 200; or, where there is no such route (404), GET /v1/models answers 200."""
        try:
            code = c.get(f"{self.url}/health").status_code
            if code == 404:
                self.ready_route = "/v1/models"
                code = c.get(f"{self.url}/v1/models").status_code
            else:
                self.ready_route = "/health"
            return code == 200
        except httpx.HTTPError:
            return False

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        t0 = time.monotonic()
        deadline, note = t0 + self.startup_timeout, t0 + self.note_every_s
        with httpx.Client(timeout=5.0, trust_env=False) as c:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise UserError(f"server command exited with code {code} before it was ready (GET /health, or "
                                    f"/v1/models where it has no /health); log: {self.log_path}\n{self.log_tail()}")
                if self._ready(c):
                    break
                now = time.monotonic()
                if now > deadline:
                    raise UserError(f"server at {self.url} was not ready (GET {self.ready_route} answering 200) "
                                    f"within {self.startup_timeout:g}s; log: {self.log_path}")
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
