"""What `llmrs serve` guards: an empty API key is refused at start; with a key, every route but /health and /version
needs it (/metrics as --metrics-public says, the docs only with --docs); the sequences one request may make are
bounded by --max-seqs-per-request, refused before any tokenizing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.server.test_server import MODEL, ROOT


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
