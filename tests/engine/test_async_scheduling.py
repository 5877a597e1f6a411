"""Async scheduling (EngineConfig.async_scheduling): step n+1 is planned and launched before step n's tokens are
back, its decode inputs taken from step n's samples by the runner (StepBatch.feed). On the CPU the runner does
the same bookkeeping synchronously, so every output must equal the step-by-step engine's exactly: through
chunked prefill, prefix hits, preemption, stop tokens and strings, seeds, n > 1 and aborts, with no block left
behind. (tests/backends/test_cuda_graphs.py runs the GPU form.)"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs.engine.config import EngineConfig
from llmrs.engine.llm_engine import LLMEngine, Runner
from llmrs.model.loader import load
from llmrs.engine.runner import ModelRunner, stream_generate
from llmrs.engine.sampling import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def smol():
    return load("smollm2-135m")


def engine(model, run_ahead: bool, note=lambda batch: batch.feed is not None, **cfg) -> tuple[LLMEngine, list]:
    """An engine whose runner records `note(batch)` per launch (default: whether the step had inputs fed from the
    step before)."""
    e = LLMEngine(model, EngineConfig(async_scheduling=run_ahead, **cfg))
    fed: list = []
    launch = e.runner.launch

    def recording(batch, states):
        fed.append(note(batch))
        return launch(batch, states)

    e.runner.launch = recording
    return e, fed


def workload(smol) -> tuple[list[list[int]], list[SamplingParams]]:
    tok = smol.tokenizer
    system = "You are a careful assistant who answers briefly. " * 4
    texts = [system + "What is 2+2?", system + "Name a color.", "def add(a, b):", "The history of Rome:",
             "List three fruits:", "Bonjour, comment", "Why is the sky blue?"]
    prompts = [tok.encode(t) for t in texts]
    # the greedy continuation of prompt 0, to pick a stop token and a stop string that occur in it
    ref = LLMEngine(smol, EngineConfig(kv_cache_tokens=4096, async_scheduling=False)).generate(
        [prompts[0]], SamplingParams(max_tokens=12, **GREEDY))[0]
    stop_token = ref.token_ids[0][5]
    stop_text = ref.texts[0][len(ref.texts[0]) // 2:][:3] or "the"
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_token]),  # ends on a token
        SamplingParams(max_tokens=12, **GREEDY),  # prompt 0 again: a prefix hit
        SamplingParams(max_tokens=14, **GREEDY),
        SamplingParams(max_tokens=10, temperature=0.0, stop=[stop_text]),  # a stop string (maybe unmet)
        SamplingParams(max_tokens=9, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=11, temperature=1.0, seed=3, n=2, ignore_eos=True),
        SamplingParams(max_tokens=1, **GREEDY),  # done after its prefill
        SamplingParams(max_tokens=13, temperature=0.0),  # EOS allowed
    ]
    return [prompts[0]] + prompts, params


def run(smol, run_ahead: bool, **cfg):
    e, fed = engine(smol, run_ahead, **cfg)
    prompts, params = workload(smol)
    results = e.generate(prompts, params)
    st = e.stats()
    assert not e.has_unfinished()
    assert st.num_free_blocks == st.num_blocks, "blocks leaked"
    assert not e.requests
    return [(r.token_ids, r.texts, r.finish_reasons) for r in results], fed, e


@pytest.mark.parametrize("cfg", [
    dict(kv_cache_tokens=4096, max_num_seqs=16, max_num_batched_tokens=512),
    # chunked prefills, and a cache too small for everyone: preemptions while steps run ahead
    dict(kv_cache_tokens=8 * 16, max_num_seqs=8, max_num_batched_tokens=24),
], ids=["roomy", "chunked+preempting"])
def test_async_scheduling_gives_the_step_by_step_outputs(smol, cfg):
    ahead, fed_ahead, e_ahead = run(smol, True, **cfg)
    step, fed_step, e_step = run(smol, False, **cfg)
    assert ahead == step
    assert any(fed_ahead) and not any(fed_step)  # steps really were planned before their inputs were known
    assert {r[2][0] for r in step} >= {"stop", "length"}
    if cfg["max_num_batched_tokens"] < 100:  # admitted over several steps: prefix hits (prompts 0-2 share text)
        assert e_ahead.scheduler.num_preemptions > 0
        assert e_ahead.stats().prefix_hits > 0 and e_step.stats().prefix_hits > 0


def test_abort_while_a_step_runs_ahead_frees_everything(smol):
    tok = smol.tokenizer
    prompts = [tok.encode("Hello " * 20), tok.encode("The sea is"), tok.encode("One two three")]
    params = SamplingParams(max_tokens=20, **GREEDY)
    e, fed = engine(smol, True, kv_cache_tokens=2048)
    for i, p in enumerate(prompts):
        e.add_request(f"r{i}", p, params)
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
    for _ in range(6):
        for o in e.step():
            got[o.request_id] += o.token_ids
    assert e._inflight is not None  # a step is in flight, its successor planned
    outs = e.abort("r0")
    assert [o.finish_reason for o in outs] == ["abort"]
    n_r0 = len(got["r0"])
    while e.has_unfinished():
        for o in e.step():
            got[o.request_id] += o.token_ids
    assert len(got["r0"]) == n_r0  # nothing after the abort
    assert e.stats().num_free_blocks == e.stats().num_blocks and not e.requests
    ref = LLMEngine(smol, EngineConfig(kv_cache_tokens=2048, async_scheduling=False))
    for i in (1, 2):
        assert got[f"r{i}"] == ref.generate([prompts[i]], params)[0].token_ids[0]
    assert any(fed)


def test_requests_that_need_the_host_sampler_run_step_by_step(smol):
    """Penalties read the previous token on the host: while such a request runs, no step is planned ahead, and
    every output still equals the step-by-step engine's."""
    tok = smol.tokenizer
    prompts = [tok.encode("Tell me about the ocean."), tok.encode("List three fruits:")]
    params = [SamplingParams(max_tokens=10, **GREEDY),
              SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.3, ignore_eos=True)]
    outs = {}
    for ahead in (True, False):
        e, fed = engine(smol, ahead, kv_cache_tokens=2048)
        e.add_request("plain", prompts[0], params[0])
        got = {"plain": [], "penalty": []}
        for _ in range(3):  # plain alone: runs ahead
            for o in e.step():
                got[o.request_id] += o.token_ids
        e.add_request("penalty", prompts[1], params[1])
        n_before = len(fed)
        while e.has_unfinished():
            for o in e.step():
                got[o.request_id] += o.token_ids
        outs[ahead] = got
        if ahead:
            assert any(fed[:n_before])
            # from the penalty request's arrival until it ended, no step took fed inputs
            assert not any(fed[n_before:n_before + params[1].max_tokens])
        assert e.stats().num_free_blocks == e.stats().num_blocks
    assert outs[True] == outs[False]


