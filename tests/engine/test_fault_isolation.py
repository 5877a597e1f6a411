"""Fault isolation: a fault in one request's processing (its row of logits cannot be sampled, its detokenizer or
stop handling raises) ends THAT request with finish_reason "error" and a one-line message, on every choice, its
blocks freed; the engine's step goes on and the other requests come out exactly as alone. The request of issue 45
(repetition_penalty 5e-324) is refused up front, and the sampler survives it even unvalidated.

A real LLMEngine on the embedded SmolLM2, with and without async scheduling (the step run ahead)."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

import numpy as np
import pytest

import llmrs.engine.runner as runner_mod
from llmrs.engine.async_engine import AsyncEngine
from llmrs.engine.config import EngineConfig
from llmrs.engine.llm_engine import LLMEngine, check_request
from llmrs.engine.protocol import AddRequest, StepMessage, StopCore
from llmrs.engine.sampling import UNSAMPLABLE, SamplingParams
from llmrs.engine.sequence import Sequence
from llmrs.errors import UserError
from llmrs.model.loader import load
from llmrs.model.tokenizer import IncrementalDetokenizer

GREEDY = dict(temperature=0.0, ignore_eos=True)
# the request of issue 45 item 1 (POST /v1/completions), which killed the engine core
ISSUE_PARAMS = dict(max_tokens=3, repetition_penalty=5e-324, top_p=0.9)


@pytest.fixture(scope="module")
def smol():
    return load("smollm2-135m")


def new_engine(smol, async_scheduling: bool = False) -> LLMEngine:
    return LLMEngine(smol, EngineConfig(kv_cache_tokens=1024, async_scheduling=async_scheduling))


def run(engine: LLMEngine) -> dict[tuple[str, int], list]:
    """Step until idle; every output, by (request id, choice)."""
    outs: dict[tuple[str, int], list] = {}
    for _ in range(500):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            outs.setdefault((o.request_id, o.index), []).append(o)
    assert not engine.has_unfinished()
    return outs


def tokens(outs: list) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def assert_nothing_left(engine: LLMEngine, outs: dict) -> None:
    assert engine.requests == {} and not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.kv.num_free_blocks == engine.kv.pool.num_blocks  # every block back
    assert engine.stats().generation_tokens_total == sum(len(tokens(o)) for o in outs.values())


def assert_failed(outs: list, message: str) -> None:
    """One choice's outputs: running ones, then exactly one final output with reason "error" and `message`."""
    assert [o.finish_reason for o in outs[:-1]] == [None] * (len(outs) - 1)
    assert outs[-1].finish_reason == "error" and message in outs[-1].error and "\n" not in outs[-1].error


def good_alone(smol, ids: list[int], params: SamplingParams) -> list[int]:
    return new_engine(smol).generate([ids], params)[0].token_ids[0]


def fail_detokenizer_of(monkeypatch, seqs: list[Sequence], after: int) -> None:
    """The detokenizer of `seqs` raises on their token number `after` + 1 (a bug in one request's processing)."""
    calls = {id(s.detok): 0 for s in seqs}
    real = IncrementalDetokenizer.add

    def add(self, token):
        if id(self) in calls:
            calls[id(self)] += 1
            if calls[id(self)] > after:
                raise RuntimeError("injected detokenizer fault")
        return real(self, token)

    monkeypatch.setattr(IncrementalDetokenizer, "add", add)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_exception_in_one_requests_token_processing_fails_only_that_request(smol, monkeypatch, async_scheduling):
    tok = smol.tokenizer
    bad_ids, good_ids = tok.encode("Tell me a story about"), tok.encode("The capital of France is")
    good_params = SamplingParams(max_tokens=8, **GREEDY)
    want = good_alone(smol, good_ids, good_params)
    e = new_engine(smol, async_scheduling)
    e.add_request("bad", bad_ids, SamplingParams(max_tokens=8, n=2, temperature=0.8, seed=1, ignore_eos=True))
    e.add_request("good", good_ids, good_params)
    fail_detokenizer_of(monkeypatch, e.requests["bad"][:1], after=2)  # choice 0 fails; choice 1 with it
    outs = run(e)
    for i in range(2):
        assert_failed(outs["bad", i], "processing the generated token failed: RuntimeError: injected detokenizer")
    assert len(tokens(outs["bad", 0])) == 2
    assert tokens(outs["good", 0]) == want and outs["good", 0][-1].finish_reason == "length"
    assert_nothing_left(e, outs)
    # the engine goes on: a later request runs as on a fresh engine
    e.add_request("after", good_ids, good_params)
    assert tokens(run(e)["after", 0]) == want


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_row_that_cannot_be_sampled_fails_only_its_request(smol, monkeypatch, async_scheduling):
    """The model's logits for one request turn NaN (a numerical fault) at its third step: the sampler reports the
    row, the engine fails that request; the rows beside it in the same batch are sampled as always."""
    tok = smol.tokenizer
    good_ids = tok.encode("The capital of France is")
    good_params = SamplingParams(max_tokens=8, **GREEDY)
    want = good_alone(smol, good_ids, good_params)
    e = new_engine(smol, async_scheduling)
    e.add_request("bad", tok.encode("Once upon a time"), SamplingParams(max_tokens=8, **GREEDY))
    e.add_request("good", good_ids, good_params)
    bad_state = e.requests["bad"][0].sampling
    seen = {"n": 0}
    real = runner_mod.sample

    def poisoned(logits, states):
        for i, st in enumerate(states):
            if st is bad_state:
                seen["n"] += 1
                if seen["n"] == 3:
                    logits = logits.copy()
                    logits[i] = np.nan
        return real(logits, states)

    monkeypatch.setattr(runner_mod, "sample", poisoned)
    outs = run(e)
    assert_failed(outs["bad", 0], UNSAMPLABLE)
    assert len(tokens(outs["bad", 0])) == 2
    assert tokens(outs["good", 0]) == want
    assert_nothing_left(e, outs)


