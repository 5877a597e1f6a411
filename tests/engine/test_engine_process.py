"""`llmrs serve` with the engine core in a child process (the default) against the one-process server
(`--no-engine-process`).

Real servers (`python -m llmrs serve smollm2-135m` subprocesses on 127.0.0.1), raw SSE. The rest of the server's
behaviour is pinned by tests/server/test_server.py, which runs in the default mode (LLMRS_ENGINE_PROCESS=0: one process).
A core that dies: tests/server/test_chaos.py (killed under a real server), tests/engine/test_engine_recovery.py (a step
that raises).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = os.environ.get("LLMRS_TEST_MODEL") or "smollm2-135m"  # as tests/server/test_server.py, whose Server runs it


def _check_model() -> None:
    from llmrs.model.loader import resolve
    from llmrs.errors import UserError

    try:
        resolve(MODEL)
    except UserError as e:
        pytest.skip(str(e), allow_module_level=True)


_check_model()

from tests.server.test_server import Server as BaseServer  # noqa: E402


class Server(BaseServer):
    """tests/server/test_server.py's server (LLMRS_TEST_DEVICE / LLMRS_TEST_TP apply), each saying its own mode."""

    drop_env = ("LLMRS_ENGINE_PROCESS",)

    def __init__(self, args: list[str], log: Path):
        super().__init__(["--kv-cache-tokens", "4096", *args], log)

    def core_pid(self) -> int:
        m = re.search(r"engine core: process (\d+)", self.log.read_text())
        assert m, self.log.read_text()[-3000:]
        return int(m.group(1))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def sse_events(url: str, body: dict, path: str) -> list[dict | str]:
    """Every `data:` payload of a streamed request; the chunk ids and timestamps dropped."""
    out: list[dict | str] = []
    with httpx.stream("POST", url + path, json=body, timeout=120, trust_env=False) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[6:]
                if payload == "[DONE]":
                    out.append(payload)
                    continue
                ev = json.loads(payload)
                ev.pop("id"), ev.pop("created")
                out.append(ev)
    return out


def split_floats(x, floats: list[float]):
    """`x` with every float replaced by None, the floats appended to `floats` in order."""
    if isinstance(x, float):
        floats.append(x)
        return None
    if isinstance(x, dict):
        return {k: split_floats(v, floats) for k, v in x.items()}
    if isinstance(x, list):
        return [split_floats(v, floats) for v in x]
    return x


def joined(choices: list[dict]) -> dict:
    """One choice's streamed events as one: texts / delta contents joined, logprob lists concatenated, the last
    finish_reason, the other delta keys (the role) as seen. A server whose loop falls a step behind sends a choice's
    queued tokens as one event (engine.take_merged), so event boundaries are not part of the comparison."""
    out: dict = {"index": choices[0]["index"], "text": "", "delta": {}, "logprobs": {}, "finish_reason": None}
    for c in choices:
        out["text"] += c.get("text") or ""
        for k, v in (c.get("delta") or {}).items():
            out["delta"][k] = out["delta"].get(k, "") + v if k == "content" else v
        for k, v in (c.get("logprobs") or {}).items():
            out["logprobs"].setdefault(k, []).extend(v or [])
        out["finish_reason"] = c.get("finish_reason") or out["finish_reason"]
    return out


