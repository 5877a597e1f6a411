"""`llmrs bench --server-cmd` against stand-ins that answer as vLLM, SGLang, llama-server, llama-cpp-python and TGI
do (tests/bench_fixtures/fake_server.py --flavor): readiness, the model id and the tokenize shape found without
flags, the engine named in the results, and prompt lengths equal to what the server counted."""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llmrs.bench.server import DEFAULT_PORTS, ManagedServer, _port_of
from llmrs.bench.sysinfo import server_identity
from llmrs.bench.tokenization import LLAMA_CPP_PYTHON, LLAMA_SERVER, SGLANG, VLLM
from tests.bench_fixtures.fake_server import MODEL_IDS
from tests.bench_fixtures.serving import fake_server_cmd

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "300", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
INPUT_LEN = 16


def _bench(tmp_path: Path, flavor: str, *extra: str, **server) -> tuple[subprocess.CompletedProcess, Path]:
    """`llmrs bench --server-cmd <fake --flavor F>` with no --model and no --tokenizer; the fake records the prompt
    tokens it counted per request in tmp_path/counted.jsonl."""
    cmd = fake_server_cmd(flavor=flavor, record=str(tmp_path / "counted.jsonl"), **server)
    res = subprocess.run(
        [sys.executable, "-m", "llmrs", "bench", "--server-cmd", shlex.join(cmd), "-n", "4", "-c", "2",
         "--input-len", str(INPUT_LEN), "--output-len", "4", "--server-timeout", "60", "-o", str(tmp_path / "res"),
         "--name", "peer", *extra],
        capture_output=True, text=True, env=ENV, timeout=300,
    )
    return res, tmp_path / "res" / "peer.json"


def _counted(tmp_path: Path) -> list[int]:
    return sorted(json.loads(line)["prompt_tokens"] for line in (tmp_path / "counted.jsonl").read_text().splitlines())


def _rows(doc_path: Path) -> list[dict]:
    (run,) = json.loads(doc_path.read_text())["runs"]
    return list(csv.DictReader(open(doc_path.parent / run["csv"])))


@pytest.mark.parametrize(("flavor", "shape", "engine"), [
    ("vllm", VLLM, "vllm"),
    ("sglang", SGLANG, "sglang"),
    ("llama-server", LLAMA_SERVER, "llama.cpp"),
    ("llama-cpp-python", LLAMA_CPP_PYTHON, "llama-cpp-python"),
])
def test_each_peer_is_benched_without_flags_and_prompts_are_as_long_as_it_counts(tmp_path, flavor, shape, engine):
    res, path = _bench(tmp_path, flavor)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(path.read_text())
    assert doc["server"]["model"] == MODEL_IDS[flavor]
    assert doc["server"]["engine"] == engine
    assert doc["tokenizer"] == f"server:{shape.label}"
    assert f"tokenizer: server:{shape.label}" in res.stdout
    rows = _rows(path)
    assert len(rows) == 4 and all(r["success"] == "True" for r in rows)
    # the server counted exactly the lengths the bench built and recorded (BOS included where the server adds it)
    assert sorted(int(r["input_len"]) for r in rows) == _counted(tmp_path) == [INPUT_LEN] * 4
    if flavor != "llama-cpp-python":  # (it sends no usage in a stream)
        assert all(r["prompt_tokens"] == r["input_len"] for r in rows)


def test_tgi_takes_the_prompts_from_model_config_and_its_model_id_from_the_model_list(tmp_path, word_tokenizer):
    config = word_tokenizer / "config.json"
    config.write_text("{}")
    res, path = _bench(tmp_path, "tgi", "--model-config", str(config), count_with=str(word_tokenizer))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(path.read_text())
    assert doc["server"]["model"] == MODEL_IDS["tgi"] and doc["server"]["engine"] == "tgi"
    assert doc["tokenizer"] == f"model-config:{word_tokenizer}"
    rows = _rows(path)
    assert sorted(int(r["input_len"]) for r in rows) == _counted(tmp_path) == [INPUT_LEN] * 4
    assert all(r["prompt_tokens"] == r["input_len"] for r in rows)


def test_a_server_without_a_tokenizer_and_without_local_one_is_one_clear_error(tmp_path):
    res, _ = _bench(tmp_path, "tgi")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "--tokenizer" in res.stderr and "--model-config" in res.stderr and "--prompt-format ids" in res.stderr


@pytest.mark.parametrize(("flavor", "source"), [("tgi", "GET /info (model_id)"), ("llama-server", "GET /props (model_path)")])
def test_the_model_id_comes_from_info_or_props_without_a_model_list(tmp_path, flavor, source):
    srv = ManagedServer.from_command(fake_server_cmd(flavor=flavor, no_models=True, loading_s=0.5),
                                     tmp_path / "server.log", startup_timeout=30)
    with srv:
        ident = server_identity(srv.url)
    assert ident["models"] == [{"id": MODEL_IDS[flavor]}] and ident["models_from"] == source
    assert ident["engine"] == ("tgi" if flavor == "tgi" else "llama.cpp")


def test_readiness_waits_out_llama_servers_503_and_takes_the_model_list_where_health_is_missing(tmp_path):
    loading = ManagedServer.from_command(fake_server_cmd(flavor="llama-server", loading_s=1.5),
                                         tmp_path / "a.log", startup_timeout=30)
    with loading:  # ready only once /health said 200 (503 "Loading model" before)
        assert loading.ready_route == "/health"
        assert httpx.get(f"{loading.url}/health", trust_env=False).json() == {"status": "ok"}
    no_health = ManagedServer.from_command(fake_server_cmd(flavor="llama-cpp-python"), tmp_path / "b.log",
                                           startup_timeout=30)
    with no_health:
        assert no_health.ready_route == "/v1/models"
        assert httpx.get(f"{no_health.url}/health", trust_env=False).status_code == 404


@pytest.mark.parametrize(("cmd", "port"), [
    ("vllm serve Qwen/Qwen2.5-7B-Instruct", DEFAULT_PORTS["vllm"]),
    ("python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct", 30000),
    ("/opt/llama.cpp/build/bin/llama-server -m model.gguf -np 4", 8080),
    ("python3 -m llama_cpp.server --model model.gguf", 8000),
    ("text-generation-launcher --model-id Qwen/Qwen2.5-7B-Instruct", 3000),
    ("text-generation-launcher --model-id m -p 8081", 8081),
    ("env CUDA_VISIBLE_DEVICES=1 llama-server -m model.gguf --port=9001", 9001),
    ("python -m sglang.launch_server --model-path m --port 31000", 31000),
    ("./my-server --listen 1", 8000),
])
def test_a_command_without_port_placeholder_is_reached_on_its_programs_port(cmd, port):
    assert _port_of(shlex.split(cmd)) == port
    assert ManagedServer.from_command(cmd, Path("unused.log")).url == f"http://127.0.0.1:{port}"


@pytest.fixture
def word_tokenizer(tmp_path) -> Path:
    return write_word_tokenizer(tmp_path)


def write_word_tokenizer(tmp_path: Path) -> Path:
    """A Hugging Face directory whose tokenizer.json is a word-level vocabulary ("w0".."w999") with BOS: decode and
    encode round-trip exactly, so prompts fit any length."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<bos>": 0, "<unk>": 1, **{f"w{i}": i + 2 for i in range(1000)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tk.add_special_tokens(["<bos>", "<unk>"])
    d = tmp_path / "words"
    d.mkdir()
    tk.save(str(d / "tokenizer.json"))
    return d
