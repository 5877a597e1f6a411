"""Every environment variable llmrs reads, typed and documented in one place (vLLM's envs.py is the model).

Read a setting as an attribute: `from llmrs import envs; envs.LLMRS_CUDA_GRAPHS`. Each access reads the
environment again, so a test's `monkeypatch.setenv` and a child process's environment both take effect. No other
module of the package reads `os.environ`; settings that are not here are constructor or CLI options.

A value that does not parse raises UserError naming the variable (one line on the command line, never a traceback).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from llmrs.errors import UserError

OFF_VALUES = ("0", "false", "no", "off")  # an on/off switch read as off


def _raw(name: str) -> str | None:
    v = os.environ.get(name)
    return None if v is None or v.strip() == "" else v.strip()


def _flag(name: str, default: bool) -> Callable[[], bool]:
    def read() -> bool:
        v = _raw(name)
        return default if v is None else v.lower() not in OFF_VALUES
    return read


def _str(name: str, default: str | None = None, choices: tuple[str, ...] | None = None) -> Callable[[], Any]:
    def read() -> Any:
        v = _raw(name)
        if v is None:
            return default
        if choices is not None and v.lower() not in choices:
            raise UserError(f"{name}={v!r}: expected {' or '.join(choices)}")
        return v.lower() if choices is not None else v
    return read


def _verbatim(name: str) -> Callable[[], str | None]:
    """The value as set, "" included (None only where unset): a setting whose empty value is a mistake to report."""
    def read() -> str | None:
        return os.environ.get(name)
    return read


def _list(name: str) -> Callable[[], tuple[str, ...]]:
    def read() -> tuple[str, ...]:
        return tuple(p.strip() for p in (_raw(name) or "").split(",") if p.strip())
    return read


# name -> (reader, what it does). Grouped: where llmrs finds things, diagnostics, A/B switches.
_SETTINGS: dict[str, tuple[Callable[[], Any], str]] = {
    # --- where things are ---
    "LLMRS_API_KEY": (_verbatim("LLMRS_API_KEY"),
                      "`llmrs serve --api-key`'s default: require 'Authorization: Bearer KEY' on every route but "
                      "/health and /version (/metrics: see --metrics-public); set but empty is an error at start."),
    "LLMRS_ENGINE_PROCESS": (_str("LLMRS_ENGINE_PROCESS"),
                             "`llmrs serve --engine-process/--no-engine-process` (typer reads it as the flag)."),
    "LLMRS_EMBEDDED_DIR": (_str("LLMRS_EMBEDDED_DIR"),
                           "A folder holding the embedded models' files, searched before the installed package."),
    "LLMRS_CACHE_DIR": (_str("LLMRS_CACHE_DIR"),
                        "Where `llmrs roofline --measure` stores measured ceilings (default $XDG_CACHE_HOME/llmrs "
                        "or ~/.cache/llmrs)."),
    "LLMRS_PTXAS": (_str("LLMRS_PTXAS"), "ptxas for `llmrs ptx-check` (default: the pip wheel, then PATH)."),
    "LLMRS_NVDISASM": (_str("LLMRS_NVDISASM"), "nvdisasm for `llmrs ptx-check --sass` (default: the wheel, then PATH)."),
    # --- diagnostics ---
    "LLMRS_TRACE_FILE": (_str("LLMRS_TRACE_FILE"),
                         "Append '<perf_counter> <pid> <tag>' at each hop of a request (client, server, engine core) "
                         "to this file; `tools/ttft_trace.py` summarises it."),
    "LLMRS_TIMELINE_TRACE": (_str("LLMRS_TIMELINE_TRACE"),
                             "`llmrs profile --timeline`: also keep the raw Chrome trace at this path."),
    # --- A/B switches (the default is what ships) ---
    "LLMRS_CUDA_GRAPHS": (_flag("LLMRS_CUDA_GRAPHS", True), "0: run every decode step eagerly (no CUDA graphs)."),
    "LLMRS_PREFILL_GRAPHS": (_flag("LLMRS_PREFILL_GRAPHS", True),
                             "0: no CUDA graphs for lone short prefills (TTFT path)."),
    "LLMRS_PDL": (_flag("LLMRS_PDL", True),
                  "0: no programmatic dependent launch between graphed kernels (sm_90+)."),
    "LLMRS_CUDA_DEFINES": (_list("LLMRS_CUDA_DEFINES"),
                           "NAME[=VALUE],...: extra macros for every kernel compiled (A/B of a kernel from probes/)."),
    "LLMRS_WARMUP": (_flag("LLMRS_WARMUP", True),
                     "0: `llmrs serve` on a GPU skips the warm-up (graph capture, cuBLAS heuristics) before healthy."),
    "LLMRS_HTTP_STACK": (_str("LLMRS_HTTP_STACK", "auto", ("auto", "h11")),
                         "uvicorn's loop and parser: auto (uvloop + httptools where installed) or h11 (asyncio + h11)."),
    "LLMRS_BENCH_HTTPX": (_flag("LLMRS_BENCH_HTTPX", False),
                          "1: `llmrs bench` workers use httpx instead of the minimal HTTP/1.1 client for http URLs."),
}


def __getattr__(name: str) -> Any:
    if name in _SETTINGS:
        return _SETTINGS[name][0]()
    raise AttributeError(f"module 'llmrs.envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(_SETTINGS) + ["EXTERNAL", "OFF_VALUES", "external"])


# Variables of other tools that llmrs honours as those tools do (read here, so no other module reads os.environ).
EXTERNAL = {
    "XDG_CACHE_HOME": "the base of LLMRS_CACHE_DIR's default",
    "CUPY_CACHE_DIR": "CuPy's kernel cache (`llmrs doctor` reports its size)",
}


def external(name: str) -> str | None:
    """The value of another tool's variable (EXTERNAL), None where unset or empty."""
    assert name in EXTERNAL, name
    return _raw(name)
