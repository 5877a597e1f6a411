"""The FastAPI app: routes, OpenAI-shaped errors, and one ASGI guard in front (API key, body size limit).

With an API key, every route needs it but /health and /version (a probe must not need the secret), and /metrics
while --metrics-public (the default, as vLLM); the docs routes (/docs, /redoc, /openapi.json) exist only with
--docs, behind the key too.

The engine is built before the app (the model loads before the port answers); the app's lifespan starts its
loop thread and, at shutdown, aborts whatever still runs and joins the thread.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import llmrs
from llmrs import trace
from llmrs.engine.protocol import EngineClient
from llmrs.server import errors, openapi
from llmrs.server.metrics import ServerMetrics
from llmrs.server.routes import router
from llmrs.server.serving import ServerState

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


DEFAULT_MAX_SEQS_PER_REQUEST = 128  # vLLM's bound on n
OPEN_PATHS = frozenset({"/health", "/version"})
DOCS_PATHS = ("/docs", "/redoc", "/openapi.json")


@dataclass(slots=True)
class ServerSettings:
    served_names: list[str]
    model_root: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    block_size: int = 16
    metrics_public: bool = True
    docs: bool = False
    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST

    def needs_key(self, path: str) -> bool:
        """Whether a request to `path` must carry the API key (none: nothing does)."""
        if not self.api_key or path in OPEN_PATHS:
            return False
        return not (path == "/metrics" and self.metrics_public)


class Guard:
    """Pure ASGI middleware: Bearer auth on /v1 routes (401), then the request body read up to the limit (413)
    and replayed to the app. Raw ASGI, so a refusal costs no JSON parsing and a huge body is never buffered."""

    def __init__(self, app: ASGIApp, settings: ServerSettings):
        self.app, self.settings = app, settings
        self.api_key, self.max_body_bytes = (settings.api_key or "").encode(), settings.max_body_bytes

    async def _refuse(self, send: Send, status: int, message: str, code: str | None = None,
                      headers: list[tuple[bytes, bytes]] = ()) -> None:
        body = json.dumps(errors.error_body(status, message, code=code)).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.settings.needs_key(scope["path"]):
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.api_key):
                what = "wrong API key" if auth else "missing API key"
                return await self._refuse(send, 401, f"{what}: send the header 'Authorization: Bearer <key>'",
                                          "invalid_api_key", [(b"www-authenticate", b"Bearer")])
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        limit = self.max_body_bytes
        too_large = f"the request body is larger than the server's limit of {limit} bytes (--max-body-bytes)"
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._refuse(send, 413, too_large)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self._refuse(send, 413, too_large)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: waits for the client's disconnect

        await self.app(scope, replay, send)


def build_app(engine: EngineClient, settings: ServerSettings) -> FastAPI:
    """The app over a built (not yet started) engine."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await warm_up()
        engine.start()
        try:
            yield
        finally:
            await engine.shutdown(abort_running=True)

    docs = dict(zip(("docs_url", "redoc_url", "openapi_url"), DOCS_PATHS if settings.docs else (None,) * 3))
    app = FastAPI(title="llmrs", summary="OpenAI-compatible server over the llmrs engine", version=llmrs.__version__,
                  lifespan=lifespan, swagger_ui_oauth2_redirect_url=None, **docs)
    app.state.llmrs = ServerState(engine=engine, metrics=ServerMetrics(engine, settings.served_names[0]),
                                  served_names=settings.served_names, model_root=settings.model_root,
                                  block_size=settings.block_size, max_seqs_per_request=settings.max_seqs_per_request)
    errors.install(app)
    app.include_router(router)
    app.openapi = lambda: app.openapi_schema or _openapi(app, engine, settings)  # type: ignore[method-assign]
    app.add_middleware(Guard, settings=settings)
    if trace.PATH is not None:  # LLMRS_TRACE_FILE: the request's first moment inside the app (outermost)
        app.add_middleware(TraceEntry)
    return app


def _openapi(app: FastAPI, engine: EngineClient, settings: ServerSettings) -> dict:
    app.openapi_schema = openapi.document(app, engine, settings.max_seqs_per_request,
                                          protected=settings.needs_key)
    return app.openapi_schema


async def warm_up() -> None:
    """What the first request would otherwise pay inside a burst: the first streamed response's task group imports
    anyio's asyncio backend (anyio._backends._asyncio and 12 more modules: ~13 ms on a 2-core VM, more from sources
    without .pyc, as `pip install --no-compile` leaves them); here, before the port answers."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep, 0)


class TraceEntry:
    """ASGI middleware: the `asgi_enter` tag of llmrs.trace for each HTTP request."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            trace.tr("asgi_enter")
        await self.app(scope, receive, send)
