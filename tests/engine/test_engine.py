"""LLMEngine: batch invariance, prefix caching, preemption, abort, chunked prefill, AsyncEngine streams."""

from __future__ import annotations

import asyncio
import collections
import itertools
import sys
import time

import pytest

from llmrs.engine.config import EngineConfig
from llmrs.engine.async_engine import AsyncEngine, take_merged
from llmrs.engine.llm_engine import LLMEngine
from llmrs.engine.protocol import EngineOverloaded, RequestOutput
from llmrs.model.loader import load
from llmrs.engine.sampling import SampleResult, SamplingParams
from llmrs.errors import UserError

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def smol():
    return load("smollm2-135m")


def prompts_of_different_lengths(tok, n=16):
    base = ["Tell me about the ocean.", "def add(a, b):", "The history of Rome, in short:",
            "List three fruits:", "Why is the sky blue? Explain like I'm five.", "Bonjour, comment"]
    return [tok.encode(" ".join([base[i % len(base)]] * (1 + i % 4))) for i in range(n)]


def test_batch_invariance_16_concurrent_equal_one_at_a_time(smol):
    prompts = prompts_of_different_lengths(smol.tokenizer)
    max_tokens = [6 + (i * 5) % 11 for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=m, **GREEDY) for m in max_tokens]
    batched = LLMEngine(smol, EngineConfig(kv_cache_tokens=4096, max_num_seqs=16, max_num_batched_tokens=256))
    together = batched.generate(prompts, params)
    assert batched.stats().num_free_blocks == batched.stats().num_blocks
    alone_engine = LLMEngine(smol, EngineConfig(kv_cache_tokens=4096, enable_prefix_caching=False))
    for p, sp, res in zip(prompts, params, together):
        alone = alone_engine.generate([p], sp)[0]
        assert res.token_ids == alone.token_ids
        assert len(res.token_ids[0]) == sp.max_tokens


def test_prefix_hit_skips_prefill_of_shared_blocks_and_keeps_tokens(smol):
    tok = smol.tokenizer
    system = "You are a careful assistant. " * 12
    a, b = tok.encode(system + "Question one: what is 2+2?"), tok.encode(system + "Question two: name a color.")
    shared_blocks = 0
    while a[: (shared_blocks + 1) * 16] == b[: (shared_blocks + 1) * 16]:
        shared_blocks += 1
    assert shared_blocks >= 4
    params = SamplingParams(max_tokens=8, **GREEDY)

    cached = LLMEngine(smol, EngineConfig(kv_cache_tokens=2048))
    cached.generate([a], params)
    before = cached.stats().computed_tokens_total
    out_b = cached.generate([b], params)[0]
    computed_b = cached.stats().computed_tokens_total - before
    # only the suffix after the shared full blocks is prefilled (+ one token per generated token after the first)
    assert computed_b == len(b) - shared_blocks * 16 + params.max_tokens - 1
    assert cached.stats().prefix_hits >= shared_blocks * 16

    fresh = LLMEngine(smol, EngineConfig(kv_cache_tokens=2048, enable_prefix_caching=False))
    assert fresh.generate([b], params)[0].token_ids == out_b.token_ids


def test_prefix_hit_is_capped_so_last_token_is_computed(smol):
    ids = smol.tokenizer.encode("word " * 64)[:48]  # exactly 3 full blocks
    e = LLMEngine(smol, EngineConfig(kv_cache_tokens=1024))
    first = e.generate([ids], SamplingParams(max_tokens=4, **GREEDY))[0]
    before = e.stats().computed_tokens_total
    again = e.generate([ids], SamplingParams(max_tokens=4, **GREEDY))[0]
    assert e.stats().computed_tokens_total - before == 16 + 3  # the last block recomputed, then 3 decodes
    assert again.token_ids == first.token_ids


