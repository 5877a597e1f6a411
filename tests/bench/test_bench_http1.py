"""llmrs.bench.http1 (the bench's plain-http client) against small real socket servers: chunked, Content-Length and
close-delimited bodies, keep-alive reuse, a reused connection the server closed meanwhile, errors as HTTPError
subclasses; and which client the workers pick (worker.client_kind)."""

from __future__ import annotations

import asyncio

import pytest

from llmrs.bench import http1
from llmrs.bench.worker import client_kind


class RawServer:
    """An asyncio TCP server answering each request (head + Content-Length body) with `answer(n)`, n = requests
    so far; `close_after` closes the connection after that reply. Counts connections."""

    def __init__(self, answer, close_after: bool = False):
        self.answer, self.close_after = answer, close_after
        self.connections = self.requests = 0
        self.bodies: list[bytes] = []

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.bodies.append(await r.readexactly(length))
                self.requests += 1
                for part in self.answer(self.requests):
                    w.write(part)
                    await w.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def __aenter__(self):
        self.srv = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.srv.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.srv.close()


def chunked(*parts: bytes, trailer: bytes = b"") -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return [head] + [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n" + trailer + b"\r\n"]


def run(coro):
    return asyncio.run(coro)


def test_chunked_stream_arrives_chunk_by_chunk_and_the_connection_is_reused():
    events = [b'data: {"a": 1}\n\n', b'data: {"a": 2}\n\n', b"data: [DONE]\n\n"]

    async def main():
        async with RawServer(lambda n: chunked(*events, trailer=b"x-t: 1\r\n")) as srv:
            async with http1.StreamClient(srv.url) as c:
                for _ in range(3):
                    async with c.stream("POST", srv.url + "/v1/completions", content=b'{"x": 1}',
                                        headers={"Content-Type": "application/json"}) as resp:
                        assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
                        got = [part async for part in resp.aiter_raw()]
                    assert got == events
            assert srv.connections == 1 and srv.requests == 3 and srv.bodies == [b'{"x": 1}'] * 3

    run(main())


def test_content_length_and_close_delimited_bodies():
    body = b'{"error": {"message": "bad"}}'

    async def main():
        fixed = lambda n: [b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body), body]  # noqa: E731
        async with RawServer(fixed) as srv:
            async with http1.StreamClient(srv.url) as c:
                async with c.stream("POST", srv.url + "/x", content=b"{}") as resp:
                    assert resp.status_code == 400 and await resp.aread() == body
                assert await c.get(srv.url + "/health", timeout=5) == (400, body)
            assert srv.connections == 1
        until_close = lambda n: [b"HTTP/1.0 200 OK\r\n\r\n", b"part one, ", b"part two"]  # noqa: E731
        async with RawServer(until_close, close_after=True) as srv:
            async with http1.StreamClient(srv.url) as c:
                for _ in range(2):
                    assert await c.get(srv.url + "/", timeout=5) == (200, b"part one, part two")
            assert srv.connections == 2  # no length: the connection ends with the body, never reused

    run(main())


def test_a_keep_alive_connection_the_server_closed_is_replaced_before_anything_is_lost():
    """The server answers with keep-alive headers but closes after each reply (as uvicorn does once its keep-alive
    timeout passes): the next request finds the idle connection dead, and goes out again on a new one."""

    async def main():
        ok = lambda n: [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", b"%02d" % n]  # noqa: E731
        async with RawServer(ok, close_after=True) as srv:
            async with http1.StreamClient(srv.url) as c:
                for i in range(1, 4):
                    assert await c.get(srv.url + "/health", timeout=5) == (200, b"%02d" % i)
                    await asyncio.sleep(0.05)  # the server's close reaches the idle connection
            assert srv.connections == 3 and srv.requests == 3

    run(main())


def test_errors_are_http_errors():
    async def main():
        cut = lambda n: chunked(b"data: 1\n\n")[:2] + [b"5\r\nab"]  # noqa: E731  (a chunk cut short, then close)
        async with RawServer(cut, close_after=True) as srv:
            async with http1.StreamClient(srv.url) as c:
                with pytest.raises(http1.RemoteProtocolError):
                    async with c.stream("POST", srv.url + "/x", content=b"{}") as resp:
                        async for _ in resp.aiter_raw():
                            pass
        async with RawServer(lambda n: [b"SPDY/9 what\r\n\r\n"]) as srv:
            async with http1.StreamClient(srv.url) as c:
                with pytest.raises(http1.RemoteProtocolError, match="status line"):
                    await c.get(srv.url + "/", timeout=5)
        async with RawServer(lambda n: [], close_after=True) as srv:  # reads the request, answers nothing
            async with http1.StreamClient(srv.url) as c:
                with pytest.raises(http1.RemoteProtocolError, match="without sending a response"):
                    await c.get(srv.url + "/", timeout=5)
        srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        srv.close()
        await srv.wait_closed()
        async with http1.StreamClient(f"http://127.0.0.1:{port}") as c:
            with pytest.raises(http1.ConnectError):
                await c.get(f"http://127.0.0.1:{port}/", timeout=5)
        assert issubclass(http1.ConnectError, http1.HTTPError) and issubclass(http1.RemoteProtocolError,
                                                                              http1.HTTPError)

    run(main())


def test_the_workers_take_http1_for_plain_http_and_httpx_otherwise(monkeypatch):
    for v in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "LLMRS_BENCH_HTTPX"):
        monkeypatch.delenv(v, raising=False)
    assert client_kind("http://127.0.0.1:8000") == "http1"
    assert client_kind("http://gpu-box:8000/") == "http1"
    assert client_kind("https://api.example.com") == "httpx"  # TLS: httpx
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert client_kind("http://gpu-box:8000") == "httpx"  # a proxy httpx honours for a remote host
    assert client_kind("http://localhost:8000") == "http1"  # ... and not for a local one (trust_env off there)
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.setenv("LLMRS_BENCH_HTTPX", "1")
    assert client_kind("http://127.0.0.1:8000") == "httpx"
    with pytest.raises(ValueError):
        http1.StreamClient("https://api.example.com")
