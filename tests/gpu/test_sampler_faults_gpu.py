"""The GPU sampler (kernels_cu/sampling.cu through CUDABackend.sample / sample_launch) on rows of NaN / inf logits,
the faults of a model gone numerically wrong: run on the GPU machine with
`python3 -m pytest -q -m gpu tests/gpu/test_sampler_faults_gpu.py`; skips cleanly without CuPy or a GPU.

- every row gets what the CPU sampler gives it (llmrs.engine.sampling's rules: NaN never drawn, the first +inf
  taken, a row with nothing above -inf reported as SampleResult.error), greedy and sampled, on the kernel's
  one-block and several-blocks-a-row paths, its candidate list and its whole-row passes;
- the good rows beside the bad ones get the tokens they get in a batch without them (nothing crosses rows);
- the device copy the next step's feed reads holds a valid token id on every row (0 on an unsamplable one), the
  hand-off counters are back at 0, and the next launch runs (no hang);
- the mixed path (rows that need the host sampler beside GPU rows) reports both kinds of bad rows;
- an engine on the GPU (async scheduling, the step run ahead) fails only the request whose logits turn NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_helpers import require_gpu

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.backends.cuda import CUDABackend  # noqa: E402
from llmrs.engine.config import ModelConfig  # noqa: E402
from llmrs.engine.sampling import UNSAMPLABLE, SamplingParams, SamplingState, make_generator  # noqa: E402
from llmrs.engine.sampling import sample as cpu_sample  # noqa: E402


def cfg(vocab: int) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=64, intermediate_size=160,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                       rope_theta=10000.0, rope_scaling=None, max_position_embeddings=4096)


PARAMS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=50),
          SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0, min_p=0.1, top_k=3000),
          SamplingParams(temperature=1.0)]


def bad_row(kind: str, V: int, rng) -> np.ndarray:
    x = (rng.standard_normal(V) * 2.5).astype(np.float32)
    half = rng.choice(V, V // 2, replace=False)
    if kind == "nan":
        x[:] = np.nan
    elif kind == "-inf":
        x[:] = -np.inf
    elif kind == "nan,-inf":
        x[:] = np.nan
        x[half] = -np.inf
    elif kind == "half nan":
        x[half] = np.nan
    elif kind == "two +inf":
        x[sorted(half[:2])] = np.inf
    elif kind == "+inf, nan":
        x[half] = np.nan
        x[half[0]] = np.inf
    elif kind == "one finite":
        keep = x[V - 1]
        x[:] = np.nan
        x[V - 1] = keep
    return x


KINDS = ["nan", "-inf", "nan,-inf", "half nan", "two +inf", "+inf, nan", "one finite"]
UNSAMPLABLE_KINDS = {"nan", "-inf", "nan,-inf"}


def states(params: list[SamplingParams]) -> list[SamplingState]:
    return [SamplingState(p, make_generator(1000 + i), [], [], []) for i, p in enumerate(params)]


def pairs(results) -> list[tuple[int, str | None]]:
    return [(r.token_id, r.error) for r in results]


@pytest.mark.parametrize("V", [1000, 151936])
@pytest.mark.parametrize("S", [1, 3, 9, 70])
def test_bad_rows_follow_the_cpu_rules_and_leave_the_other_rows_alone(V, S):
    be = CUDABackend(cfg(V), num_blocks=1)
    rng = np.random.default_rng(S * 7 + V)
    for shift in range(len(KINDS)):  # every kind of bad row at some position of the batch, under every params
        logits = (rng.standard_normal((S, V)) * 2.5).astype(np.float32)
        params = [PARAMS[(r + shift) % len(PARAMS)] for r in range(S)]
        bad = {r: KINDS[(r + shift) % len(KINDS)] for r in range(0, S, 2 if S > 1 else 1)}
        clean = logits.copy()
        for r, kind in bad.items():
            logits[r] = bad_row(kind, V, rng)
        want = pairs(cpu_sample(logits, states(params)))
        got = pairs(be.sample(cp.asarray(logits), states(params)))
        assert got == want, (S, V, shift, bad)
        for r, kind in bad.items():
            assert (got[r][1] == UNSAMPLABLE) == (kind in UNSAMPLABLE_KINDS), (r, kind, got[r])
            if kind in ("two +inf", "+inf, nan"):  # the first +inf, greedy or not
                assert got[r][0] == int(np.flatnonzero(logits[r] == np.inf)[0])
            if kind == "one finite":
                assert got[r][0] == V - 1
        fed = cp.asnumpy(be._samples[:S])  # what the next step's feed reads: a valid id everywhere
        assert ((0 <= fed) & (fed < V)).all() and all(fed[r] == 0 for r in bad if got[r][1])
        # the good rows: as in the batch without the bad ones (same seeds)
        alone = pairs(be.sample(cp.asarray(clean), states(params)))
        assert [got[r] for r in range(S) if r not in bad] == [alone[r] for r in range(S) if r not in bad]
        assert int(cp.asnumpy(be._counters("sample_sem", be.num_sms)).sum()) == 0


def test_sample_launch_reports_the_bad_row_and_the_next_launch_runs():
    """The asynchronous path (SampledOnDevice: the tokens read back from the kernel's `res`), twice in flight."""
    V, S = 151936, 4
    be = CUDABackend(cfg(V), num_blocks=1)
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((S, V)) * 2.5).astype(np.float32)
    logits[2] = np.nan
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9)] * 2
    first = be.sample_launch(cp.asarray(logits), states(params))
    second = be.sample_launch(cp.asarray(logits[::-1].copy()), states(params))
    a, b = first.wait(), second.wait()
    assert [r.error for r in a] == [None, None, UNSAMPLABLE, None] and a[2].token_id == 0
    assert [r.error for r in b] == [None, UNSAMPLABLE, None, None]
    assert pairs(a) == pairs(cpu_sample(logits, states(params)))