def test_preemption_every_request_completes_with_alone_output(smol):
    prompts = prompts_of_different_lengths(smol.tokenizer, n=6)
    params = SamplingParams(max_tokens=24, **GREEDY)
    # 12 blocks of 16 tokens: each request needs 2-4 blocks, all six at once need ~20
    small = LLMEngine(smol, EngineConfig(kv_cache_tokens=12 * 16, max_num_seqs=6, max_num_batched_tokens=512))
    results = small.generate(prompts, params)
    assert small.scheduler.num_preemptions > 0
    assert small.stats().num_free_blocks == small.stats().num_blocks
    ref = LLMEngine(smol, EngineConfig(kv_cache_tokens=4096, enable_prefix_caching=False))
    for p, r in zip(prompts, results):
        assert r.finish_reasons == ["length"]
        assert r.token_ids == ref.generate([p], params)[0].token_ids


def test_chunked_prefill_equals_whole_prefill(smol):
    ids = smol.tokenizer.encode("A long prompt about paged attention and batching. " * 6)
    params = SamplingParams(max_tokens=8, **GREEDY)
    chunked = LLMEngine(smol, EngineConfig(kv_cache_tokens=1024, max_num_batched_tokens=20))
    whole = LLMEngine(smol, EngineConfig(kv_cache_tokens=1024, max_num_batched_tokens=4096))
    assert chunked.generate([ids], params)[0].token_ids == whole.generate([ids], params)[0].token_ids


def test_abort_frees_blocks_at_once(smol):
    e = LLMEngine(smol, EngineConfig(kv_cache_tokens=1024))
    e.add_request("r1", smol.tokenizer.encode("Hello " * 40), SamplingParams(max_tokens=50, **GREEDY))
    e.step()
    e.step()
    assert e.stats().num_free_blocks < e.stats().num_blocks
    outs = e.abort("r1")
    assert [o.finish_reason for o in outs] == ["abort"]
    assert e.stats().num_free_blocks == e.stats().num_blocks and not e.has_unfinished()


def test_n_choices_and_seeds(smol):
    e = LLMEngine(smol, EngineConfig(kv_cache_tokens=2048))
    ids = smol.tokenizer.encode("Once upon a time")
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=123, n=2, ignore_eos=True)
    r1 = e.generate([ids], p)[0]
    r2 = e.generate([ids], p)[0]
    assert r1.token_ids == r2.token_ids  # same seed, same tokens
    assert r1.token_ids[0] != r1.token_ids[1]  # choices differ


def test_request_errors_are_user_errors(smol):
    e = LLMEngine(smol, EngineConfig(kv_cache_tokens=256))
    with pytest.raises(UserError, match="maximum context length"):
        e.add_request("a", [1] * 10, SamplingParams(max_tokens=9000))
    with pytest.raises(UserError, match="KV cache"):
        e.add_request("b", [1] * 10, SamplingParams(max_tokens=500))
    with pytest.raises(UserError, match="token ids"):
        e.add_request("c", [10**9], SamplingParams(max_tokens=5))
    with pytest.raises(UserError, match="empty"):
        e.add_request("d", [], SamplingParams(max_tokens=5))
    assert not e.has_unfinished()


def test_async_engine_streams_and_cancellation_aborts(smol):
    async def main():
        eng = AsyncEngine(LLMEngine(smol, EngineConfig(kv_cache_tokens=1024)), max_waiting=8)
        eng.start()
        ids = smol.tokenizer.encode("The capital of France is")
        deltas = [o async for o in eng.add_request(None, ids, SamplingParams(max_tokens=6, **GREEDY))]
        assert deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 6
        alone = LLMEngine(smol, EngineConfig(kv_cache_tokens=1024)).generate([ids], SamplingParams(max_tokens=6, **GREEDY))
        assert "".join(d.text for d in deltas) == alone[0].texts[0]
        # a consumer that stops reading mid-stream aborts its request and frees its blocks
        stream = eng.add_request("cut", ids, SamplingParams(max_tokens=200, **GREEDY))
        async for _ in stream:
            break
        await stream.aclose()
        for _ in range(200):
            await asyncio.sleep(0.02)
            if eng.stats().num_free_blocks == eng.stats().num_blocks and eng.stats().num_running == 0:
                break
        assert eng.stats().num_free_blocks == eng.stats().num_blocks
        await eng.shutdown()

    asyncio.run(main())


