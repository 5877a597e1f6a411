"""Arrival times of requests: a gamma process, as in `vllm bench serve`.

Inter-arrival gaps are Gamma(shape=burstiness, scale=1/(rate*burstiness)), so their mean is 1/rate for any
burstiness; burstiness 1 is a Poisson process, < 1 burstier, > 1 more regular. rate=inf sends all at once.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times in seconds after the start of the run, first request at 0, non-decreasing."""
    if n <= 0:
        return np.zeros(0)
    if rate <= 0:
        raise ValueError("request rate must be > 0 (use inf to send everything at once)")
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    if math.isinf(rate):
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])
