"""How `llmrs bench` ends when it is told to: SIGINT (Ctrl-C), SIGTERM (kill, a CI timeout) and SIGHUP (a closed
terminal) all stop it the same way: the run in progress stops sending, what finished is saved, the server it
started is stopped, and the process exits with 128 + the signal's number (130, 143, 129), as a shell reports it.

`Interrupts` installs one handler for the three signals while a bench runs. Outside a `deferred()` section the
handler raises `Interrupted` (a KeyboardInterrupt, so code that handles Ctrl-C handles the others too); inside one
(a load run, saving its results) the first signal is only noted (`signum`) for the code there to act on at a safe
point, and a second one raises: a user who insists is not kept waiting. Coroutines run through `run()` are
cancelled by the first signal instead (as asyncio.run does on Ctrl-C: an exception raised inside the event loop
would leave its tasks half-finished), and `run()` then raises Interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from rich.console import Console

T = TypeVar("T")
SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


class Interrupted(KeyboardInterrupt):
    """The bench was interrupted by signal `signum`; `path`: the results file that holds what finished (if any)."""

    def __init__(self, signum: int, path=None):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.path = path

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class Interrupts:
    """Context manager: the handlers of SIGNALS while the bench runs (main thread only; elsewhere a no-op)."""

    def __init__(self, console: Console | None = None):
        self.console = console
        self.signum: int | None = None  # the first interrupt's signal
        self._deferred = 0
        self._saved: dict[int, object] = {}
        self._task: asyncio.Task | None = None  # the coroutine `run` runs

    def pending(self) -> int | None:
        return self.signum

    def _handle(self, signum: int, frame) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if signum == getattr(signal, "SIGHUP", None) and self.console is not None and self.console.is_terminal:
            self.console.quiet = True  # the terminal is gone: writing to it would fail
        if self._deferred and first:
            return
        task = self._task
        if first and task is not None and not task.done():
            task.cancel()
            task.get_loop().call_soon_threadsafe(lambda: None)  # wake the loop's selector
            return
        raise Interrupted(signum)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """asyncio.run(coro), cancelled by an interrupt, which then raises Interrupted."""
        async def main() -> T:
            self._task = asyncio.current_task()
            return await coro

        try:
            with asyncio.Runner() as runner:
                return runner.run(main())
        except asyncio.CancelledError:
            if self.signum is not None:
                raise Interrupted(self.signum) from None
            raise
        finally:
            self._task = None

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A section in which the first interrupt is noted, not raised (the code checks `signum`)."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._saved[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._saved.items():
            signal.signal(s, h)
        self._saved.clear()
