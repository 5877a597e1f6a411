"""Sampling: filters never pick outside their sets, seeds reproduce, penalties follow their definitions,
stop strings are trimmed (also when split across tokens); validate() refuses every non-finite or out-of-range value
naming the field, and (hypothesis) the sampler never raises on any parameters validate() accepts and any logits
(NaN, +-inf, float32's extremes): a token of the row, or the row's error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from llmrs.engine.sampling import (
    LOGPROB_FLOOR, UNSAMPLABLE, SampleResult, SamplingParams, SamplingState, apply_penalties, filter_probs,
    log_softmax, make_generator, sample, sample_row,
)
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
                         ({"temperature": float("inf")}, "temperature"),
                         ({"repetition_penalty": 5e-324}, "repetition_penalty"), ({"temperature": 2.5}, "temperature"),
                         ({"top_k": -2}, "top_k"), ({"top_k": 2**31}, "top_k"), ({"seed": 2**63}, "seed"),
                         ({"n": True}, "n"), ({"max_tokens": 2.0}, "max_tokens"), ({"min_tokens": -1}, "min_tokens"),
                         ({"stop_token_ids": [1.5]}, "stop_token_ids"), ({"presence_penalty": "1"}, "presence_penalty")]:
        with pytest.raises(UserError, match=f"^{word} "):
            SamplingParams(**kwargs).validate()


# ---------------------------------------------------------------- stop strings through a real tokenizer
def run_sequence(tok, text_tokens, params):
    seq = Sequence("r", [1], params, tok, eos_token_ids=[2], max_model_len=10_000)
    out = ""
    for t in text_tokens:
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


# ---------------------------------------------------------------- robustness: any valid params, any logits
# (hypothesis) every parameter validate() accepts, at its edges too, and rows of logits with NaN, +-inf, float32's
# extremes: the sampler never raises and returns a token of the row or, for a row with nothing above -inf, the
# per-request error.
F32_MAX = float(np.finfo(np.float32).max)
ROBUST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def unit(lo_open: bool = False):
    """Floats in [0, 1] (or (0, 1]) with the edges and the subnormals drawn often."""
    edges = [1.0, 5e-324, 1e-300, 1e-12, 0.5, 1 - 1e-16] + ([] if lo_open else [0.0])
    return hs.one_of(hs.sampled_from(edges), hs.floats(5e-324 if lo_open else 0.0, 1.0))


def bounded(lo: float, hi: float):
    return hs.one_of(hs.sampled_from([lo, hi, 0.0 if lo <= 0 <= hi else lo, 1.0 if lo <= 1 <= hi else hi]),
                     hs.floats(lo, hi))


@hs.composite
def valid_params(draw, V: int) -> SamplingParams:
    p = SamplingParams(
        max_tokens=draw(hs.integers(3, 64)),
        temperature=draw(hs.one_of(hs.sampled_from([0.0, 5e-324, 1e-6, 1e-5, 2.0]), hs.floats(0.0, 2.0))),
        top_p=draw(unit(lo_open=True)),
        top_k=draw(hs.sampled_from([-1, 0, 1, 2, max(1, V - 1), V, V + 1, 2**31 - 1])),
        min_p=draw(unit()),
        repetition_penalty=draw(bounded(0.01, 100.0)),
        presence_penalty=draw(bounded(-2.0, 2.0)),
        frequency_penalty=draw(bounded(-2.0, 2.0)),
        seed=draw(hs.one_of(hs.none(), hs.integers(-(2**63), 2**63 - 1))),
        min_tokens=draw(hs.integers(0, 3)),
        logprobs=draw(hs.one_of(hs.none(), hs.integers(0, 20))),
        logit_bias=draw(hs.dictionaries(hs.integers(0, V - 1), bounded(-100.0, 100.0), max_size=4)),
    )
    p.validate()  # the strategy draws only what the server accepts
    return p


def logits_rows(V: int, rows: int = 1):
    special = hs.sampled_from([np.nan, np.inf, -np.inf, F32_MAX, -F32_MAX, 0.0, -0.0, 1e-45, 80.0, -80.0])
    value = hs.one_of(special, hs.floats(-1e4, 1e4, width=32), hs.floats(width=32))
    return hs.lists(hs.lists(value, min_size=V, max_size=V), min_size=rows, max_size=rows).map(
        lambda r: np.asarray(r, dtype=np.float32))


@hs.composite
def sampling_case(draw):
    V = draw(hs.integers(1, 40))
    p = draw(valid_params(V))
    ids = hs.lists(hs.integers(0, V - 1), max_size=6)
    st = SamplingState(p, make_generator(p.seed), draw(ids), draw(ids), draw(ids))
    return draw(logits_rows(V))[0], st


def usable(row: np.ndarray, st: SamplingState) -> np.ndarray:
    """The rule, stated on its own: what can be drawn is a logit above -inf (NaN is not), outside the min_tokens
    mask (the penalties and the bias, finite and bounded, keep a finite logit finite and an infinite one infinite)."""
    ok = row > -np.inf
    if len(st.output_ids) < st.params.min_tokens:
        ok[st.stop_ids] = False
    return ok


@ROBUST
@given(sampling_case())
def test_the_sampler_never_raises_and_returns_a_drawable_token_or_the_row_error(case):
    row, st = case
    r = sample_row(row, st)
    ok = usable(row, st)
    if not ok.any():
        assert r.error == UNSAMPLABLE and r.token_id == 0
        return
    assert r.error is None and 0 <= r.token_id < row.size and ok[r.token_id], (row, r)
    inf = ok & (row == np.inf)
    if inf.any():  # a +inf logit takes all the mass: the first one (the GPU sampler's pick too)
        assert r.token_id == int(np.flatnonzero(inf)[0])
    if st.params.logprobs is not None:
        lps = [r.logprob] + [lp for _, lp in r.top_logprobs or []]
        assert all(LOGPROB_FLOOR <= lp <= 0.0 for lp in lps), lps
        assert len(r.top_logprobs or []) == min(st.params.logprobs, row.size)


@ROBUST
@given(hs.integers(1, 6).flatmap(lambda S: hs.tuples(hs.lists(sampling_case(), min_size=S, max_size=S))))
def test_a_bad_row_changes_nothing_for_the_other_rows_of_the_batch(cases):
    """`sample` over a batch gives each row what it gives alone (the same seed), whatever the other rows hold."""
    (cases,) = cases
    V = min(row.size for row, _ in cases)
    rows = np.stack([row[:V] for row, _ in cases])
    fresh = [SamplingState(dataclasses.replace(st.params, seed=i if st.params.seed is None else st.params.seed,
                                               logit_bias={t: b for t, b in st.params.logit_bias.items() if t < V}),
                           None, [t for t in st.prompt_ids if t < V], [t for t in st.output_ids if t < V],
                           [t for t in st.stop_ids if t < V]) for i, (_, st) in enumerate(cases)]

    def states():
        return [dataclasses.replace(s, generator=make_generator(s.params.seed)) for s in fresh]

    together = sample(rows, states())
    alone = [sample(rows[i:i + 1], [s])[0] for i, s in enumerate(states())]
    assert together == alone


def test_the_greedy_fast_path_skips_nan_and_reports_a_row_of_nothing():
    """np.argmax picks a NaN over any number: the plain-greedy batch path applies the rules too."""
    greedy = SamplingParams(temperature=0.0)
    rows = np.array([[1.0, np.nan, 3.0, 2.0], [np.nan] * 4, [-np.inf, np.nan, -np.inf, np.nan],
                     [0.0, np.inf, 5.0, np.inf]], dtype=np.float32)
    got = sample(rows, [state(greedy) for _ in rows])
    assert [(r.token_id, r.error) for r in got] == [(2, None), (0, UNSAMPLABLE), (0, UNSAMPLABLE), (1, None)]


def test_min_tokens_masking_every_drawable_token_is_the_row_error():
    st = SamplingState(SamplingParams(temperature=0.7, min_tokens=2), make_generator(0), [], [], [0, 2])
    assert sample_row(np.array([1.0, -np.inf, 3.0, np.nan], dtype=np.float32), st) == SampleResult(0, error=UNSAMPLABLE)


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=30), valid_params(30))
def test_filter_probs_and_log_softmax_never_raise_on_any_row(values, p):
    probs = np.abs(np.asarray(values, dtype=np.float64))
    out = filter_probs(probs, p)
    assert not out.any() or (np.isfinite(out).all() and abs(out.sum() - 1) < 1e-9)
    lp = log_softmax(np.asarray(values))
    assert not np.isnan(lp).any() and (lp <= 0).all()


@ROBUST
@given(hs.sampled_from(["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                        "frequency_penalty"]),
       hs.one_of(hs.sampled_from([np.nan, np.inf, -np.inf, 5e-324, -5e-324, 1e308, -1e308, 2.0000001, -2.0000001,
                                  0.0099, 100.5, 1.0000001, -1e-300, True, "1", None]),
                 hs.floats(allow_nan=True, allow_infinity=True)))
def test_validate_refuses_every_non_finite_or_out_of_range_float_naming_it(name, value):
    lo, hi, lo_open = {"temperature": (0, 2, False), "top_p": (0, 1, True), "min_p": (0, 1, False),
                       "repetition_penalty": (0.01, 100, False), "presence_penalty": (-2, 2, False),
                       "frequency_penalty": (-2, 2, False)}[name]
    p = SamplingParams(**{name: value})
    fine = (isinstance(value, float) and np.isfinite(value) and (lo < value if lo_open else lo <= value)
            and value <= hi)
    if fine:
        p.validate()
        return
    with pytest.raises(UserError, match=f"^{name} must be"):
        p.validate()


@ROBUST
@given(hs.sampled_from(["max_tokens", "top_k", "seed", "min_tokens", "logprobs", "n"]),
       hs.one_of(hs.integers(-(2**70), 2**70), hs.sampled_from([True, False, 1.0, "3", np.nan]),
                 hs.integers(-3, 25)))
def test_validate_refuses_every_out_of_range_integer_naming_it(name, value):
    ok = {"max_tokens": lambda v: v >= 1, "top_k": lambda v: v in (-1, 0) or 1 <= v <= 2**31 - 1,
          "seed": lambda v: -(2**63) <= v < 2**63, "min_tokens": lambda v: 0 <= v <= 16,  # (max_tokens: 16)
          "logprobs": lambda v: 0 <= v <= 20, "n": lambda v: v >= 1}[name]
    p = SamplingParams(**{name: value})
    if isinstance(value, int) and not isinstance(value, bool) and ok(value):
        p.validate()
        return
    with pytest.raises(UserError, match=f"^{name} must"):
        p.validate()
