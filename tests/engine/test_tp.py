"""Tensor parallelism on the CPU, without NCCL: every rank's shard runs in one process (a thread per rank), the
simulated all-reduce sums partials in rank order; logits and greedy tokens equal the unsharded reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.conftest import write_tiny_model
from llmrs.backends.cpu import CPUBackend
from llmrs.engine.batch import build_step_batch
from llmrs.engine.config import EngineConfig, ModelConfig
from llmrs.engine.llm_engine import LLMEngine
from llmrs.model.loader import load
from llmrs.model.decoder import Model, build_weights
from llmrs.engine.sampling import SamplingParams
from llmrs.engine.tp import (ShardPlan, SimulatedTP, SimulatedTPRunner, shard_fused, shard_tensors, tp_engine)
from llmrs.errors import UserError

BS = 16
NUM_BLOCKS = 16
TINY = dict(num_attention_heads=8, num_key_value_heads=4, intermediate_size=168)  # 168 = 4 * 42


@pytest.fixture(scope="module")
def tp_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    return {
        "llama": load(str(write_tiny_model(root / "llama", "llama", **TINY))),
        # Qwen2 with an intermediate size no N divides evenly (uneven MLP shards)
        "qwen2": load(str(write_tiny_model(root / "qwen2", "qwen2", seed=1, **{**TINY, "intermediate_size": 170}))),
    }


def reference(loaded) -> Model:
    be = CPUBackend(loaded.config, num_blocks=NUM_BLOCKS, block_size=BS)
    return Model(loaded.config, build_weights(loaded.config, loaded.tensors, be), be)


def mixed_steps():
    """Four steps over 3 sequences: a first chunk alone (nothing sampled); a whole prefill + a second chunk; a
    decode + the last chunk + a new prefill; then every sequence decoding. Token ids cover the whole vocabulary (every rank's embedding slice)."""
    rng = np.random.default_rng(7)
    a, b, c = (rng.integers(0, 400, n).tolist() for n in (11, 29, 5))
    ta, tb, tc = [0, 1], [2, 3, 4], [5]
    return [
        build_step_batch([(b[:4], 0, tb, False)], BS),  # samples nothing: K/V written, no logits
        build_step_batch([(a, 0, ta, True), (b[4:9], 4, tb, False)], BS),
        build_step_batch([([17], 11, ta, True), (b[9:], 9, tb, True), (c, 0, tc, True)], BS),
        build_step_batch([([399], 12, ta, True), ([0], 29, tb, True), ([250], 5, tc, True)], BS),
    ]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("n", [2, 4])
def test_sharded_logits_equal_reference_on_prefill_chunks_and_decode(tp_models, arch, n):
    loaded = tp_models[arch]
    ref = reference(loaded)
    tp = SimulatedTP(loaded.config, loaded.tensors, n, NUM_BLOCKS, BS)
    try:
        for batch in mixed_steps():
            batch.validate(BS)
            want = ref.forward(batch)
            got_all = tp.forward_all(batch)
            assert got_all[0].shape == want.shape == (len(batch.sample_rows), 400)
            for got in got_all:  # every rank ends the step with the same logits
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            assert np.array_equal(got_all[0].argmax(-1), want.argmax(-1))
    finally:
        tp.close()
    # per step: 1 all-reduce for the embedding + 2 per layer; 1 all-gather of the logits
    layers = loaded.config.num_hidden_layers
    assert tp.group.calls == {"all_reduce": 4 * (1 + 2 * layers), "all_gather": 3}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("n", [2, 4])
def test_sharded_greedy_tokens_equal_reference(tp_models, arch, n):
    loaded = tp_models[arch]
    ref = reference(loaded)
    tp = SimulatedTP(loaded.config, loaded.tensors, n, NUM_BLOCKS, BS)
    prompts = [[5, 77, 301, 12, 9, 150, 42], [399, 1, 200, 3]]
    tables = [[0, 1], [2, 3]]
    outs = {"ref": [[], []], "tp": [[], []]}
    try:
        for name, run in (("ref", ref.forward), ("tp", tp.forward)):
            new, cached = [list(p) for p in prompts], [0, 0]
            for _ in range(12):
                logits = run(build_step_batch([(new[i], cached[i], tables[i], True) for i in range(2)], BS))
                for i in range(2):
                    cached[i] += len(new[i])
                    tok = int(logits[i].argmax())
                    outs[name][i].append(tok)
                    new[i] = [tok]
    finally:
        tp.close()
    assert outs["tp"] == outs["ref"]


def test_kv_cache_is_split_by_kv_heads_and_block_ids_are_shared(tp_models):
    loaded = tp_models["qwen2"]
    tp = SimulatedTP(loaded.config, loaded.tensors, 2, NUM_BLOCKS, BS)
    ref = reference(loaded)
    for batch in mixed_steps()[:2]:
        ref.forward(batch)
        tp.forward(batch)
    tp.close()
    for r, shard in enumerate(tp.shards):
        assert shard.backend.k_cache[0].shape == (NUM_BLOCKS, 2, BS, loaded.config.head_dim)
        # rank r's cache holds KV heads [2r, 2r+2) of the reference's, in the same blocks
        np.testing.assert_allclose(shard.backend.k_cache[1], ref.backend.k_cache[1][:, 2 * r: 2 * r + 2], atol=1e-5)
        np.testing.assert_allclose(shard.backend.v_cache[2], ref.backend.v_cache[2][:, 2 * r: 2 * r + 2], atol=1e-5)


def test_engine_with_simulated_tp_generates_the_reference_tokens(tp_models):
    loaded = tp_models["qwen2"]
    prompts = [[5, 77, 301, 12, 9, 150, 42] * 3, [399, 1, 200, 3], [8, 9, 10, 11, 12] * 7]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    cfg = EngineConfig(kv_cache_tokens=512, max_num_batched_tokens=24)  # chunked prefills mixed with decodes
    want = LLMEngine(loaded, cfg).generate(prompts, params)
    engine = tp_engine(loaded, cfg, lambda blocks: SimulatedTPRunner(loaded, blocks, cfg.block_size, 4))
    got = engine.generate(prompts, params)
    engine.runner.shutdown()
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert engine.stats().num_free_blocks == engine.stats().num_blocks == 32


def random_tensors(c: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i, q, kv, v = c.hidden_size, c.intermediate_size, c.q_size, c.kv_size, c.vocab_size
    f = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": f(v, h), "model.norm.weight": 1 + f(h), "lm_head.weight": f(v, h)}
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        t.update({p + "input_layernorm.weight": 1 + f(h), p + "post_attention_layernorm.weight": 1 + f(h),
                  p + "self_attn.q_proj.weight": f(q, h), p + "self_attn.k_proj.weight": f(kv, h),
                  p + "self_attn.v_proj.weight": f(kv, h), p + "self_attn.o_proj.weight": f(h, q),
                  p + "mlp.gate_proj.weight": f(i, h), p + "mlp.up_proj.weight": f(i, h),
                  p + "mlp.down_proj.weight": f(h, i), p + "self_attn.q_proj.bias": f(q),
                  p + "self_attn.k_proj.bias": f(kv), p + "self_attn.v_proj.bias": f(kv)})
    return t


ODD = ModelConfig(model_type="qwen2", vocab_size=403, hidden_size=32, intermediate_size=45, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, head_dim=8, attention_bias=True)


def test_uneven_vocab_is_padded_and_uneven_mlp_split_still_equals_reference():
    plan = ShardPlan(ODD, 2)
    assert plan.vocab_shard == 202 and plan.vocab_range(1) == (202, 403)
    assert [plan.inter_range(r) for r in range(2)] == [(0, 23), (23, 45)]
    assert plan.rank_config(1).num_attention_heads == 3 and plan.rank_config(1).num_key_value_heads == 1
    tensors = random_tensors(ODD)
    r1 = shard_tensors(plan, tensors, 1)
    assert r1["lm_head.weight"].shape == (202, 32) and not r1["lm_head.weight"][201].any()  # the padding row
    be = CPUBackend(ODD, num_blocks=4, block_size=BS)
    ref = Model(ODD, build_weights(ODD, tensors, be), be)
    tp = SimulatedTP(ODD, tensors, 2, 4, BS)
    batch = build_step_batch([(list(range(390, 403)) + [0, 201, 202], 0, [0], True), ([402, 7], 0, [1], True)], BS)
    np.testing.assert_allclose(tp.forward(batch), ref.forward(batch), rtol=1e-4, atol=1e-4)
    tp.close()


def test_shard_fused_equals_sharding_the_checkpoint_then_fusing():
    plan = ShardPlan(ODD, 2)
    tensors = random_tensors(ODD, seed=3)
    full = build_weights(ODD, tensors, CPUBackend(ODD, num_blocks=1))
    for r in range(2):
        rc = plan.rank_config(r)
        want = build_weights(rc, shard_tensors(plan, tensors, r), CPUBackend(rc, num_blocks=1))
        got = shard_fused(plan, full, r)
        for a, b in [(got.embed, want.embed), (got.lm_head, want.lm_head), (got.norm, want.norm)] + [
                (getattr(g, f), getattr(w, f)) for g, w in zip(got.layers, want.layers)
                for f in ("input_norm", "qkv", "qkv_bias", "o", "post_norm", "gate_up", "down")]:
            assert np.array_equal(a, b)


@pytest.mark.parametrize("n, needle", [(3, "does not divide the model's 4 KV heads; choose one of 1, 2, 4"),
                                       (8, "does not divide the model's 4 KV heads"),
                                       (0, "must be at least 1")])
def test_tensor_parallel_size_that_does_not_divide_kv_heads_is_a_user_error(tp_models, n, needle):
    with pytest.raises(UserError, match=needle):
        ShardPlan(tp_models["llama"].config, n)


def test_default_tiny_model_with_two_kv_heads_refuses_four_ranks(tiny_llama):
    loaded = load(str(tiny_llama))
    with pytest.raises(UserError, match="choose one of 1, 2"):
        SimulatedTP(loaded.config, loaded.tensors, 4, NUM_BLOCKS, BS)
    assert dataclasses.replace(loaded.config).num_key_value_heads == 2


def test_too_few_gpus_is_one_clear_line(monkeypatch):
    from llmrs.engine import tp_nccl

    monkeypatch.setattr(tp_nccl, "visible_gpus", lambda: 1)
    with pytest.raises(UserError, match=r"^--tensor-parallel-size 2 needs 2 GPUs; 1 visible$"):
        tp_nccl.check_tp_size(2, "auto")
    tp_nccl.check_tp_size(1, "cpu")  # TP=1 is the ordinary single-device path


@pytest.mark.parametrize("args", [["generate", "-p", "hi", "--tensor-parallel-size", "2"],
                                  ["serve", "--port", "0", "--tensor-parallel-size", "2"]])
def test_cli_tensor_parallel_without_enough_gpus_exits_2_with_the_gpu_count(args):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from llmrs.engine.tp_nccl import visible_gpus

    if visible_gpus() >= 2:
        pytest.skip("this machine has the GPUs")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    p = subprocess.run([sys.executable, "-m", "llmrs", *args], capture_output=True, text=True, env=env,
                       cwd=root, timeout=120)
    assert p.returncode == 2
    assert f"--tensor-parallel-size 2 needs 2 GPUs; {visible_gpus()} visible" in p.stderr
    assert "Traceback" not in p.stderr


def _widened(loaded, n):
    from llmrs.engine.tp import widen_heads

    c, t = widen_heads(loaded.config, loaded.tensors, n)
    return dataclasses.replace(loaded, config=c, tensors=t)


@pytest.mark.parametrize("n", [3, 4])
def test_widened_heads_compute_the_same_logits_and_shard_at_sizes_the_model_does_not_divide(tp_models, n):
    """widen_heads: KV heads copied, dummy query heads with zero q/o weights: the same function, sharded at an N
    the original's 4 KV heads do not allow (n = 3), and nothing widened where N divides them (n = 4)."""
    loaded = tp_models["qwen2"]
    wide = _widened(loaded, n)
    c = wide.config
    assert c.num_key_value_heads % n == 0 and c.num_attention_heads % c.num_key_value_heads == 0
    if n == 4:
        assert (c.num_attention_heads, c.num_key_value_heads) == (8, 4)
    else:  # 4 KV heads x 3 copies, each with ceil(2 / 3) = 1 query slot: 12 query heads, 4 of them dummies
        assert (c.num_attention_heads, c.num_key_value_heads) == (12, 12)
    with pytest.raises(UserError):
        ShardPlan(loaded.config, 3)
    ref, wide_ref = reference(loaded), reference(wide)
    tp = SimulatedTP(c, wide.tensors, n, NUM_BLOCKS, BS)
    try:
        for batch in mixed_steps():
            want = ref.forward(batch)
            np.testing.assert_allclose(wide_ref.forward(batch), want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(tp.forward(batch), want, rtol=1e-4, atol=1e-4)
    finally:
        tp.close()


def test_smollm2_widened_for_tp2_writes_a_checkpoint_with_the_same_logits(tmp_path):
    """The checkpoint the GPU machine's server suite runs at TP=2 (tests/tp_widen.py): SmolLM2's 9 query / 3 KV
    heads become 12 / 6 (3 dummies), and the reference logits of the written directory equal the GGUF's."""
    from tests.tp_widen import write_widened

    out = write_widened("smollm2-135m", tmp_path / "smollm2-tp2", 2)
    orig, wide = load("smollm2-135m"), load(str(out))
    assert (wide.config.num_attention_heads, wide.config.num_key_value_heads) == (12, 6)
    ShardPlan(wide.config, 2)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert wide.tokenizer.encode_chat(msgs) == orig.tokenizer.encode_chat(msgs)
    assert wide.tokenizer.encode("Hello, world! ünïcödé") == orig.tokenizer.encode("Hello, world! ünïcödé")
    ids = orig.tokenizer.encode_chat(msgs)
    batch = build_step_batch([(ids, 0, list(range(-(-len(ids) // BS))), True)], BS)
    np.testing.assert_allclose(reference(wide).forward(batch), reference(orig).forward(batch), rtol=1e-4, atol=1e-4)
    assert wide.stop_token_ids == orig.stop_token_ids
