"""A small HTTP/1.1 client for the bench's requests over plain http: keep-alive connections to one origin on
asyncio streams, the response body streamed as it arrives (chunked, Content-Length or until close).

Why: httpx (httpcore over anyio) spends about 1 ms of the client's time on each request (a 2-core VM, a fake
server answering after 7.3 ms, 27 requests: TTFT median 10.65 ms through httpx, 9.69 over a bare socket), and the
bench puts that into every TTFT it reports, and under load into the client's CPU. This one does what the bench
needs and nothing else: no TLS, no proxies, no redirects, no cookies; `worker.make_client` keeps httpx for https,
for a proxy set in the environment, and with LLMRS_BENCH_HTTPX=1.

The interface is the slice of httpx's the bench uses (`stream(...)` as a context manager giving `status_code`,
`aiter_raw()`, `aread()`; `get()`; HTTPError / RemoteProtocolError / ConnectError).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

MAX_HEAD = 1 << 16  # status line + headers


class HTTPError(Exception):
    """Any failure of a request on this client."""


class ConnectError(HTTPError):
    """No connection to the server."""


class RemoteProtocolError(HTTPError):
    """The server closed the connection or sent what is not HTTP/1.1."""


class Response:
    """A response whose head has been read; the body is read by `aiter_raw` or `aread`, once."""

    __slots__ = ("status_code", "headers", "_reader", "_chunked", "_left", "complete", "keep_alive")

    def __init__(self, status_code: int, headers: dict[str, str], reader: asyncio.StreamReader,
                 http11: bool) -> None:
        self.status_code, self.headers, self._reader = status_code, headers, reader
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        try:
            self._left = None if self._chunked or cl is None else int(cl)
        except ValueError:
            raise RemoteProtocolError(f"bad Content-Length {cl!r}") from None
        self.complete = False
        conn = headers.get("connection", "").lower()
        # the connection can carry the next request only when the body's end is known and nobody said close
        self.keep_alive = ((http11 and "close" not in conn) or "keep-alive" in conn) and (
            self._chunked or self._left is not None)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        r = self._reader
        try:
            if self._chunked:
                while True:
                    line = await r.readuntil(b"\r\n")
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise RemoteProtocolError(f"bad chunk size line {line[:40]!r}") from None
                    if size == 0:
                        while await r.readuntil(b"\r\n") != b"\r\n":  # trailers, up to the blank line
                            pass
                        break
                    data = await r.readexactly(size + 2)
                    if data[-2:] != b"\r\n":
                        raise RemoteProtocolError("a chunk not followed by CRLF")
                    yield data[:-2]
            elif self._left is not None:
                while self._left:
                    data = await r.read(min(self._left, 1 << 16))
                    if not data:
                        raise RemoteProtocolError("peer closed connection before the end of the body")
                    self._left -= len(data)
                    yield data
            else:  # delimited by the server closing the connection
                while data := await r.read(1 << 16):
                    yield data
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise RemoteProtocolError(f"peer closed connection without sending complete message body ({e})") \
                from None
        except asyncio.LimitOverrunError:
            raise RemoteProtocolError("a chunk size line over the reader's limit") from None
        self.complete = True

    async def aread(self) -> bytes:
        return b"".join([part async for part in self.aiter_raw()])


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise RemoteProtocolError(f"bad header line {line[:60]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(parts[1]), headers, parts[0] == "HTTP/1.1"


class StreamClient:
    """Keep-alive HTTP/1.1 connections to the origin of `base_url` (http only), one request at a time on each."""

    def __init__(self, base_url: str) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"StreamClient takes http://host[:port] URLs, not {base_url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self._host_header = u.netloc.rsplit("@", 1)[-1]
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._closed = False

    async def __aenter__(self) -> "StreamClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for _, w in idle:
            w.close()

    def _request(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> bytes:
        u = urlsplit(url)
        if (u.hostname, u.port or 80) != (self.host, self.port):
            raise ValueError(f"{url}: another origin than {self.host}:{self.port}")
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def _exchange(self, request: bytes):
        """Send the request and read the response head, on an idle connection if there is one. A reused
        connection the server has closed meanwhile (its keep-alive timeout) is dropped and the request goes out
        again on a new one, but only if not a byte of an answer came back."""
        while True:
            reused = bool(self._idle)
            if reused:
                r, w = self._idle.pop()
            else:
                try:
                    r, w = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD)
                except OSError as e:
                    raise ConnectError(f"cannot connect to {self.host}:{self.port}: {e}") from None
            try:
                w.write(request)
                await w.drain()
                head = await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as e:
                w.close()
                if reused and not e.partial:
                    continue
                raise RemoteProtocolError("server disconnected without sending a response") from None
            except ConnectionError as e:
                w.close()
                if reused:
                    continue
                raise RemoteProtocolError(f"connection lost: {e}") from None
            except asyncio.LimitOverrunError:
                w.close()
                raise RemoteProtocolError(f"response head over {MAX_HEAD} bytes") from None
            except BaseException:
                w.close()
                raise
            return r, w, head

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, content: bytes = b"",
                     headers: dict[str, str] | None = None) -> AsyncIterator[Response]:
        r, w, head = await self._exchange(self._request(method, url, content, headers or {}))
        resp = None
        try:
            status, hdrs, http11 = _parse_head(head)
            resp = Response(status, hdrs, r, http11)
            yield resp
        finally:
            if resp is not None and resp.complete and resp.keep_alive and not self._closed:
                self._idle.append((r, w))
            else:
                w.close()

    async def get(self, url: str, timeout: float | None = None) -> tuple[int, bytes]:
        """GET url, the whole body read (status, body)."""
        async with asyncio.timeout(timeout):
            async with self.stream("GET", url) as resp:
                return resp.status_code, await resp.aread()
