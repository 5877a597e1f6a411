"""The routes: /v1/completions, /v1/chat/completions, /v1/models(/ID), /health, /version, /tokenize, /detokenize,
/metrics."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

import llmrs
from llmrs.errors import UserError
from llmrs.server import sse
from llmrs.server.errors import APIError, error_body, error_response, user_error
from llmrs.server.metrics import CONTENT_TYPE
from llmrs.server.protocol import (
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, CompletionChunk, CompletionRequest,
    CompletionResponse, DetokenizeRequest,
    DetokenizeResponse, ErrorResponse, HealthResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
    VersionResponse,
)
from llmrs.server.serving import (
    ChoiceAcc, Generation, ServerState, chat_logprobs, completion_logprobs, until_disconnect, usage,
    validate,
)
from llmrs.trace import tr

router = APIRouter()
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy default
OFF_LOOP_CHARS = 64 * 1024  # text longer than this is tokenized in a worker thread (`_off_loop`)
HEALTH_RETRY_AFTER_S = 2  # /health's Retry-After while the engine restarts


def _state(request: Request) -> ServerState:
    return request.app.state.llmrs


def _check_stream_options(req) -> None:
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")


def _stream_error(e: Exception) -> bytes:
    """The SSE event of a failure after the stream's headers went out: an OpenAI error object, then [DONE]."""
    if isinstance(e, APIError):
        return sse.event(error_body(e.status, e.message, e.param, e.code))
    return sse.event(error_body(500, f"generation failed: {e}"))


# ---------------------------------------------------------------------- the OpenAPI document's responses
_ERRORS = {
    400: "A bad value, type or field; prompt + max_tokens over the context; too many sequences",
    404: "No such model (or route)",
    413: "The body is over --max-body-bytes",
    429: "--max-waiting requests already wait",
    500: "A server bug, or the engine failed this request",
    503: "The engine is not available",
}  # (401 is declared by llmrs.server.openapi on the routes that need the key)


def _responses(ok: type | None, *errors: int, media: str | None = None, stream: type | None = None) -> dict:
    """`responses=` of a route: its 200 (a response model, or `media` as text), the OpenAI errors it may answer."""
    out: dict = {code: {"model": ErrorResponse, "description": _ERRORS[code]} for code in (*errors, 500)}
    ok_doc: dict = {"description": "OK"}
    if ok is not None:
        ok_doc["model"] = ok
    content = {}
    if media is not None:
        content[media] = {"schema": {"type": "string"}}
    if stream is not None:  # `stream: true`: SSE `data: {chunk}` events, an error event if it fails, `data: [DONE]`
        content["text/event-stream"] = {"schema": sse.event_schema(f"#/components/schemas/{stream.__name__}")}
    if content:
        ok_doc["content"] = content
    out[200] = ok_doc
    return out




# ---------------------------------------------------------------------- plain endpoints
@router.get("/health", response_model=None, responses=_responses(HealthResponse, 503))
async def health(request: Request) -> Response:
    """200 {"status": "ok"} while serving; 503 (OpenAI-shaped) while the engine restarts after a failure (with
    Retry-After; requests sent meanwhile wait for it) or once it is dead (`--on-engine-death`)."""
    status, why = _state(request).engine.health()
    if status == "ok":
        return JSONResponse({"status": "ok"})
    if status == "restarting":
        return error_response(503, f"the engine is restarting: {why}", code="engine_restarting",
                              headers={"Retry-After": str(HEALTH_RETRY_AFTER_S)})
    return error_response(503, f"the engine is dead: {why}", code="engine_dead")


def _models(st: ServerState) -> list[dict]:
    return [{"id": name, "object": "model", "created": st.created, "owned_by": "llmrs", "root": st.model_root,
             "parent": None, "max_model_len": st.engine.max_model_len} for name in st.served_names]


@router.get("/v1/models", response_model=None, responses=_responses(ModelList))
async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": _models(_state(request))})


@router.get("/v1/models/{model:path}", response_model=None, responses=_responses(ModelCard, 404))
async def model_info(model: str, request: Request) -> Response:
    for m in _models(_state(request)):
        if m["id"] == model:
            return JSONResponse(m)
    raise APIError(404, f"the model '{model}' does not exist", param="model", code="model_not_found")


@router.get("/version", response_model=None, responses=_responses(VersionResponse))
async def version() -> Response:
    return JSONResponse({"version": llmrs.__version__})


@router.get("/metrics", response_class=PlainTextResponse, responses=_responses(None, media="text/plain"))
async def metrics(request: Request) -> Response:
    """Prometheus' text format (vLLM's metric names under `llmrs:`)."""
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


