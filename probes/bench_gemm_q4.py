"""Probe: the 4-bit GEMM's cp.async pipeline depth on the 7B's AWQ shapes, beside dequantize + cuBLAS.
Last result (H200): deeper rings change nothing (T 256: 11.98-12.07 ms a 28-layer step); defaults kept.

The 4-bit GEMM (gemm_q4.cu's gemm_q4z_m<MT>) on Qwen2.5-7B's AWQ shapes at batched-decode / prefill token counts,
for each pipeline depth asked for, beside dequantize + cuBLAS (the backend's path above quant_linear.MAX_TOKENS).

    python -m probes.bench_gemm_q4 [--tokens 128,192,256,512] [--stages "8:2,4:3;8:4,4:4"]

Each --stages set (';'-separated, each `MT:STAGES,...`) compiles the 4-bit GEMM's file once with those
-DGQ_STAGES_M<MT> and times MT 4 and MT 8 at every T (CUDA events around --reps launches, the backend's K slices);
every output is checked against dequantize + cuBLAS (the same bf16 weights and x: equal up to f32 summation order;
"WRONG" above 1e-4). Prints us and TFLOP/s per shape, T, set and MT, then the 28-layer sums of the four linears per
set at each T (the best MT each); --json writes the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
LAYERS = 28


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="128,192,256,512")
    ap.add_argument("--stages", default="8:2,4:3;8:3,4:4;8:4,4:4;8:4,4:5")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp
    import numpy as np

    import llmrs.backends.cuda.quant_linear as q4
    from llmrs.backends.cuda import kernels as ck
    from tests.cuda_helpers import tiny_backend
    from tests.model.test_quant_marlin import make_weight

    be = tiny_backend()
    sets = {}
    for spec in filter(None, (s.strip() for s in args.stages.split(";"))):
        stages = {**ck.GEMM_Q4_STAGES, **{int(mt): int(n) for mt, n in (p.split(":") for p in spec.split(","))}}
        opts = ck.options() + tuple(f"-DGQ_STAGES_M{mt}={n}" for mt, n in sorted(stages.items()))
        fname = next(f for f, ns in ck.ENTRY_POINTS.items() if "gemm_q4z_m4" in ns)  # the 4-bit GEMM's file
        mod = cp.RawModule(code=ck.kernel_source(fname), options=opts)
        fns = {}
        for mt in (4, 8):
            fn = mod.get_function(f"gemm_q4z_m{mt}")
            if ck.gemm_q4_smem_bytes(mt, stages) > ck.STATIC_SMEM_LIMIT:
                fn.max_dynamic_shared_size_bytes = ck.gemm_q4_smem_bytes(mt, stages)
            fns[mt] = fn
        sets[spec] = (stages, fns)

    def launch(stages, fn, mt, mw, xb, out):
        """The backend's gemm_q4 (its tile count, K slices and split-K reduce) with this set's kernel for MT:
        the backend's entry point, its MT rule and its stage table swapped for the call."""
        name = f"gemm_q4z_m{mt}"
        saved = be.k.fns[name], q4.MT8_FROM, ck.GEMM_Q4_STAGES
        be.k.fns[name], q4.MT8_FROM, ck.GEMM_Q4_STAGES = fn, (1 if mt == 8 else 0), stages
        try:
            assert be.gemm_q4(xb, mw, None, out)
        finally:
            be.k.fns[name], q4.MT8_FROM, ck.GEMM_Q4_STAGES = saved

    def timed(fn) -> float:
        fn()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(args.reps):
            fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) * 1e3 / args.reps

    rng = np.random.default_rng(7)
    rows = []
    tokens = [int(t) for t in args.tokens.split(",")]
    for name, (N, K) in SHAPES.items():
        mw = be.to_marlin(be.upload_quantized(make_weight("awq", N, K, 128, rng)))
        wb = cp.empty((N, K), dtype=cp.uint16)
        for T in tokens:
            x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
            xb = cp.empty((T, K), dtype=cp.uint16)
            be._cast_bf16(x, xb)
            ref = cp.empty((T, N), dtype=cp.float32)

            def deq():
                be.dequant_marlin(mw, wb)
                be._linear(x, wb, None, ref, False)

            us = timed(deq)
            rows.append({"shape": name, "T": T, "set": "dequant+cublas", "mt": 0, "us": round(us, 1),
                         "tflops": round(2 * T * N * K / us / 1e6, 1)})
            want = cp.asnumpy(ref)
            for spec, (stages, fns) in sets.items():
                for mt, fn in fns.items():
                    out = cp.full((T, N), np.nan, dtype=cp.float32)
                    us = timed(lambda: launch(stages, fn, mt, mw, xb, out))
                    got = cp.asnumpy(out)
                    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                    rows.append({"shape": name, "T": T, "set": spec, "mt": mt, "us": round(us, 1),
                                 "tflops": round(2 * T * N * K / us / 1e6, 1), "err": err,
                                 "wrong": not np.isfinite(got).all() or err > 1e-4})
            for r in rows:
                if r["shape"] == name and r["T"] == T:
                    print(f"{name:8s} T{T:4d} {r['set']:22s} MT{r['mt']} {r['us']:8.1f} us {r['tflops']:6.1f} TFLOP/s"
                          + (" WRONG" if r.get("wrong") else ""), flush=True)
    print("\n28-layer sums of qkv + o + gate_up + down (ms), best MT each:")
    for T in tokens:
        for spec in ["dequant+cublas", *sets]:
            tot = sum(min(r["us"] for r in rows if r["shape"] == s and r["T"] == T and r["set"] == spec)
                      for s in SHAPES)
            print(f"  T{T:4d} {spec:22s} {tot * LAYERS / 1e3:7.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
