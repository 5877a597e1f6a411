"""sample_tokens at a 256-row step of Qwen2.5 logits (V 152064), greedy and sampling rows, the coalesced first pass
(branch exp/sample-coalesced's change, made here on the tree's source: its max / argmax strided over the threads)
against the tree's llmrs/kernels_cu/sampling.cu (each thread walking its own contiguous range): the
median of 50 launches timed with CUDA events, the achieved GB/s of the logits read, and whether both give the same
tokens. GPU; run from the repository root with PYTHONPATH=.

    python3 reports/h200-qwen2.5/session21/bench_sample.py
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from llmrs.engine.backends import cuda_kernels as ck

S, V = 256, 152064
# exp/sample-coalesced's change to sampling.cu: the first pass strided; lo / hi defined after it for the later passes
EDITS = [("""    const int per = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(V, tid * per), hi = min(V, lo + per);

    // 1) max""", """
    // 1) max"""),
         ("for (int i = lo; i < hi; ++i)\n        if (x[i] > bv)",
          "for (int i = tid; i < V; i += SAMPLE_THREADS)\n        if (x[i] > bv)"),
         ("""    // 2) unnormalized probabilities""", """    const int per = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(V, tid * per), hi = min(V, lo + per);

    // 2) unnormalized probabilities""")]
branch_src = ck.kernel_source("sampling.cu")
for old, new in EDITS:
    assert branch_src.count(old) == 1, old
    branch_src = branch_src.replace(old, new)
fns = {name: cp.RawModule(code=src, options=ck.OPTIONS).get_function("sample_tokens")
       for name, src in (("main", ck.kernel_source("sampling.cu")), ("branch", branch_src))}
rng = np.random.default_rng(0)
logits = cp.asarray(rng.standard_normal((S, V)).astype(np.float32))
logits[3, [5, 70000, 151000]] = 50.0  # ties: the lowest index wins
work = cp.empty((S, V), dtype=cp.float32)
for label, temp in (("greedy", 0.0), ("sampling t=0.8 top_k=50 top_p=0.9", 0.8)):
    t = cp.full(S, temp, dtype=cp.float32)
    k = cp.full(S, 50 if temp else 0, dtype=cp.int32)
    tp = cp.full(S, 0.9 if temp else 1.0, dtype=cp.float32)
    mp = cp.zeros(S, dtype=cp.float32)
    u = cp.asarray(rng.random(S).astype(np.float32))
    toks = {}
    for name, fn in fns.items():
        out = cp.zeros(S, dtype=cp.int32)
        args = (logits, np.int32(V), t, k, tp, mp, u, work, out)
        fn((S,), (1024,), args)
        cp.cuda.Device().synchronize()
        toks[name] = cp.asnumpy(out)
        times = []
        for _ in range(50):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            fn((S,), (1024,), args)
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
        ms = float(np.median(times))
        print(f"{label:36s} {name:6s} {ms * 1e3:8.1f} us  logits read {4 * S * V / ms / 1e6:7.0f} GB/s")
    print(f"{label:36s} same tokens: {np.array_equal(toks['main'], toks['branch'])}"
          + (f" (row 3: {toks['branch'][3]})" if not temp else ""))