@router.post("/tokenize", response_model=None, responses=_responses(TokenizeResponse, 400, 404, 413))
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    st = _state(request)
    st.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of 'prompt' or 'messages'", param="prompt")
    try:
        if body.prompt is not None:
            ids = await _off_loop(st.tokenizer.encode, body.prompt, body.add_special_tokens, size=len(body.prompt))
        else:
            ids = await _encode_chat(st, [m.as_template_dict() for m in body.messages], body.add_generation_prompt)
    except UserError as e:
        raise user_error(e) from None
    return JSONResponse({"count": len(ids), "max_model_len": st.engine.max_model_len, "tokens": ids})


@router.post("/detokenize", response_model=None, responses=_responses(DetokenizeResponse, 400, 404, 413))
async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    st = _state(request)
    st.check_model(body.model)
    vocab = st.tokenizer.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
    return JSONResponse({"prompt": st.tokenizer.decode(body.tokens, skip_special_tokens=False)})


# ---------------------------------------------------------------------- /v1/completions
async def _off_loop(fn, *args, size: int):
    """fn(*args) in a worker thread when `size` characters of text make it long (tokenizing ~1 MB takes ~0.4 s, and
    on the event loop every open stream would wait it out), inline otherwise (a thread hop costs ~50-100 us)."""
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def _encode_chat(st: ServerState, msgs: list[dict], add_generation_prompt: bool) -> list[int]:
    return await _off_loop(st.tokenizer.encode_chat, msgs, add_generation_prompt,
                           size=sum(len(m["content"]) for m in msgs))


async def _completion_prompts(st: ServerState, prompt) -> tuple[list[list[int]], list[str | None]]:
    """Token ids (and the original text, for echo) of each prompt in str | list[str] | list[int] | list[list[int]]."""
    if isinstance(prompt, str):
        return [await _off_loop(st.tokenizer.encode, prompt, size=len(prompt))], [prompt]
    if all(isinstance(p, str) for p in prompt):
        def encode_all() -> list[list[int]]:
            return [st.tokenizer.encode(p) for p in prompt]
        return await _off_loop(encode_all, size=sum(map(len, prompt))), list(prompt)
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)], [None]
    return [list(p) for p in prompt], [None] * len(prompt)


def _num_prompts(prompt) -> int:
    """How many prompts (engine requests) a completions `prompt` of a validated shape holds."""
    return 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)


@router.post("/v1/completions", response_model=None,
             responses=_responses(CompletionResponse, 400, 404, 413, 429, 503, stream=CompletionChunk))
async def completions(body: CompletionRequest, request: Request) -> Response:
    arrival = time.perf_counter()
    tr("route")
    st = _state(request)
    model = st.check_model(body.model)
    _check_stream_options(body)
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo together with logprobs is not supported (no prompt logprobs)", param="echo")
    st.check_seqs(_num_prompts(body.prompt), body.n or 1)
    st.check_max_tokens(max_tokens=body.max_tokens)
    prompts, texts = await _completion_prompts(st, body.prompt)
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    params = [validate(body.sampling_params(max_tokens, body.logprobs)) for _ in prompts]
    n = params[0].n
    rid = f"cmpl-{uuid.uuid4().hex}"
    gen = await Generation.start(st, rid, prompts, params, arrival)
    created = int(time.time())
    echo = {}
    if body.echo:
        echo = {i: t if t is not None else st.tokenizer.decode(prompts[i], skip_special_tokens=False)
                for i, t in enumerate(texts)}
    n_prompt = sum(len(p) for p in prompts)

    if body.stream:
        async def chunks() -> AsyncIterator[bytes]:
            head = {"id": rid, "object": "text_completion", "created": created, "model": model}
            tail = {"usage": None} if body.include_usage else {}
            plain = sse.DeltaTemplate({**head, "choices": [{"index": sse.INDEX_MARK, "text": sse.TEXT_MARK,
                                                            "logprobs": None, "finish_reason": None}], **tail})
            offsets: dict[int, int] = {}
            out_tokens: dict[int, int] = {}
            continuous = body.continuous_usage
            try:
                async for p, out in gen.events():
                    tr("sse_event")
                    idx = p * n + out.index
                    text = out.text
                    if idx not in offsets:
                        text = echo.get(p, "") + text
                        offsets[idx] = len(text) - len(out.text)
                    out_tokens[idx] = out.num_output_tokens
                    lp = None
                    if body.logprobs is not None and out.logprobs:
                        lp, offsets[idx] = completion_logprobs(st, out.logprobs, offsets[idx])
                    if lp is None and out.finish_reason is None and (not text or not continuous):
                        if text:
                            yield plain.render(idx, text)
                        continue
                    choice = {"index": idx, "text": text, "logprobs": lp, "finish_reason": out.finish_reason}
                    if continuous:  # this choice's tokens so far, as vLLM counts them
                        tail = {"usage": usage(len(prompts[p]), out.num_output_tokens)}
                    yield sse.event({**head, "choices": [choice], **tail})
                if body.include_usage:
                    yield sse.event({**head, "choices": [], "usage": usage(n_prompt, sum(out_tokens.values()))})
            except Exception as e:  # noqa: BLE001 - headers are sent: report in-band
                yield _stream_error(e)
            finally:
                await gen.close()
            yield sse.DONE

        return sse.response(chunks(), gen.close)

    async def collect() -> dict[int, ChoiceAcc]:
        acc: dict[int, ChoiceAcc] = {}
        async for p, out in gen.events():
            acc.setdefault(p * n + out.index, ChoiceAcc()).add(out)
        return acc

    try:
        acc = await until_disconnect(request, collect())
    finally:
        await gen.close()
    if acc is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    choices = []
    for idx in sorted(acc):
        c, p = acc[idx], idx // n
        lp = completion_logprobs(st, c.logprobs, len(echo.get(p, "")))[0] if body.logprobs is not None else None
        choices.append({"index": idx, "text": echo.get(p, "") + "".join(c.text), "logprobs": lp,
                        "finish_reason": c.finish_reason})
    return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": model,
                         "choices": choices, "usage": usage(n_prompt, sum(c.num_output_tokens for c in acc.values()))})


