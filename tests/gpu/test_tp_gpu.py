"""Tensor parallelism over NCCL on real GPUs (llmrs/engine/tp_nccl.py).

They skip unless CuPy sees at least 2 GPUs (4-rank cases skip below 4). What they pin:
- NCCL itself through our communicator: all_reduce sums, all_gather stacks in rank order (2 processes);
- a tiny Llama and a tiny Qwen2 at TP=2 (and 4): logits close to the single-GPU engine's, greedy tokens equal,
  decode steps replayed from CUDA graphs with the NCCL calls captured in them;
- the engine (scheduler, one block pool in rank 0, batched chunked prefill + decode) at TP=2: same tokens;
- synthetic Qwen2.5-7B at TP=2 (and 4): the same random weights as TP=1 (synthetic_shard), greedy tokens equal;
- `llmrs serve --tensor-parallel-size 2` answers a chat completion through the official client;
- `llmrs profile` at TP=2 times the collectives as "communication".
The whole server suite also runs at TP=2: LLMRS_TEST_TP=2 LLMRS_TEST_MODEL=<synth qwen2.5-0.5b dir> pytest
tests/server/test_server.py (tools/gpu_check.sh).
Run: PYTHONPATH=. python -m pytest tests/gpu/test_tp_gpu.py -q -s   (NCCL_NVLS_ENABLE=0 is set by the code too)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cuda_helpers import rel_err, report, require_gpu

cp = require_gpu()
pytestmark = pytest.mark.gpu
N_GPUS = cp.cuda.runtime.getDeviceCount()
if N_GPUS < 2:
    pytest.skip(f"tensor parallelism needs >= 2 GPUs; {N_GPUS} visible", allow_module_level=True)

from llmrs.engine.batch import build_step_batch  # noqa: E402
from llmrs.engine.config import EngineConfig  # noqa: E402
from llmrs.engine.llm_engine import LLMEngine  # noqa: E402
from llmrs.model.loader import load  # noqa: E402
from llmrs.engine.runner import ModelRunner, stream_generate  # noqa: E402
from llmrs.engine.sampling import SamplingParams  # noqa: E402
from llmrs.engine.tp import tp_engine  # noqa: E402
from llmrs.engine.tp_nccl import MULTICAST_OFF, NcclTPRunner, new_unique_id  # noqa: E402
from tests.conftest import write_tiny_model  # noqa: E402

os.environ.update(MULTICAST_OFF)
ROOT = Path(__file__).resolve().parents[2]
BS = 16
SIZES = [n for n in (2, 4) if n <= N_GPUS]
TINY = dict(num_attention_heads=8, num_key_value_heads=4, intermediate_size=168)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_gpu")
    return {"llama": write_tiny_model(root / "llama", "llama", **TINY),
            "qwen2": write_tiny_model(root / "qwen2", "qwen2", seed=1, **{**TINY, "intermediate_size": 170})}


def _collectives(rank: int, world: int, uid, q) -> None:
    os.environ.update(MULTICAST_OFF)
    import cupy

    from llmrs.engine.tp_nccl import NcclCommunicator

    cupy.cuda.Device(rank).use()
    comm = NcclCommunicator(rank, world, uid)
    s = comm.all_reduce(cupy.full((3, 5), float(rank + 1), dtype=cupy.float32))
    g = comm.all_gather(cupy.full((2,), float(rank), dtype=cupy.float32))
    cupy.cuda.Device().synchronize()
    q.put((rank, cupy.asnumpy(s), cupy.asnumpy(g)))


def test_nccl_all_reduce_sums_and_all_gather_stacks_in_rank_order():
    ctx = mp.get_context("spawn")
    uid, q = new_unique_id(), ctx.Queue()
    procs = [ctx.Process(target=_collectives, args=(r, 2, uid, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (s, g)) for r, s, g in (q.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r in range(2):
        assert np.array_equal(got[r][0], np.full((3, 5), 3.0, np.float32))
        assert np.array_equal(got[r][1], np.array([[0, 0], [1, 1]], np.float32))


def _tokens(runner, prompt, n=24):
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.token_ids[0] for o in stream_generate(runner, prompt, params)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("n", SIZES)
def test_tiny_model_tp_logits_close_and_greedy_tokens_equal_single_gpu(tiny, arch, n):
    path = str(tiny[arch])
    prompt = [5, 77, 301, 12, 9, 150, 42, 8, 399, 1, 200, 3] * 3
    batch = build_step_batch([(prompt, 0, [0, 1, 2], True)], BS)
    one = ModelRunner(load(path), num_blocks=32, block_size=BS, device="cuda")
    want_logits, want = one.execute(batch), _tokens(one, prompt)
    del one
    tp = NcclTPRunner(load(path), path, n, block_size=BS, num_blocks=32)
    try:
        got_logits, got = tp.execute(batch), _tokens(tp, prompt)
        graphs = tp.backend.graphs
        replays = 0 if graphs is None else graphs.replays
    finally:
        tp.shutdown()
    err = rel_err(got_logits, want_logits)
    report(f"tp{n}_{arch}_logits_rel_err", err)
    assert err < 1e-2
    assert got == want
    if os.environ.get("LLMRS_CUDA_GRAPHS", "1") != "0":
        assert replays >= 20  # the decode steps (all-reduces and the logits all-gather inside) ran as graphs


def test_engine_at_tp2_batches_chunked_prefill_and_decode_like_one_gpu(tiny):
    path = str(tiny["qwen2"])
    loaded = load(path)
    prompts = [[5, 77, 301, 12, 9, 150, 42] * 3, [399, 1, 200, 3], [8, 9, 10, 11, 12] * 7]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    cfg = EngineConfig(kv_cache_tokens=1024, max_num_batched_tokens=24, device="cuda")
    want = [r.token_ids for r in LLMEngine(loaded, cfg).generate(prompts, params)]
    mine = load(path)
    engine = tp_engine(mine, cfg, lambda blocks: NcclTPRunner(mine, path, 2, block_size=BS, num_blocks=blocks))
    try:
        got = [r.token_ids for r in engine.generate(prompts, params)]
    finally:
        engine.runner.shutdown()
    assert got == want
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


@pytest.mark.parametrize("n", SIZES)
def test_synthetic_qwen25_7b_tp_greedy_tokens_equal_single_gpu(n):
    spec = "synthetic:qwen2.5-7b"
    prompt = list(range(100, 164))
    one = ModelRunner(load(spec), num_blocks=16, block_size=BS, device="cuda")
    want = _tokens(one, prompt, 16)
    del one
    cp.get_default_memory_pool().free_all_blocks()
    tp = NcclTPRunner(load(spec), spec, n, block_size=BS, num_blocks=16)
    try:
        t0 = time.perf_counter()
        got = _tokens(tp, prompt, 16)
        report(f"tp{n}_qwen2.5-7b_16_tokens_s", time.perf_counter() - t0)
    finally:
        tp.shutdown()
    assert got == want


def test_serve_with_tp2_answers_a_chat_completion(tiny):
    import httpx
    import openai

    from llmrs.bench.server import free_port

    port = free_port()
    env = {**os.environ, **MULTICAST_OFF,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "llmrs", "serve", str(tiny["qwen2"]), "--port", str(port),
                             "--tensor-parallel-size", "2", "--kv-cache-tokens", "2048"], env=env)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, "server exited early"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server not ready"
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
        r = client.chat.completions.create(model=str(tiny["qwen2"]), max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "hello"}])
        assert r.usage.completion_tokens == 8 or r.choices[0].finish_reason == "stop"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_profile_at_tp2_times_the_collectives_as_communication(tiny):
    from llmrs.profiling import profile as prof

    profiles, meta = prof.run_profile(str(tiny["llama"]), [1, 8], context=40, prefill_len=30, steps=3, gpu="auto",
                                      tp=2)
    assert meta["tensor_parallel"] == 2 and meta["link_gbs"] > 0
    for p in profiles:
        names = {k.kernel for k in p.kernels}
        assert "allreduce all_reduce" in names and p.categories["communication"] > 0
        ar = next(k for k in p.kernels if k.kernel == "allreduce all_reduce")
        assert ar.calls == 1 + 2 * 3  # the embeddings, then o_proj and down_proj of each of the 3 layers
        assert ar.bound == "link"
    assert "allgather all_gather" in {k.kernel for k in profiles[0].kernels}
