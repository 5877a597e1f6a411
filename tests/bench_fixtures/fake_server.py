"""An OpenAI-style streaming server with exact, known timing, for checking `llmrs bench`'s metric arithmetic.

A bare ASGI app (no framework between the clock and the socket). Every streamed request is shaped by
directives in its prompt text (`key=value` words), falling back to the server's defaults:

- `ttft_ms=100`  first content chunk this long after the request arrived;
- `gap_ms=20`    then one content chunk (one token) every gap, on an absolute schedule (no drift);
- `n=10`         number of content chunks (default: max_tokens);
- `fault=500|close|nodone|hang`  answer 500 / drop the connection mid-stream / end without [DONE] or
                 finish_reason / never answer;
- `usage_lie=1`  report one completion token more than sent (to test the usage cross-check).

Also: GET /health, GET /v1/models, POST /tokenize and /detokenize with a toy tokenizer (word "t123" <-> id 123,
BOS id 1 prepended, so prompts fit exactly), GET /stats (peak in-flight, request count, `timings`: per prompt, the
perf_counter of its arrival and of each content write: one clock with the client's on Linux; `sampling`: per prompt,
the sampling fields its request carried), POST /stats/reset.
`--gap-ms 0` streams as fast as it can; `--coalesce K` packs K events into one write. `--graph-failures N` serves
GET /metrics with an llmrs server's count of failed CUDA graph captures (no /metrics without it).
Run standalone: `python tests/bench_fixtures/fake_server.py --port 8123`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

BOS = 1
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p")


@dataclass(slots=True)
class Defaults:
    ttft_ms: float = 0.0
    gap_ms: float = 0.0
    coalesce: int = 1
    model: str = "fake-model"
    graph_failures: int = -1  # >= 0: GET /metrics exports llmrs:cuda_graph_capture_failures with this value


def toy_tokenize(text: str) -> list[int]:
    ids = [BOS]
    for w in text.split():
        ids.append(int(w[1:]) if w[:1] == "t" and w[1:].isdigit() else 256 + sum(w.encode()) % 30000)
    return ids


def toy_detokenize(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids if i != BOS)


def directives(prompt) -> dict[str, str]:
    if not isinstance(prompt, str):
        return {}
    return dict(w.split("=", 1) for w in prompt.split() if "=" in w)


class FakeServer:
    """The ASGI app. `stats` is read by tests in the same process or via GET /stats."""

    def __init__(self, defaults: Defaults | None = None) -> None:
        self.d = defaults or Defaults()
        self.inflight = 0
        self.max_inflight = 0
        self.requests = 0
        self.timings: dict[str, list[float]] = {}  # prompt -> [arrival, send time of each content chunk]
        self.sampling: dict[str, dict] = {}  # prompt -> the sampling fields its request carried

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        t_arrive = time.perf_counter()
        if path == "/health":
            return await _json(send, 200, {})
        if path == "/v1/models":
            return await _json(send, 200, {"object": "list", "data": [{"id": self.d.model, "object": "model", "owned_by": "fake", "max_model_len": 4096}]})
        if path == "/stats":
            return await _json(send, 200, {"max_inflight": self.max_inflight, "requests": self.requests,
                                           "timings": self.timings, "sampling": self.sampling})
        if path == "/metrics" and self.d.graph_failures >= 0:
            name = "llmrs:cuda_graph_capture_failures_total"
            text = f'{name}{{model_name="{self.d.model}"}} {self.d.graph_failures}.0\n'
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
            return await send({"type": "http.response.body", "body": text.encode()})
        if path == "/stats/reset":
            self.max_inflight = self.requests = 0
            self.timings.clear()
            self.sampling.clear()
            return await _json(send, 200, {})
        req = json.loads(body or b"{}")
        if path == "/tokenize":
            ids = toy_tokenize(req.get("prompt", ""))
            return await _json(send, 200, {"tokens": ids, "count": len(ids), "max_model_len": 4096})
        if path == "/detokenize":
            return await _json(send, 200, {"prompt": toy_detokenize(req.get("tokens", []))})
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            self.requests += 1
            prompt = req.get("prompt") if "prompt" in req else (req.get("messages") or [{}])[-1].get("content")
            self.sampling[str(prompt)] = {k: req[k] for k in SAMPLING_FIELDS if k in req}
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                await self._stream(receive, send, req, path.endswith("chat/completions"), t_arrive)
            finally:
                self.inflight -= 1
            return
        return await _json(send, 404, {"error": {"message": f"no route {path}"}})

    async def _stream(self, receive, send, req: dict, chat: bool, t0: float) -> None:
        prompt = req["messages"][-1]["content"] if chat else req.get("prompt", "")
        d = directives(prompt)
        ttft = float(d.get("ttft_ms", self.d.ttft_ms)) / 1e3
        gap = float(d.get("gap_ms", self.d.gap_ms)) / 1e3
        n = int(d.get("n", req.get("max_tokens", 16)))
        fault = d.get("fault", "")
        if fault == "500":
            return await _json(send, 500, {"error": {"message": "injected failure", "type": "server_error"}})
        if fault == "hang":  # until the client gives up and disconnects
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        rid, model = "cmpl-fake", req.get("model", self.d.model)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(text: str, finish: str | None) -> bytes:
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            return b"data: " + json.dumps({"id": rid, "object": obj, "model": model, "choices": [choice]}).encode() + b"\n\n"

        if chat:  # like vLLM: a role-only first delta, which must not count as the first token
            await send({"type": "http.response.body", "body": b"data: " + json.dumps({"id": rid, "object": obj, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}).encode() + b"\n\n", "more_body": True})
        pending: list[bytes] = []
        k = max(1, self.d.coalesce)
        times = self.timings[prompt if isinstance(prompt, str) else str(prompt)] = [t0]
        for i in range(n):
            if ttft or gap:
                delay = t0 + ttft + i * gap - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            if fault == "close" and i == n // 2:
                raise RuntimeError("injected: connection dropped mid-stream")
            last = i == n - 1 and fault != "nodone"
            pending.append(event(" tok", "length" if last else None))
            if len(pending) >= k or i == n - 1:
                await send({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
                pending.clear()
                times.append(time.perf_counter())
        tail = b""
        if fault != "nodone":
            if (req.get("stream_options") or {}).get("include_usage"):
                plen = len(prompt) if isinstance(prompt, list) else len(toy_tokenize(prompt))
                out = n + (1 if d.get("usage_lie") else 0)
                usage = {"prompt_tokens": plen, "completion_tokens": out, "total_tokens": plen + out}
                tail += b"data: " + json.dumps({"id": rid, "object": obj, "choices": [], "usage": usage}).encode() + b"\n\n"
            tail += b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _json(send, status: int, obj) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--gap-ms", type=float, default=0.0)
    ap.add_argument("--coalesce", type=int, default=1)
    ap.add_argument("--graph-failures", type=int, default=-1)
    a = ap.parse_args()
    app = FakeServer(Defaults(a.ttft_ms, a.gap_ms, a.coalesce, graph_failures=a.graph_failures))
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
