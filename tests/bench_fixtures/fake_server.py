"""An OpenAI-style streaming server with exact, known timing, for checking `llmrs bench`'s metric arithmetic.

A bare ASGI app (no framework between the clock and the socket). Every streamed request is shaped by
directives in its prompt text (`key=value` words), falling back to the server's defaults:

- `ttft_ms=100`  first content chunk this long after the request arrived;
- `gap_ms=20`    then one content chunk (one token) every gap, on an absolute schedule (no drift);
- `n=10`         number of content chunks (default: max_tokens);
- `fault=500|close|nodone|hang`  answer 500 / drop the connection mid-stream / end without [DONE] or
                 finish_reason / never answer;
- `usage_lie=1`  report one completion token more than sent (to test the usage cross-check);
- `reply=WORD`   stream WORD as each chunk's text instead of "tok" (a chat request: read from its last message).

Also: GET /health, GET /v1/models, POST /tokenize and /detokenize with a toy tokenizer (word "t123" <-> id 123,
BOS id 1 prepended, so prompts fit exactly), GET /stats (peak in-flight, request count, `timings`: per prompt, the
perf_counter of its arrival and of each content write: one clock with the client's on Linux; `sampling`: per prompt,
the sampling fields its request carried; `messages`: per chat request's last message, the messages it carried),
POST /stats/reset.
`--gap-ms 0` streams as fast as it can; `--coalesce K` packs K events into one write. `--graph-failures N` serves
GET /metrics with an llmrs server's count of failed CUDA graph captures (no /metrics without it).
`--record FILE` appends one JSON line per completion request: the prompt tokens the server counted.

`--flavor` answers as another engine does on the routes `llmrs bench` relies on (default: the above):
- `vllm`: the above, models owned_by "vllm", GET /version;
- `sglang`: /tokenize (and /v1/tokenize) as vLLM's, /detokenize answering {"text"}, GET /health_generate,
  GET /get_model_info, models owned_by "sglang";
- `llama-server`: every route answers 503 while "loading" (`--loading-s`), then /health {"status": "ok"};
  POST /tokenize {"content", "add_special"} (BOS only with add_special, a completion always has it),
  /detokenize {"tokens"} -> {"content"}, GET /props, models owned_by "llamacpp" with meta.n_vocab;
- `llama-cpp-python`: no /health (404), /extras/tokenize {"input"} -> {"tokens"} (BOS included),
  /extras/detokenize -> {"text"}, a 500 for a piece that is not whole UTF-8 (here: ids `UNDECODABLE`),
  token-id prompts refused, no usage in a stream, models owned_by "me" with the model path as id;
- `tgi`: GET /info {"model_id", "router", ...}, models owned_by the model id, no tokenize/detokenize pair (its
  /tokenize takes {"inputs"} and answers a list), any model name accepted.
`--no-models` drops GET /v1/models (older llama-server, a TGI behind a proxy); `--count-with SPEC` counts prompt
tokens with a real tokenizer (llmrs.bench.tokenization.LocalTokenizer: a tokenizer.json, HF directory, GGUF or
embedded model name) as a server of that model would, instead of the toy one.
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
FLAVORS = ("default", "vllm", "sglang", "llama-server", "llama-cpp-python", "tgi")
UNDECODABLE = frozenset(range(700, 760))  # llama-cpp-python flavor: ids whose piece alone is not valid UTF-8
N_VOCAB = 32000
MODEL_IDS = {"default": "fake-model", "vllm": "fake/vllm-model", "sglang": "fake/sglang-model",
             "llama-server": "/models/fake-llama-server.gguf", "llama-cpp-python": "/models/fake-lcp.gguf",
             "tgi": "fake/tgi-model"}
OWNERS = {"default": "fake", "vllm": "vllm", "sglang": "sglang", "llama-server": "llamacpp", "llama-cpp-python": "me"}


@dataclass(slots=True)
class Defaults:
    ttft_ms: float = 0.0
    gap_ms: float = 0.0
    coalesce: int = 1
    model: str = "fake-model"
    graph_failures: int = -1  # >= 0: GET /metrics exports llmrs:cuda_graph_capture_failures with this value
    flavor: str = "default"
    loading_s: float = 1.0  # llama-server flavor: 503 on every route this long after start-up
    models_route: bool = True
    count_with: str | None = None  # a real tokenizer's spec: prompt tokens counted with it
    record: str | None = None  # a file: one JSON line per completion, {"prompt_tokens": n}


def toy_tokenize(text: str) -> list[int]:
    ids = [BOS]
    for w in text.split():
        ids.append(int(w[1:]) if w[:1] == "t" and w[1:].isdigit() else 256 + sum(w.encode()) % 30000)
    return ids


def toy_detokenize(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids if i != BOS)


DIRECTIVES = ("ttft_ms", "gap_ms", "n", "fault", "usage_lie", "reply")


def directives(prompt) -> dict[str, str]:
    """The prompt's directives; a word of random text that merely holds "=" (decoded random tokens) is none."""
    if not isinstance(prompt, str):
        return {}
    out = {}
    for w in prompt.split():
        k, sep, v = w.partition("=")
        if sep and k in DIRECTIVES:
            if k in ("fault", "reply") or _number(v):
                out[k] = v
    return out