def per_choice(events: list[dict | str]) -> tuple[dict, dict]:
    """Each choice's events joined (`joined`; choices of different prompts may interleave differently from run to
    run), the rest (usage, [DONE]) in order; logprob values apart: a prefill batched differently (two prompts in one
    step or in two) changes the CPU's float32 sums in the last bits."""
    by: dict = {}
    for ev in events:
        if isinstance(ev, dict) and ev["choices"]:
            for c in ev["choices"]:
                by.setdefault(c["index"], []).append(c)
        else:
            by.setdefault("rest", []).append(ev)
    out: dict = {}
    floats: dict[int, list[float]] = {}
    for k, v in by.items():
        out[k] = v if k == "rest" else split_floats(joined(v), floats.setdefault(k, []))
    return out, floats


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    logs = tmp_path_factory.mktemp("engine-process")
    plain = Server(["--no-engine-process"], logs / "plain.log")
    proc = Server([], logs / "proc.log")  # the default (checked by core_pid: the log names the core process)
    try:
        plain.wait_ready()
        proc.wait_ready()
        core = proc.core_pid()
        assert alive(core)
        yield plain, proc
    finally:
        rc_plain, rc_proc = plain.stop(), proc.stop()
    assert rc_plain == 0, plain.log.read_text()[-3000:]
    assert rc_proc == 0, proc.log.read_text()[-3000:]
    assert not alive(core), "the engine core outlived its server"


REQUESTS = [
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True}),
    ("/v1/completions", {"prompt": ["Paged attention is", "Le café de Zürich"], "max_tokens": 12, "logprobs": 2,
                         "stop": ["\n\n"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 20,
                              "logprobs": True, "top_logprobs": 1}),
]


@pytest.mark.parametrize(("path", "body"), REQUESTS, ids=["completion", "two-prompts-logprobs-stop", "chat"])
def test_engine_process_streams_the_same_greedy_events_as_one_process(pair, path, body):
    plain, proc = pair
    body = {"model": MODEL, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **body}
    want = sse_events(plain.url, body, path)
    got = sse_events(proc.url, body, path)
    assert want[-1] == "[DONE]" and want[-2]["usage"]["completion_tokens"] > 0
    (want_choices, want_lps), (got_choices, got_lps) = per_choice(want), per_choice(got)
    assert got_choices == want_choices
    assert got_lps.keys() == want_lps.keys()
    for i in want_lps:
        assert got_lps[i] == pytest.approx(want_lps[i], abs=1e-4)


