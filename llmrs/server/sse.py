"""Server-sent events as OpenAI streams them: `data: {json}\\n\\n` per chunk, `data: [DONE]\\n\\n` at the end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


TEXT_MARK = "\x00llmrs-text\x00"  # stand-ins for a chunk's text and choice index in `DeltaTemplate`
INDEX_MARK = -8_070_450_532_247_928_832


class DeltaTemplate:
    """The common streamed chunk (one choice, a text delta, no logprobs, not finished) as pre-encoded bytes:
    `render(index, text)` is byte-for-byte `event(obj)` of the same chunk, without building and dumping a dict
    per token. `obj` is the chunk with INDEX_MARK as the choice's index and TEXT_MARK as its text."""

    __slots__ = ("a", "b", "c")

    def __init__(self, obj: Any):
        raw = event(obj)
        a, rest = raw.split(str(INDEX_MARK).encode())
        b, c = rest.split(json.dumps(TEXT_MARK, ensure_ascii=False).encode())
        self.a, self.b, self.c = a, b, c

    def render(self, index: int, text: str) -> bytes:
        return b"".join((self.a, str(index).encode(), self.b, _encode_str(text).encode(), self.c))


_encode_str = json.encoder.encode_basestring  # what json.dumps(str, ensure_ascii=False) returns


def event_schema(chunk_ref: str) -> dict[str, Any]:
    """The JSON schema of one event of a stream (an SSE event as {"event", "data"}): `data` is a chunk's JSON
    (`chunk_ref`), an error object's (a failure after the headers went out), or `[DONE]`, the last."""
    return {"type": "object", "required": ["data"], "properties": {
        "event": {"const": "message"},
        "data": {"type": "string", "anyOf": [
            {"const": "[DONE]"},
            {"contentMediaType": "application/json", "contentSchema": {"anyOf": [
                {"$ref": chunk_ref}, {"$ref": "#/components/schemas/ErrorResponse"}]}}]}}}


def response(chunks: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]]) -> StreamingResponse:
    """A text/event-stream response; `cleanup` runs after it ends, however it ends (a client disconnect cancels
    the stream, possibly before the generator ever started, so its own `finally` is not enough)."""
    return StreamingResponse(chunks, media_type="text/event-stream", headers=HEADERS,
                             background=BackgroundTask(cleanup))
