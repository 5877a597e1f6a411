"""The StepBatch contract on the reference backend: chunked prefill, decode and several sequences in one step,
with scattered blocks, give the same logits as each sequence computed alone in one go."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrs.engine.batch import build_step_batch, build_step_batch_arrays
from llmrs.model.loader import load
from llmrs.engine.llm_engine import Runner
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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 70), st.integers(1, 40), st.booleans()), min_size=1, max_size=12),
       st.sampled_from([1, 4, 16]))
def test_vectorized_builder_equals_the_reference_builder(seqs, bs):
    """build_step_batch_arrays (the scheduler's, from a padded block-table array) == build_step_batch."""
    rng = np.random.default_rng(len(seqs) * 100 + bs)
    entries = []
    for cached, n, sample in seqs:
        table = rng.permutation(1000)[: -(-(cached + n) // bs)].tolist()
        entries.append((rng.integers(0, 50000, n).tolist(), cached, table, sample))
    ref = build_step_batch(entries, bs)
    tables = np.full((len(entries), max(len(t) for _, _, t, _ in entries)), -1, dtype=np.int32)
    for i, (_, _, t, _) in enumerate(entries):
        tables[i, : len(t)] = t
    got = build_step_batch_arrays([t for e in entries for t in e[0]], [e[1] for e in entries],
                                  [len(e[0]) for e in entries], tables, [e[3] for e in entries], bs)
    got.validate(bs)
    for f in ("token_ids", "positions", "query_start", "context_lens", "block_tables", "slot_mapping", "sample_rows"):
        a, b = getattr(ref, f), getattr(got, f)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), f


class _RecordingRunner(Runner):
    """Answers at once (token = position % 50 + 100, never EOS), keeping every batch it was given."""

    device = "cpu"

    def __init__(self, num_blocks: int):
        self.num_blocks, self.batches = num_blocks, []

    def execute_and_sample(self, batch, states):
        from llmrs.engine.sampling import SampleResult

        self.batches.append(batch)
        return [SampleResult(int(p) % 50 + 100) for p in batch.positions[batch.sample_rows]]

    def launch(self, batch, states):
        from llmrs.backends.base import Launched

        return Launched(self.execute_and_sample(batch, states))


def test_scheduler_batches_equal_the_reference_builder_through_prefill_preemption_and_finish(smollm2):
    """Every step of a run with chunked prefill, prefix hits, preemption and staggered finishes: the batch the
    scheduler builds equals build_step_batch over the same sequences (their tokens and block lists)."""
    from llmrs.engine.config import EngineConfig
    from llmrs.engine.llm_engine import LLMEngine
    from llmrs.engine.sampling import SamplingParams

    bs = 4
    runner = _RecordingRunner(num_blocks=40)  # small: forces preemption
    eng = LLMEngine(smollm2, EngineConfig(block_size=bs, max_num_seqs=6, max_num_batched_tokens=24), runner=runner)
    rng = np.random.default_rng(0)
    shared = rng.integers(1000, 5000, 9).tolist()
    for i in range(9):
        prompt = (shared if i % 2 else []) + rng.integers(1000, 5000, int(rng.integers(3, 30))).tolist()
        eng.add_request(f"r{i}", prompt, SamplingParams(max_tokens=int(rng.integers(1, 25)), temperature=0.0,
                                                        ignore_eos=True))
    steps = 0
    while eng.has_unfinished():
        plan = eng.scheduler.schedule()
        if plan is None:
            break
        entries = []
        for seq, n, after in zip(plan.seqs, plan.num_new_tokens, plan.computed_after):
            start = after - n  # (the plan already counts its tokens as computed)
            entries.append((seq.all_ids[start : start + n], start, eng.kv.block_ids(seq),
                            start + n == len(seq.all_ids)))
        ref = build_step_batch(entries, bs)
        for f in ("token_ids", "positions", "query_start", "context_lens", "block_tables", "slot_mapping",
                  "sample_rows"):
            assert np.array_equal(getattr(ref, f), getattr(plan.batch, f)), (steps, f)
        plan.batch.validate(bs)
        results = runner.execute_and_sample(plan.batch, [s.sampling for s in plan.sample_seqs])
        eng.scheduler.update(plan, results)
        steps += 1
    assert not eng.has_unfinished() and eng.scheduler.num_preemptions > 0
    assert eng.kv.num_free_blocks == 40 and not eng.kv.row_of


def test_keys_below_position_minus_index_were_written_by_earlier_steps():
    """The decode attention loads the K / V rows of token t's keys below positions[t] - t before its PDL wait
    (attention.cu attn_first_keys): it takes them as written by earlier steps. That holds because a sequence's new
    tokens in a step are contiguous in the batch at consecutive positions from its cached count (so at most t of
    them come before token t): checked here over random mixes of decodes and prefill chunks, with token_seq as the
    CUDA backend forms it (np.repeat over the per-sequence counts)."""
    rng = np.random.default_rng(7)
    bs = 16
    for _ in range(200):
        B = int(rng.integers(1, 9))
        cached = rng.integers(0, 300, B).tolist()
        new = [int(n) for n in rng.choice([1, 1, 1, 5, 17, 64], B)]
        tables = np.arange(B * 32, dtype=np.int32).reshape(B, 32)
        ids = rng.integers(0, 100, sum(new)).tolist()
        batch = build_step_batch_arrays(ids, cached, new, tables, [True] * B, bs)
        token_seq = np.repeat(np.arange(B), new)
        t = np.arange(len(ids))
        # every key below positions[t] - t is below the sequence's cached count: computed before this step
        assert (batch.positions - t <= np.asarray(cached)[token_seq]).all()
