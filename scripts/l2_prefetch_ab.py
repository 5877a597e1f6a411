#!/usr/bin/env python3
"""A/B of LLMRS_L2_PREFETCH on single-stream decode, one process a preset (GPU).

Builds the synthetic preset once (`llmrs synth --decode-bench`'s weights and timing loop: the engine's run-ahead
decode, prompt --prompt-len, --steps tokens), then for each variant "POINTS@MB" sets the backend's l2_points /
l2_budget, drops the captured graphs and times the decode again; the variants go round --rounds times in turn (a
drift of the lease's clocks lands on all of them). Prints ms/token per variant and round, writes --json.

  python3 scripts/l2_prefetch_ab.py --like qwen2.5-7b [--quant awq] --variants 0/attn@24/all@24 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", required=True)
    ap.add_argument("--quant", default=None)
    ap.add_argument("--variants", default="0/attn@24/attn,norm2@24/all@24", help="POINTS@MB variants, /-separated")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from llmrs.engine.backends import cuda_l2
    from llmrs.engine.backends.cuda import CUDABackend, CUDAModel
    from llmrs.engine.batch import build_step_batch
    from llmrs.engine.sampling import SamplingParams, SamplingState, make_generator
    from llmrs.roofline.presets import preset_config
    from llmrs.synth import gpu_weights, run_ahead_intervals

    c = preset_config(a.like)
    bs, warmup = 16, 8
    total = a.prompt_len + warmup + a.steps + 2
    nb = -(-total // bs)
    backend = CUDABackend(c, num_blocks=nb, block_size=bs)
    model = CUDAModel(c, gpu_weights(c, backend, quant=a.quant), backend)
    table = list(range(nb))
    prompt = np.random.default_rng(0).integers(0, c.vocab_size, a.prompt_len).tolist()
    state = SamplingState(SamplingParams(temperature=0.0), make_generator(0), prompt, [], [])
    backend.sample(model.forward_device(build_step_batch([(prompt, 0, table, True)], bs)), [state])
    variants = []  # (label, points, bytes)
    for v in a.variants.split("/"):
        pts, _, mb = v.partition("@")
        variants.append((v, cuda_l2.parse_points(pts), int(float(mb or 24) * (1 << 20))))
    res: dict[str, list[float]] = {v[0]: [] for v in variants}
    for r in range(a.rounds):
        for label, pts, nbytes in variants:
            backend.l2_points, backend.l2_budget = pts, nbytes
            if backend.graphs is not None:
                backend.graphs.graphs.clear()
            t = run_ahead_intervals(model, backend, state, a.prompt_len, table, bs, warmup, a.steps)
            ms = 1000 * float(np.median(t))
            res[label].append(round(ms, 4))
            print(f"{a.like}{' ' + a.quant if a.quant else ''} round {r + 1} {label:>24}: {ms:.4f} ms/token",
                  flush=True)
    base = min(res[variants[0][0]])
    print(f"--- {a.like}{' ' + a.quant if a.quant else ''} (best of {a.rounds}; vs {variants[0][0]})")
    for label, ms in res.items():
        print(f"{label:>24}: {min(ms):.4f} ms/token  ({min(ms) / base:.3f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.like, "quant": a.quant, "prompt_len": a.prompt_len, "steps": a.steps,
                       "time": time.strftime("%Y-%m-%d %H:%M:%S"), "ms_per_token": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
