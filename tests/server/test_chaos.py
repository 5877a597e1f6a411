"""Chaos against a real `llmrs serve` (the engine core in its own process, the embedded model, CPU): the core killed
mid-stream under both `--on-engine-death` policies, a storm of clients that disconnect mid-stream, SIGTERM with
streams in flight.

Two servers for the module: `restarting` (the default policy; its tests run in order and the last one stops it
with SIGTERM) and `exiting` (`--on-engine-death exit`, killed by its test).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.test_server import MODEL, Server as BaseServer

LEN = ["--max-model-len", "256", "--kv-cache-tokens", "4096"]


class Server(BaseServer):
    drop_env = ("LLMRS_ENGINE_PROCESS",)  # the default: the engine core in its own process

    def children(self) -> list[int]:
        pid = self.proc.pid
        out: list[int] = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                out += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
            except OSError:  # the thread ended meanwhile
                pass
        return out

    def core_pid(self) -> int:
        """The engine core: the server's child started by multiprocessing's spawn (the other child is
        multiprocessing's resource tracker)."""
        cores = [c for c in self.children() if "multiprocessing.spawn" in _cmdline(c)]
        assert len(cores) == 1, [(c, _cmdline(c)) for c in self.children()]
        return cores[0]

    def zombies(self) -> list[int]:
        return [c for c in self.children() if _state(c) == "Z"]

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.url}/health", timeout=10, trust_env=False)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...); None once it is gone (reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Stream(threading.Thread):
    """A streamed completion read in a thread: every `data:` payload, `first` set at the first one."""

    def __init__(self, url: str, max_tokens: int, prompt: str = "Once upon a time"):
        super().__init__(daemon=True)
        self.url, self.max_tokens, self.prompt = url, max_tokens, prompt
        self.events: list[str] = []
        self.first = threading.Event()
        self.status: int | None = None
        self.start()

    def run(self) -> None:
        body = {"model": MODEL, "prompt": self.prompt, "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120, trust_env=False) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    self.first.set()

    def ended_with_error(self) -> str:
        """The error message of a stream that ended with an error event and [DONE]."""
        assert self.events[-1] == "[DONE]", self.events[-3:]
        return json.loads(self.events[-2])["error"]["message"]

    def finish_reasons(self) -> list[str]:
        assert self.events[-1] == "[DONE]", self.events[-3:]
        return [c["finish_reason"] for e in self.events[:-1] for c in json.loads(e)["choices"] if c["finish_reason"]]


def _post(url: str, results: list, body: dict) -> None:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, **body}, timeout=120, trust_env=False)
    results.append((r.status_code, r.json()))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("chaos")
    restarting = Server([*LEN, "--shutdown-timeout", "1"], logs / "restarting.log")
    exiting = Server([*LEN, "--on-engine-death", "exit"], logs / "exiting.log")
    try:
        restarting.wait_ready()
        exiting.wait_ready()
        yield restarting, exiting
    finally:
        for s in (restarting, exiting):
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait(30)