def test_concurrent_greedy_streams_equal_the_one_process_server(pair):
    plain, proc = pair
    bodies = [{"model": MODEL, "prompt": f"Story number {i}:", "max_tokens": 16, "temperature": 0, "stream": True,
               "ignore_eos": True} for i in range(6)]

    def choices(url: str, body: dict) -> dict:
        return per_choice(sse_events(url, body, "/v1/completions"))[0]  # (no logprobs asked: no floats apart)

    def run_all(url: str) -> list:
        results: list = [None] * len(bodies)

        def one(i: int) -> None:
            results[i] = choices(url, bodies[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return results

    got, want = run_all(proc.url), run_all(plain.url)
    if os.environ.get("LLMRS_TEST_DEVICE", "cpu") == "cpu":
        assert got == want
        return
    # On the GPU the kernels are not batch-invariant (the matvec up to 8 tokens, bf16 GEMMs above), so concurrent
    # greedy text depends on how the arrivals were batched, in either server: every stream must still be whole,
    # and one at a time (the same batches in both servers) the streams must be equal.
    def finishes(events: dict) -> list:
        return [c["finish_reason"] for k, c in events.items() if k != "rest"]

    for g, w in zip(got, want):
        assert g["rest"][-1] == w["rest"][-1] == "[DONE]"
        assert finishes(g) == finishes(w) == ["length"]
    for b in bodies[:2]:
        assert choices(proc.url, b) == choices(plain.url, b)


def test_engine_process_and_tensor_parallel_do_not_combine_yet():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "llmrs", "serve", MODEL, "--engine-process", "--tensor-parallel-size",
                        "2", "--port", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--engine-process and --tensor-parallel-size do not combine yet" in r.stdout + r.stderr


def test_freeze_heap_moves_the_start_up_heap_out_of_later_collections():
    """What `llmrs serve` and the engine core call once started: every object alive goes to the permanent
    generation (a full collection no longer walks them)."""
    import gc

    from llmrs.engine.core_client import freeze_heap

    gc.unfreeze()
    gc.collect()  # (garbage that earlier tests left in cycles is not part of the heap freeze_heap keeps)
    alive = len(gc.get_objects())
    try:
        freeze_heap()
        assert gc.get_freeze_count() >= alive // 2  # (what the collection freed is not there any more)
        assert len(gc.get_objects()) < alive // 10  # what a collection walks now: made since the freeze only
    finally:
        gc.unfreeze()


def test_commands_reach_the_core_in_order_through_a_full_pipe_without_blocking_the_loop():
    """ProcessEngine writes commands from the event loop through a non-blocking pipe end, in Connection's framing:
    with the reader stalled, ~6 MB of adds (far more than a pipe holds) must neither block the loop (a ticker
    coroutine keeps running) nor be lost or reordered once the reader (Connection.recv, as the core reads) drains
    them; commands queued in one loop pass go out as one message."""
    import asyncio
    import multiprocessing
    import time

    from llmrs.engine.core_client import ProcessEngine
    from llmrs.engine.protocol import AbortRequest, AddRequest
    from llmrs.engine.sampling import SamplingParams

    recv_end, send_end = multiprocessing.Pipe(duplex=False)
    eng = ProcessEngine.__new__(ProcessEngine)  # the pipe half alone: no core process
    eng._commands, eng._loop = send_end, None
    eng._pending, eng._flush_scheduled, eng._wbuf, eng._writing = [], False, bytearray(), False
    eng._wrote_this_pass, eng._woff, eng._restarting = False, 0, False
    eng._flush_every, eng._last_write = 3600.0, 0.0  # one write at a pass's start, one at its end (below: timed)
    got: list = []
    reader_go = threading.Event()

    def reader():
        reader_go.wait()
        while True:
            try:
                got.append(recv_end.recv())
            except EOFError:
                return

    t = threading.Thread(target=reader)
    t.start()

    async def main():
        eng._loop = asyncio.get_running_loop()
        os.set_blocking(send_end.fileno(), False)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        tick_task = asyncio.ensure_future(ticker())
        params = SamplingParams(max_tokens=4)
        t0 = time.perf_counter()
        for i in range(300):
            eng._send(AddRequest(f"r{i}", list(range(i, i + 10000)), params))
            if i % 50 == 49:
                await asyncio.sleep(0)  # another loop pass: the next commands form another message
        eng._send(AbortRequest("r7"))
        await asyncio.sleep(0.05)
        assert time.perf_counter() - t0 < 5 and ticks > 10  # the loop kept running with the pipe full
        assert eng._writing and len(eng._wbuf) > 0  # the rest waits for the loop's writer callback
        reader_go.set()
        for _ in range(500):
            if not eng._wbuf:
                break
            await asyncio.sleep(0.01)
        assert not eng._wbuf and not eng._writing
        tick_task.cancel()
        eng._close_writer()

    asyncio.run(main())
    t.join(10)
    cmds = [c for msg in got for c in msg]
    assert [c.request_id for c in cmds] == [f"r{i}" for i in range(300)] + ["r7"]
    assert all(c.prompt_ids == list(range(i, i + 10000)) for i, c in enumerate(cmds[:300]))
    # at most two messages a loop pass (its first command at once, the rest together at its end), not one an add:
    # 6 passes of 50 adds, then the abort's
    assert isinstance(cmds[-1], AbortRequest) and 7 <= len(got) <= 14 and [len(m) for m in got[:2]] == [1, 49]


@pytest.mark.parametrize("every_ms,readable", [(1.0, 6), (3.6e6, 1)])
def test_a_long_loop_pass_writes_its_commands_as_they_come_not_at_its_end(every_ms, readable):
    """A burst of requests is one long pass of the server's loop (each handler ~1 ms): the first command goes out at
    once and each later one with the next command `_flush_every` after the last write, so the core sees the adds
    while the pass still runs (with the old rule only the first, the rest at the pass's end)."""
    import asyncio
    import multiprocessing
    import time

    from llmrs.engine.core_client import ProcessEngine
    from llmrs.engine.protocol import AddRequest
    from llmrs.engine.sampling import SamplingParams

    recv_end, send_end = multiprocessing.Pipe(duplex=False)
    eng = ProcessEngine.__new__(ProcessEngine)
    eng._commands, eng._loop = send_end, None
    eng._pending, eng._flush_scheduled, eng._wbuf, eng._writing = [], False, bytearray(), False
    eng._wrote_this_pass, eng._woff, eng._restarting = False, 0, False
    eng._flush_every, eng._last_write = every_ms / 1e3, 0.0
    seen: list = []
    early: list = []

    async def main():
        eng._loop = asyncio.get_running_loop()
        os.set_blocking(send_end.fileno(), False)
        params = SamplingParams(max_tokens=4)
        for i in range(6):  # one pass: no await between the adds, 3 ms of "request handling" each
            eng._send(AddRequest(f"r{i}", [1, 2, 3], params))
            time.sleep(0.003)
        while recv_end.poll(0):  # what the core could read before the pass ends
            seen.append(recv_end.recv())
        early.append(sum(len(m) for m in seen))
        await asyncio.sleep(0.01)  # the pass ends: the rest goes out
        while recv_end.poll(0.1):
            seen.append(recv_end.recv())
        eng._close_writer()

    asyncio.run(main())
    cmds = [c.request_id for msg in seen for c in msg]
    assert cmds == [f"r{i}" for i in range(6)]
    assert early == [readable]  # adds the core could read while the pass still ran
    assert len(seen) == (6 if readable == 6 else 2)  # one message an add, or the first and the rest together


class _Conn:
    """A command pipe's poll() as wait_command sees it: readable after `ready_after` polls; the timeouts asked."""

    def __init__(self, ready_after: int):
        self.ready_after, self.timeouts = ready_after, []

    def poll(self, timeout=0.0):
        self.timeouts.append(timeout)
        return len(self.timeouts) > self.ready_after


def test_the_idle_core_polls_without_sleeping_then_blocks():
    """wait_command: with a spin it polls with no timeout until a command comes (no blocking poll at all), or until
    the spin is over and then blocks; without one it blocks at once."""
    import time

    from llmrs.engine.core_client import wait_command

    conn = _Conn(ready_after=50)
    assert wait_command(conn, 10.0) is True
    assert conn.timeouts == [0] * 51
    conn = _Conn(ready_after=10**9)
    t0 = time.monotonic()
    conn.poll = lambda timeout=0.0, c=conn: c.timeouts.append(timeout) or timeout is None
    assert wait_command(conn, 0.02) is True
    assert time.monotonic() - t0 >= 0.02
    assert conn.timeouts[-1] is None and set(conn.timeouts[:-1]) == {0} and len(conn.timeouts) > 2
    conn = _Conn(ready_after=0)
    assert wait_command(conn, 0.0) is True and conn.timeouts == [None]


def test_the_server_loop_stays_awake_for_the_spin_and_then_sleeps():
    """ProcessEngine._stay_hot: one self-requeuing callback (never two) keeps the loop polling without a timeout
    until `_spin_s` after the last call (a request in, a step message from the core), then stops; with no spin it
    never starts."""
    import asyncio

    from llmrs.engine.core_client import ProcessEngine

    eng = ProcessEngine.__new__(ProcessEngine)
    eng._hot_until, eng._spinning, eng._stopping = 0.0, False, False
    seen: list = []

    async def main():
        eng._loop = asyncio.get_running_loop()
        eng._spin_s = 0.0
        eng._stay_hot()
        seen.append(eng._spinning)
        eng._spin_s = 0.3  # (long enough for a loaded machine to come back within it)
        eng._stay_hot()
        eng._stay_hot()  # a second call moves the deadline, it does not queue a second callback
        seen.append(sum(1 for h in eng._loop._ready if getattr(h, "_callback", None) == eng._spin))
        await asyncio.sleep(0.01)
        seen.append(eng._spinning)
        await asyncio.sleep(0.6)
        seen.append(eng._spinning)

    asyncio.run(main())
    assert seen == [False, 1, True, False]
