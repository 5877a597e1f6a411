"""OpenAI-shaped errors, `{"error": {"message", "type", "param", "code"}}`, for every failure the server answers.

A client's mistake is always a 4xx that names the problem: FastAPI's 422 for a body that does not validate
(unknown field, wrong type, malformed JSON) becomes a 400 whose message names the field; a UserError from the
engine (bad sampling value, prompt + max_tokens over the context) is a 400; only the server's own bugs are 500s.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmrs.engine.protocol import EngineDeadError
from llmrs.errors import UserError

log = logging.getLogger("llmrs.server")

# status -> OpenAI's error type
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error answered as OpenAI does: raise it anywhere in a route."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class GenerationFailed(APIError):
    """The engine failed a request (RequestOutput.error): a 500 "generation failed: <why>"; its engine keeps
    serving the others."""

    def __init__(self, why: str | None):
        super().__init__(500, f"generation failed: {why or 'the engine gave no reason'}")


def printable(text: str) -> str:
    """`text` with every character UTF-8 cannot encode (a lone surrogate, as a client can send with "\\ud800" in
    JSON) written as its escape, `\\ud800`: an error message that echoes a client's string must always encode,
    or answering the error fails too (a 500 whose exception resets the keep-alive connection)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The error object every failure is answered with (responses, SSE error events, the ASGI guard's refusals):
    its strings made encodable here, the one place they all pass."""
    return {"error": {"message": printable(message), "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": None if param is None else printable(param), "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def user_error(e: UserError, fields: frozenset[str] = frozenset()) -> APIError:
    """A UserError as a 400; `param` is the field its message starts with ("temperature must be ...")."""
    message = str(e)
    first = message.split(" ", 1)[0]
    return APIError(400, message, param=first if first in fields else None)


_UNION_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _loc(loc: tuple) -> str:
    """pydantic's location as a path: ('body', 'messages', 0, 'content', 'list[ContentPart]', 0, 'type') ->
    messages[0].content[0].type (the leading 'body' and union-member tags dropped)."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, str) and (part in _UNION_TAGS or "[" in part or "-" in part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One clear line (and the `param`) for the first problem pydantic found in a request body."""
    if not errors:
        return "invalid request body", None
    e = max(errors, key=lambda x: len(x.get("loc", ())))  # the deepest: in a union, the branch that got furthest
    kind, where = e.get("type", ""), _loc(tuple(e.get("loc", ())))
    msg = str(e.get("msg", "invalid value"))
    if kind == "json_invalid":
        detail = (e.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON{': ' + detail if detail else ''}", None
    if kind == "string_unicode":  # pydantic reads no str with a lone surrogate in a key (values reach the routes)
        what = f"'{where}'" if where else "the request body"
        return f"invalid {what}: a string that is not valid Unicode (a lone surrogate such as \\ud800)", where or None
    if not where:
        if kind == "missing" or isinstance(e.get("input"), bytes | str):
            return "the request needs a JSON object body (Content-Type: application/json)", None
        return f"the request body must be a JSON object ({msg})", None
    if kind == "extra_forbidden":
        return f"unsupported parameter '{where}': this server does not accept it", where
    if kind == "missing":
        return f"missing required parameter '{where}'", where
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"invalid value for '{where}': {msg}", where


def install(app: FastAPI) -> None:
    """Route every error through OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e.status, e.message, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(e.errors()))
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        message = e.detail if isinstance(e.detail, str) else str(e.detail)
        if e.status_code == 404:
            message = "no such route (see GET /v1/models, POST /v1/completions, POST /v1/chat/completions)"
        return error_response(e.status_code, message, headers=getattr(e, "headers", None))

    @app.exception_handler(UserError)
    async def _user(_: Request, e: UserError) -> JSONResponse:
        return error_response(400, str(e))

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return error_response(503, f"the engine is not available: {e}")

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:
        log.exception("internal error")
        return error_response(500, f"internal server error: {type(e).__name__}: {e}")