def _number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


class FakeServer:
    """The ASGI app. `stats` is read by tests in the same process or via GET /stats."""

    def __init__(self, defaults: Defaults | None = None) -> None:
        self.d = defaults or Defaults()
        self.inflight = 0
        self.max_inflight = 0
        self.requests = 0
        self.timings: dict[str, list[float]] = {}  # prompt -> [arrival, send time of each content chunk]
        self.sampling: dict[str, dict] = {}  # prompt -> the sampling fields its request carried
        self.messages: dict[str, list] = {}  # a chat request's last message -> the messages it carried
        self.flavor = self.d.flavor
        self.model = self.d.model if self.d.model != "fake-model" else MODEL_IDS.get(self.flavor, self.d.model)
        self.t_start = time.monotonic()
        self.counter = None
        if self.d.count_with:
            from llmrs.bench.tokenization import LocalTokenizer

            self.counter = LocalTokenizer(self.d.count_with).tok

    def count(self, prompt) -> int:
        """Prompt tokens as this server counts them (a completion's usage.prompt_tokens)."""
        if isinstance(prompt, list):
            return len(prompt)
        if self.counter is not None:
            return len(self.counter.encode(prompt, add_special_tokens=True).ids)
        return len(toy_tokenize(prompt))

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
        flavor = self.flavor
        if flavor == "llama-server" and time.monotonic() - self.t_start < self.d.loading_s:
            return await _json(send, 503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        reply = self._flavor_route(path, body)
        if reply is not None:
            return await _json(send, *reply)
        if path == "/health" and flavor != "llama-cpp-python":
            return await _json(send, 200, {"status": "ok"} if flavor == "llama-server" else {})
        if path == "/v1/models" and self.d.models_route:
            return await _json(send, 200, {"object": "list", "data": [self._model_entry()]})
        if path == "/stats":
            return await _json(send, 200, {"max_inflight": self.max_inflight, "requests": self.requests,
                                           "timings": self.timings, "sampling": self.sampling,
                                           "messages": self.messages})
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
            self.messages.clear()
            return await _json(send, 200, {})
        req = json.loads(body or b"{}")
        if path == "/tokenize" and flavor in ("default", "vllm"):
            ids = toy_tokenize(req.get("prompt", ""))
            return await _json(send, 200, {"tokens": ids, "count": len(ids), "max_model_len": 4096})
        if path == "/detokenize" and flavor in ("default", "vllm"):
            return await _json(send, 200, {"prompt": toy_detokenize(req.get("tokens", []))})
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            self.requests += 1
            prompt = req.get("prompt") if "prompt" in req else (req.get("messages") or [{}])[-1].get("content")
            if flavor == "llama-cpp-python" and not isinstance(prompt, str):
                return await _json(send, 500, {"error": {"message": "Input should be a valid string",
                                                         "type": "internal_server_error"}})
            if self.d.record:
                with open(self.d.record, "a") as f:
                    f.write(json.dumps({"prompt_tokens": self.count(prompt)}) + "\n")
            self.sampling[str(prompt)] = {k: req[k] for k in SAMPLING_FIELDS if k in req}
            if "messages" in req:
                self.messages[str(prompt)] = req["messages"]
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                await self._stream(receive, send, req, path.endswith("chat/completions"), t_arrive)
            finally:
                self.inflight -= 1
            return
        return await _json(send, 404, {"error": {"message": f"no route {path}"}})

    def _model_entry(self) -> dict:
        owner = OWNERS.get(self.flavor, self.model)  # TGI: its model id
        entry = {"id": self.model, "object": "model", "owned_by": owner}
        if self.flavor in ("default", "vllm", "sglang"):
            entry["max_model_len"] = 4096
        if self.flavor == "llama-server":
            entry["meta"] = {"vocab_type": 2, "n_vocab": N_VOCAB, "n_ctx_train": 8192}
        return entry

    def _flavor_route(self, path: str, body: bytes) -> tuple[int, object] | None:
        """(status, JSON) of a route one flavor has and the others do not, else None."""
        flavor = self.flavor
        req = json.loads(body) if body else {}
        if flavor == "vllm" and path == "/version":
            return 200, {"version": "0.0.0-fake"}
        if flavor == "sglang":
            if path == "/health_generate":
                return 200, {}
            if path == "/get_model_info":
                return 200, {"model_path": self.model, "tokenizer_path": self.model, "is_generation": True}
            if path in ("/tokenize", "/v1/tokenize"):
                ids = toy_tokenize(req.get("prompt", ""))
                return 200, {"tokens": ids, "count": len(ids), "max_model_len": 4096}
            if path in ("/detokenize", "/v1/detokenize"):
                return 200, {"text": toy_detokenize(req.get("tokens", []))}
        if flavor == "llama-server":
            if path == "/props":
                return 200, {"model_path": self.model, "total_slots": 4, "chat_template": "",
                             "default_generation_settings": {"n_ctx": 4096}}
            if path == "/tokenize":
                if "content" not in req:
                    return 200, {"tokens": []}
                ids = toy_tokenize(req["content"])
                return 200, {"tokens": ids if req.get("add_special") else ids[1:]}
            if path == "/detokenize":
                return 200, {"content": toy_detokenize(req.get("tokens", []))}
        if flavor == "llama-cpp-python":
            if path == "/extras/tokenize":
                return 200, {"tokens": toy_tokenize(req["input"])}
            if path == "/extras/detokenize":
                ids = req.get("tokens", [])
                if any(i in UNDECODABLE for i in ids):
                    return 500, {"error": {"message": "'utf-8' codec can't decode bytes", "type": "internal_server_error"}}
                return 200, {"text": toy_detokenize(ids)}
            if path in ("/health", "/tokenize", "/detokenize", "/props", "/info"):
                return 404, {"detail": "Not Found"}
        if flavor == "tgi":
            if path == "/info":
                return 200, {"model_id": self.model, "model_sha": None, "model_dtype": "torch.float16",
                             "router": "text-generation-router", "version": "3.0.0-fake",
                             "max_input_tokens": 4095, "max_total_tokens": 4096}
            if path == "/tokenize":
                text = req.get("inputs", "")
                return 200, [{"id": i, "text": "", "start": 0, "stop": 0} for i in toy_tokenize(text)]
        return None

    async def _stream(self, receive, send, req: dict, chat: bool, t0: float) -> None:
        prompt = req["messages"][-1]["content"] if chat else req.get("prompt", "")
        d = directives(prompt)
        ttft = float(d.get("ttft_ms", self.d.ttft_ms)) / 1e3
        gap = float(d.get("gap_ms", self.d.gap_ms)) / 1e3
        n = int(float(d.get("n", req.get("max_tokens", 16))))
        fault = d.get("fault", "")
        if fault == "500":
            return await _json(send, 500, {"error": {"message": "injected failure", "type": "server_error"}})
        if fault == "hang":  # until the client gives up and disconnects
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        rid, model = "cmpl-fake", req.get("model", self.model)
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
            pending.append(event(" " + d.get("reply", "tok"), "length" if last else None))
            if len(pending) >= k or i == n - 1:
                await send({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
                pending.clear()
                times.append(time.perf_counter())
        tail = b""
        if fault != "nodone":
            if (req.get("stream_options") or {}).get("include_usage") and self.flavor != "llama-cpp-python":
                # a chat's prompt is every message it carries (a multi-turn history too), one BOS in front
                plen = self.count(" ".join(str(m.get("content", "")) for m in req["messages"])) if chat else \
                    self.count(prompt)
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
    ap.add_argument("--flavor", choices=FLAVORS, default="default")
    ap.add_argument("--loading-s", type=float, default=1.0)
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--count-with", default=None)
    ap.add_argument("--record", default=None)
    a = ap.parse_args()
    app = FakeServer(Defaults(a.ttft_ms, a.gap_ms, a.coalesce, graph_failures=a.graph_failures, flavor=a.flavor,
                              loading_s=a.loading_s, models_route=not a.no_models, count_with=a.count_with,
                              record=a.record))
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
