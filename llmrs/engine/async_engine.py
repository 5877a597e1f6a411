"""AsyncEngine: the LLMEngine's step loop in one background thread of the server's process, each request's deltas
handed to its own asyncio stream. `llmrs serve --no-engine-process` and tensor parallelism run it; the default
runs the loop in its own process instead (core_client.ProcessEngine). Both are EngineClients.

A step that raises (a CUDA error, a bug outside one request's own processing) is handled per
`--on-engine-death` (engine/recovery.py): with `restart` the requests that had started fail with an error (their
blocks freed, the step launched ahead dropped), the loop waits out its back-off and goes on over the same engine
(same weights, same KV pool; the requests still waiting run on it); a device left broken fails again, and after
MAX_RESTARTS failures within RESTART_WINDOW_S, or at once with `exit`, the engine is dead: every open stream
fails and the exit hook stops the server.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from llmrs.engine.llm_engine import LLMEngine, serving_config, serving_engine
from llmrs.engine.protocol import AbortRequest, EngineDeadError, EngineOverloaded, EngineStats, RequestOutput
from llmrs.engine.recovery import RestartBudget
from llmrs.engine.sampling import SamplingParams
from llmrs.engine.sequence import Sequence, StepOutput
from llmrs.errors import UserError
from llmrs.trace import tr, tr_tokens

log = logging.getLogger("llmrs.engine")

# merge a stream's queued deltas per choice (take_merged); False hands every delta on as it came (an A/B of it)
MERGE_DELTAS = True


def take_merged(pending: Any, q: asyncio.Queue | None = None) -> Any:
    """Pop the oldest of a stream's queued deltas (a deque of RequestOutput or StepOutput, oldest first, after
    everything waiting in its queue `q`; an exception ends it) with every later delta of the same choice merged into
    it, up to and including that choice's last one (text, token ids and logprobs joined; the rest, finish_reason and
    counts, the latest delta's). Other choices' deltas keep their order.

    NOTE: a consumer that finds several deltas queued is behind the engine (a host-bound server: an event-loop pass
    over 256 streams takes longer than a small model's step). Sent one by one they cost an SSE event and a socket
    send each, so it falls further behind; merged, each stream costs one a pass. vLLM's RequestOutputCollector
    merges the same way. A consumer that keeps up finds one delta at a time: nothing changes."""
    while q is not None and not q.empty():
        pending.append(q.get_nowait())
    item = pending.popleft()
    if isinstance(item, BaseException) or item.finish_reason is not None or not pending or not MERGE_DELTAS:
        return item
    texts, ids, lps = [item.text], list(item.token_ids), list(item.logprobs)
    last, keep = item, []
    while pending:
        other = pending.popleft()
        if isinstance(other, BaseException):
            keep.append(other)
            keep.extend(pending)
            pending.clear()
            break
        if other.index != item.index or last.finish_reason is not None:
            keep.append(other)
            continue
        texts.append(other.text)
        ids += other.token_ids
        lps += other.logprobs
        last = other
    pending.extend(keep)
    if last is item:
        return item
    return dataclasses.replace(last, text="".join(texts), token_ids=ids, logprobs=lps)


@dataclass(frozen=True, slots=True)
class _AddSequences:
    """AsyncEngine's add command to its loop thread: the request's sequences, built (and checked) by the caller."""

    request_id: str
    seqs: list[Sequence]


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for q, item in items:
        q.put_nowait(item)


class AsyncEngine:
    """The engine loop in one background thread; each request's deltas go to its own asyncio queue."""

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None, model_name: str | None = None,
                 on_death: str = "restart"):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.config = engine.loaded.config
        self.max_model_len = engine.max_model_len
        self.max_num_batched_tokens = engine.engine_config.max_num_batched_tokens
        self.block_size = engine.engine_config.block_size
        self.kv_cache_tokens = engine.kv.pool.num_blocks * self.block_size
        self.model_name = model_name or engine.loaded.source.name
        self.max_waiting = max_waiting
        self._commands: queue.SimpleQueue[_AddSequences | AbortRequest] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stats = engine.stats()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self.error: BaseException | None = None
        self._health: tuple[str, str | None] = ("ok", None)
        self._budget = RestartBudget(on_death)
        self._exit_hook: Callable[[], None] | None = None

    @classmethod
    def from_args(cls, model: str | None, max_waiting: int | None = None, served_model_name: str | None = None,
                  keep_quantized: bool = False, **engine_options: Any) -> "AsyncEngine":
        """`engine_options`: EngineConfig's fields (serving_config); `keep_quantized`: load()'s."""
        engine = serving_engine(model, serving_config(**engine_options), keep_quantized)
        return cls(engine, max_waiting=max_waiting, model_name=served_model_name)

    def set_death_policy(self, policy: str, exit_hook: Callable[[], None] | None = None) -> None:
        """`--on-engine-death` (restart | exit); `exit_hook` is called (from the engine thread) once the engine is
        dead for good: `llmrs serve` stops the server there and exits non-zero."""
        self._budget = RestartBudget(policy)
        self._exit_hook = exit_hook

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(target=self._loop, name="llmrs-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, abort_running: bool = True) -> None:
        if abort_running:
            for rid in list(self._streams):
                await self.abort(rid)
        else:
            while self._streams and self.error is None:
                await asyncio.sleep(0.01)
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def stats(self) -> EngineStats:
        return self._stats

    def health(self) -> tuple[str, str | None]:
        return self._health

    @property
    def device(self) -> str:
        return self.engine.runner.device

    @property
    def async_scheduling(self) -> bool:
        return self.engine.async_scheduling

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str | None, prompt_ids: list[int], params: SamplingParams
                    ) -> AsyncIterator[RequestOutput]:
        """Validate and queue a request; returns its stream (raises UserError / EngineOverloaded at once)."""
        if self.error is not None:
            raise self.error
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise UserError(f"duplicate request id {request_id}")
        if self.max_waiting is not None and self._stats.num_waiting + self._commands.qsize() >= self.max_waiting:
            raise EngineOverloaded(f"{self._stats.num_waiting} requests already wait (--max-waiting {self.max_waiting})")
        seqs = self.engine.make_sequences(request_id, prompt_ids, params)  # pure: safe off the engine thread
        q: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), q)
        self._commands.put(_AddSequences(request_id, seqs))
        tr("cmd_sent")
        self._wake.set()
        return self._stream(request_id, q, len(seqs), len(prompt_ids))

    async def _stream(self, request_id: str, q: asyncio.Queue, n: int, n_prompt: int
                      ) -> AsyncIterator[RequestOutput]:
        finished = 0
        counts = [0] * n
        pending: collections.deque = collections.deque()
        try:
            while finished < n:
                if not pending:
                    pending.append(await q.get())
                item = take_merged(pending, q)  # with everything queued meanwhile, merged per choice
                if isinstance(item, BaseException):
                    raise item
                counts[item.index] += len(item.token_ids)
                if item.finish_reason is not None:
                    finished += 1
                yield RequestOutput(request_id, item.index, item.text, item.token_ids, item.logprobs,
                                    item.finish_reason, n_prompt, counts[item.index], item.error)
        finally:
            if finished < n:  # the consumer went away (client disconnect, cancellation): abort now
                self._commands.put(AbortRequest(request_id))
                self._wake.set()
            self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._commands.put(AbortRequest(request_id))
        self._wake.set()

    # ------------------------------------------------------------------ the loop (engine thread)
    def _deliver(self, outputs: list[StepOutput]) -> None:
        """Hand a step's outputs to their streams: one thread-safe call per event loop, not one per output.

        NOTE: each `call_soon_threadsafe` writes to the loop's self-pipe (a syscall, taken under the GIL); at 256
        streams that was milliseconds per step."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, StepOutput]]] = {}
        streams = self._streams
        for o in outputs:
            target = streams.get(o.request_id)
            if target is not None:
                loop, q = target
                items = by_loop.get(loop)
                if items is None:
                    items = by_loop[loop] = []
                items.append((q, o))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _drain_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _AddSequences):
                if cmd.request_id in self._streams:  # not aborted before it arrived
                    self.engine.add_sequences(cmd.request_id, cmd.seqs)
            else:
                self._deliver(self.engine.abort(cmd.request_id))
                self._streams.pop(cmd.request_id, None)  # its queue already holds the abort; a never-read stream is dropped

    def _loop(self) -> None:
        while True:
            try:
                self._run()
                return
            except BaseException as e:  # noqa: BLE001 - a whole step failed: --on-engine-death says what next
                if not self._recover(e):
                    return

    def _run(self) -> None:
        while True:
            self._drain_commands()  # also after a stop: queued aborts are delivered before the loop ends
            if self._stop:
                return
            if self.engine.has_unfinished():
                t0 = time.perf_counter()
                tr("core_step")
                outputs = self.engine.step()
                tr_tokens(outputs)
                self._stats = self.engine.stats()
                self._deliver(outputs)
                self.last_step_s = time.perf_counter() - t0
            else:
                self._stats = self.engine.stats()
                self._wake.wait(timeout=0.1)
                self._wake.clear()

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for rid in request_ids:
            target = self._streams.get(rid)
            if target is not None:
                loop, q = target
                loop.call_soon_threadsafe(q.put_nowait, error)

    def _recover(self, e: BaseException) -> bool:
        """After the loop raised `e` (on the engine thread): fail the requests that had started and, per the death
        policy, wait out the back-off and return True (the loop goes on), or mark the engine dead, fail every open
        stream, call the exit hook and return False."""
        why = f"the engine loop failed: {type(e).__name__}: {e}"
        log.error("llmrs: %s", why, exc_info=e)
        if self._stop:  # failed while stopping: nothing to restart for
            return self._die(why)
        backoff = self._budget.next_backoff()
        if backoff is None:
            return self._die(f"{why}; not restarted ({self._budget.give_up_reason()})")
        self._health = ("restarting", why)
        try:
            started = self.engine.drop_started()
        except BaseException as e2:  # noqa: BLE001 - the engine's own state is broken: nothing to restart over
            return self._die(f"{why}; then, freeing its requests: {type(e2).__name__}: {e2}")
        self._fail(started, EngineDeadError(f"{why}; the request had started and cannot be resumed"))
        self._stats = self.engine.stats()
        log.warning("llmrs: %d started request(s) failed; the engine loop restarts in %.1f s (restart %d)",
                    len(started), backoff, self._budget.restarts)
        deadline = time.monotonic() + backoff
        while not self._stop and (left := deadline - time.monotonic()) > 0:  # (new requests wake it: wait on)
            self._wake.wait(timeout=left)
            self._wake.clear()
        self._health = ("ok", None)
        return True

    def _die(self, why: str) -> bool:
        """The engine is dead for good: every open stream fails, new requests get a 503, the exit hook runs (unless
        the server was stopping already: read before the streams fail, whose consumers may then stop it)."""
        stopping = self._stop
        self.error = EngineDeadError(why)
        self._health = ("dead", why)
        log.error("llmrs: the engine is dead: %s", why)
        self._fail(list(self._streams), self.error)
        if self._exit_hook is not None and not stopping:
            self._exit_hook()
        return False
