"""The bf16 linears of Qwen2.5-7B at batched-decode / prefill token counts: cuBLAS (the backend's GEMM) against the
bf16 wgmma GEMM with K split over a cluster (gemm_q4.cu's gemm_bf16wg_s{S}, sm_90a; cuda_wgmma), each cluster size.

    PYTHONPATH=. python3 scripts/bench_gemm_bf16_forms.py [--tokens 64,128,192,256,384,512] [--json PATH]

CUDA events around --reps launches each (tests/cuda_helpers.event_us); every wgmma output checked against cuBLAS's
(the same bf16 operands: equal up to f32 summation order; "WRONG" above 1e-5). Per shape, T and form: us, TFLOP/s
and the fraction of the roof (the larger of the bytes at 4296 GB/s and the FLOPs at 792 TFLOP/s: issue 8's H200
ceilings); then the 28-layer sums of qkv + o + down (ms) per form at each T, the wgmma one at the backend's cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_gemm_q4 import LAYERS, SHAPES  # noqa: E402

BW, PEAK = 4296e9, 792e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="64,128,192,256,384,512")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp
    import numpy as np

    from llmrs.backends.cuda_kernels import WG_SPLITS
    from llmrs.backends.cuda_wgmma import bf16_splits, gemm_bf16wg
    from tests.cuda_helpers import bf16_words, event_us, tiny_backend

    be = tiny_backend()
    be.k.bf16_wgmma = False  # the backend's _linear: cuBLAS
    if not be.k.wgmma_arch:
        sys.exit(f"no wgmma on this GPU (compute capability {be.k.cc})")
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in args.tokens.split(",")]
    rows, sums = [], {}
    for name, (N, K) in SHAPES.items():
        w = bf16_words(be, rng.standard_normal((N, K)).astype(np.float32) * 0.02)
        for T in tokens:
            xb = bf16_words(be, rng.standard_normal((T, K)).astype(np.float32))
            ref, out = cp.empty((T, N), dtype=cp.float32), cp.empty((T, N), dtype=cp.float32)
            roof_us = max((N * K * 2 + T * K * 2 + T * N * 4) / BW, 2 * T * N * K / PEAK) * 1e6
            auto = bf16_splits(be, T, N, K)
            forms = {"cublas": lambda: be._linear(xb, w, None, ref)}
            for S in WG_SPLITS:
                forms[f"wgmma S{S}{'*' if S == auto else ''}"] = lambda S=S: gemm_bf16wg(be, xb, w, None, out, splits=S)
            forms["cublas"]()
            want = cp.asnumpy(ref)
            line = []
            for form, fn in forms.items():
                us = event_us(fn, args.reps)
                ok = ""
                if form != "cublas":
                    got = cp.asnumpy(out)
                    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                    ok = "" if np.isfinite(got).all() and err < 1e-5 else f" WRONG({err:.1e})"
                rows.append({"shape": name, "N": N, "K": K, "T": T, "form": form, "us": round(us, 2),
                             "tflops": round(2 * T * N * K / us / 1e6, 1), "roof_pct": round(100 * roof_us / us, 1),
                             "ok": not ok})
                if name != "gate_up" and (form == "cublas" or form.endswith("*")):
                    key = (T, "cublas" if form == "cublas" else "wgmma")
                    sums[key] = sums.get(key, 0.0) + us * LAYERS / 1e3
                line.append(f"{form} {us:7.1f} us {100 * roof_us / us:5.1f}%{ok}")
            print(f"{name:8s} T {T:4d}: " + " | ".join(line), flush=True)
    print("\n28-layer sums of qkv + o + down (ms), wgmma at the backend's cluster size:")
    for T in tokens:
        print(f"T {T:4d}: cublas {sums.get((T, 'cublas'), float('nan')):7.3f}  wgmma "
              f"{sums.get((T, 'wgmma'), float('nan')):7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "sums_ms": [
            {"T": T, "form": f, "ms": round(v, 3)} for (T, f), v in sums.items()]}, indent=1))


if __name__ == "__main__":
    main()
