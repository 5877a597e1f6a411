"""LLMRS_TRACE_FILE=PATH: a timestamp at each hop of a request's way through the bench client, the server and the
engine core, appended to PATH as lines "<time.perf_counter()> <pid> <tag>" by every process that has the variable
(the server, its engine core process, `llmrs bench`'s workers). On Linux perf_counter is CLOCK_MONOTONIC, one
clock for every process of the machine, so the lines of one request line up across processes;
`tools/ttft_trace.py PATH` prints the median time of each tag after the client's send, request by request.

Meant for one request at a time (a TTFT probe: `--concurrency 1`). Each process opens one descriptor in append mode
(O_APPEND: lines from several processes do not interleave) and writes each tag with one write(2): ~1.6 us a tag on
a 2-core VM, against ~12 us for an open / write / close per tag (~30 tags on a TTFT's path: the traced TTFT
stays within run-to-run noise of the untraced one, `tools/bench_host_overhead.py server --seqs 1`); nothing at all
without the variable. Tags: client_send, asgi_enter, route, add_request (the server's add),
cmd_sent (the add written to the core's pipe), core_recv, core_step (begin of each step), step_planned /
step_launched (LLMEngine.step with async scheduling), fwd_begin / fwd_batch / fwd_layer7,14,21,28 / fwd_queued (the
CUDA forward's host side), sample_begin / sample_queued, core_tokens (a step's outputs, with their token count),
server_out (the core's message read by the server), sse_event (an event handed to the response), client_first
(the client's first content token).
"""

from __future__ import annotations

import os
import time

from llmrs import envs

PATH = envs.LLMRS_TRACE_FILE  # read once: every tag site tests it


def tr_tokens(outputs) -> None:
    """core_tokens with the number of tokens in a step's outputs (counted only when tracing)."""
    if PATH is not None:
        tr(f"core_tokens {sum(len(o.token_ids) for o in outputs)}")


_fd: tuple[int, str, int] | None = None  # (pid, path, descriptor) of this process's open trace file


def _descriptor() -> tuple[int, int]:
    """(pid, fd): this process's append-mode descriptor on PATH, opened on first use and again after a fork or a
    change of PATH (the tests set it)."""
    global _fd
    pid = os.getpid()
    if _fd is None or _fd[0] != pid or _fd[1] != PATH:
        if _fd is not None:
            os.close(_fd[2])  # (after a fork: the child's copy only)
        _fd = (pid, PATH, os.open(PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    return pid, _fd[2]


def tr(tag: str) -> None:
    """Append one timestamped tag (nothing unless LLMRS_TRACE_FILE was set when this module was imported)."""
    if PATH is not None:
        pid, fd = _descriptor()
        os.write(fd, f"{time.perf_counter():.6f} {pid} {tag}\n".encode())
