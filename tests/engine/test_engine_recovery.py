"""A whole engine step that raises (a CUDA error, a bug outside one request's processing), handled per
`--on-engine-death` (engine/recovery.py): in the thread engine (AsyncEngine) and in the engine core process
(ProcessEngine). The failure is injected into the real runner of the embedded model: nothing on the CPU raises a
CUDA error of its own. tests/server/test_chaos.py kills real cores under a real server."""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path

import pytest

from llmrs.engine.config import EngineConfig
from llmrs.engine.llm_engine import LLMEngine
from llmrs.engine.protocol import EngineDeadError
from llmrs.engine.recovery import RestartBudget
from llmrs.engine.sampling import SamplingParams
from llmrs.errors import UserError
from llmrs.model.loader import load

MODEL = "smollm2-135m"
INJECTED = "injected: CUDA error: an illegal memory access was encountered"


def _check_model() -> None:
    from llmrs.model.loader import resolve

    try:
        resolve(MODEL)
    except UserError as e:
        pytest.skip(str(e), allow_module_level=True)


_check_model()


def failing_engine(fail_at_step: int, loaded=None, arm_file: str | None = None) -> LLMEngine:
    """An engine of the embedded model (one sequence at a time: the second request waits) whose runner raises at
    its `fail_at_step`-th step; with `arm_file`, only if that file exists (it is removed: the next engine built
    by the same factory, a restarted core's, runs clean)."""
    engine = LLMEngine(loaded or load(MODEL), EngineConfig(device="cpu", kv_cache_tokens=1024, max_num_seqs=1))
    if arm_file is not None:
        if not os.path.exists(arm_file):
            return engine
        os.remove(arm_file)
    run = engine.runner.execute_and_sample
    steps = 0

    def execute_and_sample(batch, states):
        nonlocal steps
        steps += 1
        if steps == fail_at_step:
            raise RuntimeError(INJECTED)
        return run(batch, states)

    engine.runner.execute_and_sample = execute_and_sample
    return engine


GREEDY = dict(temperature=0.0, ignore_eos=True)


async def _drain(stream) -> list:
    """Every output of a stream, or the exception that ended it as the last item."""
    out: list = []
    try:
        async for o in stream:
            out.append(o)
    except Exception as e:  # noqa: BLE001 - what the test looks at
        out.append(e)
    return out


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_restart_budget_restarts_three_times_a_minute_with_a_doubling_back_off():
    b = RestartBudget("restart")
    assert [b.next_backoff(now=t) for t in (0.0, 1.0, 2.0)] == [0.5, 1.0, 2.0]
    assert b.next_backoff(now=3.0) is None  # the fourth death within 60 s: give up
    assert "4 deaths within 60 s" in b.give_up_reason()
    b = RestartBudget("restart")
    assert [b.next_backoff(now=t) for t in (0.0, 61.0, 122.0, 183.0)] == [0.5] * 4  # far apart: each restarted
    b = RestartBudget("exit")
    assert b.next_backoff(now=0.0) is None and b.give_up_reason() == "--on-engine-death exit"
    with pytest.raises(UserError, match="--on-engine-death 'reboot': choose restart or exit"):
        RestartBudget("reboot")


@pytest.fixture(scope="module")
def smol():
    return load(MODEL)


def test_the_thread_engine_fails_the_started_request_and_runs_the_waiting_one_after_a_failed_step(smol):
    from llmrs.engine.async_engine import AsyncEngine

    tok = smol.tokenizer
    engine = failing_engine(3, smol)
    eng = AsyncEngine(engine)
    seen_health = []

    async def main():
        eng.start()
        running = eng.add_request("running", tok.encode("Once upon a time"), SamplingParams(max_tokens=40, **GREEDY))
        waiting = eng.add_request("waiting", tok.encode("The sky is"), SamplingParams(max_tokens=4, **GREEDY))
        ran = await _drain(running)
        seen_health.append(eng.health())  # the loop is in its back-off now
        done = await _drain(waiting)
        seen_health.append(eng.health())
        await eng.shutdown()
        return ran, done

    ran, done = asyncio.run(main())
    # two steps' tokens (the stream may merge them into one delta), then the failed step's error
    assert sum(len(o.token_ids) for o in ran[:-1]) == 2 and all(o.finish_reason is None for o in ran[:-1])
    assert isinstance(ran[-1], EngineDeadError)
    assert INJECTED in str(ran[-1]) and "cannot be resumed" in str(ran[-1])
    assert done[-1].finish_reason == "length" and sum(len(o.token_ids) for o in done) == 4
    assert seen_health[0][0] == "restarting" and INJECTED in seen_health[0][1]
    assert seen_health[1] == ("ok", None) and eng.error is None
    s = engine.stats()
    assert s.num_free_blocks == s.num_blocks and s.num_running == s.num_waiting == 0


