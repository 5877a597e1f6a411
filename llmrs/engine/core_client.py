"""The engine core in its own process, as vLLM V1 runs it: `llmrs serve`'s default (`--no-engine-process` keeps
one process).

Why: in one process, the step loop (a thread) and the event loop (HTTP, SSE, one async generator chain per
stream) share the GIL; at 256 streams the event loop's ~7 ms of work per step lands on the step's critical path.
Here the child process owns the LLMEngine (scheduler, KV cache, runner/model, sampling, detokenization: the text
is the same as in one process, made by the same `Sequence` code) and runs the step loop; the API server process
keeps HTTP, the tokenizer (/tokenize, chat templates, logprob strings) and the asyncio streams.

Wire: two one-way `multiprocessing.Pipe`s carrying protocol.py's messages, pickled.
- server -> core: a list of EngineCommands per write (AddRequest, AbortRequest, StopCore). The event loop batches
  the commands of one loop pass and writes them itself, in Connection's framing (4-byte length + pickle), through
  a non-blocking pipe end (what does not fit waits for `loop.add_writer`), so it never blocks on the pipe and a
  request reaches the core without a thread's wake-up in between.
- core -> server: once per step (or after commands changed its state) ONE StepMessage: the outputs of every
  request that advanced, the EngineStats after the step, how many adds the core has taken (so the server counts
  the ones still in the pipe as waiting) and the adds the core refused.
- start-up: CoreReady or CoreFailed; a core whose step raises sends CoreError (why, and the requests it had
  started) before it exits. The server reads the pipe with `loop.add_reader` (no thread); EOF while not stopping
  means the core died: `ProcessEngine` reaps it and restarts it or gives up, per `--on-engine-death`
  (engine/recovery.py).

The core ignores SIGINT / SIGTERM (Ctrl-C reaches the whole process group): the server stops it with StopCore
after its own shutdown, and it exits on its own when the server's end of the pipe closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import gc
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import struct
import time
import traceback
from collections.abc import AsyncIterator, Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

from llmrs.engine.async_engine import take_merged
from llmrs.engine.llm_engine import (LLMEngine, check_request, progress_to, report_progress, serving_config,
                                     serving_engine)
from llmrs.engine.protocol import (
    AbortRequest, AddRequest, CoreError, CoreFailed, CoreProgress, CoreReady, EngineCommand, EngineDeadError,
    EngineOverloaded, EngineStats, RequestOutput, StepMessage, StopCore,
)
from llmrs.engine.recovery import RestartBudget
from llmrs.engine.sampling import SamplingParams
from llmrs.errors import UserError
from llmrs.model.loader import LoadedModel, load
from llmrs.trace import tr, tr_tokens

log = logging.getLogger("llmrs.engine")

# Within one long event-loop pass (a burst of requests handled back to back), the commands queued since the last
# write go out once this long has passed; otherwise a burst's adds all reach the core at the pass's end, hundreds of
# ms after the first, with the GPU decoding one sequence meanwhile (`ProcessEngine._send`).
FLUSH_EVERY_S = 1e-3


def idle_spin_s() -> float:
    """How long the core, once idle, keeps polling its command pipe before it blocks on it (and the server's loop
    stays awake after a request or a step message, `ProcessEngine._stay_hot`), in seconds. A process that sleeps
    in poll() comes back slowly: its CPU has dropped to a low clock or a deep idle state and its caches are cold,
    and the first request after the sleep pays it before its prefill starts. 20 ms on a machine of 4 or more CPUs,
    0 below (there the spinning core would take the CPU the API server and the clients need)."""
    return 0.02 if (os.cpu_count() or 1) >= 4 else 0.0


def wait_command(commands, spin_s: float) -> bool:
    """Block until `commands` has something to read (or EOF): polled without sleeping for up to `spin_s` first, then
    a blocking poll. True, as `Connection.poll(None)` returns."""
    if spin_s > 0.0:
        deadline = time.monotonic() + spin_s
        poll = commands.poll
        while time.monotonic() < deadline:
            if poll(0):
                return True
    return commands.poll(None)


def freeze_heap() -> None:
    """Move every object alive now (modules, the tokenizer, the model's host objects, the app) into the garbage
    collector's permanent generation, as vLLM does after start-up: a full collection then walks only what the
    serving loop made since, instead of the whole start-up heap. Without it a serving process pauses for tens of
    ms at each full collection (H200, 7B, 256 streams: every stream's inter-token gap at the same instants)."""
    gc.collect()
    gc.freeze()


# ---------------------------------------------------------------------- the core (child process)
def core_main(factory: Callable[[], LLMEngine], commands, outputs) -> None:
    """Entry point of the core process: build the engine, say ready, run the loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A BrokenPipeError / EOFError on the pipes means the server is gone (stopped while the model loaded, or
    # killed): the core ends quietly, as it does when the server closes the pipe between steps.
    try:
        with progress_to(lambda phase: outputs.send(CoreProgress(phase))):
            engine = factory()
    except UserError as e:
        with contextlib.suppress(BrokenPipeError):
            outputs.send(CoreFailed(user_error=True, message=str(e)))
        return
    except BaseException:  # noqa: BLE001 - reported to the server, which prints it
        with contextlib.suppress(BrokenPipeError):
            outputs.send(CoreFailed(user_error=False, message=traceback.format_exc()))
        return
    freeze_heap()
    try:
        outputs.send(CoreReady(max_model_len=engine.max_model_len, num_blocks=engine.kv.pool.num_blocks,
                               max_num_batched_tokens=engine.engine_config.max_num_batched_tokens,
                               block_size=engine.kv.block_size, device=engine.runner.device,
                               async_scheduling=engine.async_scheduling, stats=engine.stats()))
        run_core(engine, commands, outputs)
    except (EOFError, BrokenPipeError):  # the server's end of a pipe closed: it is gone, so is the core
        pass
    except BaseException as e:  # a step raised (a CUDA error, a bug): tell the server why and whom it took down
        try:
            started = tuple(engine.started_requests())
        except Exception:  # noqa: BLE001 - the engine's state is broken too: the server goes by what it saw
            started = ()
        try:
            outputs.send(CoreError(f"{type(e).__name__}: {e}", started))
        except OSError:
            pass
        raise  # (the traceback goes to stderr; the process exits with code 1)
    finally:
        engine.runner.shutdown()


def run_core(engine: LLMEngine, commands, outputs) -> None:
    """The step loop: take every queued command, step if anything runs, send one message for the step."""
    adds_seen = 0
    spin_s = idle_spin_s()
    while True:
        pending: list = []
        rejected: list[tuple[str, str]] = []
        stop = changed = False
        # block only when idle (after spinning for spin_s); EOF (the server is gone) raises EOFError here and ends
        # the process
        while (commands.poll(0) if engine.has_unfinished() or changed else wait_command(commands, spin_s)):
            changed = True
            tr("core_recv")
            cmd: EngineCommand
            for cmd in commands.recv():
                if isinstance(cmd, AddRequest):
                    rid = cmd.request_id
                    adds_seen += 1
                    try:
                        engine.add_sequences(rid, engine.make_sequences(rid, cmd.prompt_ids, cmd.params))
                    except UserError as e:  # the server checked it already: only if the two disagree
                        rejected.append((rid, str(e)))
                elif isinstance(cmd, AbortRequest):
                    pending.extend(engine.abort(cmd.request_id))
                else:
                    assert isinstance(cmd, StopCore), cmd
                    stop = True
        if not stop and engine.has_unfinished():
            tr("core_step")
            pending.extend(engine.step())
            tr_tokens(pending)
        outputs.send(StepMessage([(o.request_id, o.index, o.text, o.token_ids, o.logprobs, o.finish_reason, o.error)
                                  for o in pending], engine.stats(), adds_seen, rejected))
        if stop:
            return


# ---------------------------------------------------------------------- the server side
def start_core(factory: Callable[[], LLMEngine], on_start: Callable[[Any], None] | None = None):
    """Start a core process (`factory` builds its LLMEngine there; it must pickle) and wait until it is ready;
    returns (process, command pipe's end, output pipe's end, CoreReady). `on_start(process)` is called once it
    runs (a caller in another thread may kill it meanwhile). A core that fails to start is reaped and raises:
    UserError for a user's mistake, RuntimeError for a bug."""
    report_progress("starting the engine core process")
    ctx = multiprocessing.get_context("spawn")
    cmd_recv, cmd_send = ctx.Pipe(duplex=False)
    out_recv, out_send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=core_main, args=(factory, cmd_recv, out_send), name="llmrs-engine-core", daemon=True)
    proc.start()
    cmd_recv.close()  # the child's ends: closed here, so the child's death is an EOF on our end
    out_send.close()
    if on_start is not None:
        on_start(proc)
    try:
        info = _wait_ready(proc, out_recv)
    except BaseException:
        proc.kill()
        proc.join(5)
        cmd_send.close()
        out_recv.close()
        raise
    return proc, cmd_send, out_recv, info


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# the EngineStats counters; a restarted core counts from 0, the server adds what the dead cores counted
_COUNTERS = ("prefix_queries", "prefix_hits", "prompt_tokens_total", "generation_tokens_total",
             "computed_tokens_total", "num_preemptions", "graph_captures", "graph_capture_failures")


class _Stream:
    """A request on the server side: its queue of deltas, each choice's output count, the AddRequest (sent again to
    a restarted core while nothing of it has come back), and how it stands."""

    __slots__ = ("q", "counts", "n_prompt", "add", "done", "aborted", "failed")

    def __init__(self, q: asyncio.Queue, add: AddRequest):
        self.q = q
        self.counts = [0] * add.params.n
        self.n_prompt = len(add.prompt_ids)
        self.add = add
        self.done = 0  # choices finished
        self.aborted = False  # an abort was sent for it
        self.failed = False  # it ended in an error (the core died after it had started)

    def started(self) -> bool:
        return self.done > 0 or any(self.counts)


class ProcessEngine:
    """The EngineClient over an engine core in a child process.

    When the core dies (killed, out of memory, a step that raised), `--on-engine-death` (engine/recovery.py) says
    what happens: with `restart`, the requests that had started (outputs streamed, or the dead core said it was
    running them) fail with an error, the dead core is reaped, and a new one is started after a back-off; the
    requests still waiting, and new ones that arrive meanwhile (they wait, as queued requests do), go to it. After
    MAX_RESTARTS deaths within RESTART_WINDOW_S, or at once with `exit`, the engine is dead: every stream fails, new
    requests get a 503 and the exit hook stops the server. /health says which (`health()`)."""

    def __init__(self, loaded: LoadedModel, proc, commands, outputs, info: CoreReady, max_waiting: int | None = None,
                 model_name: str | None = None, flush_every: float = FLUSH_EVERY_S, idle_spin: float | None = None,
                 factory: Callable[[], LLMEngine] | None = None, on_death: str = "restart"):
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.config = loaded.config
        self.max_model_len = info.max_model_len
        self.max_num_batched_tokens = info.max_num_batched_tokens
        self.block_size = info.block_size
        self.num_blocks = info.num_blocks
        self.kv_cache_tokens = self.num_blocks * self.block_size
        self.device = info.device
        self.async_scheduling = info.async_scheduling
        self.model_name = model_name or loaded.source.name
        self.max_waiting = max_waiting
        self.error: BaseException | None = None
        self._proc, self._commands, self._outputs = proc, commands, outputs
        self._stats: EngineStats = info.stats
        self._streams: dict[str, _Stream] = {}
        self._pending: list[EngineCommand] = []  # commands of this loop pass, written together by _flush_commands
        self._flush_scheduled = False
        self._wrote_this_pass = False  # a command went out at once in this loop pass (`_send`)
        self._flush_every = flush_every  # within a pass, a write at most this often (`_send`)
        self._last_write = 0.0  # time.monotonic() of the last write from `_send`
        self._wbuf = bytearray()  # framed bytes the pipe did not take yet, from offset _woff on
        self._woff = 0
        self._writing = False  # a loop writer is registered for the rest of _wbuf
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gone: asyncio.Future | None = None
        self._stopping = False
        self._adds_sent = self._adds_seen = 0
        self._ids = itertools.count()
        # the event loop kept from sleeping in its poll while requests run and `_spin_s` after (`_stay_hot`)
        self._spin_s = idle_spin_s() if idle_spin is None else idle_spin
        self._hot_until = 0.0
        self._spinning = False
        # the core's death and its restart (engine/recovery.py)
        self._factory = factory  # builds a new core's engine (None: no restart)
        self._budget = RestartBudget(on_death)
        self._exit_hook: Callable[[], None] | None = None
        self._health: tuple[str, str | None] = ("ok", None)
        self._restarting = False  # the core is dead and a new one is on its way: commands wait for it
        self._recovery: asyncio.Task | None = None
        self._spawning = None  # the process of a core being started (shutdown kills it)
        self._stop_event: asyncio.Event | None = None
        self._death_msg: str | None = None  # CoreError's message from the dying core
        self._core_started: set[str] = set()  # and the requests it had started
        self._base: dict[str, int] | None = None  # the dead cores' counters (stats())

    @classmethod
    def spawn(cls, loaded: LoadedModel, factory: Callable[[], LLMEngine], max_waiting: int | None = None,
              model_name: str | None = None, on_death: str = "restart") -> "ProcessEngine":
        """Start the core process (`factory` builds its LLMEngine there, also a restarted core's; it must pickle)
        and wait until it is ready. A core that fails to start raises here: UserError for a user's mistake,
        RuntimeError for a bug."""
        proc, commands, outputs, info = start_core(factory)
        return cls(loaded, proc, commands, outputs, info, max_waiting, model_name, factory=factory,
                   on_death=on_death)

    def set_death_policy(self, policy: str, exit_hook: Callable[[], None] | None = None) -> None:
        """`--on-engine-death` (restart | exit); `exit_hook` is called (on the event loop) once the engine is dead
        for good: `llmrs serve` stops the server there and exits non-zero."""
        self._budget = RestartBudget(policy)
        self._exit_hook = exit_hook

    @classmethod
    def from_args(cls, model: str | None, max_waiting: int | None = None, served_model_name: str | None = None,
                  keep_quantized: bool = False, **engine_options: Any) -> "ProcessEngine":
        """AsyncEngine.from_args's options; the core loads the weights, this process only config + tokenizer."""
        cfg = serving_config(**engine_options)
        loaded = load(model, read_tensors=False)
        return cls.spawn(loaded, functools.partial(serving_engine, model, cfg, keep_quantized), max_waiting,
                         served_model_name)

    @property
    def pid(self) -> int | None:
        """The current core process's id."""
        return self._proc.pid

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Called on the server's event loop: read the core's messages there, write its commands from there."""
        assert self._loop is None
        self._loop = asyncio.get_running_loop()
        self._gone = self._loop.create_future()
        self._stop_event = asyncio.Event()
        self._loop.add_reader(self._outputs.fileno(), self._on_readable)
        os.set_blocking(self._commands.fileno(), False)

    async def shutdown(self, abort_running: bool = True) -> None:
        if abort_running:
            for rid in list(self._streams):
                await self.abort(rid)
        else:
            while self._streams and self.error is None:
                await asyncio.sleep(0.01)
        self._stopping = True
        if self._recovery is not None and not self._recovery.done():  # a core is being restarted: stop that
            self._stop_event.set()
            spawning = self._spawning
            if spawning is not None:
                spawning.kill()  # (its start-up then fails; the recovery reaps it)
            await asyncio.gather(self._recovery, return_exceptions=True)
        if self._gone is None:  # never started: nothing reads the core's messages (_send writes at once)
            self._send(StopCore())
        elif self.error is None and not self._restarting:
            self._send(StopCore())
            try:  # the core answers the queued aborts, then exits: EOF
                await asyncio.wait_for(asyncio.shield(self._gone), timeout=30)
            except TimeoutError:
                pass
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._proc.join, 10)
        if self._proc.is_alive():
            self._proc.kill()
            await loop.run_in_executor(None, self._proc.join, 5)
        self._close_reader()
        self._close_writer()

    def stats(self) -> EngineStats:
        s = self._stats
        if self._base is None:
            return s
        return dataclasses.replace(s, **{k: getattr(s, k) + v for k, v in self._base.items()})

    def health(self) -> tuple[str, str | None]:
        return self._health

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str | None, prompt_ids: list[int], params: SamplingParams
                    ) -> AsyncIterator[RequestOutput]:
        """Validate and queue a request; returns its stream (raises UserError / EngineOverloaded /
        EngineDeadError at once)."""
        if self.error is not None:
            raise self.error
        if self._stopping:
            raise EngineDeadError("the engine is shutting down")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise UserError(f"duplicate request id {request_id}")
        in_pipe = self._adds_sent - self._adds_seen
        if self.max_waiting is not None and self._stats.num_waiting + in_pipe >= self.max_waiting:
            raise EngineOverloaded(f"{self._stats.num_waiting + in_pipe} requests already wait "
                                   f"(--max-waiting {self.max_waiting})")
        prompt_ids, params = check_request(prompt_ids, params, self.config.vocab_size, self.max_model_len,
                                           self.num_blocks, self.block_size)
        q: asyncio.Queue = asyncio.Queue()
        add = AddRequest(request_id, prompt_ids, params)
        self._streams[request_id] = _Stream(q, add)
        self._adds_sent += 1
        tr("add_request")
        self._send(add)  # (while a core restarts: it goes to the new one with the other waiting requests)
        self._stay_hot()
        return self._stream(request_id, q, params.n)

    async def _stream(self, request_id: str, q: asyncio.Queue, n: int) -> AsyncIterator[RequestOutput]:
        finished = 0
        pending: collections.deque = collections.deque()
        try:
            while finished < n:
                if not pending:
                    pending.append(await q.get())
                item = take_merged(pending, q)  # with everything queued meanwhile, merged per choice
                if isinstance(item, BaseException):
                    raise item
                if item.finish_reason is not None:
                    finished += 1
                yield item
        finally:
            s = self._streams.pop(request_id, None)
            if finished < n and self.error is None and s is not None and not s.failed:  # the consumer went away
                self._send(AbortRequest(request_id))

    async def abort(self, request_id: str) -> None:
        if self.error is not None:
            return
        s = self._streams.get(request_id)
        if s is None:
            self._send(AbortRequest(request_id))
            return
        if self._restarting:  # the new core has not seen it: it ends here (nothing of it had started)
            if not s.failed and s.done < len(s.counts):
                s.done = len(s.counts)
                for i, c in enumerate(s.counts):
                    s.q.put_nowait(RequestOutput(request_id, i, "", [], [], "abort", s.n_prompt, c))
            return
        s.aborted = True
        self._send(AbortRequest(request_id))

    # ------------------------------------------------------------------ the pipes
    def _send(self, cmd: EngineCommand) -> None:
        """Queue a command (on the event loop); the commands of one loop pass go out in one write, at its end."""
        if self._restarting:  # no core to take it: the new core gets the waiting requests' adds when it is up
            return
        if self._loop is None:  # not started: nothing else writes the pipe, a blocking send of its own
            if not self._commands.closed:
                try:
                    self._commands.send([cmd])
                except OSError:  # the core is gone
                    pass
            return
        if self._loop.is_closed():  # a stream finalized after the loop ended: nothing reads the core any more
            return
        self._pending.append(cmd)
        # the first command of a loop pass goes out now (a request reaches the core without waiting for the rest of
        # the pass: the response's start, other callbacks); the later ones of the same pass together at its end
        # (`_flush_commands`), or with the next command `_flush_every` after the last write (a long pass: a burst
        # of requests handled back to back)
        now = time.monotonic()
        first = not self._wrote_this_pass
        if first:
            self._wrote_this_pass = True
            self._loop.call_soon(self._end_pass)
        if first or now - self._last_write >= self._flush_every:
            self._last_write = now
            self._flush_commands()
            return
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        self._loop.call_soon(self._flush_commands)

    def _end_pass(self) -> None:
        self._wrote_this_pass = False

    def _flush_commands(self) -> None:
        self._flush_scheduled = False
        if not self._pending or self._commands.closed:
            self._pending.clear()
            return
        data = ForkingPickler.dumps(self._pending)
        self._pending = []
        self._wbuf += struct.pack("!i", len(data))  # Connection.recv's framing (messages < 2 GiB)
        self._wbuf += data
        tr("cmd_sent")
        self._write_some()

    def _write_some(self) -> None:
        """Write what the pipe takes now; the rest when the loop says it is writable again. The written part of
        the buffer is skipped by an offset (not cut off after every write: a large backlog would be moved once a
        pipe's worth) and dropped when all of it is out, or when it is most of a buffer past 1 MiB."""
        fd = self._commands.fileno()
        try:
            while self._woff < len(self._wbuf):
                with memoryview(self._wbuf)[self._woff:] as rest:
                    self._woff += os.write(fd, rest)
        except BlockingIOError:
            pass
        except OSError:  # the core is gone; the reader reports it
            self._woff = len(self._wbuf)
        if self._woff >= len(self._wbuf):
            self._wbuf.clear()
            self._woff = 0
        elif self._woff > 1 << 20 and 2 * self._woff > len(self._wbuf):
            del self._wbuf[: self._woff]
            self._woff = 0
        if self._wbuf and not self._writing:
            self._loop.add_writer(fd, self._write_some)
            self._writing = True
        elif not self._wbuf and self._writing:
            self._loop.remove_writer(fd)
            self._writing = False

    def _close_writer(self) -> None:
        if self._writing:
            self._loop.remove_writer(self._commands.fileno())
            self._writing = False
        self._commands.close()

    def _stay_hot(self) -> None:
        """Keep the event loop from sleeping in its poll for the next `_spin_s` (idle_spin_s): a callback that
        queues itself again makes every loop pass poll without a timeout. Called when a request comes in and when
        the core's step message arrives, so the loop is awake for the next message and for the next request after
        the last one ends, as the core is (`wait_command`): a process woken from a sleep in poll() takes a while to
        get going."""
        if self._spin_s <= 0.0 or self._loop is None:
            return
        self._hot_until = time.monotonic() + self._spin_s
        if not self._spinning:
            self._spinning = True
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        if time.monotonic() < self._hot_until and not self._stopping and not self._loop.is_closed():
            self._loop.call_soon(self._spin)
        else:
            self._spinning = False

    def _on_readable(self) -> None:
        tr("server_out")
        self._stay_hot()
        try:
            while self._outputs.poll():
                self._handle(self._outputs.recv())
        except (EOFError, OSError):
            self._core_gone()

    def _handle(self, msg: StepMessage | CoreError) -> None:
        if isinstance(msg, CoreError):  # the core's loop failed; its EOF follows (`_core_gone`)
            self._death_msg, self._core_started = msg.message, set(msg.started)
            return
        self._stats, self._adds_seen = msg.stats, msg.adds_seen
        streams = self._streams
        for rid, index, text, token_ids, logprobs, finish_reason, error in msg.outputs:
            s = streams.get(rid)
            if s is None:
                continue
            counts = s.counts
            counts[index] += len(token_ids)
            if finish_reason is not None:
                s.done += 1
            s.q.put_nowait(RequestOutput(rid, index, text, token_ids, logprobs, finish_reason, s.n_prompt,
                                         counts[index], error))
        for rid, message in msg.rejected:
            s = streams.get(rid)
            if s is not None:
                s.q.put_nowait(UserError(message))

    def _core_gone(self) -> None:
        """EOF on the core's output pipe: it exited. Expected after StopCore; otherwise it died (recovery)."""
        self._close_reader()
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)
        if self._stopping:  # (whatever had not ended by now will not: StopCore answered the aborts)
            self._fail_all(EngineDeadError("the engine core process exited during shutdown"))
            return
        if self.error is not None or self._restarting:
            return
        self._restarting = True
        self._health = ("restarting", "the engine core process died")
        self._close_writer()
        self._pending.clear()
        self._wbuf.clear()
        self._woff = 0
        self._recovery = self._loop.create_task(self._recover_or_die())

    # ------------------------------------------------------------------ the core's death (engine/recovery.py)
    async def _recover_or_die(self) -> None:
        try:
            await self._recover()
        except Exception as e:  # noqa: BLE001 - a bug in the recovery itself: never leave the engine "restarting"
            log.exception("llmrs: the engine core's restart failed")
            self._die(f"the engine core's restart failed: {type(e).__name__}: {e}")

    async def _recover(self) -> None:
        """Reap the dead core, fail the requests that had started, then start a new core after the back-off (again
        if that fails) or, per the death policy, give up: the engine is dead."""
        loop = asyncio.get_running_loop()
        proc = self._proc
        await loop.run_in_executor(None, proc.join, 5)  # reaped: no zombie
        if proc.is_alive():  # said CoreError but did not exit
            proc.kill()
            await loop.run_in_executor(None, proc.join, 5)
        if self._death_msg is not None:
            why = f"the engine core process failed: {self._death_msg}"
        else:
            why = f"the engine core process died ({_exit_status(proc.exitcode)})"
        log.error("llmrs: %s", why)
        self._fail_started(why)
        while True:
            backoff = None if self._stopping or self._factory is None else self._budget.next_backoff()
            if backoff is None:
                if self._stopping:  # the server stops: no new core (not a death of its own: no exit hook, no error)
                    self._fail_all(EngineDeadError(f"{why}; the server is shutting down"))
                elif self._factory is None:
                    self._die(f"{why}; not restarted (no factory to build a new core)")
                else:
                    self._die(f"{why}; not restarted ({self._budget.give_up_reason()})")
                return
            self._health = ("restarting", why)
            log.warning("llmrs: restarting the engine core in %.1f s (restart %d)", backoff, self._budget.restarts)
            try:
                await asyncio.wait_for(self._stop_event.wait(), timeout=backoff)
            except TimeoutError:
                pass
            if self._stopping:
                continue
            try:
                core = await loop.run_in_executor(None, start_core, self._factory, self._on_spawn)
            except Exception as e:  # noqa: BLE001 - a start-up that failed counts as another death
                why = f"the engine core failed to restart: {e}"
                log.error("llmrs: %s", why)
                continue
            finally:
                self._spawning = None
            if self._stopping:  # shut down while it started: stop it again
                core[0].kill()
                await loop.run_in_executor(None, core[0].join, 5)
                core[1].close()
                core[2].close()
                continue
            self._install(*core)
            return

    def _on_spawn(self, proc) -> None:
        self._spawning = proc

    def _fail_started(self, why: str) -> None:
        """The requests that had started in the dead core end with an error; the waiting ones stay for the next."""
        err = EngineDeadError(f"{why}; the request had started and cannot be resumed")
        waiting = 0
        for rid, s in self._streams.items():
            if s.failed or s.done >= len(s.counts):
                continue
            if s.aborted or s.started() or rid in self._core_started:
                s.failed = True
                s.q.put_nowait(err)
            else:
                waiting += 1
        self._adds_sent, self._adds_seen = waiting, 0
        # the dead core's counters carry over into stats(); its gauges are gone with it
        last = self._stats
        base = self._base or dict.fromkeys(_COUNTERS, 0)
        self._base = {k: v + getattr(last, k) for k, v in base.items()}
        self._stats = dataclasses.replace(last, num_running=0, num_waiting=0, kv_usage=0.0,
                                          num_free_blocks=last.num_blocks, **dict.fromkeys(_COUNTERS, 0))

    def _fail_all(self, err: EngineDeadError) -> None:
        for s in self._streams.values():
            if not s.failed and s.done < len(s.counts):
                s.failed = True
                s.q.put_nowait(err)

    def _die(self, why: str) -> None:
        """Dead for good: every open stream fails, new requests get a 503, the exit hook stops the server."""
        self.error = EngineDeadError(why)
        self._health = ("dead", why)
        log.error("llmrs: the engine is dead: %s", why)
        self._fail_all(self.error)
        if self._exit_hook is not None and not self._stopping:
            self._exit_hook()

    def _install(self, proc, commands, outputs, info: CoreReady) -> None:
        """A new core is up: read and write its pipes, send it the requests still waiting (in arrival order)."""
        self._proc, self._commands, self._outputs = proc, commands, outputs
        self._stats = info.stats
        self._death_msg, self._core_started = None, set()
        self._writing = False
        self._gone = self._loop.create_future()
        self._loop.add_reader(outputs.fileno(), self._on_readable)
        os.set_blocking(commands.fileno(), False)
        self._restarting = False
        self._health = ("ok", None)
        waiting = [s.add for s in self._streams.values() if not (s.failed or s.aborted or s.done >= len(s.counts))]
        self._adds_sent, self._adds_seen = len(waiting), 0
        for add in waiting:
            self._send(add)
        log.warning("llmrs: the engine core restarted (process %d); %d waiting request(s) sent to it", proc.pid,
                    len(waiting))

    def _close_reader(self) -> None:
        if self._loop is not None and not self._outputs.closed:
            self._loop.remove_reader(self._outputs.fileno())
            self._outputs.close()


def _wait_ready(proc, outputs) -> CoreReady:
    while True:
        ready = multiprocessing.connection.wait([outputs, proc.sentinel])
        if outputs in ready:
            try:
                msg = outputs.recv()
            except EOFError:
                msg = None
            if isinstance(msg, CoreProgress):
                report_progress(msg.phase)
                continue
            if isinstance(msg, CoreReady):
                return msg
            if isinstance(msg, CoreFailed):
                if msg.user_error:
                    raise UserError(msg.message)
                raise RuntimeError(f"the engine core process failed to start:\n{msg.message}")
        if proc.sentinel in ready or (outputs in ready):
            proc.join(5)
            raise RuntimeError(f"the engine core process exited during start-up (exit code {proc.exitcode})")
