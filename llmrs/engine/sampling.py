"""SamplingParams and the batched sampler.

Order of operations (vLLM's): penalties, logit_bias -> min_tokens mask -> temperature -> min_p, top_k, top_p ->
draw.
Logprobs are those of the model's raw distribution (log_softmax of the unprocessed logits), as vLLM V1
returns by default. A request's seed makes its own generator, so its tokens do not depend on what else is
in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from llmrs.errors import UserError


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
        """Raise UserError naming the first bad field (the server turns it into a 400)."""
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):  # JSON's Infinity / NaN (Python's json reads both)
                raise UserError(f"{name} must be a finite number")
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 0, "top_k must be -1, 0 (disabled) or positive"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (self.min_tokens >= 0, "min_tokens must be >= 0"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens must be <= max_tokens"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be in [0, 20]"),
            (self.n >= 1, "n must be >= 1"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
            (all(t >= 0 for t in self.stop_token_ids), "stop_token_ids must be token ids (>= 0)"),
            (all(isinstance(t, int) and t >= 0 for t in self.logit_bias), "logit_bias keys must be token ids (>= 0)"),
            (all(math.isfinite(b) and -100 <= b <= 100 for b in self.logit_bias.values()),
             "logit_bias values must be in [-100, 100]"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


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


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


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
    full stable sort (ties broken by index), computed over the prefixes that decide (top_k: `desc_order_prefix`)."""
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
    p = st.params
    raw = logits
    logits = apply_penalties(logits.astype(np.float64, copy=True), st)
    if min_tokens_pending(st):
        logits[np.asarray(st.stop_ids)] = -np.inf
    if p.greedy:
        token = int(np.argmax(logits))
    else:
        z = logits / p.temperature
        z -= z.max()
        probs = np.exp(z)
        probs /= probs.sum()
        probs = filter_probs(probs, p)
        # inverse-CDF draw with the request's own generator: one uniform per token, reproducible
        cdf = np.cumsum(probs)
        token = int(np.searchsorted(cdf, st.generator.random() * cdf[-1], side="right"))
        token = min(token, probs.size - 1)
        while probs[token] == 0.0:  # guard against a draw landing exactly on a zero-mass boundary
            token -= 1
    result = SampleResult(token_id=token)
    if p.logprobs is not None:
        lp = log_softmax(raw)
        result.logprob = float(lp[token])
        if p.logprobs > 0:
            top = desc_order_prefix(lp, p.logprobs)[: p.logprobs]
            result.top_logprobs = [(int(t), float(lp[t])) for t in top]
    return result


def sample(logits: np.ndarray, states: list[SamplingState]) -> list[SampleResult]:
    """Sample one token per row of `logits` [S, vocab] (row i belongs to states[i])."""
    assert logits.shape[0] == len(states)
    if all(s.params.greedy and not penalized_or_logprobs(s.params) and len(s.output_ids) >= s.params.min_tokens
           for s in states):
        return [SampleResult(int(t)) for t in np.argmax(logits, axis=-1)]  # fast path: plain greedy batch
    return [sample_row(logits[i], st) for i, st in enumerate(states)]
