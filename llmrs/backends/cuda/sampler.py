"""GPU sampling: `sample_launch(logits_on_device, states)` samples every row in one launch (greedy, temperature,
top-k, top-p, min-p; one uniform per request from its own seeded generator, as the CPU sampler draws) and queues
the tokens' copy to the host. Rows that need penalties, logprobs or a min_tokens mask take the CPU sampler.
Non-finite logits follow the CPU sampler's rules (llmrs/engine/sampling.py): a row with no logit above -inf comes
back as SampleResult(0, error=UNSAMPLABLE), the kernel's -1 in the tokens read back (the device copy the next step
feeds on holds 0 there, a valid id).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmrs.backends.base import Launched
from llmrs.backends.cuda.kernels import sample_row_blocks
from llmrs.engine.sampling import UNSAMPLABLE, SampleResult, min_tokens_pending, penalized_or_logprobs
from llmrs.engine.sampling import sample as cpu_sample
from llmrs.trace import tr


class Sampler:
    """The sampling launches, mixed into CUDABackend (module docstring)."""

    def sample(self, logits: Any, states: list) -> list:
        """One token per row of device `logits` [S, V] (row i belongs to states[i]); see sample_launch."""
        return self.sample_launch(logits, states).wait()

    def sample_launch(self, logits: Any, states: list) -> Any:
        """Queue the sampling of one token per row of device `logits` [S, V] (row i belongs to states[i]) in one
        launch and the copy of the tokens to the host; `.wait()` on the result gives the SampleResults. The tokens
        also stay on the device for the next step's `feed`. At most two launches may be outstanding (their
        read-back buffers take turns).

        The rows of requests that need penalties, logprobs or a min_tokens mask (`needs_cpu_sampler`) go to the CPU
        sampler (llmrs.engine.sampling.sample; the step is then synchronous): only those rows' logits are copied to
        the host, the others are sampled on the GPU as always (the same tokens the CPU sampler gives them: GPU
        tests), so one such request in a large batch costs a row's copy, not the step's (256 x 152k f32 = 155 MB,
        and the CPU sampler over every row). Draws one uniform per non-greedy request from its own generator.
        """
        cp = self.cp
        S = len(states)
        assert logits.shape[0] == S
        if S == 0:
            return Launched([])
        if self._samples.size < S:  # grown, keeping what a feed of the next step may still read
            grown = cp.zeros(max(S, 2 * self._samples.size), dtype=cp.int32)
            grown[: self._samples.size] = self._samples
            self._samples = grown
        out = self._samples[:S]
        on_host = [i for i, st in enumerate(states) if needs_cpu_sampler(st)]
        if len(on_host) == S:
            results = cpu_sample(cp.asnumpy(logits).astype(np.float32), states)
            out.set(np.fromiter((r.token_id for r in results), dtype=np.int32, count=S))
            return Launched(results)
        host = set(on_host)
        V = logits.shape[1]
        # one staged copy: [temperature | top_p | min_p | uniform | top_k bits]
        params = np.zeros(5 * S, dtype=np.float32)
        f, top_k = params[: 4 * S].reshape(4, S), params[4 * S :].view(np.int32)
        for i, st in enumerate(states):
            if i in host:  # greedy on the GPU (no draw from its generator), replaced by the CPU sampler's token
                continue
            p = st.params
            f[0, i] = p.temperature
            f[1, i] = p.top_p
            f[2, i] = p.min_p
            top_k[i] = p.top_k if p.top_k and p.top_k > 0 else 0
            if not p.greedy:
                f[3, i] = st.generator.random()
        tr("sample_begin")
        d = self._stage("sample_params", params)
        fd, kd = d[: 4 * S].reshape(4, S), d[4 * S :].view(cp.int32)
        nb = sample_row_blocks(S, V, self.num_sms)  # S x nb <= num_sms: the hand-off's buffers
        part_v = self._buf("sample_part_v", (self.num_sms,))
        part_i = self._buf("sample_part_i", (self.num_sms,), np.int32)
        sem = self._counters("sample_sem", self.num_sms)
        res = self._buf("sample_res", (S,), np.int32)  # what is read back: the tokens, -1 for an unsamplable row
        with self._span("sample", "sample_tokens", S, V, sum(not st.params.greedy for st in states)):
            self.k.sample_tokens((S, nb), (1024,), (cp.ascontiguousarray(logits), np.int32(V), fd[0], kd, fd[1],
                                                    fd[2], fd[3], part_v, part_i, sem, out, res))
        self._launches += 1
        if on_host:  # those rows' logits only, sampled on the CPU; their tokens into `out` for the next step's feed
            idx = cp.asarray(np.asarray(on_host, dtype=np.int32))
            cpu_results = cpu_sample(cp.asnumpy(logits[idx]).astype(np.float32), [states[i] for i in on_host])
            out[idx] = cp.asarray(np.fromiter((r.token_id for r in cpu_results), dtype=np.int32, count=len(on_host)))
            results = results_of(cp.asnumpy(res).tolist())
            for i, r in zip(on_host, cpu_results):
                results[i] = r
            return Launched(results)
        tokens = self._pinned(f"sample_tokens.{self._launches % 2}", S, np.int32)
        stream = cp.cuda.get_current_stream()
        cp.cuda.runtime.memcpyAsync(tokens.ctypes.data, res.data.ptr, 4 * S, cp.cuda.runtime.memcpyDeviceToHost,
                                    stream.ptr)
        done = cp.cuda.Event(disable_timing=True)
        done.record(stream)
        tr("sample_queued")
        return SampledOnDevice(done, tokens)


class SampledOnDevice:
    """A step's sampling queued on the GPU: wait() blocks until its tokens are on the host."""

    __slots__ = ("done", "tokens")

    def __init__(self, done: Any, tokens: np.ndarray) -> None:
        self.done, self.tokens = done, tokens

    def wait(self) -> list:
        self.done.synchronize()
        return results_of(self.tokens.tolist())


def results_of(tokens: list[int]) -> list[SampleResult]:
    """The kernel's read-back tokens as SampleResults: -1 (a row with no logit above -inf) as the unsamplable
    row's error."""
    results = [SampleResult(t) for t in tokens]
    if -1 in tokens:
        for i, t in enumerate(tokens):
            if t < 0:
                results[i] = SampleResult(0, error=UNSAMPLABLE)
    return results


def needs_cpu_sampler(st: Any) -> bool:
    """What the GPU sampler does not do: penalties, logprobs, a pending min_tokens mask."""
    return penalized_or_logprobs(st.params) or min_tokens_pending(st)
