"""Schemathesis hooks for tests/server/test_schema.py (loaded by its CLI through SCHEMATHESIS_HOOKS).

The OpenAPI document states every bound of a single field (ranges, vocabulary, context, sequences per request), so
schema-valid requests get 2xx and schema-violating ones 4xx. What JSON Schema cannot state is a rule between fields
or about the prompt's tokens, where the OpenAI API (and vLLM) answer a schema-valid request with a 400:
prompt + max_tokens over the context (OpenAI's context_length_exceeded), min_tokens over max_tokens, prompts x n
over --max-seqs-per-request, echo with logprobs, stream_options without stream, top_logprobs without logprobs,
tools that the model could call, a prompt of only characters the vocabulary lacks. `map_case` makes each *positive* (schema-valid) case also satisfy those rules, so
"positive data acceptance" tests everything else; negative cases go out untouched. It also keeps the positive cases
cheap on a 2-core CPU: max_tokens at most MAX_TOKENS (chat's default is the whole context), short text.
The rules themselves are tested with their 400s in test_server.py and test_limits.py.
"""

from __future__ import annotations

from typing import Any

import schemathesis

MAX_SEQS = 4  # the server's --max-seqs-per-request (test_schema.py starts it so)
MAX_TOKENS = 3
MAX_CHARS = 24  # a prompt string at most this long: <= ~100 tokens whatever its characters
MAX_IDS = 64
MAX_MESSAGES = 3


def _short(text: Any) -> Any:
    return text[:MAX_CHARS] if isinstance(text, str) else text


def _prompt_text(text: str) -> str:
    """A prompt string with at least one token: a string of only characters the vocabulary lacks (SmolLM2's has no
    token for U+0004, U+0006, ...: the tokenizer drops them, as HF's does) is an empty prompt, a 400 as in vLLM."""
    return "A" + text[:MAX_CHARS]


def _fit_prompt(body: dict) -> int:
    """Shorten the completions prompt; how many prompts (engine requests) it holds."""
    p = body.get("prompt")
    if isinstance(p, str):
        body["prompt"] = _prompt_text(p)
        return 1
    if isinstance(p, list) and p and all(isinstance(x, list) for x in p):
        body["prompt"] = [x[:MAX_IDS] for x in p]
        return len(p)
    if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        body["prompt"] = [_prompt_text(x) for x in p]
        return len(p)
    if isinstance(p, list):
        body["prompt"] = p[:MAX_IDS]
    return 1


def _fit_messages(body: dict) -> None:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return
    body["messages"] = msgs = msgs[:MAX_MESSAGES]
    for m in msgs:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            m["content"] = m["content"][:2]
            for part in m["content"]:
                if isinstance(part, dict):
                    part["text"] = _short(part.get("text"))
        elif isinstance(m, dict):
            m["content"] = _short(m.get("content"))


def _fit_generation(body: dict, chat: bool) -> None:
    prompts = 1
    if chat:
        _fit_messages(body)
        if body.get("top_logprobs") and not body.get("logprobs"):
            body["logprobs"] = True
        if body.get("tools") and body.get("tool_choice") != "none":
            body["tool_choice"] = "none"
    else:
        prompts = _fit_prompt(body)
        if body.get("echo") is True and body.get("logprobs") is not None:
            body["echo"] = False
    if body.get("stream_options") is not None and body.get("stream") is not True:
        body["stream"] = True
    n = body.get("n") or 1
    if prompts * n > MAX_SEQS:
        body["n"] = max(1, MAX_SEQS // prompts)
    names = ["max_tokens", "max_completion_tokens"] if chat else ["max_tokens"]
    for name in names:
        if body.get(name) is not None:
            body[name] = min(body[name], MAX_TOKENS)
    if all(body.get(name) is None for name in names):
        body["max_tokens"] = MAX_TOKENS
    used = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") is not None \
        else body["max_tokens"]
    if body.get("min_tokens") is not None:
        body["min_tokens"] = min(body["min_tokens"], used)


@schemathesis.hook
def map_case(context, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    path = case.operation.path
    if path in ("/v1/completions", "/v1/chat/completions"):
        _fit_generation(case.body, chat=path == "/v1/chat/completions")
    elif path == "/tokenize":
        _fit_messages(case.body)
    return case
