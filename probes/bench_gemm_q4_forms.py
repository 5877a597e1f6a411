"""Probe: each form of the 4-bit GEMM against the bf16 cuBLAS GEMM on the same shapes, per token count.
Last result (H200): the mma GEMM beats dequantize + cuBLAS up to 192 tokens a step (quant_linear.MAX_TOKENS).

The 4-bit GEMM's forms on Qwen2.5-7B's AWQ shapes at batched-decode / prefill token counts, beside the bf16 model's
cuBLAS GEMM on the same (dequantized) weights: what a 4-bit linear costs against a bf16 one at each T.

    python -m probes.bench_gemm_q4_forms [--tokens 64,128,192,256,512,1024,4096] [--json PATH]

Forms: `mma` (gemm_q4{z}_m<MT>: mma.sync), `wgmma` (gemm_q4wgz: sm_90a; absent elsewhere), `wgmma256` (gemm_q4w2z:
its 256-token tiles, two warpgroups a block; sm_90a, above 128 tokens), `dequant+cublas` (the
weight dequantized into a bf16 scratch, then cuBLAS: the backend's path above quant_linear.MAX_TOKENS without
wgmma), and `bf16` (cuBLAS alone on that bf16 weight: a bf16 checkpoint's linear). CUDA events around --reps
launches each, the backend's K slices; every 4-bit output checked against dequantize + cuBLAS (equal up to f32
summation order; "WRONG" above 1e-4). Prints us, TFLOP/s and the fraction of the roof per shape, T and form (the
larger of the bytes at 4296 GB/s, 4.25 bits a weight for the 4-bit forms and 16 for bf16, and the FLOPs at 792
TFLOP/s: issue 8's H200 ceilings), then the 28-layer sums of the four linears (ms) per form at each T.
--splits also times the wgmma forms at every compiled cluster size (`wgmma S2`, ...: K split over S blocks): the
backend picks S from the SMs its tiles leave free, which leaves a large weight's last wave of blocks part-empty
(the 7B's gate_up at 256 tokens: 592 tiles of 128 x 128 on 264 resident blocks, 2.24 rounds); the figures say
whether a split that fills the last round pays for its reduction.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from probes.bench_gemm_q4 import LAYERS, SHAPES  # noqa: E402

BW, PEAK = 4296e9, 792e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="64,128,192,256,512,1024,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--splits", action="store_true", help="also the wgmma forms at each compiled cluster size")
    args = ap.parse_args()

    import cupy as cp
    import numpy as np

    from llmrs.backends.cuda.kernels import WG_SPLITS
    from tests.cuda_helpers import bf16_words, event_us, tiny_backend
    from tests.model.test_quant_marlin import make_weight

    be = tiny_backend()
    print(f"wgmma form: {be.k.wgmma_arch or 'none'} (compute capability {be.k.cc}; the backend takes it: "
          f"{be.k.wgmma})")

    rng = np.random.default_rng(0)
    tokens = [int(t) for t in args.tokens.split(",")]
    rows, sums = [], {}
    for name, (N, K) in SHAPES.items():
        dw = be.upload_quantized(make_weight("awq", N, K, 128, rng))
        mw = be.to_marlin(dw)
        wb = cp.empty((N, K), dtype=cp.uint16)
        be.dequant_marlin(mw, wb)
        for T in tokens:
            x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
            xb = bf16_words(be, x)
            out = cp.empty((T, N), dtype=cp.float32)
            ref = cp.empty((T, N), dtype=cp.float32)

            xin = xb if be.fuse_bf16 else x  # the backend's producers write bf16 x for cuBLAS (fuse_bf16)

            def dq():
                be.dequant_marlin(mw, wb)
                be._linear(xin, wb, None, ref, False)

            forms = {"mma": lambda: be.gemm_q4(xb, mw, None, out, wgmma=False), "dequant+cublas": dq,
                     "bf16": lambda: be._linear(xin, wb, None, ref, False)}
            if be.k.wgmma_arch:
                forms["wgmma"] = lambda: be.gemm_q4(xb, mw, None, out, wgmma=True, t256=False)
                if T > 128:
                    forms["wgmma256"] = lambda: be.gemm_q4(xb, mw, None, out, wgmma=True, t256=True)
                for S in WG_SPLITS if args.splits else ():
                    for form, t256 in (("wgmma", False), ("wgmma256", True)):
                        if form in forms:
                            forms[f"{form} S{S}"] = (lambda S=S, t256=t256: be.gemm_q4(xb, mw, None, out, splits=S,
                                                                                     wgmma=True, t256=t256))
            dq()
            want = cp.asnumpy(ref)
            line = []
            for form, fn in forms.items():
                us = event_us(fn, args.reps)
                ok = ""
                if form.startswith(("mma", "wgmma")):
                    got = cp.asnumpy(out)
                    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                    ok = "" if np.isfinite(got).all() and err < 1e-4 else f" WRONG({err:.1e})"
                tf = 2 * T * N * K / us / 1e6
                wbytes = N * K * (2 if form == "bf16" else 4.25 / 8)
                roof_us = max((wbytes + T * K * 2 + T * N * 4) / BW, 2 * T * N * K / PEAK) * 1e6
                rows.append({"shape": name, "N": N, "K": K, "T": T, "form": form, "us": round(us, 2),
                             "tflops": round(tf, 1), "roof_pct": round(100 * roof_us / us, 1), "ok": not ok})
                sums[(T, form)] = sums.get((T, form), 0.0) + us * LAYERS / 1e3
                line.append(f"{form} {us:8.1f} us {tf:6.1f} TF {100 * roof_us / us:5.1f}%{ok}")
            print(f"{name:8s} T {T:5d}: " + " | ".join(line), flush=True)
    print("\n28-layer sums of the four linears (ms):")
    forms = sorted({f for _, f in sums})
    print(f"{'T':>6s} " + " ".join(f"{f:>15s}" for f in forms))
    for T in tokens:
        print(f"{T:6d} " + " ".join(f"{sums.get((T, f), float('nan')):15.3f}" for f in forms))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "sums_ms": [
            {"T": T, "form": f, "ms": round(v, 3)} for (T, f), v in sums.items()]}, indent=1))


if __name__ == "__main__":
    main()
