"""Request / Sequence state: tokens, detokenized text, stop handling, finish reason.

Stop strings are not included in the output and are caught when split across tokens: the text that could
still turn into a stop string (the longest suffix that is a prefix of one) is held back until the next token
decides, and flushed when the sequence finishes for another reason.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field

from llmrs.engine.sampling import SampleResult, SamplingParams, SamplingState, make_generator
from llmrs.model.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger("llmrs.engine")


def one_line(message: str, limit: int = 500) -> str:
    """An error message as one line of at most `limit` characters (what a client is sent)."""
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# the members as module constants: `SequenceStatus.FINISHED` is an attribute lookup on the enum class (~65 ns on a
# 2-core VM), paid per sequence a step in the scheduler's loops
WAITING, RUNNING, FINISHED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.FINISHED


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one sequence (a streaming delta)."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[SampleResult]
    finish_reason: str | None  # None while running; "stop" | "length" | "abort" | "error"
    error: str | None = None  # with finish_reason "error": why the engine failed the request (one line)


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    tokenizer: Tokenizer
    eos_token_ids: list[int]
    max_model_len: int
    index: int = 0  # choice index among the request's n sequences
    arrival_time: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[SampleResult] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # finish_reason "error": why
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache (or are being written by a planned step)
    # tokens sampled by planned steps whose results are not back yet (at most 2 with one step run ahead: the
    # one the step in flight samples, and the one the step planned after it samples); the newest one is entry
    # `pending_index` of the last planned step's samples, which the next step reads on the device
    num_pending: int = 0
    pending_index: int = -1
    block_table: list[int] = field(default_factory=list)
    text: str = ""  # decoded output, stop string removed
    emitted: int = 0  # characters of `text` already handed out
    sampling: SamplingState = field(init=False)
    detok: IncrementalDetokenizer = field(init=False)
    _length_limit: int = field(init=False)  # outputs at which "length" ends the sequence

    def __post_init__(self) -> None:
        p = self.params
        seed = None if p.seed is None else p.seed + self.index
        stop_ids = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_token_ids))
        # a greedy request never draws: no generator (numpy seeding one from the OS costs ~10-20 us a request)
        gen = None if p.greedy else make_generator(seed)
        self.sampling = SamplingState(p, gen, self.prompt_ids, self.output_ids, stop_ids)
        self.detok = IncrementalDetokenizer(self.tokenizer, self.prompt_ids, p.skip_special_tokens)
        limit = self.max_model_len - len(self.prompt_ids)
        self._length_limit = limit if p.max_tokens is None else min(p.max_tokens, limit)

    # ------------------------------------------------------------------ lengths
    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        """Prompt + outputs, counting the sampled tokens still in flight."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending

    @property
    def at_length_limit(self) -> bool:
        """The outputs (in flight included) reach max_tokens / the context: the sequence ends with them."""
        return len(self.output_ids) + self.num_pending >= self._length_limit

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] without building all_ids (a decode step wants only the last token)."""
        p = len(self.prompt_ids)
        if start >= p:
            return self.output_ids[start - p : end - p]
        if end <= p:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    @property
    def is_finished(self) -> bool:
        return self.status is FINISHED

    # ------------------------------------------------------------------ output
    def append(self, result: SampleResult) -> StepOutput:
        """Add a sampled token, apply the stop rules, return the text delta this token releases.

        Fault isolation: a row the sampler could not sample (`result.error`), or an exception while this token is
        processed (detokenizer, stop strings, logprobs: a bug), ends this sequence with finish_reason "error"
        (`fail`) instead of raising out of the engine's step; the engine then fails the request's other choices."""
        if result.error is not None:
            return self.fail(result.error)
        try:
            p = self.params
            token = result.token_id
            n_out = len(self.output_ids) + 1
            if (not p.stop and p.logprobs is None and n_out < self._length_limit
                    and (n_out < p.min_tokens or token not in self.sampling.stop_ids)):
                # NOTE: the common case, the same as `_append_checked`: no stop strings (so nothing is held back
                # and `emitted` is always len(text)), no logprobs, not the last token
                self.output_ids.append(token)
                delta = self.detok.add(token)
                if delta:
                    self.text += delta
                    self.emitted = len(self.text)
                return StepOutput(self.request_id, self.index, delta, [token], [], None)
            return self._append_checked(result)
        except Exception as e:  # noqa: BLE001 - one request's fault: it ends, the step and the other requests go on
            log.exception("request %s: processing its token failed", self.request_id)
            return self.fail(one_line(f"processing the generated token failed: {type(e).__name__}: {e}"))

    def _append_checked(self, result: SampleResult) -> StepOutput:
        """`append`'s general path: stop ids and strings, logprobs, the length limit."""
        p = self.params
        token = result.token_id
        self.output_ids.append(token)
        if p.logprobs is not None:
            self.output_logprobs.append(result)
        n_out = len(self.output_ids)
        stop_ids = self.sampling.stop_ids
        if n_out > p.min_tokens - 1 and token in stop_ids:
            self.finish("stop", stop_reason=token)
            return self._delta([token], flush=True)
        prev_len = len(self.text)
        self.text += self.detok.add(token)
        if p.stop and n_out >= p.min_tokens:
            hit = self._find_stop(prev_len)
            if hit is not None:
                idx, s = hit
                self.text = self.text[:idx]
                self.finish("stop", stop_reason=s)
                return self._delta([token], flush=True)
        if (p.max_tokens is not None and n_out >= p.max_tokens) or len(self.prompt_ids) + n_out >= self.max_model_len:
            self.finish("length")
            return self._delta([token], flush=True)
        return self._delta([token], flush=False)

    def _find_stop(self, prev_len: int) -> tuple[int, str] | None:
        longest = max(len(s) for s in self.params.stop)
        start = max(0, prev_len - longest + 1)
        best: tuple[int, str] | None = None
        for s in self.params.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def _held_back(self) -> int:
        """Characters at the end of `text` that may still become a stop string."""
        held = 0
        for s in self.params.stop:
            for k in range(min(len(s) - 1, len(self.text)), held, -1):
                if self.text.endswith(s[:k]):
                    held = k
                    break
        return held

    def _delta(self, token_ids: list[int], flush: bool) -> StepOutput:
        if flush and not isinstance(self.stop_reason, str):  # after a stop string, the rest is cut anyway
            self.text += self.detok.finish()
        end = len(self.text) if flush else len(self.text) - self._held_back()
        text = self.text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        lps = self.output_logprobs[-len(token_ids):] if self.params.logprobs is not None else []
        return StepOutput(self.request_id, self.index, text, token_ids, lps, self.finish_reason)

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status = FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def fail(self, message: str) -> StepOutput:
        """End with finish_reason "error" (text still held back for a stop string is dropped); the output that
        tells the client, carrying `message`. The caller frees the blocks (the scheduler, for a sequence failed
        in `append`)."""
        self.finish("error")
        self.error = message
        return StepOutput(self.request_id, self.index, "", [], [], "error", message)
