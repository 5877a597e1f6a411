"""sample_tokens at a 256-row step of Qwen2.5 logits (V 152064), greedy and sampling rows, this branch's kernel (the
first pass strided over the threads) against main's (`sampling_main.cu` beside this file, each thread walking its
own contiguous range): the median of 50 launches timed with CUDA events, the achieved GB/s of the logits read, and
whether both give the same tokens. GPU; run from the repository root with PYTHONPATH=.

    python3 reports/h200-qwen2.5/session20/next/bench_sample.py
"""

from __future__ import annotations

import re
from pathlib import Path

import cupy as cp
import numpy as np

from llmrs.engine.backends import cuda_kernels as ck

S, V = 256, 152064
common = (ck.KERNELS_DIR / "common.cuh").read_text().replace("#pragma once", "")
main_src = re.sub(r'#include\s+"common\.cuh"', lambda _: common,
                  (Path(__file__).resolve().parent / "sampling_main.cu").read_text())
fns = {name: cp.RawModule(code=src, options=ck.OPTIONS).get_function("sample_tokens")
       for name, src in (("main", main_src), ("branch", ck.kernel_source("sampling.cu")))}
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
