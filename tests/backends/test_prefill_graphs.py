"""A lone prompt's prefill from CUDA graphs (graphs.PrefillGraphs; LLMRS_PREFILL_GRAPHS=0 turns them off): which
steps qualify, the padded step's arrays (CPU), and on a GPU the replayed prefill against the eager one (logits, then decoding
on from the K/V it wrote)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llmrs.backends.cuda.graphs import (PREFILL_BUCKETS, is_lone_prefill, padded_prefill,
                                                       prefill_bucket)
from llmrs.engine.batch import build_step_batch

BS = 16


def test_buckets_round_up_from_the_prefill_kernels_minimum():
    assert [prefill_bucket(n, 16) for n in (15, 16, 32, 33, 200, 1024)] == [None, 32, 32, 64, 256, 1024]
    assert prefill_bucket(PREFILL_BUCKETS[-1] + 1, 16) is None
    assert all(b % BS == 0 for b in PREFILL_BUCKETS)


def test_only_a_fresh_single_sequence_prefill_qualifies():
    assert is_lone_prefill(build_step_batch([(list(range(3, 40)), 0, [5, 6, 7], True)], BS))
    assert not is_lone_prefill(build_step_batch([(list(range(3, 40)), 16, [5, 6, 7, 8], True)], BS))  # prefix
    assert not is_lone_prefill(build_step_batch([(list(range(3, 40)), 0, [5, 6, 7], False)], BS))  # not sampled
    assert not is_lone_prefill(build_step_batch([([3, 4], 0, [1], True), ([5, 6], 0, [2], True)], BS))
    assert not is_lone_prefill(build_step_batch([([3], 9, [1], True)], BS))  # a decode step


def test_the_padded_step_keeps_the_prompt_and_sends_the_padding_to_the_pad_block():
    L, Tb, pad = 37, 64, 99
    batch = build_step_batch([(list(range(3, 3 + L)), 0, [5, 6, 7], True)], BS)
    p = padded_prefill(batch, Tb, pad, BS)
    assert p.num_tokens == Tb and p.num_seqs == 1
    assert p.token_ids[:L].tolist() == batch.token_ids.tolist() and not p.token_ids[L:].any()
    assert p.positions.tolist() == list(range(Tb))
    assert p.slot_mapping[:L].tolist() == batch.slot_mapping.tolist()  # the prompt's K/V where eager puts it
    # padding rows in the sequence's last block (positions 37..47): slots the next tokens overwrite before any
    # read; past its blocks (48..63): the pad block
    assert p.slot_mapping[L:48].tolist() == [7 * BS + i % BS for i in range(L, 48)]
    assert p.slot_mapping[48:].tolist() == [pad * BS + i % BS for i in range(48, Tb)]
    assert p.block_tables.tolist() == [[5, 6, 7, pad]] and p.sample_rows.tolist() == [L - 1]
    # -1 entries of a table (a padded row of a batch) become the pad block too
    b2 = build_step_batch([(list(range(3, 20)), 0, [4, 8], True)], BS)
    b2.block_tables = np.array([[4, 8, -1]], dtype=np.int32)
    assert padded_prefill(b2, 32, pad, BS).block_tables.tolist() == [[4, 8]]


def test_every_prompt_of_a_bucket_packs_to_the_layout_the_graph_was_captured_with():
    """The replay copies `pack_batch(padded)` over the captured step's buffer: same size, same prefill tiles and
    positions whatever the prompt's length within the bucket."""
    from llmrs.backends.cuda import CUDABackend

    be = SimpleNamespace(prefill_min_tokens=16)
    pack = lambda batch: CUDABackend.pack_batch(be, batch)  # noqa: E731
    Tb, pad = 128, 7
    ref, n_ref = pack(build_step_batch([([0] * Tb, 0, [pad] * (Tb // BS), True)], BS))
    for L in (65, 100, 128):
        got, n = pack(padded_prefill(build_step_batch([(list(range(1, L + 1)), 0, list(range(9)), True)], BS),
                                     Tb, pad, BS))
        assert n == n_ref and got.size == ref.size
        assert np.array_equal(got[Tb:2 * Tb], ref[Tb:2 * Tb])  # positions
        assert np.array_equal(got[-4 * n:], ref[-4 * n:])  # the prefill attention's tiles
        assert got[4 * Tb] == L - 1  # the sampled row


# ---------------------------------------------------------------------- on the GPU
@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from tests.cuda_helpers import require_gpu

    require_gpu()
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    # 64-dim heads: the tensor-core prefill attention's (the graphs serve only steps that take it)
    path = write_tiny_model(tmp_path_factory.mktemp("pgraphs") / "qwen2", "qwen2", hidden_size=256,
                            num_attention_heads=4, num_key_value_heads=2)
    r = ModelRunner(load(str(path)), num_blocks=64, device="cuda")
    assert r.backend.prefill_min_tokens == 16
    return r


@pytest.mark.gpu
@pytest.mark.parametrize("L", [16, 37, 64, 100])
def test_replayed_prefill_matches_the_eager_one_and_decoding_goes_on_alike(runner, L):
    from llmrs.backends.cuda.graphs import PrefillGraphs

    b = runner.backend
    b.attn_splits = 1
    rng = np.random.default_rng(L)
    prompt = rng.integers(3, 390, L).tolist()
    table = list(range(10, 10 + -(-(L + 8) // BS)))
    out = {}
    try:
        for graphed in (False, True):
            b.prefill_graphs = PrefillGraphs(b) if graphed else None
            logits = [b.forward(runner.model.w, build_step_batch([(prompt, 0, table, True)], BS))]
            if graphed:
                assert b.prefill_graphs.replays == 1, "the prefill ran from a graph"
            tok = int(logits[0].argmax())
            for i in range(6):  # decoding reads the K/V the prefill wrote
                logits.append(b.forward(runner.model.w, build_step_batch([([tok], L + i, table, True)], BS)))
                tok = int(logits[-1].argmax())
            out[graphed] = logits
        for e, g in zip(out[False], out[True]):
            assert np.abs(e - g).max() <= 1e-3 * np.abs(e).max()  # cuBLAS may pick another algorithm at Tb rows
            assert int(e.argmax()) == int(g.argmax())
    finally:
        b.prefill_graphs, b.attn_splits = None, None
