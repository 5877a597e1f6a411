"""The 4-bit decode linears of one layer of a Qwen2.5 shape (AWQ G128, random weights) inside CUDA graphs on the GPU:
matvec_q4 (row form) and gemv_q4 (Marlin layout) at every K split S, each launch reading its own copy of the weight
(copies spanning --span-mb, so that back-to-back launches stream from DRAM as a decode step's layers do).

    python -m tools.bench_gemv_q4 [--preset qwen2.5-7b] [--tokens 1] [--splits 1,2,3,4,5,6,8]

Prints per shape and kernel: us a launch, GB/s of the packed bytes (codes + scales + zeros), % of --roof-gbs, the
grid's blocks and the resident-block rounds it needs (4 blocks an SM), and the 28-layer sums of the backend's
choice and of the best S. On sm_90 each S runs twice: its K slices launched as one cluster (the default up to S = 4) and
through the L2 hand-off ("gemv_q4 l2", the q4_gemv_cluster=False form). Each kernel's output is checked against
x (rounded to bf16) @ the dequantized weights:
"WRONG" marks a relative error above 1e-2 or an output left unwritten. --json writes the rows.
--variants 'MACROS;MACROS' compiles the GEMV's file again with each set of macros and times those builds beside
the shipped one; --source probes/gemv_q4_ablate.cu takes them from the GEMV's ablation probe instead, whose macros
say what bounds the GEMV (outputs WRONG by design): --variants '-DGV_ABLATE_MATH
-DGV_ABLATE_PAD=39000;-DGV_ABLATE_LOADS' times the code stream alone (no decode, no mma; held at 4 blocks an SM) and
the math alone (codes made from their addresses) beside the kernel; '-DGV_ABLATE_X;-DGV_ABLATE_X -DGV_ABLATE_LOADS'
the kernel with x's loads left out, and the decode + mma with neither stream (what x's round trips cost);
-DGV_ABLATE_ONES (no ones mma for X) and -DGV_ABLATE_DECODE (no decode: the code words straight into the mma) say
whether that arithmetic waits on the tensor pipe or the integer pipe.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "qwen2.5-7b": {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944), "L": 28},
    "qwen2.5-3b": {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (22016, 2048), "down": (2048, 11008), "L": 36},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-7b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--splits", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--span-mb", type=float, default=320.0)
    ap.add_argument("--reps", type=int, default=3, help="passes over the copies inside one graph")
    ap.add_argument("--roof-gbs", type=float, default=4296.0)
    ap.add_argument("--variants", default="",
                    help="';'-separated NVRTC option sets for the GEMV's kernel file (e.g. '-DGV_DEPTH=8 -DGV_MINB=3;"
                         "-DGV_MINB=5'; `llmrs ptx-check -D` says first whether they spill): each timed beside "
                         "the built-in kernels")
    ap.add_argument("--source", default=None, help="kernel file the --variants are built from (default: the shipped "
                    "GEMV's; e.g. probes/gemv_q4_ablate.cu)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp
    import numpy as np

    from llmrs.model.weights import round_bf16
    from llmrs.backends.cuda.quant_linear import GEMV_BLOCKS_PER_SM
    from tests.cuda_helpers import graph_us as graph_time_us
    from tests.cuda_helpers import tiny_backend
    from tests.model.test_quant_marlin import make_weight

    be = tiny_backend()
    cluster_default = be.q4_gemv_cluster
    from llmrs.backends.cuda.kernels import ENTRY_POINTS, kernel_source, options

    fname = next(f for f, ns in ENTRY_POINTS.items() if "gemv_q4z" in ns)  # the GEMV's kernel file
    names = [n for n in ENTRY_POINTS[fname] if n.startswith("gemv_")]  # every form a variant replaces
    if args.source:
        src, inc = Path(args.source).read_text(), (f"-I{Path(args.source).resolve().parent}",)
    else:
        src, inc = kernel_source(fname), ()
    variants = {"main": {n: be.k.fns[n] for n in names}}
    for opts in filter(None, (v.strip() for v in args.variants.split(";"))):
        mod = cp.RawModule(code=src, options=options() + inc + tuple(opts.split()))
        variants[opts] = {n: mod.get_function(n) for n in names}
        fn = variants[opts]["gemv_q4z"]
        print(f"variant {opts!r}: {fn.num_regs} registers, {fn.local_size_bytes} bytes local", flush=True)
    sms = be.num_sms
    rng = np.random.default_rng(0)
    shapes = dict(SHAPES[args.preset])
    layers = shapes.pop("L")
    T = args.tokens
    rows, chosen, best = [], 0.0, 0.0
    for name, (N, K) in shapes.items():
        w = make_weight("awq", N, K, 128, rng)
        be.q4_gemv = False  # every copy keeps its row form as well: matvec_q4 is timed beside
        try:
            first = be.upload_quantized(w)
            nbytes = first.nbytes  # the packed bytes one launch reads (one form)
            copies = max(1, int(args.span_mb * 2**20 // first.gpu_nbytes))
            ws = [first] + [be.upload_quantized(w) for _ in range(copies - 1)]
        finally:
            be.q4_gemv = True
        x_host = rng.standard_normal((T, K)).astype(np.float32)
        x = cp.asarray(x_host)
        out = cp.empty((T, N), dtype=cp.float32)

        def graph_us(launch) -> float:  # a launch per copy, args.reps rounds, inside one graph: us a launch
            out.fill(np.nan)
            return graph_time_us(lambda: [launch(dw) for dw in ws], args.reps) / len(ws)

        # the product to check every kernel's last output against: x rounded to bf16 @ the exact weights (f32 on
        # the GPU); out is poisoned with NaN before each timing, so a kernel that leaves outputs unwritten shows
        wd = cp.asarray(w.dequantize())
        ref = cp.asnumpy(cp.asarray(round_bf16(x_host)) @ wd.T)
        del wd

        def check() -> float:
            got = cp.asnumpy(out)
            return float(np.abs(got - ref).max() / (np.abs(ref).max() + 1e-30)) if np.isfinite(got).all() else np.inf

        def add(kernel, us, S=None, blocks=None):
            err = check()
            row = {"shape": name, "N": N, "K": K, "T": T, "kernel": kernel, "S": S, "us": round(us, 2), "rel_err": err,
                   "GB/s": round(nbytes / us / 1e3, 1), "roof %": round(100 * nbytes / us / 1e3 / args.roof_gbs, 1),
                   "blocks": blocks,
                   "rounds": None if blocks is None else round(blocks / (GEMV_BLOCKS_PER_SM * sms), 2)}
            rows.append(row)
            print(f"  {name:8s} {kernel:24s} S={str(S):4s} {us:8.2f} us {row['GB/s']:8.1f} GB/s "
                  f"{row['roof %']:5.1f}%  blocks {blocks} ({row['rounds']} of the resident)"
                  f"{'' if err < 1e-2 else f'  WRONG: rel err {err:.3g}'}", flush=True)
            return us

        if T <= 8:
            be.q4_gemv = False  # _linear_quant's matvec_q4 at any N
            try:
                us_mv = add("matvec_q4", graph_us(lambda dw: be._linear_quant(x, dw, None, out, False, name)))
            finally:
                be.q4_gemv = True
        else:
            us_mv = float("inf")
        cl = be.gemv_cluster() and T <= 8  # the default launch: K slices as a cluster (sm_90, S <= 4)
        auto_S, _ = be.gemv_splits(N, K)
        per_shape = {}
        # each S with the slices as one cluster (the default on sm_90) and through the L2 hand-off ("l2")
        for vname, fns in variants.items():
            be.k.fns.update(fns)
            for form in (["", " l2"] if cl else [""]):
                be.q4_gemv_cluster = cl and form == ""
                seen = set()
                for S in sorted({int(s) for s in args.splits.split(",")} | {auto_S}):
                    S_eff, per = be.gemv_splits(N, K, S)
                    if S_eff in seen:
                        continue
                    seen.add(S_eff)
                    us = add(f"gemv_q4 {vname}{form}" if vname != "main" else f"gemv_q4{form}",
                             graph_us(lambda dw: be.gemv_q4(x, dw.marlin, None, out, splits=S)), S_eff,
                             N // 32 * S_eff)
                    if vname == "main" and form == "":
                        per_shape[S_eff] = us
            be.q4_gemv_cluster = cluster_default
        be.k.fns.update(variants["main"])
        takes = be.gemv_takes(T, N, K)
        choice = per_shape[auto_S] if takes else us_mv
        fastest = min(min(per_shape.values()), us_mv)
        chosen += choice
        best += fastest
        print(f"  {name}: backend's choice {'gemv_q4 S=%d' % auto_S if takes else 'matvec_q4'} {choice:.2f} us; "
              f"best {fastest:.2f} us", flush=True)
        ws = first = None  # (the copies freed; not `del`: graph_us's closure reads ws)
        cp.get_default_memory_pool().free_all_blocks()
    print(f"{layers} layers, ms: backend's choice {layers * chosen / 1e3:.3f}, "
          f"best per shape {layers * best / 1e3:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"preset": args.preset, "T": T, "sms": sms, "rows": rows,
                                               "chosen_ms": layers * chosen / 1e3, "best_ms": layers * best / 1e3},
                                              indent=1))


if __name__ == "__main__":
    main()
