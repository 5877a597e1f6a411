"""GGUF files with llama.cpp's "llama" (sentencepiece BPE) vocabulary: Llama 2, Mistral, TinyLlama. A small
vocabulary written by the test (scores, byte pieces, control tokens, no merges in the file) tokenizes as a port
of llama.cpp's own sentencepiece tokenizer below (bigrams merged best score first, leftmost on ties; a space in
front of every text fragment; unknown characters as <0xNN> bytes), and, where the two agree (no leading space,
no special token inside the text), as transformers' GGUF tokenizer loader; decoding restores the text."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from llmrs.model.tokenizer import Tokenizer
from llmrs.model.weights import GGUFFile

SP = "\u2581"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "new", "line"]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello world", "  two leading spaces", "new\nline",
         "über naïve — 日本", "a", "dog</s>fox", "x" * 40]


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """<unk>, <s>, </s>, the 256 byte pieces, single characters, then every prefix of each word (with and
    without the space mark) as a piece; longer pieces score lower, as merges learned later do."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    scores += [0.0] * 256
    types += [6] * 256
    pieces: list[str] = [SP] + sorted(set("".join(WORDS) + "Tthe.,x"))
    for w in WORDS:
        for s in (SP + w, w):
            for i in range(2, len(s) + 1):
                if s[:i] not in pieces:
                    pieces.append(s[:i])
    pieces.append(SP * 2)
    for n, p in enumerate(pieces):
        tokens.append(p)
        scores.append(-float(len(p)) - n / 1000.0)
        types.append(1)
    return tokens, scores, types


def write_spm_gguf(path: Path, add_space_prefix: bool = True) -> Path:
    tokens, scores, types = spm_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    if not add_space_prefix:
        w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_cpp_spm(text: str, tokens: list[str], scores: list[float], specials: dict[str, int]) -> list[int]:
    """llama.cpp's tokenization of `text` with a sentencepiece vocabulary (llm_tokenizer_spm, special tokens
    parsed), written from its algorithm: fragments split at special tokens, each raw fragment given a leading
    space when it is the first or follows a special token, spaces as U+2581, then symbol (UTF-8 character) pairs
    merged while their concatenation is a token, highest score first, leftmost first on ties; a symbol that is
    not a token is split back along its merges, down to <0xNN> byte tokens."""
    import heapq
    import re

    vocab = {t: i for i, t in enumerate(tokens)}
    out: list[int] = []
    prev_special = True
    for frag in re.split("(" + "|".join(re.escape(t) for t in specials) + ")", text):
        if frag in specials:
            out.append(specials[frag])
            prev_special = True
            continue
        if not frag:
            continue
        s = ((" " if prev_special else "") + frag).replace(" ", SP)
        prev_special = False
        sym = [[c, i - 1, i + 1] for i, c in enumerate(s)]  # text, prev, next
        sym[-1][2] = -1
        heap: list[tuple[float, int, int, str]] = []
        rev: dict[str, tuple[str, str]] = {}

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            t = sym[left][0] + sym[right][0]
            if t in vocab:
                heapq.heappush(heap, (-scores[vocab[t]], left, right, t))
                rev[t] = (sym[left][0], sym[right][0])

        for i in range(1, len(sym)):
            add(i - 1, i)
        while heap:
            _, left, right, t = heapq.heappop(heap)
            if sym[left][0] == "" or sym[right][0] == "" or sym[left][0] + sym[right][0] != t:
                continue  # stale
            sym[left][0] = t
            sym[right][0] = ""
            sym[left][2] = sym[right][2]
            if sym[right][2] >= 0:
                sym[sym[right][2]][1] = left
            add(sym[left][1], left)
            add(left, sym[left][2])

        def resegment(t: str) -> None:
            if t in vocab:
                out.append(vocab[t])
            elif t in rev:
                resegment(rev[t][0])
                resegment(rev[t][1])
            else:
                out.extend(vocab[f"<0x{b:02X}>"] for b in t.encode("utf-8"))

        i = 0
        while i != -1:
            if sym[i][0]:
                resegment(sym[i][0])
            i = sym[i][2]
    return out


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory) -> Path:
    return write_spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf")


def test_sentencepiece_gguf_tokenizes_as_llama_cpp_and_transformers(spm_file):
    from transformers import AutoTokenizer

    ours = Tokenizer.from_gguf(GGUFFile(spm_file))
    ref = AutoTokenizer.from_pretrained(str(spm_file.parent), gguf_file=spm_file.name)
    tokens, scores, _ = spm_vocab()
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids[0] == 1  # BOS, as llama.cpp adds it to this vocabulary
        assert ids[1:] == llama_cpp_spm(text, tokens, scores, {"<s>": 1, "</s>": 2}), text
        if not text.startswith(" ") and "</s>" not in text:  # transformers' Metaspace adds no second space there
            assert ids == ref.encode(text), text
        if "</s>" not in text:
            assert ours.decode(ids) == text, text
    # streamed (the server's incremental detokenizer after a prompt): the deltas join to the one-shot decode
    from llmrs.model.tokenizer import IncrementalDetokenizer

    prompt = ours.encode("hello world")
    reply = ours.encode("über naïve new\nline  lazy dog", add_special_tokens=False)
    det = IncrementalDetokenizer(ours, prompt)
    streamed = "".join(det.add(i) for i in reply) + det.finish()
    assert streamed == ours.decode(prompt + reply)[len(ours.decode(prompt)):]
    # pieces merge (not character by character), unknown characters fall back to bytes, decoding restores them
    ids = ours.encode("über hello", add_special_tokens=False)
    assert ours.tk.id_to_token(ids[-1]) == SP + "hello"
    assert "<0xC3>" in [ours.tk.id_to_token(i) for i in ids]
    assert ours.decode(ids) == "über hello"
    assert ours.eos_token_id == 2 and ours.bos_token == "<s>"


def test_sentencepiece_gguf_scores_must_match_the_tokens(tmp_path):
    from llmrs.errors import UserError

    path = write_spm_gguf(tmp_path / "s.gguf")
    gf = GGUFFile(path)
    gf.float_array = lambda key: [0.0] * 3  # a file whose scores array is short
    with pytest.raises(UserError, match="tokenizer.ggml.scores has 3 entries"):
        Tokenizer.from_gguf(gf)


def test_unknown_gguf_tokenizer_models_stay_one_clear_error(tmp_path):
    from llmrs.errors import UserError

    w = gguf.GGUFWriter(str(tmp_path / "t5.gguf"), "llama")
    w.add_tokenizer_model("t5")
    w.add_token_list(["<pad>", "a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UserError, match="tokenizer model 't5' is not supported"):
        Tokenizer.from_gguf(GGUFFile(tmp_path / "t5.gguf"))
