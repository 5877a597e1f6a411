"""The OpenAPI document of a running server: FastAPI's, made to say what this server answers.

- the bounds only the running server knows, marked with `protocol.LIMIT` in the request schemas, filled in: token
  ids below the vocabulary, max_tokens within the context and the KV cache, n and the prompts of one request
  within --max-seqs-per-request;
- no 422 (FastAPI's validation error: this server answers every bad body with an OpenAI-shaped 400);
- with an API key, the routes that need it declare the bearer scheme and their 401;
- the streamed chunks' models in the components (the text/event-stream events' schemas refer to them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from llmrs.engine.protocol import EngineClient
from llmrs.server.protocol import INT64, LIMIT, STREAM_MODELS
from llmrs.server.serving import max_tokens_bound

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}


def decimal_at_most(m: int) -> str:
    """A regular expression of the decimal strings (ASCII digits, leading zeros allowed) whose value is <= m >= 0:
    the token-id keys of logit_bias (JSON object keys are strings)."""
    d, k = str(m), len(str(m))
    if k == 1:
        alts = [f"[0-{d}]"]
    else:
        alts = ["0", "[1-9]" if k == 2 else f"[1-9][0-9]{{0,{k - 2}}}"]  # fewer digits than m
        for i in range(k):  # m's first i digits, a smaller digit, then any
            lo, hi = (1 if i == 0 else 0), int(d[i]) - 1
            if hi >= lo:
                rest = k - i - 1
                alts.append(d[:i] + (str(lo) if hi == lo else f"[{lo}-{hi}]")
                            + ("" if rest == 0 else "[0-9]" if rest == 1 else f"[0-9]{{{rest}}}"))
        alts.append(d)
    return "^0*(?:" + "|".join(alts) + ")$"


def limits(engine: EngineClient, max_seqs_per_request: int) -> dict[str, dict[str, Any]]:
    """LIMIT marker -> the JSON-schema keywords it stands for on this server."""
    vocab = engine.config.vocab_size
    return {
        "token_id": {"maximum": vocab - 1},
        "detokenize_id": {"maximum": engine.tokenizer.vocab_size - 1},
        "token_key": {"pattern": decimal_at_most(vocab - 1)},
        "max_tokens": {"maximum": max_tokens_bound(engine)},
        "n": {"maximum": max_seqs_per_request},
        "prompts": {"maxItems": max_seqs_per_request},
        "int64": {"minimum": INT64[0], "maximum": INT64[1]},
    }


def _fill(node: Any, bounds: dict[str, dict[str, Any]]) -> None:
    if isinstance(node, dict):
        marker = node.pop(LIMIT, None)
        if marker is not None:
            node.update(bounds[marker])
        for v in node.values():
            _fill(v, bounds)
    elif isinstance(node, list):
        for v in node:
            _fill(v, bounds)


def document(app: FastAPI, engine: EngineClient, max_seqs_per_request: int,
             protected: Callable[[str], bool]) -> dict[str, Any]:
    doc = copy.deepcopy(get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes))
    _fill(doc, limits(engine, max_seqs_per_request))
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in STREAM_MODELS:  # referenced from the text/event-stream events' schemas
        one = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(one.pop("$defs", {}))
        schemas[model.__name__] = one
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    secured = False
    for path, ops in doc.get("paths", {}).items():
        for op in ops.values():
            op.get("responses", {}).pop("422", None)
            if protected(path):
                secured = True
                op["security"] = [{"bearer": []}]
                op["responses"]["401"] = {"description": "Missing or wrong API key",
                                          "content": {"application/json": {"schema": ERROR_REF}}}
    if secured:
        doc.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "llmrs serve --api-key"}}
    return doc