# ---------------------------------------------------------------------- /v1/chat/completions
@router.post("/v1/chat/completions", response_model=None,
             responses=_responses(ChatCompletionResponse, 400, 404, 413, 429, 503, stream=ChatCompletionChunk))
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    arrival = time.perf_counter()
    tr("route")
    st = _state(request)
    model = st.check_model(body.model)
    _check_stream_options(body)
    if body.tool_calling():
        raise APIError(400, "tool calling is not supported by this server: send no tools, or tool_choice 'none'",
                       param="tool_choice" if body.tool_choice is not None else "tools")
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    st.check_seqs(1, body.n or 1)
    st.check_max_tokens(max_tokens=body.max_tokens, max_completion_tokens=body.max_completion_tokens)
    add_gen = body.add_generation_prompt if body.add_generation_prompt is not None else True
    try:
        ids = await _encode_chat(st, body.template_messages(), add_gen)
    except UserError as e:
        raise user_error(e) from None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if max_tokens is None:
        max_tokens = st.default_max_tokens(len(ids))
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = validate(body.sampling_params(max_tokens, logprobs))
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    gen = await Generation.start(st, rid, [ids], [params], arrival)
    created = int(time.time())

    if body.stream:
        async def chunks() -> AsyncIterator[bytes]:
            head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            tail = {"usage": None} if body.include_usage else {}
            plain = sse.DeltaTemplate({**head, "choices": [{"index": sse.INDEX_MARK, "delta": {"content": sse.TEXT_MARK},
                                                            "logprobs": None, "finish_reason": None}], **tail})
            out_tokens = [0] * params.n
            continuous = body.continuous_usage
            try:
                for i in range(params.n):
                    role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}
                    yield sse.event({**head, "choices": [role], **({"usage": usage(len(ids), 0)} if continuous
                                                                   else tail)})
                async for _, out in gen.events():
                    tr("sse_event")
                    out_tokens[out.index] = out.num_output_tokens
                    lp = {"content": chat_logprobs(st, out.logprobs)} if logprobs is not None and out.logprobs else None
                    if lp is None and out.finish_reason is None and (not out.text or not continuous):
                        if out.text:
                            yield plain.render(out.index, out.text)
                        continue
                    delta = {"content": out.text} if out.text else {}
                    choice = {"index": out.index, "delta": delta, "logprobs": lp, "finish_reason": out.finish_reason}
                    if continuous:  # this choice's tokens so far, as vLLM counts them
                        tail = {"usage": usage(len(ids), out.num_output_tokens)}
                    yield sse.event({**head, "choices": [choice], **tail})
                if body.include_usage:
                    yield sse.event({**head, "choices": [], "usage": usage(len(ids), sum(out_tokens))})
            except Exception as e:  # noqa: BLE001 - headers are sent: report in-band
                yield _stream_error(e)
            finally:
                await gen.close()
            yield sse.DONE

        return sse.response(chunks(), gen.close)

    async def collect() -> dict[int, ChoiceAcc]:
        acc: dict[int, ChoiceAcc] = {}
        async for _, out in gen.events():
            acc.setdefault(out.index, ChoiceAcc()).add(out)
        return acc

    try:
        acc = await until_disconnect(request, collect())
    finally:
        await gen.close()
    if acc is None:
        return Response(status_code=499)
    choices = [{"index": i, "message": {"role": "assistant", "content": "".join(c.text)},
                "logprobs": {"content": chat_logprobs(st, c.logprobs)} if logprobs is not None else None,
                "finish_reason": c.finish_reason} for i, c in sorted(acc.items())]
    return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": model,
                         "choices": choices, "usage": usage(len(ids), sum(c.num_output_tokens for c in acc.values()))})

