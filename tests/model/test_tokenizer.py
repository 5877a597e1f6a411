"""Tokenizer ids equal transformers', chat templates render the same, streaming detokenization equals one-shot."""

from __future__ import annotations

import numpy as np
import pytest

from llmrs.model.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Hello, world! The year 2024 had 366 days.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "café naïve Zürich 東京 Привет мир",
    "emoji: 🙂🚀👍🏽 family 👨‍👩‍👧",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "code: def f(x):\n    return x ** 2  # ok",
]


@pytest.fixture(scope="module")
def hf_gguf_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_tokenizer_ids_equal_transformers(smollm2, hf_gguf_tokenizer, text):
    assert smollm2.tokenizer.encode(text) == hf_gguf_tokenizer(text)["input_ids"]
    ids = smollm2.tokenizer.encode(text)
    assert smollm2.tokenizer.decode(ids, skip_special_tokens=False) == hf_gguf_tokenizer.decode(ids)


def test_special_tokens_stay_whole(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode("<|im_start|>assistant")
    assert ids[0] == tok.token_id("<|im_start|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant"


def test_chat_template_renders_like_transformers(smollm2, hf_gguf_tokenizer):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    for gen in (True, False):
        ours = smollm2.tokenizer.apply_chat_template(conv, add_generation_prompt=gen)
        ref = hf_gguf_tokenizer.apply_chat_template(conv, add_generation_prompt=gen, tokenize=False)
        assert ours == ref
    assert ours.endswith("<|im_start|>user\nBye<|im_end|>\n")


@pytest.mark.parametrize("text", TEXTS)
def test_hf_dir_tokenizer_ids_equal_transformers(tiny_llama, text):
    from transformers import AutoTokenizer

    ours = Tokenizer.from_hf_dir(tiny_llama)
    ref = AutoTokenizer.from_pretrained(str(tiny_llama))
    assert ours.encode(text) == ref(text)["input_ids"]
    conv = [{"role": "user", "content": text}]
    assert ours.apply_chat_template(conv) == ref.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("text", TEXTS + ["🙂" * 7, "日本語のテキスト" * 3])
def test_streaming_detokenization_equals_one_shot(smollm2, text):
    tok = smollm2.tokenizer
    prompt = tok.encode("Prompt before: ")
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=True)
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.finish())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in d for d in deltas), "a delta carried half a UTF-8 character"


def test_streaming_detokenizer_flushes_incomplete_tail(smollm2):
    """A sequence cut in the middle of a character still returns every byte it decoded (as U+FFFD)."""
    tok = smollm2.tokenizer
    ids = tok.encode("🚀")
    assert len(ids) > 1  # the emoji spans several byte-level tokens
    detok = IncrementalDetokenizer(tok)
    streamed = "".join(detok.add(i) for i in ids[:-1]) + detok.finish()
    assert streamed == tok.decode(ids[:-1])


@pytest.mark.parametrize("skip", [True, False])
def test_fast_detokenizer_gives_the_same_deltas_as_the_two_decode_path(smollm2, skip):
    """The byte-table fast path of IncrementalDetokenizer: delta for delta what decoding the window twice gives,
    on text, on text with random tokens (byte fragments, specials) mixed in, and on random ids."""
    tok = smollm2.tokenizer
    assert tok.token_bytes(skip) is not None  # a byte-level BPE: the fast path is on
    rng = np.random.default_rng(1)
    base = tok.encode(" ".join(TEXTS) + " 🙂🚀 日本語のテキスト", add_special_tokens=False)
    V = tok.vocab_size
    for trial in range(150):
        if trial % 3 == 0:
            ids = rng.integers(0, V, 40).tolist()
        elif trial % 3 == 1:
            ids = [t if rng.random() > 0.2 else int(rng.integers(0, V)) for t in base]
        else:
            ids = [t if rng.random() > 0.1 else int(rng.integers(0, 20)) for t in base]  # specials mixed in
        prompt = rng.integers(0, V, 8).tolist()
        fast = IncrementalDetokenizer(tok, prompt, skip, fast=True)
        slow = IncrementalDetokenizer(tok, prompt, skip, fast=False)
        assert [fast.add(i) for i in ids] + [fast.finish()] == [slow.add(i) for i in ids] + [slow.finish()]
    assert tok.token_bytes(skip).ok


def test_token_bytes_match_one_token_decodes(smollm2):
    tok = smollm2.tokenizer
    tb = tok.token_bytes(skip_special_tokens=False)
    for i in list(range(0, 300)) + list(range(tok.vocab_size - 300, tok.vocab_size)):
        assert tb.get(i).decode("utf-8", "replace") == tok.decode([i], skip_special_tokens=False)
    assert tok.token_bytes(skip_special_tokens=True).get(0) == b""  # <|endoftext|> is special: skipped


@pytest.mark.parametrize("specials", [True, False])
def test_encode_fast_path_gives_the_ids_of_tokenizers_encode(smollm2, specials):
    """Tokenizer.encode goes through encode_batch_fast (no offsets): the very ids of tokenizers' own `encode`, with
    and without special tokens, on the texts above, an empty string and a long random one."""
    tok = smollm2.tokenizer
    assert hasattr(tok.tk, "encode_batch_fast")  # the pinned tokenizers has it: the fast path is the one tested
    rng = np.random.default_rng(0)
    long_text = tok.decode([int(i) for i in rng.integers(100, tok.vocab_size - 1, 300)], skip_special_tokens=False)
    for text in [*TEXTS, "", long_text]:
        assert tok.encode(text, add_special_tokens=specials) == tok.tk.encode(text, add_special_tokens=specials).ids
