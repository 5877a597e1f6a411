"""CUDA graphs for decode steps: bucket and padding rules everywhere; replay equals eager on a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llmrs.backends.cuda.graphs import BUCKETS, DecodeGraphs, _Graph, bucket_for, is_pure_decode, len_cap_for
from llmrs.engine.batch import build_step_batch

BS = 16


def test_buckets_round_up_and_stop_at_the_largest():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 9, 13, 64, 65, 512)] == [1, 2, 4, 8, 12, 16, 64, 96, 512]
    assert bucket_for(BUCKETS[-1] + 1) is None


def test_context_cap_is_a_power_of_two_of_at_least_256():
    assert [len_cap_for(n) for n in (1, 256, 257, 600, 4096)] == [256, 256, 512, 1024, 4096]


def test_only_steps_of_one_sampled_token_per_sequence_are_pure_decode():
    decode = build_step_batch([([5], 10, [0], True), ([7], 3, [1], True)], BS)
    prefill = build_step_batch([([5, 6, 7], 0, [0], True)], BS)
    mixed = build_step_batch([([5], 10, [0], True), ([1, 2], 0, [1], True)], BS)
    unsampled = build_step_batch([([5], 10, [0], True), ([7], 3, [1], False)], BS)
    assert is_pure_decode(decode)
    assert not is_pure_decode(prefill) and not is_pure_decode(mixed) and not is_pure_decode(unsampled)


def test_padding_rows_write_and_read_only_the_pad_block():
    g = DecodeGraphs.__new__(DecodeGraphs)
    g.b = SimpleNamespace(pad_block=99, block_size=BS)
    B, nb = 4, 3
    graph = _Graph(graph=None, host=g._pad_host(B, nb), dev=None, logits=None, nb=nb)
    batch = build_step_batch([([11], 20, [3, 4], True), ([12], 5, [7, 8, 9, 10], True)], BS)
    g._fill(graph, batch, B)
    h = graph.host
    assert h[:B].tolist() == [11, 12, 0, 0]
    assert h[B:2 * B].tolist() == [20, 5, 0, 0]
    assert h[2 * B:3 * B].tolist() == [4 * BS + 4, 7 * BS + 5, 99 * BS, 99 * BS]
    assert h[3 * B:4 * B].tolist() == [0, 1, 2, 3] and h[4 * B:5 * B].tolist() == [0, 1, 2, 3]
    tables = h[5 * B:].reshape(B, nb)
    assert tables.tolist() == [[3, 4, 99], [7, 8, 9], [99, 99, 99], [99, 99, 99]]


# ---------------------------------------------------------------------- on the GPU
@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from tests.cuda_helpers import require_gpu

    require_gpu()
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp("graphs") / "qwen2", "qwen2")
    r = ModelRunner(load(str(path)), num_blocks=64, device="cuda")
    assert r.backend.graphs is not None, "graphs are on by default"
    return r


def greedy_decode(runner, prompts, steps, graphs):
    """Prefill every prompt in one (eager) step, then `steps` decode steps; logits of every decode step."""
    backend = runner.backend
    saved = backend.graphs
    if not graphs:
        backend.graphs = None
    try:
        per = 64 // max(len(prompts), 4)
        tables = [list(range(i * per, (i + 1) * per)) for i in range(len(prompts))]
        batch = build_step_batch([(p, 0, tables[i], True) for i, p in enumerate(prompts)], BS)
        toks = runner.execute(batch).argmax(axis=1)
        cached = [len(p) for p in prompts]
        out = []
        for _ in range(steps):
            batch = build_step_batch([([int(t)], cached[i], tables[i], True) for i, t in enumerate(toks)], BS)
            logits = backend.forward(runner.model.w, batch)
            out.append(logits)
            toks = logits.argmax(axis=1)
            cached = [c + 1 for c in cached]
        return out
    finally:
        backend.graphs = saved


def prompts_of(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 400, int(rng.integers(1, 40))).tolist() for _ in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3, 10, 1])  # 1 again: after 10 grew the graph workspace
def test_graph_replay_equals_eager_step(runner, n):
    backend = runner.backend
    backend.attn_splits = 1  # the same key order in both paths: the logits must be identical
    try:
        prompts = prompts_of(n, seed=n)
        before = backend.graphs.replays
        eager = greedy_decode(runner, prompts, 12, graphs=False)
        graph = greedy_decode(runner, prompts, 12, graphs=True)
        assert backend.graphs.replays == before + 12, "every decode step replayed a graph"
        assert not backend.graphs.failed
        for e, g in zip(eager, graph):
            assert np.isfinite(g).all()
            if n <= 8:  # matvec rows are computed the same way at any padded T
                assert np.array_equal(e, g)
            else:  # cuBLAS may pick another algorithm for the padded shape
                assert np.abs(e - g).max() <= 1e-4 * np.abs(e).max()
            assert np.array_equal(e.argmax(axis=1), g.argmax(axis=1))
    finally:
        backend.attn_splits = None


@pytest.mark.gpu
def test_graph_decode_with_default_splits_matches_eager_tokens(runner):
    prompts = prompts_of(2, seed=7)
    eager = greedy_decode(runner, prompts, 20, graphs=False)
    graph = greedy_decode(runner, prompts, 20, graphs=True)
    for e, g in zip(eager, graph):
        assert np.abs(e - g).max() <= 1e-4 * np.abs(e).max()


@pytest.mark.gpu
def test_prefill_steps_run_eagerly(runner):
    before = runner.backend.graphs.replays
    batch = build_step_batch([(prompts_of(1, 3)[0] + [5, 6], 0, [0, 1, 2], True)], BS)
    runner.execute(batch)
    assert runner.backend.graphs.replays == before


@pytest.mark.gpu
def test_graphs_use_programmatic_dependent_launch_on_hopper(runner):
    """On sm_90+ every decode graph is captured with programmatic launches (no silent fallback: the capture
    check in cuda_graphs.py drops PDL only if a replay differs from the eager step); below sm_90 none are. The
    graph tests above compare those replays with eager steps."""
    import cupy as cp

    backend = runner.backend
    greedy_decode(runner, prompts_of(2, seed=11), 3, graphs=True)
    assert backend.graphs.graphs
    if int(cp.cuda.Device().compute_capability) >= 90:
        assert backend.k.pdl_capable, "the PDL capture failed and fell back (stderr says why)"
        assert all(g.pdl for g in backend.graphs.graphs.values())
        assert backend.k.pdl_launches > 0
    else:
        assert not any(g.pdl for g in backend.graphs.graphs.values())


def test_precapture_goes_largest_first_and_skips_what_exists():
    """DecodeGraphs.precapture: every bucket up to max_seqs' at every cap up to max_cap, the largest cap and batch
    first (the workspace grows once), not the graphs already there or failed before."""
    g = DecodeGraphs.__new__(DecodeGraphs)
    g.b = SimpleNamespace(tp=None)
    g.graphs, g.failed = {(4, 256): object()}, {(2, 512)}
    order = []

    def capture(w, B, cap):
        order.append((B, cap))
        return None if (B, cap) == (1, 512) else object()

    g._capture = capture
    n = g.precapture(None, max_seqs=5, max_cap=700)
    assert order == [(8, 512), (4, 512), (1, 512), (8, 256), (2, 256), (1, 256)]
    assert n == 5
    g.b = SimpleNamespace(tp=object())  # tensor-parallel ranks capture together with their NCCL calls: never here
    assert g.precapture(None, max_seqs=5, max_cap=700) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["tiny", "heads128"])
def test_engine_warmup_captures_the_decode_graphs_before_serving(tmp_path, shape):
    """LLMEngine.warmup precaptures every bucket up to max_num_seqs at caps 256 and 512; a burst of decode steps
    after it replays graphs without capturing any. heads128: 128-dim heads, whose one-token steps ask the driver how
    many attention clusters run at once (an int once cached among the workspace's buffers made every capture after
    the first one-token graph fail, and the server ran eagerly), with both caps captured, none failed."""
    from tests.cuda_helpers import require_gpu

    require_gpu()
    from llmrs.engine.config import EngineConfig
    from llmrs.engine.llm_engine import LLMEngine
    from llmrs.model.loader import load
    from llmrs.engine.sampling import SamplingParams
    from tests.conftest import write_tiny_model

    kw = (dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
          if shape == "heads128" else {})
    caps = (256, 512) if shape == "heads128" else (256,)
    eng = LLMEngine(load(str(write_tiny_model(tmp_path / "qwen2", "qwen2", **kw))),
                    EngineConfig(device="cuda", max_num_seqs=12, max_model_len=caps[-1]))
    eng.warmup(prompt_len=16, decode_steps=2)
    graphs = eng.runner.backend.graphs
    assert not graphs.failed, sorted(graphs.failed)
    assert set(graphs.graphs) == {(b, cap) for b in (1, 2, 4, 8, 12) for cap in caps}, sorted(graphs.graphs)
    captures = graphs.captures
    for i in range(10):
        eng.add_request(f"r{i}", [3 + i, 5, 7], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert graphs.captures == captures, "a decode step captured a graph after the warm-up"
    assert graphs.replays > 0
