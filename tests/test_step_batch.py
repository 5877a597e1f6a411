"""The StepBatch contract on the reference backend: chunked prefill, decode and several sequences in one step,
with scattered blocks, give the same logits as each sequence computed alone in one go."""

from __future__ import annotations

import numpy as np

from llmrs.engine.batch import build_step_batch
from llmrs.engine.loader import load
from llmrs.engine.runner import ModelRunner


def test_mixed_step_equals_sequences_alone(tiny_qwen2):
    loaded = load(str(tiny_qwen2))
    tok = loaded.tokenizer
    a = tok.encode("The quick brown fox jumps over the lazy dog. " * 2)  # > 16 tokens: spans blocks
    b = tok.encode("Unicode: café, naïve")
    bs = 16
    alone = {}
    for name, ids in (("a", a), ("b", b)):
        r = ModelRunner(loaded, num_blocks=8, block_size=bs)
        alone[name] = r.execute(build_step_batch([(ids, 0, [0, 1, 2, 3], True)], bs))[0]

    r = ModelRunner(loaded, num_blocks=16, block_size=bs)
    table_a, table_b = [9, 3, 12], [5, 14]  # scattered, non-contiguous blocks
    # step 1: a's first chunk (no sample: prompt not finished) + b's whole prompt minus its last token
    s1 = build_step_batch([(a[:10], 0, table_a, False), (b[:-1], 0, table_b, False)], bs)
    s1.validate(bs)
    assert r.execute(s1).shape == (0, loaded.config.vocab_size)
    # step 2: the rest of a's prompt (crosses a block boundary) + b's last token as a one-token step
    s2 = build_step_batch([(a[10:], 10, table_a, True), (b[-1:], len(b) - 1, table_b, True)], bs)
    s2.validate(bs)
    logits = r.execute(s2)
    np.testing.assert_allclose(logits[0], alone["a"], atol=1e-4)
    np.testing.assert_allclose(logits[1], alone["b"], atol=1e-4)