def test_async_engine_rejects_when_too_many_wait(smol):
    async def main():
        eng = AsyncEngine(LLMEngine(smol, EngineConfig(kv_cache_tokens=1024)), max_waiting=1)
        # not started: requests pile up in the queue
        eng.add_request(None, [1, 2, 3], SamplingParams(max_tokens=2))
        with pytest.raises(EngineOverloaded):
            eng.add_request(None, [1, 2, 3], SamplingParams(max_tokens=2))

    asyncio.run(main())


def test_warmup_runs_a_request_then_leaves_no_trace(smol):
    """LLMEngine.warmup (run before serving on the GPU): one throwaway prefill + decodes through the real step,
    then blocks free, prefix cache empty, counters zero, and later requests come out as on a fresh engine (no
    prefix hit on the warm-up's prompt either)."""
    cfg = EngineConfig(kv_cache_tokens=2048, max_num_batched_tokens=64)
    eng = LLMEngine(smol, cfg)
    seconds = eng.warmup(prompt_len=48, decode_steps=3)
    assert seconds > 0 and not eng.has_unfinished() and not eng.requests
    st = eng.stats()
    assert st.num_free_blocks == st.num_blocks and not eng.kv.pool.cached
    assert (st.prefix_queries, st.prefix_hits, st.prompt_tokens_total, st.generation_tokens_total,
            st.computed_tokens_total, st.num_preemptions) == (0, 0, 0, 0, 0, 0)
    vocab = smol.config.vocab_size
    warm_prompt = [1 + (i * 7919) % (vocab - 1) for i in range(48)]
    prompts = prompts_of_different_lengths(smol.tokenizer, 4) + [warm_prompt]
    params = SamplingParams(max_tokens=8, **GREEDY)
    got = [r.token_ids for r in eng.generate(prompts, params)]
    fresh = [r.token_ids for r in LLMEngine(smol, cfg).generate(prompts, params)]
    assert got == fresh
    assert eng.stats().prefix_hits == 0


def test_stats_count_the_backends_graph_captures_and_failures(smol):
    """EngineStats' graph counters (the server's /metrics llmrs:cuda_graph_captures / _capture_failures): 0 on the
    CPU; over a GPU backend's decode and prefill graph sets, what each captured and the shapes it failed on."""
    from types import SimpleNamespace

    eng = LLMEngine(smol, EngineConfig(kv_cache_tokens=256))
    st = eng.stats()
    assert (st.graph_captures, st.graph_capture_failures) == (0, 0)
    decode = SimpleNamespace(captures=5, failed={(2, 256), (4, 256)})
    prefill = SimpleNamespace(captures=2, failed={(128, 0)})
    eng.runner = SimpleNamespace(graph_sets=lambda: (decode, prefill))
    st = eng.stats()
    assert (st.graph_captures, st.graph_capture_failures) == (7, 3)


def test_warmup_for_serving_only_on_the_gpu_and_not_when_turned_off(smol, monkeypatch):
    from llmrs.engine.llm_engine import warm_up_for_serving

    eng = LLMEngine(smol, EngineConfig(kv_cache_tokens=1024))
    calls = []
    monkeypatch.setattr(eng, "warmup", lambda: calls.append(eng.runner.device))
    warm_up_for_serving(eng)  # the CPU: nothing to warm
    assert calls == []
    monkeypatch.setattr(eng.runner, "device", "cuda")
    warm_up_for_serving(eng)
    assert calls == ["cuda"]
    monkeypatch.setenv("LLMRS_WARMUP", "0")
    warm_up_for_serving(eng)
    assert calls == ["cuda"]


