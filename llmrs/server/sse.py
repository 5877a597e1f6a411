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


def response(chunks: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]]) -> StreamingResponse:
    """A text/event-stream response; `cleanup` runs after it ends, however it ends (a client disconnect cancels
    the stream, possibly before the generator ever started, so its own `finally` is not enough)."""
    return StreamingResponse(chunks, media_type="text/event-stream", headers=HEADERS,
                             background=BackgroundTask(cleanup))
