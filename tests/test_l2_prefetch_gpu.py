"""l2_prefetch on the GPU: decode steps with every LLMRS_L2_PREFETCH point give bit-identical logits to steps
without, eagerly and replayed from graphs, and the launches happen where cuda_l2 says."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_cuda_graphs import greedy_decode, prompts_of


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from tests.cuda_helpers import require_gpu

    cp = require_gpu()
    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("l2_prefetch (cp.async.bulk.prefetch) needs sm_90", allow_module_level=True)
    from llmrs.engine.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.conftest import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp("l2") / "qwen2", "qwen2")
    return ModelRunner(load(str(path)), num_blocks=64, device="cuda")


class Counting:
    """Wraps the l2_prefetch kernel: counts launches and the bytes they cover."""

    def __init__(self, fn):
        self.fn, self.calls, self.bytes = fn, 0, 0

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls += 1
        self.bytes += sum(int(a) for a in args[1::2])
        return self.fn(grid, block, args, shared_mem=shared_mem)


@pytest.mark.gpu
@pytest.mark.parametrize("fuse_norm", ["auto", "0"])  # "0": the norms are their own kernels (norm1 / norm2 apply)
@pytest.mark.parametrize("graphs", [False, True])
def test_prefetch_changes_no_bit_of_the_logits(runner, fuse_norm, graphs):
    b = runner.backend
    saved = (b.l2_points, b.fuse_norm)
    counter = Counting(b.k.l2_prefetch)
    b.k.l2_prefetch = counter
    b.attn_splits = 1
    b.fuse_norm = fuse_norm
    try:
        if b.graphs is not None:
            b.graphs.graphs.clear()  # captured afresh for each setting
        prompts = prompts_of(3, seed=5)
        b.l2_points = frozenset()
        off = greedy_decode(runner, prompts, 8, graphs=graphs)
        assert counter.calls == 0
        if b.graphs is not None:
            b.graphs.graphs.clear()
        b.l2_points = frozenset(("attn", "norm1", "norm2"))
        on = greedy_decode(runner, prompts, 8, graphs=graphs)
        layers = runner.model.config.num_hidden_layers
        per_step = layers * (1 if fuse_norm == "auto" else 3)  # tiny hidden size: auto folds both norms
        # eager: every step launches them; graphs: the captures did (the replays run them without Python)
        assert counter.calls >= per_step and counter.bytes > 0
        if not graphs:
            assert counter.calls == per_step * 8
        for x, y in zip(off, on):
            assert np.array_equal(x, y)
    finally:
        b.l2_points, b.fuse_norm = saved
        del b.k.l2_prefetch  # the shared Kernels' own entry again
        b.attn_splits = None
        if b.graphs is not None:
            b.graphs.graphs.clear()
