"""ptx-check's progress on stderr: a bar on a terminal, else a plain line every few seconds (CI logs, pipes)."""

from __future__ import annotations

import time
from typing import Any, Callable

from rich.console import Console


class CompileProgress:
    """Callable as run_check's `progress(done, total, running)`; use it as a context manager.

    On a terminal: a rich bar (compiled / total, elapsed, the pairs being compiled), gone when done. Elsewhere:
    a line when compiling starts, one at least every `every_s` seconds while it runs, and one at the end."""

    def __init__(self, total: int, jobs: int, console: Console | None = None, every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(stderr=True)
        self.total, self.jobs, self.every_s, self.clock = total, jobs, every_s, clock
        self.bar: Any = None
        self.task: Any = None
        self.t0 = self.last = 0.0

    def __enter__(self) -> "CompileProgress":
        self.t0 = self.last = self.clock()
        if not self.console.is_terminal:
            self.line(f"compiling {self.total} file/arch pair(s) on {self.jobs} process(es)")
        return self

    def _start_bar(self) -> None:
        """The bar (and rich's refresh thread) starts at the first update: run_check forks its workers before
        that, so no thread is forked."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("[dim]{task.fields[running]}"), console=self.console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task("compiling", total=self.total, running="")

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def line(self, text: str) -> None:
        self.console.print(f"ptx-check: {text}", markup=False, highlight=False, soft_wrap=True)

    def __call__(self, done: int, total: int, running: list[tuple[str, str]]) -> None:
        names = ", ".join(f"{f} {a}" for f, a in running)
        if self.console.is_terminal:
            if self.bar is None:
                self._start_bar()
            self.bar.update(self.task, completed=done, total=total, running=names)
            return
        now = self.clock()
        if done == total:
            self.line(f"{done}/{total} compiled in {now - self.t0:.0f} s")
        elif now - self.last >= self.every_s:
            self.line(f"{done}/{total} compiled, {now - self.t0:.0f} s" + (f" (compiling {names})" if names else ""))
        else:
            return
        self.last = now