def test_a_killed_core_fails_its_running_stream_restarts_and_serves_the_waiting_requests(servers):
    srv = servers[0]
    core = srv.core_pid()
    running = Stream(srv.url, max_tokens=200)
    assert running.first.wait(60)
    plain: list = []  # a non-streamed request that runs too
    plain_post = threading.Thread(target=_post, args=(srv.url, plain, {"prompt": "Long", "max_tokens": 200,
                                                                       "ignore_eos": True}))
    plain_post.start()
    deadline = time.monotonic() + 60
    while srv.metrics()["llmrs:num_requests_running"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    # requests the core never sees: it is stopped, they wait in its pipe; then it is killed
    os.kill(core, signal.SIGSTOP)
    waiting: list = []
    posts = [threading.Thread(target=_post, args=(srv.url, waiting, {"prompt": f"Fact {i}:", "max_tokens": 4}))
             for i in range(3)]
    for t in posts:
        t.start()
    queued_stream = Stream(srv.url, max_tokens=6, prompt="Queued")
    time.sleep(1.0)  # (they reach the server; one that arrives later waits for the new core all the same)
    os.kill(core, signal.SIGKILL)

    running.join(60)
    assert not running.is_alive(), "the running stream hangs after the core died"
    message = running.ended_with_error()
    assert "engine core process died (killed by SIGKILL)" in message and "cannot be resumed" in message
    plain_post.join(60)
    assert plain[0][0] == 503 and "cannot be resumed" in plain[0][1]["error"]["message"], plain

    seen = []  # /health while the new core starts, until it answers ok
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        h = srv.health()
        seen.append((h.status_code, h.json()))
        if h.status_code == 200:
            break
        time.sleep(0.05)
    assert seen[-1] == (200, {"status": "ok"}), seen[-3:]
    restarting = [body for code, body in seen if code == 503]
    assert restarting, "no /health answer said the engine was restarting"
    assert all(b["error"]["code"] == "engine_restarting" and "restarting" in b["error"]["message"]
               and "killed by SIGKILL" in b["error"]["message"] for b in restarting)

    for t in [*posts, queued_stream]:
        t.join(120)
    assert [code for code, _ in waiting] == [200, 200, 200], waiting
    assert all(body["choices"][0]["finish_reason"] == "length" for _, body in waiting)
    assert queued_stream.finish_reasons() == ["length"]

    r = srv.client().completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens >= 1
    new_core = srv.core_pid()
    assert new_core != core
    assert _state(core) is None, "the dead core was not reaped"
    assert srv.zombies() == []


def test_a_disconnect_storm_leaves_no_kv_block_in_use(servers):
    srv = servers[0]
    n, rng = 48, random.Random(45)
    leave_after = {i: rng.randint(1, 4) for i in rng.sample(range(n), k=round(0.3 * n))}  # events read, then gone
    before = srv.metrics()

    async def client(c: httpx.AsyncClient, i: int) -> str:
        body = {"model": MODEL, "prompt": f"Story number {i}:", "max_tokens": 10, "ignore_eos": True,
                "stream": True}
        seen = 0
        async with c.stream("POST", f"{srv.url}/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return "done"
                seen += 1
                if seen == leave_after.get(i):
                    return "left"  # leaving the block closes the connection mid-stream
        return "cut"

    async def storm() -> list[str]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as c:
            return await asyncio.gather(*(client(c, i) for i in range(n)))

    ends = asyncio.run(storm())
    # (a client meant to leave may have had its 10 tokens in fewer events: the server merges queued deltas)
    assert all(e == "done" or (e == "left" and i in leave_after) for i, e in enumerate(ends))
    assert ends.count("left") >= len(leave_after) // 2

    def finished(m: dict) -> float:
        return m.get("llmrs:request_success_total", 0.0) - before.get("llmrs:request_success_total", 0.0)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the last aborts land a moment after the clients have gone
        m = srv.metrics()
        if finished(m) == n and m["llmrs:num_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert finished(m) == n  # every request ended once: "length" or, for a client that left, "abort"
    assert m["llmrs:num_requests_running"] == m["llmrs:num_requests_waiting"] == 0
    assert m["llmrs:kv_cache_free_blocks"] == m["llmrs:kv_cache_num_blocks"] > 0
    assert m["llmrs:kv_cache_usage_perc"] == 0.0


def test_sigterm_with_streams_in_flight_ends_each_cleanly_and_exits_0(servers):
    srv = servers[0]
    core = srv.core_pid()
    streams = [Stream(srv.url, max_tokens=240, prompt=f"Chapter {i}:") for i in range(6)]
    for s in streams:
        assert s.first.wait(60)
    rc = srv.stop()  # --shutdown-timeout 1: whatever still runs then is aborted
    for s in streams:
        s.join(30)
    assert rc == 0, srv.log.read_text()[-3000:]
    for s in streams:
        assert s.status == 200 and s.finish_reasons() in (["abort"], ["length"]), s.events[-3:]
    assert _state(core) is None, "the engine core outlived its server"


def test_with_exit_a_killed_core_ends_the_stream_and_the_server_exits_non_zero(servers):
    srv = servers[1]
    core = srv.core_pid()
    stream = Stream(srv.url, max_tokens=200)
    assert stream.first.wait(60)
    os.kill(core, signal.SIGKILL)
    stream.join(60)
    assert not stream.is_alive()
    assert "engine core process died (killed by SIGKILL)" in stream.ended_with_error()
    rc = srv.proc.wait(timeout=30)  # (a liveness bound: it stops at once, in well under a second here)
    assert rc == 1, srv.log.read_text()[-3000:]
    log = srv.log.read_text()
    assert "the engine is dead" in log and "--on-engine-death exit" in log
    assert _state(core) is None
