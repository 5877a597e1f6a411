"""SamplingParams and the batched sampler.

Order of operations (vLLM's): penalties, logit_bias -> min_tokens mask -> temperature -> min_p, top_k, top_p ->
draw.
Logprobs are those of the model's raw distribution (log_softmax of the unprocessed logits), as vLLM V1
returns by default. A request's seed makes its own generator, so its tokens do not depend on what else is
in the batch.

Non-finite logits (a model's numerical fault, never a user's: `SamplingParams.validate` keeps every parameter finite
and in range, so the penalties and the temperature keep finite logits finite) never raise here and never reach
another row: a NaN logit counts as -inf (never drawn); a +inf logit takes all the probability (the first one is the
token, greedy or not); a row with no logit above -inf (all NaN / -inf, or every finite one masked by min_tokens)
cannot be sampled and gives `SampleResult.error` (token 0, a valid id for a step that reads it on the device): the
engine ends that request with finish_reason "error". The GPU sampler (backends/cuda/sampler.py, sampling.cu)
follows the same rules. Logprobs are never NaN, and -inf is reported as LOGPROB_FLOOR (vLLM's server's -9999.0).
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmrs.errors import UserError

log = logging.getLogger("llmrs.engine")


INT32_MAX = 2**31 - 1
MAX_LOGPROBS = 20  # OpenAI's top_logprobs bound
REPETITION_PENALTY_RANGE = (0.01, 100.0)
LOGPROB_FLOOR = -9999.0  # what a -inf logprob is reported as (JSON has no -Infinity)
UNSAMPLABLE = "no token can be sampled: every logit is NaN or -inf (a numerical fault of the model)"


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_float(p: "SamplingParams", name: str, lo: float, hi: float, low_open: bool = False) -> None:
    v = getattr(p, name)
    span = f"{'(' if low_open else '['}{lo:g}, {hi:g}]"
    if not _is_real(v) or not math.isfinite(v):  # JSON's Infinity / NaN (Python's json reads both)
        raise UserError(f"{name} must be a finite number in {span}")
    if not (lo < v <= hi if low_open else lo <= v <= hi):
        raise UserError(f"{name} must be in {span}")


def _check_int(p: "SamplingParams", name: str, lo: int, hi: int | None, optional: bool = False) -> None:
    v = getattr(p, name)
    if v is None and optional:
        return
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        raise UserError(f"{name} must be an integer " + (f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"))


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: no logprobs; 0: the chosen token's; N: also the top N
    skip_special_tokens: bool = True
    n: int = 1
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit (OpenAI's)

    def validate(self) -> None:
        """Raise UserError naming the first bad field (the server turns it into a 400 whose `param` is the message's
        first word). vLLM's bounds (SamplingParams._verify_args), plus what keeps every number the sampler computes
        finite: each float finite (JSON's Infinity / NaN, which Python's json reads, are refused), and
        repetition_penalty in [0.01, 100] (vLLM takes any positive value; 5e-324 made a logit / penalty infinite)."""
        _check_int(self, "max_tokens", 1, None, optional=True)
        _check_float(self, "temperature", 0.0, 2.0)
        _check_float(self, "top_p", 0.0, 1.0, low_open=True)
        if not (_is_int(self.top_k) and (self.top_k in (-1, 0) or 1 <= self.top_k <= INT32_MAX)):
            raise UserError(f"top_k must be -1 or 0 (disabled) or an integer in [1, {INT32_MAX}]")
        _check_float(self, "min_p", 0.0, 1.0)
        _check_float(self, "repetition_penalty", *REPETITION_PENALTY_RANGE)
        _check_float(self, "presence_penalty", -2.0, 2.0)
        _check_float(self, "frequency_penalty", -2.0, 2.0)
        _check_int(self, "seed", -(2**63), 2**63 - 1, optional=True)
        _check_int(self, "min_tokens", 0, None)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise UserError("min_tokens must be <= max_tokens")
        _check_int(self, "logprobs", 0, MAX_LOGPROBS, optional=True)
        _check_int(self, "n", 1, None)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise UserError("stop strings must be non-empty strings")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise UserError("stop_token_ids must be token ids (integers >= 0)")
        if not all(_is_int(t) and t >= 0 for t in self.logit_bias):
            raise UserError("logit_bias keys must be token ids (integers >= 0)")
        if not all(_is_real(b) and math.isfinite(b) and -100 <= b <= 100 for b in self.logit_bias.values()):
            raise UserError("logit_bias values must be finite numbers in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    # set when the row could not be sampled (or its sampling failed): token_id is then 0, a placeholder that a step
    # run ahead may read on the device, and the engine ends the request with finish_reason "error" and this message
    error: str | None = None


@dataclass(slots=True)
class SamplingState:
    """What the sampler needs of one request: its params, generator, and token history for penalties."""

    params: SamplingParams
    generator: np.random.Generator | None  # None for a greedy request (nothing draws from it)
    prompt_ids: list[int]
    output_ids: list[int]
    stop_ids: list[int]  # ids that end the request (EOS unless ignore_eos, + stop_token_ids)


def penalized_or_logprobs(p: SamplingParams) -> bool:
    """Penalties (they read the request's earlier tokens), a logit_bias, or logprobs: what only the host sampler
    does."""
    return (p.logprobs is not None or p.repetition_penalty != 1.0 or bool(p.presence_penalty)
            or bool(p.frequency_penalty) or bool(p.logit_bias))


def min_tokens_pending(st: SamplingState) -> bool:
    """The min_tokens mask applies to this step: fewer outputs than min_tokens, and stop ids to mask."""
    return len(st.output_ids) < st.params.min_tokens and bool(st.stop_ids)


def needs_host_sampler(p: SamplingParams) -> bool:
    """Sampling that reads the request's earlier tokens on the host (penalties, a min_tokens mask) or returns
    what only the host sampler computes (logprobs), at some step of the request. A step of such a request is not
    planned before the previous step's tokens are in (async scheduling); the GPU sampler hands the steps where it
    applies (backends.cuda.needs_cpu_sampler) to the host one."""
    return penalized_or_logprobs(p) or p.min_tokens > 0


def make_generator(seed: int | None) -> np.random.Generator:
    # any integer is a valid seed (OpenAI's API allows negative ones); numpy wants a non-negative one
    return np.random.default_rng(None if seed is None else seed % 2**64)


def nan_to_neg_inf(x: np.ndarray) -> np.ndarray:
    """x (float64, owned by the caller) with its NaNs set to -inf, in place; a row without NaN (its max is not NaN)
    costs one max."""
    if np.isnan(x.max()):
        x[np.isnan(x)] = -np.inf
    return x


def log_softmax(x: np.ndarray) -> np.ndarray:
    """The log-probabilities of a 1-D row of logits, by the module's rules: NaN as -inf, the +inf entries sharing all
    the mass; never NaN (a row with nothing above -inf is all -inf)."""
    x = nan_to_neg_inf(x.astype(np.float64))
    m = x.max()
    if m == np.inf:
        top = x == np.inf
        return np.where(top, -math.log(int(top.sum())), -np.inf)
    if m == -np.inf:
        return x
    return x - m - np.log(np.exp(x - m).sum())


def apply_penalties(logits: np.ndarray, st: SamplingState) -> np.ndarray:
    p = st.params
    if p.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(st.prompt_ids + st.output_ids, dtype=np.int64))
        vals = logits[seen]
        logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and st.output_ids:
        ids, counts = np.unique(np.asarray(st.output_ids, dtype=np.int64), return_counts=True)
        logits[ids] -= p.frequency_penalty * counts + p.presence_penalty
    if p.logit_bias:
        ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
        logits[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float64, count=len(p.logit_bias))
    return logits


# top_p's thresholds, fractions of the largest kept probability (2^-4: 2.8 logits below it, ... 2^-40: 27.7), then
# every positive entry (`filter_probs`)
TOP_P_PROBES = (2.0**-4, 2.0**-8, 2.0**-12, 2.0**-16, 2.0**-24, 2.0**-40, 0.0)


def desc_order_prefix(values: np.ndarray, m: int) -> np.ndarray:
    """The first m or more entries of `np.argsort(-values, kind="stable")` (value descending, ties by lowest index)
    without sorting the whole array: every index whose value is at least the m-th largest, in that order. Exactly
    that prefix of the full order (all values >= the threshold come before any below it), so a cumulative sum or a
    cut over it is the same as over the full order, at O(V) + a sort of the few instead of a sort of V."""
    n = values.size
    if m >= n:
        return np.argsort(-values, kind="stable")
    thr = np.partition(values, n - m)[n - m]  # the m-th largest
    idx = np.flatnonzero(values >= thr)  # ascending: a stable sort keeps ties in index order
    return idx[np.argsort(-values[idx], kind="stable")]


def filter_probs(probs: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Zero out tokens outside min_p / top_k / top_p, renormalize. `probs` is a 1-D distribution. The semantics of a
    full stable sort (ties broken by index), computed over the prefixes that decide (top_k: `desc_order_prefix`).
    Every filter keeps the largest entry, so a distribution with a positive finite maximum keeps some mass; one
    without (all zeros, a NaN, an inf: no distribution) gives all zeros, which `sample_row` reports as unsamplable."""
    if not 0.0 < probs.max() < np.inf:  # (NaN compares false)
        return np.zeros_like(probs)
    keep = np.ones_like(probs, dtype=bool)
    if p.min_p > 0:
        keep &= probs >= p.min_p * probs.max()
    if p.top_k and p.top_k > 0 and p.top_k < probs.size:
        topk = np.zeros_like(keep)
        topk[desc_order_prefix(probs, p.top_k)[: p.top_k]] = True  # exactly k, ties broken by index
        keep &= topk
    if p.top_p < 1.0:
        masked = np.where(keep, probs, 0.0)
        total = masked.sum()
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it is kept). The entries at or
        # above any threshold are a prefix of the full stable order (zeros, last in it, change nothing): thresholds
        # from the top down, a sum to skip the ones whose entries cannot reach top_p, then one sort of the first
        # prefix whose cumulative mass does (a peaked nucleus: a few entries; a broad one: part of the row)
        target, top = p.top_p - 1e-12, masked.max()
        for f in TOP_P_PROBES:
            idx = np.flatnonzero(masked >= top * f) if f else np.flatnonzero(masked > 0)
            if f and masked[idx].sum() < target * total:
                continue
            order = idx[np.argsort(-masked[idx], kind="stable")]
            csum = np.cumsum(masked[order]) / total
            if not f or csum[-1] >= target:
                break
        n_keep = int(np.searchsorted(csum, target)) + 1
        nucleus = np.zeros_like(keep)
        nucleus[order[:n_keep]] = True
        keep &= nucleus
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def sample_row(logits: np.ndarray, st: SamplingState) -> SampleResult:
    """One token for a 1-D row of logits. Never raises on the row's values (the module's rules for NaN and inf): a
    row it cannot sample gives SampleResult(0, error=UNSAMPLABLE)."""
    p = st.params
    raw = logits
    logits = apply_penalties(nan_to_neg_inf(logits.astype(np.float64, copy=True)), st)
    if min_tokens_pending(st):
        logits[np.asarray(st.stop_ids)] = -np.inf
    top = logits.max()
    if not top > -np.inf:  # all -inf (NaN: only from parameters validate() refuses)
        return SampleResult(0, error=UNSAMPLABLE)
    if p.greedy or top == np.inf:  # a +inf logit takes all the mass: the first one, as the GPU sampler picks it
        token = int(np.argmax(logits))
    else:
        z = logits / p.temperature
        z -= z.max()
        probs = np.exp(z)
        probs /= probs.sum()
        probs = filter_probs(probs, p)
        # inverse-CDF draw with the request's own generator: one uniform per token, reproducible
        cdf = np.cumsum(probs)
        if not cdf[-1] > 0:  # nothing kept (cannot happen with the max at 1: every filter keeps it)
            return SampleResult(0, error=UNSAMPLABLE)
        token = int(np.searchsorted(cdf, st.generator.random() * cdf[-1], side="right"))
        token = min(token, probs.size - 1)
        while token > 0 and probs[token] == 0.0:  # guard against a draw landing exactly on a zero-mass boundary
            token -= 1
    result = SampleResult(token_id=token)
    if p.logprobs is not None:
        lp = log_softmax(raw)
        result.logprob = max(float(lp[token]), LOGPROB_FLOOR)
        if p.logprobs > 0:
            top_ids = desc_order_prefix(lp, p.logprobs)[: p.logprobs]
            result.top_logprobs = [(int(t), max(float(lp[t]), LOGPROB_FLOOR)) for t in top_ids]
    return result


def sample(logits: np.ndarray, states: list[SamplingState]) -> list[SampleResult]:
    """Sample one token per row of `logits` [S, vocab] (row i belongs to states[i]). Never raises for one row: an
    exception while sampling a row (a bug) is logged and becomes that row's SampleResult.error, so only its request
    fails (the engine's fault isolation), not the step."""
    assert logits.shape[0] == len(states)
    if all(s.params.greedy and not penalized_or_logprobs(s.params) and len(s.output_ids) >= s.params.min_tokens
           for s in states):
        # fast path: plain greedy batch. np.argmax picks a NaN over any number: a NaN or -inf pick (the row has a
        # NaN, or nothing above -inf) sends the batch through sample_row, which applies the rules
        tokens = np.argmax(logits, axis=-1)
        if (logits[np.arange(len(states)), tokens] > -np.inf).all():
            return [SampleResult(int(t)) for t in tokens]
    results = []
    for i, st in enumerate(states):
        try:
            results.append(sample_row(logits[i], st))
        except Exception as e:  # noqa: BLE001 - a bug in one row's sampling fails its request, not the step
            log.exception("sampling a row failed")
            results.append(SampleResult(0, error=f"sampling failed: {type(e).__name__}: {e}"))
    return results
