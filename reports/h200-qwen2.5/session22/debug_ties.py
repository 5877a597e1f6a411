"""Session 22 call 5: which case of test_gpu_sampling_cuts_ties_by_index stops (call4: the test ran past its 200 s).
The cases in turn in one process, each printed as it ends (the missing line names the one that stops); the caller
times the process out. GPU; from the repository root."""

from __future__ import annotations

import sys
import time

import cupy as cp
import numpy as np

from llmrs.engine.backends.cuda import CUDABackend
from llmrs.engine.config import ModelConfig
from llmrs.engine.sampling import SamplingParams, SamplingState, make_generator

c = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
                num_attention_heads=8, num_key_value_heads=2, head_dim=8)
be = CUDABackend(c, num_blocks=1)
for case, S, V in [("topk", 4, 5000), ("topk-ties", 1, 5000), ("topk-ties", 200, 5000), ("k-then-p-ties", 1, 5000),
                   ("flat-topp", 1, 5000), ("flat-topp", 200, 5000), ("k-then-p-ties", 200, 5000)]:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((S, V)).astype(np.float32)
    ties = np.sort(rng.choice(V, 300, replace=False))
    kw = dict(top_k=50)
    if case == "topk-ties":
        logits[:, ties] = 30.0
        kw = dict(top_k=5)
    elif case == "flat-topp":
        logits[:] = 0.0
        kw = dict(top_p=0.1)
    elif case == "k-then-p-ties":
        logits[:, ties[:100]] = 30.0
        kw = dict(top_k=40, top_p=0.5)
    states = [SamplingState(SamplingParams(temperature=1.0, **kw), make_generator(i), [], [], []) for i in range(S)]
    t = time.time()
    toks = [r.token_id for r in be.sample(cp.asarray(logits), states)]
    print(f"{case} S={S} V={V}: {time.time() - t:.2f} s, tokens {sorted(set(toks))[:8]}", flush=True)
