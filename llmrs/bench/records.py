"""What one request sends (RequestSpec) and what it measured (RequestResult).

Both cross process boundaries (main -> worker -> main), so they are plain slotted dataclasses that pickle
cheaply. All times are `time.perf_counter()` seconds: on Linux that is CLOCK_MONOTONIC, one clock for every
process on the machine, so timestamps taken in different worker processes compare directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestSpec:
    """One request of the workload: a text or token-id prompt and how many tokens to ask for."""

    idx: int
    prompt: str | list[int]
    input_len: int  # prompt tokens as the workload believes (the server's usage.prompt_tokens wins when present)
    output_len: int  # max_tokens sent
    at: float = 0.0  # a trace replay: the row's timestamp (s from the trace's start), before --trace-speed
    # a multi-turn conversation's turns share `conversation` (>= 0) and are sent in `turn` order, each after the
    # previous answer, its prompt the chat history so far + this user message (`prompt`); -1: a single request
    conversation: int = -1
    turn: int = 0


@dataclass(slots=True)
class RequestResult:
    """Timings of one request. Latencies are seconds; `start`/`end` are absolute perf_counter times.

    NOTE: a failed request keeps its reason in `error` and is excluded from latency statistics, never dropped.
    """

    idx: int
    worker: int = 0
    success: bool = False
    error: str = ""
    start: float = 0.0  # when the request was sent
    end: float = 0.0  # when the last byte arrived or the request failed
    ttft: float = 0.0  # first chunk with content
    latency: float = 0.0  # E2E: last chunk carrying choices
    itl: list[float] = field(default_factory=list)  # gaps between consecutive content chunks
    chunks: int = 0  # content chunks received (counted as they arrive: the live progress reads it)
    prompt_tokens: int | None = None  # usage.prompt_tokens
    output_tokens: int | None = None  # usage.completion_tokens
    text: str = ""  # generated text (for the usage cross-check)
    input_len: int = 0  # from the spec, when the server reports no usage
    scheduled: float = 0.0  # planned send time (absolute); start - scheduled = client-side queueing delay
    max_tokens: int = 0  # max_tokens sent
    finish_reason: str = ""  # the last finish_reason the stream carried ("length", "stop", ...)
    interrupted: str = ""  # "in flight" or "not sent": the run was interrupted (neither a success nor a failure)
    conversation: int = -1  # a multi-turn run: the conversation and the turn (from 0) this request was
    turn: int = 0
