"""The synthetic tokenizer (`llmrs synth`, `synthetic:PRESET`): exactly the preset's vocabulary size, text round
trips, and every token but the single bytes above 0x7f decodes to complete text on its own, so a stream of random
weights' tokens is never held back mid-character (a benchmark's TTFT then counts one step, as with real text)."""

from __future__ import annotations

import numpy as np
import pytest

from llmrs.model.tokenizer import IncrementalDetokenizer, Tokenizer
from llmrs.model.presets import preset_config
from llmrs.model.synthetic import write_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth-tok")
    c = preset_config("qwen2.5-0.5b")
    write_tokenizer(c, d)
    return c, Tokenizer.from_hf_dir(d)


def test_size_and_round_trip(tok):
    c, t = tok
    assert t.vocab_size == c.vocab_size
    text = "Hello world! The quick brown fox, 42 times. café 🙂 naïve\n\tend"
    assert t.decode(t.encode(text, add_special_tokens=False)) == text


def test_every_merged_token_is_complete_text(tok):
    c, t = tok
    tb = t.token_bytes(skip_special_tokens=True)
    assert tb is not None and tb.ok
    partial = []
    for i in range(c.vocab_size):
        b = tb.get(i)
        if b is None or len(b) == 1:  # a special token, or a single byte (the only possibly partial ones)
            continue
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            partial.append(i)
    assert partial == []


def test_random_first_tokens_are_not_held_back(tok):
    c, t = tok
    rng = np.random.default_rng(0)
    held = 0
    for _ in range(2000):
        det = IncrementalDetokenizer(t, prompt_ids=[int(v) for v in rng.integers(0, c.vocab_size, 8)])
        held += det.add(int(rng.integers(0, c.vocab_size))) == ""
    assert held <= 10, held  # the 128 high single bytes and the specials: ~0.1% of draws
