"""Old import path of core_client.py, kept for callers outside the engine that have not moved yet."""

from llmrs.engine.core_client import (  # noqa: F401
    FLUSH_EVERY_S, ProcessEngine, core_main, freeze_heap, idle_spin_s, run_core, wait_command,
)
