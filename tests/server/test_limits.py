"""What `llmrs serve` guards: an empty API key is refused at start; with a key, every route but /health and /version
needs it (/metrics as --metrics-public says, the docs only with --docs); the sequences one request may make are
bounded by --max-seqs-per-request, refused before any tokenizing."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.server.test_server import API_KEY, MODEL, ROOT, Server, _error, _servers, guarded, post, server  # noqa: F401


def _serve(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "llmrs", "serve", MODEL, "--port", "0", *args], env=full_env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, env, name", [
    (["--api-key", ""], {}, "--api-key"),
    (["--api-key", "  "], {}, "--api-key"),
    ([], {"LLMRS_API_KEY": ""}, "LLMRS_API_KEY"),
])
def test_an_empty_api_key_is_an_error_at_start(args, env, name):
    """An empty key would turn authentication off without a word: one error line naming it, exit 2, before the
    model loads."""
    r = _serve(args, env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{name} is empty" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---------------------------------------------------------------------- which routes need the key
def test_with_a_key_every_route_but_health_and_version_needs_it(guarded):
    """`guarded` has a key, /metrics public (the default) and no --docs: /tokenize and /detokenize (CPU work) need
    the key like /v1; /health, /version and /metrics answer without it; the docs routes do not exist."""
    key = {"Authorization": f"Bearer {API_KEY}"}
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})):
        assert "missing API key" in _error(post(guarded, path, body), 401)
        assert "wrong API key" in _error(post(guarded, path, body, headers={"Authorization": "Bearer nope"}), 401)
        assert post(guarded, path, body, headers=key).status_code == 200
    for path in ("/health", "/version", "/metrics"):
        assert httpx.get(guarded.url + path, timeout=10, trust_env=False).status_code == 200, path
    for path in ("/docs", "/redoc", "/openapi.json"):
        r = httpx.get(guarded.url + path, headers=key, timeout=10, trust_env=False)
        assert r.status_code == 404, (path, r.status_code)
    # deny by default: a route that does not exist needs the key before it is a 404
    assert httpx.get(guarded.url + "/nowhere", timeout=10, trust_env=False).status_code == 401


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    srv = Server(["--kv-cache-tokens", "1024", "--api-key", API_KEY, "--no-metrics-public", "--docs",
                  "--max-seqs-per-request", "8"], tmp_path_factory.mktemp("locked") / "serve.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        assert srv.stop() == 0


def test_no_metrics_public_and_docs_are_behind_the_key(locked):
    key = {"Authorization": f"Bearer {API_KEY}"}
    for path in ("/metrics", "/docs", "/redoc", "/openapi.json"):
        assert "missing API key" in _error(httpx.get(locked.url + path, timeout=10, trust_env=False), 401), path
        r = httpx.get(locked.url + path, headers=key, timeout=10, trust_env=False)
        assert r.status_code == 200, (path, r.text[:300])
    doc = httpx.get(locked.url + "/openapi.json", headers=key, timeout=10, trust_env=False).json()
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer",
                                                             "description": "llmrs serve --api-key"}
    assert "security" not in doc["paths"]["/health"]["get"] and "security" not in doc["paths"]["/version"]["get"]
    assert doc["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]
    for path in ("/health", "/version"):
        assert httpx.get(locked.url + path, timeout=10, trust_env=False).status_code == 200


# ---------------------------------------------------------------------- sequences per request
def test_sequences_over_the_limit_are_a_400_naming_it(locked):
    key = {"Authorization": f"Bearer {API_KEY}"}
    cases = [({"prompt": ["a", "b", "c"], "n": 3}, "9 sequences (3 prompts x n=3)", "n"),
             ({"prompt": [[1, 2]] * 9}, "9 sequences (9 prompts x n=1)", "prompt"),
             ({"prompt": "a", "n": 9}, "9 sequences (n=9)", "n")]
    for body, what, param in cases:
        r = post(locked, "/v1/completions", {**body, "max_tokens": 1}, headers=key)
        message = _error(r, 400)
        assert what in message and "at most 8" in message and "--max-seqs-per-request" in message, message
        assert r.json()["error"]["param"] == param
    r = post(locked, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 9,
                                              "max_tokens": 1}, headers=key)
    assert "--max-seqs-per-request" in _error(r, 400)
    r = post(locked, "/v1/completions", {"prompt": ["a", "b"], "n": 4, "max_tokens": 1}, headers=key)
    assert r.status_code == 200 and len(r.json()["choices"]) == 8, r.text


def test_two_thousand_prompts_times_sixteen_are_refused_before_any_work(server):
    """2,000 prompts x n=16 (a 15 KB body) held the server for minutes: now a 400 from the body's shape, with no
    prompt tokenized or queued (the engine's prompt-token counter does not move)."""
    before = server.metrics()["llmrs:prompt_tokens_total"]
    r = post(server, "/v1/completions", {"prompt": ["Hello there"] * 2000, "n": 16, "max_tokens": 16})
    message = _error(r, 400)
    assert "32000 sequences (2000 prompts x n=16)" in message and "at most 128" in message, message
    assert server.metrics()["llmrs:prompt_tokens_total"] == before
    assert server.metrics()["llmrs:num_requests_waiting"] == 0
