"""One launch of each decode linear of one layer of a Qwen2.5 shape, for Nsight Compute to profile (GPU):
4-bit (AWQ G128, random) through gemv_q4 (the Marlin layout, the backend's K splits) and matvec_q4 (the row form),
and bf16 through the matvec; with --kinds gemm (and --tokens above 16, e.g. 256: a batched decode step), the 4-bit
GEMM (gemm_q4z_m<MT> on the Marlin layout, the backend's tile and K slices; profile it with
-k "regex:gemm_q4[zm]_m" so that its split-K reduce is left out); the launch order goes to --labels for
tools/ncu_summary.py.

    ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \\
        --section LaunchStats --section Occupancy \\
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio" \\
        -k "regex:gemv_q4|matvec" python -m tools.ncu_linears --labels /tmp/labels.json > /tmp/ncu.txt
    python3 tools/ncu_summary.py /tmp/ncu.txt --labels /tmp/labels.json

Every launch is profiled on its own (ncu replays it, caches flushed), so no warm-up launches are made: the -k
filter above must match exactly the kernels launched here (gemv_q4*, matvec_q4*, matvec_bf16*).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench_gemv_q4 import SHAPES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-7b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--kinds", default="gemv,matvec_q4,bf16", help="comma-separated: gemv, matvec_q4, bf16, gemm")
    ap.add_argument("--labels", type=Path, required=True)
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in ("gemv", "matvec_q4", "bf16", "gemm")]
    if bad:
        sys.exit(f"--kinds: unknown {bad}; expected gemv, matvec_q4, bf16, gemm")

    import cupy as cp
    import numpy as np

    from tests.cuda_helpers import bf16_words, tiny_backend
    from tests.model.test_quant_marlin import make_weight

    be = tiny_backend()
    rng = np.random.default_rng(0)
    shapes = {k: v for k, v in SHAPES[args.preset].items() if k != "L"}
    T = args.tokens
    labels = []
    for name, (N, K) in shapes.items():
        x = cp.asarray(rng.standard_normal((T, K)).astype(np.float32))
        out = cp.empty((T, N), dtype=cp.float32)
        if "gemv" in kinds or "matvec_q4" in kinds:
            w = make_weight("awq", N, K, 128, rng)
            be.q4_gemv = False  # keep the row form for matvec_q4
            try:
                dw = be.upload_quantized(w)
            finally:
                be.q4_gemv = True
            if "gemv" in kinds:
                assert be.gemv_q4(x, dw.marlin, None, out, name=name)
                labels.append(f"{name} {N}x{K} gemv_q4")
            if "matvec_q4" in kinds:
                be.q4_gemv = False
                try:
                    be._linear_quant(x, dw, None, out, False, name)
                finally:
                    be.q4_gemv = True
                labels.append(f"{name} {N}x{K} matvec_q4")
            del dw
        if "gemm" in kinds:
            dw = be.upload_quantized(make_weight("awq", N, K, 128, rng))
            xb = bf16_words(be, x)
            assert be.gemm_q4(xb, dw.marlin, None, out, name=name), (name, N, K)
            labels.append(f"{name} {N}x{K} gemm_q4 T{T}")
            del dw, xb
        if "bf16" in kinds:
            wb = cp.asarray(rng.integers(0x3C00, 0x3D00, (N, K), dtype=np.uint16))  # bf16 words of 0.0078..0.0156
            be._linear(x, wb, None, out)
            labels.append(f"{name} {N}x{K} bf16")
            del wb
        cp.cuda.Device().synchronize()
        cp.get_default_memory_pool().free_all_blocks()
    args.labels.write_text(json.dumps(labels))
    print("\n".join(labels))


if __name__ == "__main__":
    main()
