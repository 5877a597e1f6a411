"""One streamed request against an OpenAI-compatible endpoint, timed the way `vllm bench serve` times it.

- TTFT: time from sending to the first chunk whose text (completions) or delta content (chat) is non-empty;
- ITL: gaps between consecutive content chunks (several events read in one network read share a timestamp);
- E2E latency: time to the last event carrying `choices` (content or finish_reason);
- output tokens: `usage.completion_tokens` from the final usage chunk (stream_options.include_usage).
A request succeeds when it saw content and the stream ended properly ([DONE] or a finish_reason).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from time import perf_counter

import httpx

from llmrs.bench import http1
from llmrs.bench.records import RequestResult, RequestSpec
from llmrs.bench.sse import SSEParser
from llmrs.trace import tr

# the sampling fields a request carries only when the bench was given them (`build_body`; the results' `params`)
OPTIONAL_SAMPLING = ("top_p", "top_k", "min_p")


@dataclass(slots=True)
class ClientConfig:
    """What a worker needs to build and send requests (picklable: it travels to worker processes)."""

    base_url: str
    model: str
    backend: str = "completions"  # completions | chat
    endpoint: str = ""  # default: /v1/completions or /v1/chat/completions
    api_key: str | None = None
    timeout: float = 600.0  # seconds, whole request
    ignore_eos: bool = False
    temperature: float = 0.0
    # sent only where set (OPTIONAL_SAMPLING; top_k and min_p are not OpenAI fields: vLLM, SGLang, llama.cpp and
    # llmrs take them)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None

    @property
    def url(self) -> str:
        path = self.endpoint or ("/v1/chat/completions" if self.backend == "chat" else "/v1/completions")
        return self.base_url.rstrip("/") + path

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def build_body(cfg: ClientConfig, spec: RequestSpec, history: list[dict] | None = None) -> bytes:
    """The JSON request body: streaming with usage, max_tokens = the spec's output length. `history`: a multi-turn
    conversation's earlier messages (user and assistant, alternating), sent before this turn's user message."""
    body: dict = {
        "model": cfg.model,
        "max_tokens": spec.output_len,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.backend == "chat":
        assert isinstance(spec.prompt, str), "chat prompts are text"
        body["messages"] = [*(history or ()), {"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    for key in OPTIONAL_SAMPLING:
        if getattr(cfg, key) is not None:
            body[key] = getattr(cfg, key)
    return json.dumps(body).encode()


def _short(body: bytes, n: int = 120) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    try:  # OpenAI-shaped errors: {"error": {"message": ...}}
        err = json.loads(text).get("error")
        text = err.get("message", text) if isinstance(err, dict) else str(err or text)
    except (ValueError, AttributeError):
        pass
    return text[:n]


async def send_request(client: httpx.AsyncClient | http1.StreamClient, cfg: ClientConfig, spec: RequestSpec,
                       body: bytes, res: RequestResult | None = None) -> RequestResult:
    """Send one request and time its stream into `res` (a new one by default; a caller that passes its own sees the
    chunks counted as they arrive); never raises but CancelledError (failures come back with their reason)."""
    if res is None:
        res = RequestResult(idx=spec.idx, input_len=spec.input_len)
    res.max_tokens = spec.output_len
    chat = cfg.backend == "chat"
    parts: list[str] = []
    itl = res.itl
    ttft = None
    last = last_choice = 0.0
    done = finished = False
    st = res.start = perf_counter()
    tr("client_send")
    try:
        async with asyncio.timeout(cfg.timeout):
            async with client.stream("POST", cfg.url, content=body, headers=cfg.headers()) as resp:
                if resp.status_code != 200:
                    res.error = f"HTTP {resp.status_code}: {_short(await resp.aread())}"
                    return res
                parser = SSEParser()
                async for raw in resp.aiter_raw():
                    now = perf_counter()
                    for payload in parser.feed(raw):
                        if payload == b"[DONE]":
                            done = True
                            continue
                        obj = json.loads(payload)
                        choices = obj.get("choices")
                        if choices:
                            c = choices[0]
                            if chat:
                                d = c.get("delta") or {}
                                text = d.get("content") or d.get("reasoning_content") or d.get("reasoning")
                            else:
                                text = c.get("text")
                            if text:
                                if ttft is None:
                                    ttft = now - st
                                    tr("client_first")
                                else:
                                    itl.append(now - last)
                                last = now
                                parts.append(text)
                                res.chunks += 1
                            if fr := c.get("finish_reason"):
                                finished = True
                                res.finish_reason = str(fr)
                            last_choice = now
                        usage = obj.get("usage")
                        if usage:
                            res.prompt_tokens = usage.get("prompt_tokens")
                            res.output_tokens = usage.get("completion_tokens")
                        if obj.get("error"):
                            res.error = f"stream error: {_short(payload)}"
    except TimeoutError:
        res.error = f"timeout after {cfg.timeout:g}s"
    except (httpx.RemoteProtocolError, http1.RemoteProtocolError) as e:
        res.error = f"stream closed early: {str(e)[:80]}"
    except (httpx.HTTPError, http1.HTTPError) as e:
        res.error = f"{type(e).__name__}: {str(e)[:80]}"
    except ValueError as e:  # bad JSON in an event
        res.error = f"bad event: {str(e)[:80]}"
    finally:
        res.end = perf_counter()
    res.text = "".join(parts)
    if ttft is not None:
        res.ttft = ttft
        res.latency = max(last, last_choice) - st
    if not res.error:
        if ttft is None:
            res.error = "no content received"
        elif not (done or finished):
            res.error = "stream closed early: no [DONE] or finish_reason"
    res.success = not res.error
    return res
