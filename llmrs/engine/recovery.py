"""What an engine does when its loop dies (`llmrs serve --on-engine-death restart|exit`).

The loop dies when a whole step raises (a CUDA error, a bug outside one request's own processing) or, with the
engine core in its own process, when that process dies (killed, out of memory, a crash in native code).

- `restart` (the default): the requests that had started (scheduled, or with outputs streamed) fail with an
  error; the ones still waiting are kept and run on the restarted loop; new requests wait for it. After
  `MAX_RESTARTS` deaths within `RESTART_WINDOW_S` the engine gives up and is dead, as with `exit`.
- `exit`: the engine is dead at once: open streams end with an error, and the server stops and exits non-zero so
  that a supervisor (systemd, Kubernetes) starts it again.

A dead engine answers new requests with 503 and /health with 503 "dead".
"""

from __future__ import annotations

import collections
import time

from llmrs.errors import UserError

ON_DEATH_CHOICES = ("restart", "exit")
MAX_RESTARTS = 3  # deaths within RESTART_WINDOW_S that are restarted; one more and the engine is dead
RESTART_WINDOW_S = 60.0
BACKOFF_S = 0.5  # wait before the k-th restart in the window: BACKOFF_S * 2**(k-1)


def check_on_death(policy: str) -> str:
    if policy not in ON_DEATH_CHOICES:
        raise UserError(f"--on-engine-death {policy!r}: choose {' or '.join(ON_DEATH_CHOICES)}")
    return policy


class RestartBudget:
    """Counts an engine loop's deaths and says whether (and after how long) to restart it."""

    def __init__(self, policy: str = "restart", max_restarts: int = MAX_RESTARTS,
                 window_s: float = RESTART_WINDOW_S, backoff_s: float = BACKOFF_S):
        self.policy = check_on_death(policy)
        self.max_restarts, self.window_s, self.backoff_s = max_restarts, window_s, backoff_s
        self.deaths: collections.deque[float] = collections.deque()
        self.restarts = 0  # restarts begun since the start (for the log and tests)

    def next_backoff(self, now: float | None = None) -> float | None:
        """Record a death: the seconds to wait before restarting, or None to give up (the `exit` policy, or more
        than `max_restarts` deaths within `window_s`)."""
        now = time.monotonic() if now is None else now
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > self.window_s:
            self.deaths.popleft()
        if self.policy == "exit" or len(self.deaths) > self.max_restarts:
            return None
        self.restarts += 1
        return self.backoff_s * 2 ** (len(self.deaths) - 1)

    def give_up_reason(self) -> str:
        if self.policy == "exit":
            return "--on-engine-death exit"
        return f"{len(self.deaths)} deaths within {self.window_s:g} s (at most {self.max_restarts} are restarted)"