def test_released_host_weights_are_refused_not_replaced(tiny_llama):
    """serving_engine drops the host copy of the weights once they are on the GPU (`LoadedModel.tensors = None`);
    a runner built from such a LoadedModel afterwards is one clear error, never a model with drawn weights (which
    is what tensors None means for a synthetic model). On the CPU the engine keeps them (its forward reads them)."""
    import dataclasses

    from llmrs.engine.llm_engine import serving_engine, serving_config
    from llmrs.engine.runner import ModelRunner

    eng = serving_engine(str(tiny_llama), serving_config(device="cpu", kv_cache_tokens=256))
    assert eng.loaded.tensors is not None
    released = dataclasses.replace(load(str(tiny_llama)), tensors=None)
    with pytest.raises(UserError, match="host weights were released"):
        ModelRunner(released, num_blocks=4, device="cpu")


def test_serving_step_budget_follows_the_device(smol):
    """`llmrs serve` leaves --max-num-batched-tokens None: vLLM's API-server default for the device, 8192 on a GPU
    of >= 70 GiB other than an A100, else 2048 (the CPU here); a number given is kept."""
    from llmrs.engine.llm_engine import serving_batched_tokens

    gib = 2**30
    assert serving_batched_tokens("cuda", 141 * 10**9, "NVIDIA H200") == 8192
    assert serving_batched_tokens("cuda", 80 * gib, "NVIDIA H100 80GB HBM3") == 8192
    assert serving_batched_tokens("cuda", 80 * gib, "NVIDIA A100-SXM4-80GB") == 2048
    assert serving_batched_tokens("cuda", 24 * gib, "NVIDIA GeForce RTX 4090") == 2048
    assert serving_batched_tokens("cpu") == 2048
    eng = LLMEngine(smol, EngineConfig(max_num_batched_tokens=None, kv_cache_tokens=512))
    assert eng.scheduler.max_num_batched_tokens == 2048 == eng.engine_config.max_num_batched_tokens
    assert AsyncEngine(eng).max_num_batched_tokens == 2048
    eng = LLMEngine(smol, EngineConfig(max_num_batched_tokens=300, kv_cache_tokens=512))
    assert eng.scheduler.max_num_batched_tokens == 300


def test_serving_step_budget_reads_the_runners_gpu(monkeypatch):
    """On a GPU runner the budget comes from the current device's name and memory (CuPy stood in for here)."""
    from types import SimpleNamespace

    from llmrs.engine.llm_engine import _runner_batched_tokens

    def fake_cupy(name: bytes, memory: int) -> SimpleNamespace:
        props = {"name": name, "totalGlobalMem": memory}
        return SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=0), runtime=SimpleNamespace(
            getDeviceProperties=lambda i: props)))

    gpu = SimpleNamespace(device="cuda")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(b"NVIDIA H200", 150_000_000_000))
    assert _runner_batched_tokens(gpu) == 8192
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(b"NVIDIA A100-SXM4-80GB", 85_000_000_000))
    assert _runner_batched_tokens(gpu) == 2048
    assert _runner_batched_tokens(SimpleNamespace(device="cpu")) == 2048


def _out(index: int, text: str, finish: str | None = None, n_out: int = 0) -> RequestOutput:
    return RequestOutput("r", index, text, [ord(c) for c in text], [SampleResult(ord(c), -0.5) for c in text],
                         finish, 3, n_out)


