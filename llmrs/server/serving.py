"""From an HTTP request to engine requests and back: prompts in, one merged stream of deltas, OpenAI answers out.

One HTTP request may become several engine requests (a completions `prompt` that is a list: one engine request
per prompt, each with `n` choices; choice index = prompt index * n + choice). `Generation` owns them: it merges
their streams, timestamps every delta for the latency metrics, and `close()` aborts whatever has not finished,
so a client that goes away (disconnect, cancelled stream, server shutdown) frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from starlette.requests import Request

from llmrs.engine.protocol import EngineClient, EngineOverloaded
from llmrs.engine.sampling import SampleResult, SamplingParams
from llmrs.errors import UserError
from llmrs.server.errors import APIError, GenerationFailed, user_error
from llmrs.server.metrics import RequestTracker, ServerMetrics

T = TypeVar("T")
SAMPLING_FIELDS = frozenset(SamplingParams.__slots__) | {"max_completion_tokens", "top_logprobs", "prompt"}
_background: set[asyncio.Task] = set()  # strong references to fire-and-forget drains


@dataclass(slots=True)
class ServerState:
    engine: EngineClient
    metrics: ServerMetrics
    served_names: list[str]
    model_root: str
    block_size: int = 16
    max_seqs_per_request: int = 128
    created: int = field(default_factory=lambda: int(time.time()))
    live: set["Generation"] = field(default_factory=set)  # generations in flight (aborted at shutdown)
    _token_str: dict[int, str] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.served_names[0]

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def check_model(self, model: str | None) -> str:
        """The name to answer with; 404 for a model this server does not serve."""
        if model is None:
            return self.model_name
        if model not in self.served_names:
            raise APIError(404, f"the model '{model}' does not exist; this server serves: "
                           f"{', '.join(self.served_names)}", param="model", code="model_not_found")
        return model

    def check_seqs(self, prompts: int, n: int) -> None:
        """400 when a request would make more than --max-seqs-per-request sequences (prompts x n): counted from the
        body's shape, before any tokenizing or engine work."""
        limit = self.max_seqs_per_request
        if prompts * n > limit:
            what = f"{prompts} prompts x n={n}" if prompts > 1 else f"n={n}"
            raise APIError(400, f"the request makes {prompts * n} sequences ({what}); this server allows at most "
                           f"{limit} per request (--max-seqs-per-request)", param="n" if n > 1 else "prompt",
                           code="too_many_sequences")

    def check_max_tokens(self, **given: int | None) -> None:
        """400 for a max_tokens-like field outside [1, max_tokens_bound]: each one sent, also the one a request does
        not use (chat's max_tokens beside max_completion_tokens), so no out-of-range value passes unnoticed."""
        bound = max_tokens_bound(self.engine)
        for name, v in given.items():
            if v is not None and not 1 <= v <= bound:
                raise APIError(400, f"{name} must be in [1, {bound}]: prompt + {name} must fit this model's maximum "
                               f"context length ({self.engine.max_model_len} tokens) and the KV cache "
                               f"({self.engine.kv_cache_tokens} tokens), and a prompt has at least one token",
                               param=name)

    def default_max_tokens(self, prompt_len: int) -> int:
        """Whatever room the context and the KV cache leave (the engine rejects requests that could never fit)."""
        s = self.engine.stats()
        room = min(self.engine.max_model_len, s.num_blocks * self.block_size) - prompt_len
        return max(1, room)

    async def abort_all(self) -> None:
        """Abort every request in flight: their streams end with finish_reason "abort" (shutdown's deadline)."""
        for gen in list(self.live):
            for rid, ended in zip(gen.ids, gen.ended):
                if not ended:
                    await self.engine.abort(rid)

    def token_str(self, token_id: int) -> str:
        s = self._token_str.get(token_id)
        if s is None:
            s = self._token_str[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return s


def max_tokens_bound(engine: EngineClient) -> int:
    """The largest max_tokens any request could have: the context, or the KV cache where smaller, less one prompt
    token."""
    return min(engine.max_model_len, engine.kv_cache_tokens) - 1


def validate(params: SamplingParams) -> SamplingParams:
    try:
        params.validate()
    except UserError as e:
        raise user_error(e, SAMPLING_FIELDS) from None
    return params


class Generation:
    """The engine requests behind one HTTP request, as one stream of (prompt index, RequestOutput). A choice the
    engine finished with "error" raises GenerationFailed from `events()`: the caller answers a 500 (or an SSE error
    event) and `close()` aborts the rest."""

    def __init__(self, state: ServerState, ids: list[str], streams: list[AsyncIterator], n: int, arrival: float):
        self.state, self.ids, self.streams, self.n = state, ids, streams, n
        self.trackers: list[RequestTracker] = [state.metrics.tracker(arrival) for _ in ids]
        self.started = [False] * len(ids)
        self.ended = [False] * len(ids)
        self.finished: list[set[int]] = [set() for _ in ids]
        self.closed = False

    @classmethod
    async def start(cls, state: ServerState, base_id: str, prompts: list[list[int]],
                    params: list[SamplingParams], arrival: float) -> "Generation":
        """Queue every prompt; an engine refusal (bad value, too long, overloaded) undoes the ones queued."""
        ids: list[str] = []
        streams: list[AsyncIterator] = []
        try:
            for i, (prompt_ids, sp) in enumerate(zip(prompts, params)):
                rid = f"{base_id}-{i}" if len(prompts) > 1 else base_id
                streams.append(state.engine.add_request(rid, prompt_ids, sp))
                ids.append(rid)
        except BaseException as e:
            await cls(state, ids, streams, params[0].n, arrival).close(count_aborts=False)
            if isinstance(e, UserError):
                raise user_error(e, SAMPLING_FIELDS) from None
            if isinstance(e, EngineOverloaded):
                raise APIError(429, f"the server is busy: {e}; retry later", code="rate_limit_exceeded") from None
            if isinstance(e, RuntimeError):  # the engine loop is gone
                raise APIError(503, f"the engine is not available: {e}") from None
            raise
        gen = cls(state, ids, streams, params[0].n, arrival)
        state.live.add(gen)
        return gen

    def _seen(self, i: int, out: Any) -> None:
        self.trackers[i].on_output(out.index, bool(out.token_ids), out.finish_reason)
        if out.finish_reason is not None:
            self.finished[i].add(out.index)
            if out.finish_reason == "error":  # the engine failed this request (its others keep running)
                raise GenerationFailed(out.error)

    def _end(self, i: int) -> None:
        self.ended[i] = True
        self.trackers[i].on_finish()

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        if len(self.streams) == 1:  # the common case: no tasks, no queue
            self.started[0] = True
            async for out in self.streams[0]:
                self._seen(0, out)
                yield 0, out
            self._end(0)
            return
        q: asyncio.Queue = asyncio.Queue()

        async def pump(i: int) -> None:
            self.started[i] = True
            try:
                async for out in self.streams[i]:
                    q.put_nowait((i, out))
                q.put_nowait((i, None))
            except Exception as e:  # noqa: BLE001 - handed to the consumer
                q.put_nowait((i, e))

        tasks = [asyncio.create_task(pump(i)) for i in range(len(self.streams))]
        try:
            left = len(tasks)
            while left:
                i, item = await q.get()
                if item is None:
                    left -= 1
                    self._end(i)
                elif isinstance(item, Exception):
                    raise item
                else:
                    self._seen(i, item)
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()

    async def close(self, count_aborts: bool = True) -> None:
        """Abort every engine request that has not ended (idempotent; safe inside a cancelled task)."""
        if self.closed:
            return
        self.closed = True
        self.state.live.discard(self)
        engine, m = self.state.engine, self.state.metrics
        with anyio.CancelScope(shield=True):
            for i, (rid, stream) in enumerate(zip(self.ids, self.streams)):
                if self.ended[i]:
                    continue
                if count_aborts:
                    for _ in range(self.n - len(self.finished[i])):
                        m.success.labels(m.model_name, "abort").inc()
                if self.started[i]:
                    try:
                        await stream.aclose()  # the engine's stream aborts its request when closed early
                    except Exception:  # noqa: BLE001 - e.g. still running inside a cancelled task
                        pass
                await engine.abort(rid)
                if not self.started[i]:  # never iterated: drain it so the engine forgets the stream
                    task = asyncio.ensure_future(_drain(stream))
                    _background.add(task)
                    task.add_done_callback(_background.discard)


async def _drain(stream: AsyncIterator, timeout: float = 30.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            async for _ in stream:
                pass
    except (Exception, asyncio.CancelledError):  # noqa: BLE001 - best effort
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Run `work`; if the client disconnects first, cancel it and return None."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            if (await request.receive())["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        return None
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------- response pieces
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(state: ServerState, results: list[SampleResult], offset: int) -> tuple[dict, int]:
    """OpenAI's legacy completions shape; the chosen token is always among `top_logprobs`."""
    tokens, lps, tops, offsets = [], [], [], []
    for r in results:
        s = state.token_str(r.token_id)
        tokens.append(s)
        lps.append(r.logprob)
        offsets.append(offset)
        offset += len(s)
        top = {state.token_str(t): lp for t, lp in (r.top_logprobs or [])}
        top.setdefault(s, r.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, offset


def chat_logprobs(state: ServerState, results: list[SampleResult]) -> list[dict]:
    """OpenAI's chat shape: entries of `logprobs.content`."""

    def entry(token_id: int, lp: float | None) -> dict:
        s = state.token_str(token_id)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    return [{**entry(r.token_id, r.logprob), "top_logprobs": [entry(t, lp) for t, lp in (r.top_logprobs or [])]}
            for r in results]


@dataclass(slots=True)
class ChoiceAcc:
    """A non-streamed choice, accumulated from its deltas."""

    text: list[str] = field(default_factory=list)
    logprobs: list[SampleResult] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0

    def add(self, out: Any) -> None:
        if out.text:
            self.text.append(out.text)
        self.logprobs.extend(out.logprobs)
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
        self.num_output_tokens = out.num_output_tokens
