"""Sampling: filters never pick outside their sets, seeds reproduce, penalties follow their definitions,
stop strings are trimmed (also when split across tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from llmrs.engine.sampling import SamplingParams, SamplingState, apply_penalties, filter_probs, sample
from llmrs.engine.sequence import Sequence
from llmrs.errors import UserError

V = 50


def state(params: SamplingParams, seed=None, prompt=(), output=()) -> SamplingState:
    return SamplingState(params, np.random.default_rng(seed), list(prompt), list(output), [])


def draw(logits, params, n=300, seed=1):
    st = state(params, seed)
    return [sample(logits[None], [st])[0].token_id for _ in range(n)]


@pytest.fixture
def logits():
    return np.random.default_rng(0).normal(size=V).astype(np.float32) * 2


def probs_of(logits):
    p = np.exp(logits - logits.max())
    return p / p.sum()


def test_top_k_never_picks_outside_the_k_largest(logits):
    allowed = set(np.argsort(-logits)[:5].tolist())
    picks = draw(logits, SamplingParams(temperature=1.0, top_k=5))
    assert set(picks) <= allowed and len(set(picks)) > 1


def test_top_p_never_picks_outside_the_nucleus(logits):
    p = probs_of(logits)
    order = np.argsort(-p)
    csum = np.cumsum(p[order])
    nucleus = set(order[: int(np.searchsorted(csum, 0.6)) + 1].tolist())
    picks = draw(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert set(picks) <= nucleus


def test_min_p_never_picks_below_threshold(logits):
    p = probs_of(logits)
    allowed = set(np.nonzero(p >= 0.2 * p.max())[0].tolist())
    picks = draw(logits, SamplingParams(temperature=1.0, min_p=0.2))
    assert set(picks) <= allowed


def test_filter_probs_renormalizes_and_combines_filters(logits):
    out = filter_probs(probs_of(logits), SamplingParams(top_k=10, top_p=0.5, min_p=0.05))
    assert abs(out.sum() - 1) < 1e-9 and (out > 0).sum() <= 10


def test_same_seed_same_tokens_and_other_seed_differs(logits):
    params = SamplingParams(temperature=1.0)
    assert draw(logits, params, seed=7) == draw(logits, params, seed=7)
    assert draw(logits, params, seed=7) != draw(logits, params, seed=8)


def test_sampling_follows_the_distribution(logits):
    picks = np.bincount(draw(logits, SamplingParams(temperature=1.0), n=4000), minlength=V) / 4000
    assert np.abs(picks - probs_of(logits)).max() < 0.04


def test_negative_seed_is_a_seed():
    from llmrs.engine.sampling import make_generator

    assert make_generator(-5).random() == make_generator(-5).random()
    assert make_generator(-5).random() != make_generator(5).random()


def test_greedy_is_argmax(logits):
    assert draw(logits, SamplingParams(temperature=0.0), n=3) == [int(np.argmax(logits))] * 3


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    x = np.array([2.0, -2.0, 1.0, 0.5])
    out = apply_penalties(x.copy(), state(SamplingParams(repetition_penalty=2.0), prompt=[0], output=[1]))
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]


def test_presence_and_frequency_penalties_subtract_by_count():
    x = np.zeros(4)
    st = state(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), prompt=[3], output=[1, 1, 2])
    out = apply_penalties(x, st)
    assert out.tolist() == [0.0, -(0.5 + 2 * 0.25), -(0.5 + 0.25), 0.0]  # prompt tokens are not penalized


def test_logprobs_are_of_the_raw_distribution(logits):
    st = state(SamplingParams(temperature=0.0, logprobs=3))
    r = sample(logits[None], [st])[0]
    lp = np.log(probs_of(logits.astype(np.float64)))
    assert abs(r.logprob - lp[r.token_id]) < 1e-6
    assert [t for t, _ in r.top_logprobs] == np.argsort(-lp)[:3].tolist()


def test_min_tokens_masks_stop_ids(logits):
    eos = int(np.argmax(logits))
    st = SamplingState(SamplingParams(temperature=0.0, min_tokens=2), np.random.default_rng(0), [], [], [eos])
    assert sample(logits[None], [st])[0].token_id != eos


def test_logit_bias_adds_to_the_logits_before_sampling(logits):
    """OpenAI's logit_bias: +100 forces a token, -100 bans the argmax, a small bias shifts the distribution by
    exactly exp(bias); logprobs stay those of the raw logits (vLLM's default); the GPU sampler hands such rows to
    the host (needs_cpu_sampler)."""
    from llmrs.backends.cuda import needs_cpu_sampler

    top = int(np.argmax(logits))
    forced = int(np.argmin(logits))
    assert set(draw(logits, SamplingParams(temperature=1.0, logit_bias={forced: 100.0}), n=50)) == {forced}
    st = state(SamplingParams(temperature=0.0, logit_bias={top: -100.0}, logprobs=0))
    r = sample(logits[None], [st])[0]
    assert r.token_id == int(np.argsort(-logits)[1])
    assert abs(r.logprob - np.log(probs_of(logits.astype(np.float64)))[r.token_id]) < 1e-6
    biased = apply_penalties(logits.astype(np.float64), state(SamplingParams(logit_bias={3: 1.5, 7: -0.25})))
    want = logits.astype(np.float64).copy()
    want[3] += 1.5
    want[7] -= 0.25
    assert np.array_equal(biased, want)
    assert needs_cpu_sampler(state(SamplingParams(temperature=0.0, logit_bias={3: 1.0})))


def test_bad_values_name_the_field():
    for kwargs, word in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
                         ({"logprobs": 50}, "logprobs"), ({"min_p": 2}, "min_p"), ({"logit_bias": {1: 101.0}}, "logit_bias"),
                         ({"logit_bias": {-1: 1.0}}, "logit_bias"), ({"logit_bias": {1: float("nan")}}, "logit_bias"),
                         ({"temperature": float("inf")}, "temperature")]:
        with pytest.raises(UserError, match=word):
            SamplingParams(**kwargs).validate()


# ---------------------------------------------------------------- stop strings through a real tokenizer
def run_sequence(tok, text_tokens, params):
    seq = Sequence("r", [1], params, tok, eos_token_ids=[2], max_model_len=10_000)
    out = ""
    for t in text_tokens:
        from llmrs.engine.sampling import SampleResult

        out += seq.append(SampleResult(t)).text
        if seq.is_finished:
            break
    return out, seq


def test_stop_string_split_across_tokens_is_caught_and_trimmed(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode("Hello there. The END of the story, more text", add_special_tokens=False)
    out, seq = run_sequence(tok, ids, SamplingParams(max_tokens=100, stop=["END of"]))
    assert out == "Hello there. The "
    assert seq.finish_reason == "stop" and seq.stop_reason == "END of"


def test_held_back_text_is_released_when_no_stop_follows(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode("The EN and more", add_special_tokens=False)
    out, seq = run_sequence(tok, ids, SamplingParams(max_tokens=len(ids), stop=["END"]))
    assert out == "The EN and more" and seq.finish_reason == "length"


def test_eos_stops_and_is_not_in_text(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode("Fine.", add_special_tokens=False) + [2] + tok.encode(" extra", add_special_tokens=False)
    out, seq = run_sequence(tok, ids, SamplingParams(max_tokens=100))
    assert out == "Fine." and seq.finish_reason == "stop" and seq.output_ids[-1] == 2


def test_host_sampler_rules_agree():
    """needs_host_sampler (async scheduling: never plan ahead of such a request) covers every step the GPU sampler
    hands to the host (backends.cuda.needs_cpu_sampler, importable without a GPU)."""
    import itertools

    from llmrs.backends.cuda import needs_cpu_sampler
    from llmrs.engine.sampling import SamplingParams, SamplingState, make_generator, needs_host_sampler

    for lp, rep, pres, freq, mt, n_out, stop in itertools.product((None, 0), (1.0, 1.2), (0.0, 0.5), (0.0, 0.5),
                                                                (0, 3), (0, 5), ([], [2])):
        p = SamplingParams(logprobs=lp, repetition_penalty=rep, presence_penalty=pres, frequency_penalty=freq,
                           min_tokens=mt, max_tokens=8)
        st = SamplingState(p, make_generator(0), [1, 2], list(range(n_out)), stop)
        if needs_cpu_sampler(st):
            assert needs_host_sampler(p)
        if not needs_host_sampler(p):
            assert not needs_cpu_sampler(st)


def _filter_probs_full_sort(probs: np.ndarray, p: SamplingParams) -> np.ndarray:
    """filter_probs as it was written first (a full stable sort for top_k and for top_p): the oracle."""
    keep = np.ones_like(probs, dtype=bool)
    if p.min_p > 0:
        keep &= probs >= p.min_p * probs.max()
    if p.top_k and p.top_k > 0 and p.top_k < probs.size:
        order = np.argsort(-probs, kind="stable")
        topk = np.zeros_like(keep)
        topk[order[: p.top_k]] = True
        keep &= topk
    if p.top_p < 1.0:
        masked = np.where(keep, probs, 0.0)
        order = np.argsort(-masked, kind="stable")
        csum = np.cumsum(masked[order]) / masked.sum()
        n_keep = int(np.searchsorted(csum, p.top_p - 1e-12)) + 1
        nucleus = np.zeros_like(keep)
        nucleus[order[:n_keep]] = True
        keep &= nucleus
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def test_filter_probs_equals_the_full_sort_bit_for_bit():
    """filter_probs sorts only the prefix that decides (desc_order_prefix); its output is the full stable sort's to
    the bit: peaked and flat rows, ties at the k-th value and at the nucleus edge, zeros from min_p, every filter
    alone and together, a nucleus that needs the prefix grown several times."""
    from llmrs.engine.sampling import desc_order_prefix

    rng = np.random.default_rng(7)
    rows = []
    for V in (7, 300, 5000, 49152):
        for scale in (0.3, 2.5, 8.0):
            rows.append(rng.standard_normal(V) * scale)
        tied = rng.standard_normal(V)
        tied[rng.choice(V, V // 3, replace=False)] = 1.5  # a third of the row on one value
        rows.append(tied)
        rows.append(np.round(rng.standard_normal(V), 1))  # many small ties everywhere
        rows.append(np.zeros(V))  # flat
    params = [SamplingParams(temperature=1.0, top_k=k, top_p=tp, min_p=mp)
              for k in (0, 1, 5, 50, 1000) for tp in (1.0, 0.95, 0.5, 0.1) for mp in (0.0, 0.05)]
    for logits in rows:
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        for p in params:
            assert np.array_equal(filter_probs(probs, p), _filter_probs_full_sort(probs, p)), (logits.size, p)
        for m in (1, 3, 64, logits.size - 1, logits.size + 5):
            full = np.argsort(-probs, kind="stable")
            pre = desc_order_prefix(probs, m)
            assert pre.size >= min(m, probs.size) and np.array_equal(pre, full[: pre.size])
