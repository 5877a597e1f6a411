"""Where `llmrs bench` gets the tokenizer that sizes its prompts: --tokenizer / --model-config of every kind (a
tokenizer.json, a Hugging Face directory, a .gguf, an embedded model name, a config.json), the order of the sources,
a server whose detokenize refuses lone pieces of a UTF-8 character, and one clear error for anything else."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import pytest
from typer.testing import CliRunner

from llmrs.bench.tokenization import LLAMA_CPP_PYTHON, LocalTokenizer, ServerTokenizer, choose_tokenizer
from llmrs.errors import UserError
from llmrs.model.loader import embedded_model_path
from tests.bench.test_bench_peers import _bench, _counted, _rows, write_word_tokenizer


def _encode(tok, text: str) -> list[int]:
    return asyncio.run(tok.encode(text))


@pytest.fixture
def word_tokenizer(tmp_path):
    return write_word_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def gguf():
    return embedded_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def smollm_gguf_tok(gguf):
    return LocalTokenizer(str(gguf))


def test_a_gguf_file_and_the_embedded_name_give_the_models_own_tokenizer(gguf, smollm_gguf_tok):
    by_name = LocalTokenizer("smollm2-135m")
    assert smollm_gguf_tok.kind == by_name.kind == "gguf"
    assert smollm_gguf_tok.vocab_size == by_name.vocab_size == 49152
    assert by_name.source == "local:smollm2-135m (embedded, GGUF)" and smollm_gguf_tok.source == f"local:{gguf}"
    ids = _encode(by_name, "The quick brown fox")
    assert ids == _encode(smollm_gguf_tok, "The quick brown fox") and len(ids) == 4
    assert asyncio.run(by_name.decode(ids)) == "The quick brown fox"
    assert by_name.special_ids and max(by_name.special_ids) < 256  # SmolLM2's specials: kept out of random draws


def test_a_gguf_without_its_suffix_is_known_by_its_magic(tmp_path, gguf, smollm_gguf_tok):
    copy = tmp_path / "model.bin"
    shutil.copyfile(gguf, copy)
    assert _encode(LocalTokenizer(copy), "hello world") == _encode(smollm_gguf_tok, "hello world")


def test_a_tokenizer_json_its_directory_and_a_config_json_give_the_same_tokenizer(tmp_path, word_tokenizer):
    renamed = tmp_path / "words.json"
    shutil.copyfile(word_tokenizer / "tokenizer.json", renamed)
    (word_tokenizer / "config.json").write_text("{}")
    toks = [LocalTokenizer(word_tokenizer / "tokenizer.json"), LocalTokenizer(word_tokenizer), LocalTokenizer(renamed),
            LocalTokenizer(word_tokenizer / "config.json", option="--model-config", origin="model-config")]
    assert [_encode(t, "w5 w7") for t in toks] == [[0, 7, 9]] * 4  # BOS added, as the served model's server does
    assert toks[1].source == f"local:{word_tokenizer}" and toks[3].source == f"model-config:{word_tokenizer}"
    assert [t.kind for t in toks] == ["tokenizer.json", "hf", "tokenizer.json", "hf"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "missing.json", "no such file or directory, and not an embedded model (smollm2-135m)"),
    (lambda d: d, "the directory has no tokenizer.json"),
    (lambda d: _write(d / "notes.txt", b"just some text"), "not a tokenizer.json"),
    (lambda d: _write(d / "broken.gguf", b"GGUF\x03\x00\x00\x00garbage"), "broken.gguf"),
    (lambda d: _write(d / "x.gguf", b"\xff\xfe not a gguf at all"), "x.gguf"),
])
def test_anything_else_is_one_clear_error_naming_the_option(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(UserError, match="^--model-config ") as e:
        LocalTokenizer(path, option="--model-config")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_directory_holding_a_gguf_points_at_the_file(tmp_path):
    _write(tmp_path / "m.gguf", b"GGUF")
    with pytest.raises(UserError, match="for a GGUF, give the file: .*m.gguf"):
        LocalTokenizer(tmp_path)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _serverless(request: httpx.Request) -> httpx.Response:
    return httpx.Response(404, json={"detail": "Not Found"})


def _choose(handler, tokenizer=None, model_config=None):
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await choose_tokenizer("http://srv", "m", c, tokenizer, model_config=model_config)
    return asyncio.run(go())


def test_sources_in_order_server_then_tokenizer_then_model_config(word_tokenizer):
    words, embedded = str(word_tokenizer), "smollm2-135m"
    assert _choose(_serverless).source == "none"
    assert _choose(_serverless, model_config=words).source == f"model-config:{words}"
    assert _choose(_serverless, tokenizer=embedded, model_config=words).source.startswith("local:smollm2-135m")

    def llama_cpp_python(request):
        body = json.loads(request.content)
        if request.url.path == "/extras/tokenize":
            return httpx.Response(200, json={"tokens": [1] + [300] * len(body["input"].split())})
        if request.url.path == "/extras/detokenize":
            return httpx.Response(200, json={"text": " ".join("t" for _ in body["tokens"][1:])})
        return httpx.Response(404, json={"detail": "Not Found"})

    choice = _choose(llama_cpp_python, tokenizer=embedded, model_config=words)
    assert choice.source == f"server:{LLAMA_CPP_PYTHON.label}" and choice.tokenizer.shape is LLAMA_CPP_PYTHON


def test_ids_a_strict_detokenize_refuses_alone_are_left_out_and_remembered():
    """llama-cpp-python answers 500 for bytes that are not whole UTF-8 characters (a byte-level BPE piece of one):
    those ids are dropped from the text, found by halving, and not sent again."""
    refused, sent = {701, 905}, []

    def handler(request):
        ids = json.loads(request.content)["tokens"]
        sent.append(ids)
        if refused & set(ids):
            return httpx.Response(500, json={"error": {"message": "'utf-8' codec can't decode bytes"}})
        return httpx.Response(200, json={"text": " ".join(f"t{i}" for i in ids)})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            tok = ServerTokenizer("http://srv", "m", c, LLAMA_CPP_PYTHON)
            first = await tok.decode([300, 701, 400, 905, 500])
            n = len(sent)
            again = await tok.with_client(c).decode([701, 600])  # a copy shares what was learned
            return first, again, n, tok.undecodable

    first, again, n, undecodable = asyncio.run(go())
    assert first == "t300 t400 t500" and again == "t600" and undecodable == refused
    assert sent[n:] == [[600]]
    with pytest.raises(UserError, match="/extras/detokenize answered 500"):
        asyncio.run(_decode_all_refused())


async def _decode_all_refused():
    def handler(request):
        return httpx.Response(500, text="engine down")
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        await ServerTokenizer("http://srv", "m", c, LLAMA_CPP_PYTHON).decode([300, 400])


def test_bench_with_the_embedded_gguf_as_tokenizer_builds_prompts_the_server_counts_alike(tmp_path):
    """Against a server without a tokenize endpoint that counts with SmolLM2's tokenizer (as llama-cpp-python serving
    the embedded GGUF would), `--tokenizer <the .gguf>` sizes prompts whose recorded lengths are the server's."""
    gguf = str(embedded_model_path("smollm2-135m"))
    res, path = _bench(tmp_path, "tgi", "--tokenizer", gguf, count_with="smollm2-135m")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads(path.read_text())["tokenizer"] == f"local:{gguf}"
    rows = _rows(path)
    assert sorted(int(r["input_len"]) for r in rows) == _counted(tmp_path)
    assert all(r["prompt_tokens"] == r["input_len"] for r in rows)


def test_the_cli_help_names_every_tokenizer_kind():
    import typer

    from llmrs.cli import bench as bench_cli

    app = typer.Typer()
    bench_cli.register(app)
    flat = " ".join(CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "300"}).output.replace("│", " ").split())
    assert "a tokenizer.json, a Hugging Face model directory, a .gguf file or an embedded model name" in flat
