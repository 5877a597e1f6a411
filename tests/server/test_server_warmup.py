"""The server's start-up warm-up (llmrs.server.app.warm_up): what the first request of a fresh server would otherwise
load inside the first burst is loaded before the port answers. In a fresh interpreter: the test process has long
loaded anyio's backend (pytest's anyio plugin, the other server tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, sys
from llmrs.engine.async_engine import AsyncEngine
from llmrs.server.app import ServerSettings, build_app

BACKEND = "anyio._backends._asyncio"
engine = AsyncEngine.from_args("smollm2-135m", device="cpu")
app = build_app(engine, ServerSettings(served_names=["m"], model_root="m"))
before = BACKEND in sys.modules

async def main():
    async with app.router.lifespan_context(app):
        print("serving", BACKEND in sys.modules)
asyncio.run(main())
print("before", before)
"""


def test_the_lifespan_loads_anyios_backend_before_the_first_request():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["serving", "True", "before", "False"], r.stdout
