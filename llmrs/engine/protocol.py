"""The seams of the engine: `EngineClient`, what the server calls, and the messages over the engine-core pipe.

Three engines implement EngineClient: `AsyncEngine` (the step loop in a thread of the server's process; also the
tensor-parallel engine, whose runner drives the other GPUs' processes), and `ProcessEngine` (core_client.py: the
step loop in an engine-core process). The server (llmrs/server) is typed against EngineClient only.

The engine-core pipe (core_client.py) carries the dataclasses below, pickled:
- server -> core: a list of `EngineCommand`s per write (`AddRequest`, `AbortRequest`, `StopCore`);
- core -> server: `CoreProgress` for each start-up phase, then `CoreReady` or `CoreFailed`, then one
  `StepMessage` per step (or after commands changed the core's state), and `CoreError` before a core that fails
  exits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmrs.engine.sampling import SampleResult, SamplingParams

if TYPE_CHECKING:
    from llmrs.engine.config import ModelConfig
    from llmrs.model.tokenizer import Tokenizer


class EngineOverloaded(Exception):
    """Too many requests already wait (the server answers 429)."""


class EngineDeadError(RuntimeError):
    """The engine loop (thread or core process) is gone: new requests get a 503, open streams end in an error."""


@dataclass(slots=True)
class RequestOutput:
    """One event on a request's stream: a delta for one choice."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[SampleResult]
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    # finish_reason "error": the engine failed this request (its sampling or its token's processing), one line
    # (the server answers a 500 / an SSE error event with it)
    error: str | None = None


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    num_blocks: int
    prefix_queries: int
    prefix_hits: int
    prompt_tokens_total: int
    generation_tokens_total: int
    computed_tokens_total: int
    num_preemptions: int
    # CUDA graphs (decode and lone-prefill buckets) captured since the start, and the shapes whose capture failed,
    # which then run eagerly and slower (both 0 without graphs: the CPU, --no-graphs)
    graph_captures: int = 0
    graph_capture_failures: int = 0


class EngineClient(Protocol):
    """What the server needs of an engine: requests in, one stream of deltas per request out, stats, lifecycle."""

    tokenizer: Tokenizer
    config: ModelConfig
    model_name: str
    max_model_len: int
    max_num_batched_tokens: int
    block_size: int
    kv_cache_tokens: int
    device: str
    async_scheduling: bool
    error: BaseException | None  # set once the engine loop is gone for good (/health answers 503 "dead")

    def start(self) -> None:
        """Start the engine loop; called on the server's event loop."""
        ...

    async def shutdown(self, abort_running: bool = True) -> None:
        """Stop the loop: abort what runs (or wait for it to finish), then end the thread / process."""
        ...

    def stats(self) -> EngineStats:
        """The counters after the latest step (cheap: no call into the loop)."""
        ...

    def add_request(self, request_id: str | None, prompt_ids: list[int], params: SamplingParams
                    ) -> AsyncIterator[RequestOutput]:
        """Validate and queue a request; returns its stream. Raises UserError (a bad request), EngineOverloaded
        (--max-waiting) or EngineDeadError at once. Closing the stream early aborts the request."""
        ...

    async def abort(self, request_id: str) -> None:
        """Finish every choice of a request with reason "abort" and free its blocks."""
        ...

    def health(self) -> tuple[str, str | None]:
        """("ok", None) while serving; ("restarting", why) while a failed engine loop is being restarted
        (`--on-engine-death restart`: new requests wait for it); ("dead", why) once it is gone for good (new
        requests get a 503; `error` is set)."""
        ...


# ---------------------------------------------------------------------- server -> core
@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams  # checked and with max_tokens filled in (check_request)


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True, slots=True)
class StopCore:
    """Answer what is queued before it, then exit."""


EngineCommand = AddRequest | AbortRequest | StopCore


# ---------------------------------------------------------------------- core -> server
# One output of a step: (request_id, index, text, token_ids, logprobs, finish_reason, error), StepOutput's fields. A
# plain tuple on purpose: a step of 256 streams pickles and unpickles its tuples ~10x faster than as dataclasses.
OutputRow = tuple[str, int, str, list[int], list[SampleResult], "str | None", "str | None"]


@dataclass(frozen=True, slots=True)
class StepMessage:
    """What the core sends after a step (or after commands changed its state)."""

    outputs: list[OutputRow]  # every request that advanced
    stats: EngineStats  # after the step (for /metrics, --max-waiting, default max_tokens)
    adds_seen: int  # AddRequests the core has taken: the server counts the ones still in the pipe as waiting
    rejected: list[tuple[str, str]]  # (request_id, message) of adds the core refused


@dataclass(frozen=True, slots=True)
class CoreReady:
    """The core's engine is built and warmed up: what the server process reports and checks requests against."""

    max_model_len: int
    num_blocks: int
    max_num_batched_tokens: int
    block_size: int
    device: str
    async_scheduling: bool
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class CoreProgress:
    """A start-up phase the core begins (llm_engine.report_progress), before CoreReady."""

    phase: str


@dataclass(frozen=True, slots=True)
class CoreFailed:
    """The core's engine could not be built: a user's mistake (one line) or a bug (a traceback)."""

    user_error: bool
    message: str


@dataclass(frozen=True, slots=True)
class CoreError:
    """The core's loop failed (a step raised: a CUDA error, a bug); it exits after this."""

    message: str
    # the requests that had started in the failed core (scheduled, or with outputs): they fail; the others (still
    # waiting, never scheduled) can be sent again to a new core
    started: tuple[str, ...] = ()
