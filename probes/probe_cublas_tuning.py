"""Probe: torch TunableOp's best cuBLAS / cuBLASLt solution against the default heuristic for the 7B's GEMMs.
Last result (H200): TunableOp kept cuBLAS's default solution for every shape at 64-8192 tokens.

Whether cuBLAS's default algorithm leaves time on the table for the 7B's GEMMs: torch's TunableOp (which times
every cuBLAS / cuBLASLt solution for a shape) against the default heuristic, bf16 x bf16, at batched-decode and
prefill token counts. A probe for the notes, run on the GPU machine (torch is there):

    python -m probes.probe_cublas_tuning [--tokens 64,128,256,2048,8192] [--json out.json]

Prints per shape and T: us default, us tuned, TFLOP/s each, the tuned speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="64,128,256,2048,8192")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.environ.setdefault("PYTORCH_TUNABLEOP_FILENAME", os.path.join(tempfile.mkdtemp(), "tunableop.csv"))
    import torch

    tun = torch.cuda.tunable

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(args.reps):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) * 1e3 / args.reps

    rows = []
    for name, (N, K) in SHAPES.items():
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        for T in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
            fn = lambda: torch.matmul(x, w.t(), out=out)  # noqa: E731
            tun.enable(False)
            base = timed(fn)
            tun.enable(True)
            tun.tuning_enable(True)
            fn()  # tunes this shape
            tun.tuning_enable(False)
            tuned = timed(fn)
            tun.enable(False)
            fl = 2 * T * N * K
            r = {"shape": name, "T": T, "us_default": round(base, 1), "us_tuned": round(tuned, 1),
                 "tflops_default": round(fl / base / 1e6, 1), "tflops_tuned": round(fl / tuned / 1e6, 1)}
            rows.append(r)
            print(f"{name:8s} T{T:5d} default {base:8.1f} us {r['tflops_default']:6.1f} TF   tuned {tuned:8.1f} us "
                  f"{r['tflops_tuned']:6.1f} TF   x{base / tuned:.3f}", flush=True)
    res = tun.get_results() if hasattr(tun, "get_results") else None
    if res:
        print("TunableOp's picks:")
        for item in res:
            print("  ", item)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