def test_the_issue_request_is_a_user_error_naming_the_field(smol):
    """Item 1 of issue 45 through the engine (LLMEngine.add_request, and check_request: what ProcessEngine runs in
    the API server's process before anything reaches the core): a UserError whose message starts with the field
    (the server's 400 `param`), and nothing queued."""
    e = new_engine(smol)
    ids = smol.tokenizer.encode("Hello world")
    with pytest.raises(UserError, match=r"^repetition_penalty must be in \[0.01, 100\]"):
        e.add_request("r", ids, SamplingParams(**ISSUE_PARAMS))
    with pytest.raises(UserError, match="^repetition_penalty "):
        check_request(ids, SamplingParams(**ISSUE_PARAMS), smol.config.vocab_size, 2048, 64, 16)
    assert not e.has_unfinished() and e.requests == {}


def test_the_sampler_survives_the_issue_request_even_unvalidated(smol):
    """Past validation (sequences built by hand), the parameters that made the logits infinite no longer crash
    the step: an infinite logit is the token (the module rules); the request ends normally beside another."""
    tok = smol.tokenizer
    e = new_engine(smol)
    bad = Sequence("bad", tok.encode("Hello world"), SamplingParams(**ISSUE_PARAMS), tok, smol.stop_token_ids,
                   e.max_model_len)
    e.add_sequences("bad", [bad])
    e.add_request("good", tok.encode("Hello world"), SamplingParams(max_tokens=3, **GREEDY))
    outs = run(e)
    assert outs["bad", 0][-1].finish_reason in ("length", "stop") and outs["bad", 0][-1].error is None
    assert len(tokens(outs["good", 0])) == 3
    assert_nothing_left(e, outs)


def test_the_error_reaches_the_async_engines_stream(smol, monkeypatch):
    """AsyncEngine (one process): the failed request's stream ends with RequestOutput.error on every choice; a
    request beside it streams to the end."""
    tok = smol.tokenizer

    async def main():
        engine = new_engine(smol)
        eng = AsyncEngine(engine)
        real_add = engine.add_sequences

        def add_sequences(rid, seqs):  # (on the engine thread, before the request's first step)
            if rid == "bad":
                fail_detokenizer_of(monkeypatch, seqs, after=1)
            real_add(rid, seqs)

        engine.add_sequences = add_sequences
        eng.start()
        bad = eng.add_request("bad", tok.encode("Tell me a story"), SamplingParams(max_tokens=6, n=2, **GREEDY))
        good = eng.add_request("good", tok.encode("The capital of France is"), SamplingParams(max_tokens=6, **GREEDY))

        async def collect(stream):
            return [o async for o in stream]

        bad_outs, good_outs = await asyncio.gather(collect(bad), collect(good))
        await eng.shutdown()
        return bad_outs, good_outs, eng.stats()

    bad_outs, good_outs, stats = asyncio.run(main())
    finals = sorted((o.index, o.finish_reason) for o in bad_outs if o.finish_reason)
    assert finals == [(0, "error"), (1, "error")]
    assert all("injected detokenizer fault" in o.error for o in bad_outs if o.finish_reason)
    assert good_outs[-1].finish_reason == "length" and good_outs[-1].error is None
    assert stats.num_free_blocks == stats.num_blocks


def test_the_error_crosses_the_engine_core_pipe(smol, monkeypatch):
    """The engine core's loop (core_client.run_core, here on a thread over real pipes) sends the error as the 7th
    element of its output rows (protocol.OutputRow), and goes on serving the other request."""
    from llmrs.engine.core_client import run_core

    tok = smol.tokenizer
    engine = new_engine(smol)
    real_add = engine.add_sequences

    def add_sequences(rid, seqs):
        if rid == "bad":
            fail_detokenizer_of(monkeypatch, seqs, after=1)
        real_add(rid, seqs)

    engine.add_sequences = add_sequences
    cmd_recv, cmd_send = multiprocessing.Pipe(duplex=False)
    out_recv, out_send = multiprocessing.Pipe(duplex=False)
    core = threading.Thread(target=run_core, args=(engine, cmd_recv, out_send), daemon=True)
    core.start()
    params = SamplingParams(max_tokens=6, **GREEDY)
    cmd_send.send([AddRequest("bad", tok.encode("Tell me a story"), params),
                   AddRequest("good", tok.encode("The capital of France is"), params)])
    messages: list[StepMessage] = []
    finished: set[str] = set()
    while finished != {"bad", "good"}:
        assert out_recv.poll(60), "the core stopped answering"
        msg = out_recv.recv()
        messages.append(msg)
        finished |= {row[0] for row in msg.outputs if row[5] is not None}
    cmd_send.send([StopCore()])
    core.join(30)
    assert not core.is_alive()
    rows = [row for m in messages for row in m.outputs]
    assert all(len(row) == 7 for row in rows)
    assert [(r[5], r[6]) for r in rows if r[0] == "bad" and r[5]] == [
        ("error", "processing the generated token failed: RuntimeError: injected detokenizer fault")]
    assert [r[5] for r in rows if r[0] == "good" and r[5]] == ["length"]
    assert engine.kv.num_free_blocks == engine.kv.pool.num_blocks
