"""`llmrs.profiling.decode_bench.decode_benchmark`'s host logic without a GPU (the CUDA backend and model replaced by recorders): the
cache it sizes, the positions of the prefill, of the step-by-step decode and of the run-ahead decode
(`run_ahead_intervals`, fed on the device), and the figures it returns."""

from types import SimpleNamespace

import pytest

from llmrs.profiling import decode_bench as synth


class FakeBackend:
    def __init__(self, config, num_blocks, block_size):
        self.num_blocks, self.block_size, self.launches = num_blocks, block_size, 0

    def synchronize(self):
        pass

    def sample(self, logits, states):
        return [SimpleNamespace(token_id=7)]

    def sample_launch(self, logits, states):
        self.launches += 1
        return SimpleNamespace(wait=lambda: [SimpleNamespace(token_id=7)])


class FakeModel:
    def __init__(self, config, weights, backend):
        self.backend, self.steps = backend, []

    def forward_device(self, batch):
        self.steps.append((batch.positions.tolist(), batch.token_ids.tolist(), batch.feed is not None,
                           batch.block_tables[0].tolist()))
        return "logits"


def test_decode_benchmark_sizes_the_cache_and_walks_the_positions(monkeypatch):
    from llmrs.backends import cuda

    made = {}

    def model(c, w, be):
        made["model"] = FakeModel(c, w, be)
        return made["model"]

    monkeypatch.setattr(cuda, "CUDABackend", FakeBackend)
    monkeypatch.setattr(cuda, "CUDAModel", model)
    monkeypatch.setattr(synth, "gpu_weights", lambda c, backend, quant=None, group_size=128: None)
    monkeypatch.setattr(synth, "this_gpu", lambda: ("NVIDIA H100 80GB HBM3", 85_045_477_376))
    P, W, S = 40, 3, 5
    out = synth.decode_benchmark("qwen2.5-0.5b", prompt_len=P, steps=S, warmup=W, bandwidth_gbs=4296)
    m = made["model"]
    assert m.backend.num_blocks == -(-(P + W + S + 1) // 16) and m.backend.block_size == 16
    table = list(range(m.backend.num_blocks))
    prefill, rest = m.steps[0], m.steps[1:]
    assert prefill[0] == list(range(P)) and prefill[3] == table and not prefill[2]
    sync, ahead = rest[:W + S], rest[W + S:]
    assert [s[0] for s in sync] == [[P + i] for i in range(W + S)] and all(s[1] == [7] for s in sync)
    assert not any(s[2] for s in sync)  # the host had each token before the next step
    assert [s[0] for s in ahead] == [[P + i] for i in range(W + S + 1)] and all(s[2] for s in ahead)  # fed
    assert m.backend.launches == W + S + 1
    assert out["preset"] == "qwen2.5-0.5b" and out["steps"] == S and out["ms_per_token"] > 0
    assert out["tok_s"] > 0 and out["ms_per_token_sync"] > 0 and out["bytes_per_step"] > 0
    # the floors: at the measured 4,296 GB/s and at the H100 SXM's own datasheet 3,350 GB/s (not another GPU's)
    assert out["datasheet_gpu"] == "h100-sxm" and out["bandwidth_gbs_datasheet"] == 3350
    assert out["floor_ms_datasheet"] / out["floor_ms_measured"] == pytest.approx(4296 / 3350, rel=1e-3)
    assert out["fraction_of_floor_datasheet"] == pytest.approx(out["floor_ms_datasheet"] / out["ms_per_token"],
                                                               rel=1e-2)  # (each figure rounded)


@pytest.mark.parametrize("name, memory_gb, key, gbs", [
    ("NVIDIA H100 80GB HBM3", 85.0, "h100-sxm", 3350), ("NVIDIA H200", 150.0, "h200", 4800),
    ("NVIDIA A100-SXM4-80GB", 85.0, "a100-80gb-sxm", 2039), ("Some Future GPU", 10.0, None, None),
])
def test_the_datasheet_floor_is_the_gpu_it_runs_on(name, memory_gb, key, gbs):
    spec = synth.datasheet_gpu(name, int(memory_gb * 1e9))
    assert (spec.key if spec else None) == key and (spec.bandwidth_gbs if spec else None) == gbs
