"""Runs the fake server with real uvicorn on 127.0.0.1 in its own process (its own GIL: its timing is not
disturbed by the test process), started and stopped by `llmrs bench`'s own ManagedServer."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx

from llmrs.bench.server import ManagedServer

FAKE_SERVER = Path(__file__).with_name("fake_server.py")


def fake_server_cmd(ttft_ms: float = 0.0, gap_ms: float = 0.0, coalesce: int = 1,
                    graph_failures: int = -1, flavor: str = "default", loading_s: float = 1.0,
                    no_models: bool = False, count_with: str | None = None, record: str | None = None) -> list[str]:
    """The fake server's command (`{port}` left for ManagedServer); `flavor` and the rest: fake_server.py's options."""
    return [sys.executable, str(FAKE_SERVER), "--port", "{port}", "--ttft-ms", str(ttft_ms), "--gap-ms", str(gap_ms),
            "--coalesce", str(coalesce), "--graph-failures", str(graph_failures), "--flavor", flavor,
            "--loading-s", str(loading_s), *(["--no-models"] if no_models else []),
            *(["--count-with", count_with] if count_with else []), *(["--record", record] if record else [])]


class Stats:
    """Reads the server's own observations (GET /stats)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self) -> dict:
        return httpx.get(f"{self.url}/stats", trust_env=False, timeout=10).json()


@contextlib.contextmanager
def running(**defaults):
    """Yields (base_url, Stats); the server process stops when the block ends."""
    with TemporaryDirectory() as d:
        srv = ManagedServer.from_command(fake_server_cmd(**defaults), Path(d) / "server.log", startup_timeout=30)
        with srv:
            yield srv.url, Stats(srv.url)