def test_the_mixed_path_reports_bad_rows_on_the_gpu_and_on_the_host():
    """Rows that need the host sampler (logprobs, a penalty) beside GPU rows: a bad row of either kind is reported,
    every row as the CPU sampler gives it, and the device copy holds valid ids."""
    V, S = 5000, 6
    be = CUDABackend(cfg(V), num_blocks=1)
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((S, V)) * 2.5).astype(np.float32)
    logits[1] = np.nan  # a GPU row
    logits[4] = -np.inf  # a host row
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=50),
              SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=0.7, top_p=0.9),
              SamplingParams(temperature=0.9, repetition_penalty=1.2), SamplingParams(temperature=0.0)]
    got = be.sample(cp.asarray(logits), states(params))
    want = cpu_sample(logits, states(params))
    assert pairs(got) == pairs(want)
    assert [r.error is not None for r in got] == [False, True, False, False, True, False]
    fed = cp.asnumpy(be._samples[:S])
    assert ((0 <= fed) & (fed < V)).all() and fed[1] == 0 and fed[4] == 0


def test_an_engine_on_the_gpu_fails_only_the_request_whose_logits_turn_nan(monkeypatch, tmp_path):
    """LLMEngine on the GPU with async scheduling (the next step launched before this one's tokens are back, its
    feed reading them on the device), a tiny Llama written by the test: one request's logits turn NaN at its third
    step; it ends with finish_reason "error", the other request's tokens are those it gets when nothing fails,
    every block is back."""
    from llmrs.engine.config import EngineConfig
    from llmrs.engine.llm_engine import LLMEngine
    from llmrs.model.loader import load
    from tests.conftest import write_tiny_model

    loaded = load(str(write_tiny_model(tmp_path / "llama", "llama")))
    tok = loaded.tokenizer
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    bad_ids, good_ids = tok.encode("Once upon a time"), tok.encode("The quick brown fox")

    def run(poison_at: int | None) -> dict[str, list]:
        e = LLMEngine(loaded, EngineConfig(device="cuda", kv_cache_tokens=1024, async_scheduling=True))
        backend = e.runner.backend
        # the same per-token arithmetic whatever the batch (test_cuda_parity_gpu's settings): the good request's
        # tokens do not depend on whether the bad one is still in its batch
        backend.matvec_max_tokens, backend.attn_splits, backend.prefill_min_tokens = 1 << 30, 1, None
        e.add_request("bad", bad_ids, greedy)
        e.add_request("good", good_ids, greedy)
        bad_state = e.requests["bad"][0].sampling
        real = backend.sample_launch
        seen = {"n": 0}

        def poisoned(logits, sts):
            for i, st in enumerate(sts):
                if st is bad_state:
                    seen["n"] += 1
                    if seen["n"] == poison_at:
                        logits = logits.copy()
                        logits[i] = cp.nan
            return real(logits, sts)

        monkeypatch.setattr(backend, "sample_launch", poisoned)
        outs: dict[str, list] = {}
        while e.has_unfinished():
            for o in e.step():
                outs.setdefault(o.request_id, []).append(o)
        assert e.kv.num_free_blocks == e.kv.pool.num_blocks and e.requests == {}
        return outs

    clean, faulty = run(None), run(3)
    bad = faulty["bad"]
    assert bad[-1].finish_reason == "error" and bad[-1].error == UNSAMPLABLE
    assert [t for o in bad for t in o.token_ids] == [t for o in clean["bad"] for t in o.token_ids][:2]
    assert [t for o in faulty["good"] for t in o.token_ids] == [t for o in clean["good"] for t in o.token_ids]
    assert faulty["good"][-1].finish_reason == "length"
