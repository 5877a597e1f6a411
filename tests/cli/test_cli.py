"""The real `llmrs` command: it generates, and each bad input gives one clear line and exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def llmrs(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "llmrs", *args], capture_output=True, text=True, env=env,
                          input=input, timeout=300)


def assert_user_error(res: subprocess.CompletedProcess, *words: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and res.stderr.rstrip().endswith(lines[0]), res.stderr  # one line, and it is the last
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("args", [["generate"], ["generate", "The capital of France is"], ["serve", "--port", "x"],
                                  ["no-such-command"]])
def test_usage_mistakes_get_the_usage_line_and_exit_2_without_a_traceback(args):
    res = llmrs(*args)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr and "Usage:" in res.stderr and "Error" in res.stderr, res.stderr[-2000:]


def test_generate_streams_text_and_prints_summary(tiny_llama):
    res = llmrs("generate", "--model", str(tiny_llama), "-p", "Hello world", "--max-tokens", "8")
    assert res.returncode == 0, res.stderr
    assert "8 tokens" in res.stderr and "tok/s" in res.stderr and "finish: length" in res.stderr


def test_generate_on_embedded_model_greedy_answer():
    res = llmrs("generate", "-p", "The capital of France is", "--max-tokens", "6")
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout


def test_chat_multi_turn_keeps_history(tiny_llama):
    res = llmrs("chat", "--model", str(tiny_llama), "--max-tokens", "4", input="Hello\nAgain\n\n")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("tokens,") == 2


def test_info_json_on_hf_dir(tiny_qwen2):
    res = llmrs("info", str(tiny_qwen2), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["architecture"] == "qwen2" and data["qkv_bias"] and data["chat_template"]
    assert data["bytes_by_dtype"] == {"F32": data["parameters"] * 4}


def test_missing_path():
    assert_user_error(llmrs("generate", "--model", "/nonexistent/model", "-p", "x"), "model not found")


def test_directory_without_config(tmp_path):
    assert_user_error(llmrs("info", str(tmp_path)), "no config.json")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    assert_user_error(llmrs("info", str(tmp_path)), "unsupported architecture", "gpt2")


def test_truncated_safetensors(tiny_llama, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    f = bad / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert_user_error(llmrs("generate", "--model", str(bad), "-p", "x"), "truncated safetensors")


def test_truncated_gguf(smollm2_path, tmp_path):
    bad = tmp_path / "bad.gguf"
    with open(smollm2_path, "rb") as src:
        bad.write_bytes(src.read(5_000_000))
    assert_user_error(llmrs("generate", "--model", str(bad), "-p", "x"), "bad.gguf", "truncated GGUF file")


def test_prompt_longer_than_context(tiny_llama):
    # the tiny model's context is 256 tokens
    assert_user_error(llmrs("generate", "--model", str(tiny_llama), "-p", "word " * 400), "context is 256 tokens")


def test_bad_sampling_value(tiny_llama):
    assert_user_error(llmrs("generate", "--model", str(tiny_llama), "-p", "x", "--top-p", "1.5"), "top_p")


def test_debug_shows_traceback():
    res = llmrs("--debug", "info", "/nonexistent/model")
    assert res.returncode != 0 and "Traceback" in res.stderr


@pytest.mark.parametrize("cmd", ["generate", "chat", "info"])
def test_help_lists_defaults(cmd):
    res = llmrs(cmd, "--help")
    assert res.returncode == 0 and "smollm2-135m" in res.stdout  # the default model is shown


def test_synthetic_model_without_gpu_says_so():
    res = llmrs("generate", "--synthetic", "qwen2.5-0.5b", "-p", "x", "--device", "cpu")
    assert_user_error(res, "synthetic", "--device cuda")


def test_unknown_synthetic_preset():
    assert_user_error(llmrs("info", "synthetic:qwen9-1b"), "qwen9-1b")


def test_outputs_to_places_that_cannot_be_written_are_user_errors(tmp_path):
    """report -o, bench -o (checked before the run, so a long benchmark never ends unable to save) and
    roofline --plot under a path whose parent is a file: one error line each."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = str(blocker / "sub")
    res = llmrs("bench", "--url", "http://127.0.0.1:9", "--model", "m", "-n", "1", "--prompt-format", "ids",
                "-o", bad)
    assert_user_error(res, "--out-dir", "cannot write")
    results = ROOT / "reports" / "h200" / "bench-7b-c1.json"  # a committed bench results file
    assert_user_error(llmrs("report", str(results), "-o", bad), "--out", "cannot write")
    pytest.importorskip("matplotlib")
    res = llmrs("roofline", "-m", "qwen2.5-7b", "--gpu", "h200", "--plot", str(blocker / "x.png"))
    assert_user_error(res, "--plot", "cannot write")


def test_synth_into_a_place_it_cannot_write_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the output directory's parent should be
    assert_user_error(llmrs("synth", "--like", "smollm2-135m", "--out", str(blocker / "ckpt")), "--out", "cannot write")


def test_http_stack_switch(monkeypatch):
    """LLMRS_HTTP_STACK (A/B of uvicorn's event loop and HTTP parser): auto leaves uvicorn's choice, h11 pins
    asyncio + h11; a typo fails `llmrs serve` with one error line before any model loads."""
    from llmrs.errors import UserError
    from llmrs.cli.serve import http_stack

    monkeypatch.delenv("LLMRS_HTTP_STACK", raising=False)
    assert http_stack() == {"loop": "auto", "http": "auto"}
    monkeypatch.setenv("LLMRS_HTTP_STACK", "H11")
    assert http_stack() == {"loop": "asyncio", "http": "h11"}
    monkeypatch.setenv("LLMRS_HTTP_STACK", "uvloop")
    with pytest.raises(UserError, match="LLMRS_HTTP_STACK"):
        http_stack()
    res = llmrs("serve", "/nonexistent/model", "--port", "0")  # the child inherits the bad value
    assert_user_error(res, "LLMRS_HTTP_STACK")


def test_serve_socket_turns_nagle_off_for_asyncio_connections():
    """The socket `llmrs serve` binds says IPPROTO_TCP, so asyncio (uvicorn without uvloop) sets TCP_NODELAY on
    every accepted connection: with proto 0 it did not, and each small SSE write waited for the client's delayed
    ACK (~43 ms a streamed request on the H200 host). Checked on a real asyncio server over that socket."""
    import asyncio
    import socket

    from llmrs.cli.serve import _bind

    sock = _bind("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP

    async def main() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                conn = transport.get_extra_info("socket")
                seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) != 0, "accepted connections keep Nagle's algorithm on"


def test_idle_spin_is_20ms_on_4_or_more_cpus_and_0_below(monkeypatch):
    """How long the idle engine core and the server's loop poll before they sleep: 20 ms on 4+ CPUs, 0 below
    (there a spinning core would take the CPU the server and the clients need)."""
    from llmrs.engine import core_client

    monkeypatch.setattr(core_client.os, "cpu_count", lambda: 16)
    assert core_client.idle_spin_s() == 0.02
    monkeypatch.setattr(core_client.os, "cpu_count", lambda: 2)
    assert core_client.idle_spin_s() == 0.0
    monkeypatch.setattr(core_client.os, "cpu_count", lambda: None)
    assert core_client.idle_spin_s() == 0.0