def test_take_merged_joins_a_choices_queued_deltas_in_order():
    """A stream's consumer that fell behind finds several deltas queued: each choice's go out as one (text, ids and
    logprobs joined; the latest's finish and counts), up to that choice's last, other choices' in their order; an
    exception stays where it was; with MERGE_DELTAS off they come one by one."""
    q = collections.deque([_out(0, "a", n_out=1), _out(1, "x", n_out=1), _out(0, "b", n_out=2),
                           _out(1, "y", "length", 2), _out(0, "c", "stop", 3)])
    first = take_merged(q)
    assert (first.index, first.text, first.token_ids, first.finish_reason, first.num_output_tokens) == \
        (0, "abc", [97, 98, 99], "stop", 3)
    assert [lp.token_id for lp in first.logprobs] == [97, 98, 99]
    second = take_merged(q)
    assert (second.index, second.text, second.finish_reason, second.num_output_tokens) == (1, "xy", "length", 2)
    assert not q
    boom = RuntimeError("core gone")
    q = collections.deque([_out(0, "a"), _out(0, "b"), boom, _out(0, "c")])
    assert take_merged(q).text == "ab" and take_merged(q) is boom and take_merged(q).text == "c"
    lone = _out(0, "z", "stop")
    q = collections.deque([lone, _out(0, "never")])
    assert take_merged(q) is lone and len(q) == 1  # a finished choice takes nothing after it
    q = collections.deque([_out(0, "a"), _out(0, "b")])
    import llmrs.engine.async_engine as engine_module

    engine_module.MERGE_DELTAS = False
    try:
        assert take_merged(q).text == "a" and take_merged(q).text == "b"
    finally:
        engine_module.MERGE_DELTAS = True


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_consumer_behind_the_engine_gets_merged_deltas(smol, kind):
    """The event loop blocked for a while (a host-bound server's long pass) while the engine (its thread, or the
    core process) runs on: the stream hands over what piled up as merged deltas, their text the whole greedy
    text and their token counts right."""
    from llmrs.engine.core_client import ProcessEngine

    ids = smol.tokenizer.encode("The capital of France is")
    want = LLMEngine(smol, EngineConfig(kv_cache_tokens=1024)).generate([ids], SamplingParams(max_tokens=24, **GREEDY))

    async def main():
        if kind == "thread":
            eng = AsyncEngine(LLMEngine(smol, EngineConfig(kv_cache_tokens=1024)))
        else:
            eng = ProcessEngine.from_args("smollm2-135m", device="cpu", kv_cache_tokens=1024)
        eng.start()
        try:
            stream = eng.add_request(None, ids, SamplingParams(max_tokens=24, **GREEDY))
            deltas = [await anext(stream)]
            deadline = time.monotonic() + 60
            while eng.stats().num_running and time.monotonic() < deadline:
                time.sleep(0.05)  # the loop blocked: nothing reads the stream while the steps go on
                if kind == "process":
                    await asyncio.sleep(0)  # (the core's stats arrive through the loop's reader)
            deltas += [d async for d in stream]
        finally:
            await eng.shutdown()
        return deltas

    deltas = asyncio.run(main())
    assert "".join(d.text for d in deltas) == want[0].texts[0]
    assert sum(len(d.token_ids) for d in deltas) == 24 == deltas[-1].num_output_tokens
    assert deltas[-1].finish_reason == "length" and max(len(d.token_ids) for d in deltas) > 1, \
        [len(d.token_ids) for d in deltas]
    assert [d.num_output_tokens for d in deltas] == list(itertools.accumulate(len(d.token_ids) for d in deltas))


def test_serving_warm_up_says_when_graph_captures_failed(capsys, monkeypatch):
    """warm_up_for_serving (a GPU engine before serving): one warning line when some of the warm-up's graph captures
    failed (those shapes run eagerly), none when all were captured."""
    from types import SimpleNamespace

    from llmrs.engine.llm_engine import warm_up_for_serving

    monkeypatch.delenv("LLMRS_WARMUP", raising=False)
    ran = []
    for failures in (0, 2):
        eng = SimpleNamespace(runner=SimpleNamespace(device="cuda"), warmup=lambda: ran.append(1),
                              _graph_counts=lambda f=failures: {"graph_captures": 24, "graph_capture_failures": f})
        warm_up_for_serving(eng)
        err = capsys.readouterr().err
        assert ("2 of 26 CUDA graph captures failed" in err) == bool(failures), err
    assert ran == [1, 1]