def test_the_thread_engine_with_exit_fails_every_stream_and_calls_the_exit_hook(smol):
    from llmrs.engine.async_engine import AsyncEngine

    tok = smol.tokenizer
    eng = AsyncEngine(failing_engine(2, smol))
    exits = []
    eng.set_death_policy("exit", exit_hook=lambda: exits.append(True))

    async def main():
        eng.start()
        running = eng.add_request("running", tok.encode("Once upon a time"), SamplingParams(max_tokens=40, **GREEDY))
        waiting = eng.add_request("waiting", tok.encode("The sky is"), SamplingParams(max_tokens=4, **GREEDY))
        results = await _drain(running), await _drain(waiting)
        with pytest.raises(EngineDeadError, match="not restarted"):
            eng.add_request("late", tok.encode("Hi"), SamplingParams(max_tokens=2))
        await eng.shutdown()
        return results

    ran, waited = asyncio.run(main())
    assert isinstance(ran[-1], EngineDeadError) and isinstance(waited[-1], EngineDeadError)
    assert waited == [waited[-1]]  # the waiting request had not started: it ends with the error alone
    status, why = eng.health()
    assert status == "dead" and INJECTED in why and "--on-engine-death exit" in why
    assert exits == [True]


def test_a_core_whose_step_raises_reports_it_and_is_restarted_with_the_waiting_request(tmp_path):
    from llmrs.engine.core_client import ProcessEngine

    loaded = load(MODEL, read_tensors=False)
    tok = loaded.tokenizer
    arm = tmp_path / "arm"
    arm.touch()
    eng = ProcessEngine.spawn(loaded, functools.partial(failing_engine, 3, None, str(arm)))
    first_core = eng.pid
    seen_health = []

    async def main():
        eng.start()
        running = eng.add_request("running", tok.encode("Once upon a time"), SamplingParams(max_tokens=40, **GREEDY))
        waiting = eng.add_request("waiting", tok.encode("The sky is"), SamplingParams(max_tokens=4, **GREEDY))
        ran = await _drain(running)
        seen_health.append(eng.health())
        done = await _drain(waiting)
        seen_health.append(eng.health())
        again = await _drain(eng.add_request("again", tok.encode("Hello"), SamplingParams(max_tokens=3, **GREEDY)))
        await eng.shutdown()
        return ran, done, again

    ran, done, again = asyncio.run(main())
    assert isinstance(ran[-1], EngineDeadError)
    assert f"the engine core process failed: RuntimeError: {INJECTED}" in str(ran[-1])
    assert "cannot be resumed" in str(ran[-1])
    assert done[-1].finish_reason == "length" and sum(len(o.token_ids) for o in done) == 4
    assert again[-1].finish_reason == "length" and sum(len(o.token_ids) for o in again) == 3
    assert seen_health[0][0] == "restarting" and INJECTED in seen_health[0][1]
    assert seen_health[1] == ("ok", None)
    assert eng.pid != first_core and _state(first_core) is None  # a new core; the dead one reaped
    # the counters go on from the dead core's: the waiting request's prompt counted by both cores
    n = {p: len(tok.encode(p)) for p in ("Once upon a time", "The sky is", "Hello")}
    assert eng.stats().prompt_tokens_total == n["Once upon a time"] + 2 * n["The sky is"] + n["Hello"]
