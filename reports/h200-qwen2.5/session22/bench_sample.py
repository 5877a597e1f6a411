"""sample_tokens on a step of Qwen2.5 logits (V 152064) at 1 and 256 rows: the tree's kernel (llmrs/kernels_cu/
sampling.cu: a small batch's argmax over several blocks a row, radix select in 8-bit passes, fixed-point masses,
coalesced warp ranges) against session 21's (sampling_before.cu here: one block a row, each thread its own contiguous
range, 31 one-bit passes for top_k and again for top_p over stored weights). Per case the median of 30 launches
(CUDA events), the logits bytes a launch must read at least (S x V x 4) over the time as GB/s and as a fraction of
the H200's 4296 GB/s read ceiling, and how many rows drew the same token in both. GPU; from the repository root:

    PYTHONPATH=. python3 reports/h200-qwen2.5/session22/bench_sample.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import cupy as cp
import numpy as np

from llmrs.engine.backends import cuda_kernels as ck

V, CEIL = 152064, 4296.0
CASES = [("greedy", dict(t=0.0)), ("t=0.8 top_k=50 top_p=0.9", dict(t=0.8, k=50, p=0.9)),
         ("t=0.7 top_p=0.9", dict(t=0.7, p=0.9)), ("t=1.0 top_k=50", dict(t=1.0, k=50)),
         ("t=1.0 (no filter)", dict(t=1.0))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    here = pathlib.Path(__file__).parent
    common = (ck.KERNELS_DIR / "common.cuh").read_text().replace("#pragma once", "")
    before_src = (here / "sampling_before.cu").read_text().replace('#include "common.cuh"', common)
    before = cp.RawModule(code=before_src, options=ck.OPTIONS).get_function("sample_tokens")
    now = cp.RawModule(code=ck.kernel_source("sampling.cu"), options=ck.OPTIONS).get_function("sample_tokens")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rng = np.random.default_rng(0)
    rows = []
    for S in (1, 256):
        logits = cp.asarray((rng.standard_normal((S, V)) * 2.5).astype(np.float32))
        work = cp.empty((S, V), dtype=cp.float32)
        nb = ck.sample_row_blocks(S, V, sms)
        part_v, part_i, sem = cp.empty(sms, cp.float32), cp.empty(sms, cp.int32), cp.zeros(sms, cp.int32)
        for label, c in CASES:
            t = cp.full(S, c["t"], dtype=cp.float32)
            k = cp.full(S, c.get("k", 0), dtype=cp.int32)
            tp = cp.full(S, c.get("p", 1.0), dtype=cp.float32)
            mp = cp.zeros(S, dtype=cp.float32)
            u = cp.asarray(rng.random(S).astype(np.float32))
            res = {}
            for name in ("before", "now"):
                out = cp.zeros(S, dtype=cp.int32)
                if name == "before":
                    def launch():
                        before((S,), (1024,), (logits, np.int32(V), t, k, tp, mp, u, work, out))
                else:
                    def launch():
                        now((S, nb), (1024,), (logits, np.int32(V), t, k, tp, mp, u, part_v, part_i, sem, out))
                launch()
                cp.cuda.Device().synchronize()
                times = []
                for _ in range(30):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    launch()
                    e1.record()
                    e1.synchronize()
                    times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
                res[name] = (float(np.median(times)), cp.asnumpy(out))
            same = int((res["before"][1] == res["now"][1]).sum())
            for name in ("before", "now"):
                us = res[name][0]
                gbs = S * V * 4 / us / 1e3
                rows.append(dict(rows=S, case=label, kernel=name, us=us, gbs=gbs, frac=gbs / CEIL,
                                 blocks_a_row=nb if name == "now" else 1, same_tokens=same))
                print(f"S={S:<4} {label:<26} {name:<7} {us:10.1f} us  {gbs:7.0f} GB/s {100 * gbs / CEIL:5.1f}% of "
                      f"{CEIL:.0f}  same tokens {same}/{S}")
    assert int(sem.sum()) == 0, "counters not back at 0"
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(dict(vocab=V, ceiling_gbs=CEIL, rows=rows), indent=1))


if __name__ == "__main__":
    main()