def test_stream_generate_run_ahead_equals_step_by_step(smol):
    runner = ModelRunner(smol, num_blocks=64, block_size=16, device="cpu")
    ids = smol.tokenizer.encode("The quick brown fox")
    plain = SamplingParams(max_tokens=10, **GREEDY)
    ref = [o.token_ids[0] for o in stream_generate(runner, ids, plain, run_ahead=False)]
    assert [o.token_ids[0] for o in stream_generate(runner, ids, plain, run_ahead=True)] == ref
    # ends on a stop token: the step launched past it is dropped
    stop = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[ref[3]])
    ahead = list(stream_generate(runner, ids, stop, run_ahead=True))
    assert [o.token_ids[0] for o in ahead] == ref[:4] and ahead[-1].finish_reason == "stop"
    one = SamplingParams(max_tokens=1, **GREEDY)
    assert [o.token_ids[0] for o in stream_generate(runner, ids, one, run_ahead=True)] == ref[:1]


# ---------------------------------------------------------------------- randomized, against a paged fake model
class PagedFake(Runner):
    """A runner whose "model" reads the paged cache like attention does: each sampled token is a hash of every
    token in the sequence's context, gathered through its block table from a fake KV cache that each step writes
    at its slots (fed rows take the previous launch's samples first, as the GPU's feed_tokens does). A wrong feed,
    slot, block table, prefix hit or stale block changes the tokens; a never-written slot fails at once."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv = np.full(num_blocks * block_size, -1, dtype=np.int64)
        self.last = np.zeros(0, dtype=np.int64)
        self.fed = 0

    def launch(self, batch, states):
        import zlib

        from llmrs.engine.runner import Launched
        from llmrs.engine.sampling import SampleResult

        ids = batch.token_ids.astype(np.int64)
        if batch.feed is not None:
            ids = ids.copy()
            fed = batch.feed >= 0
            ids[fed] = self.last[batch.feed[fed]]
            self.fed += 1
        self.kv[batch.slot_mapping] = ids
        bs, out = self.block_size, []
        for row, st in zip(batch.sample_rows, states):
            b = int(np.searchsorted(batch.query_start, row, side="right")) - 1
            pos = np.arange(int(batch.context_lens[b]))
            ctx = self.kv[batch.block_tables[b, pos // bs].astype(np.int64) * bs + pos % bs]
            assert (ctx >= 0).all(), "a context slot no step wrote"
            h = zlib.crc32(ctx.tobytes())
            if not st.params.greedy:
                h ^= int(st.generator.random() * (1 << 20))
            out.append(SampleResult(100 + h % 40))  # 40 ordinary ids: stop ids among them hit often
        self.last = np.fromiter((r.token_id for r in out), dtype=np.int64, count=len(out))
        return Launched(out)

    def execute_and_sample(self, batch, states):
        return self.launch(batch, states).wait()


def scripted_run(smol, seed: int, ahead: bool) -> tuple[dict, set, LLMEngine, PagedFake]:
    """One random serving session, the same script for both modes: requests arriving over the steps (shared
    prefixes, n = 1 or 2, seeds, stop ids, stop strings, max_tokens 1-40), aborts at given calls."""
    rng = np.random.default_rng(seed)
    bs, blocks = 4, int(rng.integers(24, 64))
    fake = PagedFake(blocks, bs)
    e = LLMEngine(smol, EngineConfig(block_size=bs, max_num_seqs=int(rng.integers(2, 9)),
                                     max_num_batched_tokens=int(rng.integers(8, 48)), async_scheduling=ahead),
                  runner=fake)
    shared = rng.integers(200, 3000, 12).tolist()
    n_req = 24
    arrive = np.sort(rng.integers(0, 60, n_req))
    abort_at = {int(rng.integers(0, n_req)): int(rng.integers(1, 80)) for _ in range(4)}
    reqs = []
    for i in range(n_req):
        prompt = (shared[: int(rng.integers(0, 13))] + rng.integers(200, 3000, int(rng.integers(1, 20))).tolist())
        kind = int(rng.integers(0, 4))
        stop_text = smol.tokenizer.decode([int(rng.integers(100, 140))]).strip()
        params = SamplingParams(max_tokens=int(rng.integers(1, 41)), ignore_eos=True,
                                temperature=0.0 if kind < 2 else 0.8, seed=int(rng.integers(0, 99)),
                                n=2 if kind == 3 else 1,
                                stop_token_ids=[int(rng.integers(100, 140))] if kind % 2 else [],
                                stop=[stop_text] if kind == 2 and stop_text else [])
        reqs.append((f"r{i}", prompt, params))
    got: dict[str, dict[int, list[int]]] = {r[0]: {} for r in reqs}
    aborted: set[str] = set()
    call, nxt = 0, 0
    while nxt < n_req or e.has_unfinished():
        while nxt < n_req and arrive[nxt] <= call:
            e.add_request(*reqs[nxt])
            nxt += 1
        for i, at in abort_at.items():
            if at == call and reqs[i][0] in e.requests:
                e.abort(reqs[i][0])
                aborted.add(reqs[i][0])
        for o in e.step():
            got[o.request_id].setdefault(o.index, []).extend(o.token_ids)
        call += 1
        assert call < 5000
    return got, aborted, e, fake, reqs


def alone(smol, reqs: list, rid: str) -> dict[int, list[int]]:
    """Request `rid` by itself on a roomy engine without prefix caching, step by step."""
    fake = PagedFake(512, 4)
    e = LLMEngine(smol, EngineConfig(block_size=4, enable_prefix_caching=False, async_scheduling=False),
                  runner=fake)
    rid, prompt, params = next(r for r in reqs if r[0] == rid)
    res = e.generate([prompt], params)[0]
    return {i: t for i, t in enumerate(res.token_ids) if t}


@pytest.mark.parametrize("seed", range(40))
def test_randomized_serving_runs_ahead_with_the_step_by_step_tokens(smol, seed):
    ahead, ab_a, e_a, fake_a, reqs = scripted_run(smol, seed, True)
    step, ab_s, e_s, _, _ = scripted_run(smol, seed, False)
    assert fake_a.fed > 0
    for rid in ahead:
        if rid in ab_a or rid in ab_s:  # aborted at the same call, but the modes had delivered different amounts
            for i in set(ahead[rid]) | set(step[rid]):
                a, b = ahead[rid].get(i, []), step[rid].get(i, [])
                assert a[: len(b)] == b[: len(a)], rid
        else:
            assert ahead[rid] == step[rid], rid
            if int(rid[1:]) % 4 == 0:  # and both equal the request run alone (scheduling changes no token)
                assert step[rid] == alone(smol, reqs, rid), rid
    for e in (e_a, e_s):
        assert e.stats().num_free_blocks == e.stats().num_blocks and not e.requests and not e.kv.row_of


# ---------------------------------------------------------------------- through the server
def test_server_with_async_scheduling_streams_what_the_step_by_step_server_streams(tmp_path):
    """`llmrs serve` (engine core in its own process) with --async-scheduling, on the CPU, against one
    with it off: 10 concurrent streams (greedy, seeded sampling, stop strings, stop ids, n = 2, EOS allowed) give
    the same text, token counts and finish reasons; a client that drops its stream mid-way leaves no block."""
    import asyncio

    import httpx
    import openai

    from tests.server.test_server import MODEL, Server, wait_for


    bodies = [dict(prompt=f"Story {i}: once upon a time", max_tokens=12 + i, temperature=0.0 if i % 3 else 0.9,
                   seed=i, stop=[" the"] if i % 4 == 1 else None, n=2 if i == 5 else 1,
                   extra_body={"stop_token_ids": [13]} if i % 4 == 2 else None) for i in range(10)]

    async def run_all(url: str) -> list:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

        async def one(b: dict) -> list:
            kw = {k: v for k, v in b.items() if v is not None}
            stream = await client.completions.create(model=MODEL, stream=True, **kw)
            out: dict[int, list] = {}
            async for ch in stream:
                for c in ch.choices:
                    t = out.setdefault(c.index, ["", None])
                    t[0] += c.text
                    t[1] = c.finish_reason or t[1]
            return sorted(out.items())

        try:
            return await asyncio.gather(*(one(b) for b in bodies))
        finally:
            await client.close()

    results = {}
    for name, flag in (("ahead", "--async-scheduling"), ("step", "--no-async-scheduling")):
        srv = Server(["--kv-cache-tokens", "2048", flag], tmp_path / f"{name}.log")
        try:
            srv.wait_ready()
            assert ("async scheduling" in srv.log.read_text()) == (name == "ahead"), srv.log.read_text()[-1000:]
            results[name] = asyncio.run(run_all(srv.url))
            if name == "ahead":  # a client gone mid-stream: aborted, every block back
                events = 0
                with httpx.stream("POST", f"{srv.url}/v1/completions", json={
                        "model": MODEL, "prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True},
                        timeout=60, trust_env=False) as r:
                    lines = r.iter_lines()  # NOTE: keep it referenced: a dropped iterator closes the stream
                    for line in lines:
                        events += line.startswith("data: ")
                        if events == 3:
                            break
                assert wait_for(lambda: srv.metrics()["llmrs:kv_cache_usage_perc"] == 0.0), srv.metrics()
        finally:
            assert srv.stop() == 0, srv.log.read_text()[-2000:]
    assert results["ahead"] == results["step"]
    reasons = {r[1] for res in results["step"] for _, r in res}
    assert "length" in reasons and "stop" in reasons


# ---------------------------------------------------------------------- on the GPU
@pytest.fixture(scope="module")
def tiny_cuda(tmp_path_factory):
    from tests.conftest import write_tiny_model
    from tests.cuda_helpers import require_gpu

    require_gpu()
    return load(str(write_tiny_model(tmp_path_factory.mktemp("async") / "qwen2", "qwen2")))


@pytest.mark.gpu
def test_gpu_async_scheduling_gives_the_step_by_step_tokens(tiny_cuda):
    """Fed inputs through both device paths: decode graphs (pure decode steps) and eager steps (decodes mixed
    with prefill chunks). Every request ends by length, so both modes run the same batches: equal tokens."""
    from llmrs.backends.cuda.graphs import is_pure_decode

    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 400, int(rng.integers(4, 60))).tolist() for _ in range(7)]
    params = [SamplingParams(max_tokens=int(m), **GREEDY) for m in rng.integers(3, 30, 5)]
    params += [SamplingParams(max_tokens=20, temperature=0.8, top_k=20, seed=11, ignore_eos=True),
               SamplingParams(max_tokens=25, temperature=1.0, top_p=0.9, seed=12, ignore_eos=True)]
    results, kinds = {}, {}
    for ahead in (True, False):
        e, seen = engine(tiny_cuda, ahead, note=lambda b: (b.feed is not None, is_pure_decode(b)), device="cuda",
                         kv_cache_tokens=4096, max_num_seqs=8, max_num_batched_tokens=48)
        results[ahead] = [r.token_ids for r in e.generate(prompts, params)]
        kinds[ahead] = set(seen)
        assert e.stats().num_free_blocks == e.stats().num_blocks
    assert results[True] == results[False]
    assert (True, True) in kinds[True] and (True, False) in kinds[True]  # fed graph steps and fed eager steps
    assert not any(fed for fed, _ in kinds[False])


@pytest.mark.gpu
def test_gpu_stream_generate_run_ahead_equals_step_by_step(tiny_cuda):
    runner = ModelRunner(tiny_cuda, num_blocks=32, block_size=16, device="cuda")
    ids = list(range(5, 40))
    for params in (SamplingParams(max_tokens=40, **GREEDY),
                   SamplingParams(max_tokens=30, temperature=0.9, seed=4, ignore_eos=True)):
        ref = [o.token_ids[0] for o in stream_generate(runner, ids, params, run_ahead=False)]
        assert [o.token_ids[0] for o in stream_generate(runner, ids, params, run_ahead=True)] == ref
