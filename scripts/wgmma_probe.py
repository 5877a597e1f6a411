"""First aid for gemm_q4.cu's wgmma kernels on a GPU (sm_90a): one tile, one or two K stages, structured inputs, and
where the output is wrong, which token rows / columns / K stages, so a layout error shows its shape in one call.

    PYTHONPATH=. python3 scripts/wgmma_probe.py

For each kernel (the 4-bit gemm_q4wgz and its 256-token form gemm_q4w2z on an AWQ weight, the bf16 gemm_bf16wg_s1 /
_s2) and case (T x N x K: 128 x 128 x 64 = one stage of one tile; x 128 = two stages; 1 x 128 x 64; 128 x 256 x 64
= two column blocks; gemm_q4w2z the same with 256-token tiles): the
relative error against float64 numpy, then per token % 16 and per column % 32 the fraction of wrong outputs (a hex
digit each, 0-f = 0-100%), and the same with x one-hot (token t reads k = t % K only: out[t, n] = W[n, t % K]) where
a wrong output is matched to the W element it equals (the first hit: which (n, k) the kernel read instead).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))



def main() -> None:
    import cupy as cp
    import numpy as np

    from llmrs.backends.cuda import round_bf16
    from llmrs.backends.cuda_q4gemm import gemm_q4, to_marlin
    from llmrs.backends.cuda_wgmma import gemm_bf16wg
    from tests.cuda_helpers import bf16_words, tiny_backend
    from tests.test_quant_marlin import make_weight

    be = tiny_backend()
    if not be.k.wgmma_arch:
        sys.exit(f"no wgmma on this GPU (compute capability {be.k.cc})")
    print("compiled:", sorted(be.k.wgmma_fns()))
    rng = np.random.default_rng(0)

    def hexmask(bad, axis_mod, axis):
        idx = np.arange(bad.shape[axis]) % axis_mod
        fr = [bad.take(np.where(idx == i)[0], axis=axis).mean() if (idx == i).any() else 0 for i in range(axis_mod)]
        return "".join("0123456789abcdef"[min(15, int(f * 15.999))] for f in fr)

    def report(label, got, ref, w=None, onehot=False):
        err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)) if np.isfinite(got).all() else np.inf
        bad = ~np.isclose(got, ref, rtol=1e-3, atol=1e-3 * max(np.abs(ref).max(), 1e-30))
        line = f"  {label:34s} rel {err:.2e}  wrong {bad.mean():6.1%}"
        if bad.any():
            line += f"  by token%16 {hexmask(bad, 16, 0)}  by column%32 {hexmask(bad, 32, 1)}"
            if onehot and w is not None:
                t, n = map(int, np.argwhere(bad)[0])
                hits = np.argwhere(np.isclose(w, got[t, n], rtol=1e-6, atol=0))
                line += f"  first bad (t={t}, n={n}) = W{tuple(map(int, hits[0])) if len(hits) else ' none'}"
        print(line, flush=True)

    def probe(launch, wref, T, N, K):
        """Random x, then one-hot x, through `launch(x_bf16, out)` against x @ wref^T (float64)."""
        for onehot in (False, True):
            x = np.zeros((T, K), np.float32)
            if onehot:
                x[np.arange(T), np.arange(T) % K] = 1.0
            else:
                x = rng.standard_normal((T, K)).astype(np.float32)
            out = cp.full((T, N), np.nan, dtype=cp.float32)
            launch(bf16_words(be, x), out)
            ref = round_bf16(x).astype(np.float64) @ wref.T
            report(f"T{T} N{N} K{K}{' one-hot' if onehot else ''}", cp.asnumpy(out), ref, wref, onehot)

    cases = [(128, 128, 64), (128, 128, 128), (1, 128, 64), (128, 256, 64), (200, 192, 128)]
    print("gemm_q4wgz (AWQ; group size 64 where K is 64, else 128)")
    for T, N, K in cases:
        w = make_weight("awq", N, K, 64 if K == 64 else 128, rng)
        mw = to_marlin(be, be.upload_quantized(w))
        probe(lambda xb, out: gemm_q4(be, xb, mw, None, out, splits=1, wgmma=True, t256=False),
              round_bf16(w.dequantize()).astype(np.float64), T, N, K)
    print("gemm_q4w2z (256-token tiles, two warpgroups)")
    for T, N, K in [(256, 128, 64), (256, 128, 128), (1, 128, 64), (256, 256, 64), (300, 192, 128)]:
        w = make_weight("awq", N, K, 64 if K == 64 else 128, rng)
        mw = to_marlin(be, be.upload_quantized(w))
        probe(lambda xb, out: gemm_q4(be, xb, mw, None, out, splits=1, wgmma=True, t256=True),
              round_bf16(w.dequantize()).astype(np.float64), T, N, K)
    for S in (1, 2):
        print(f"gemm_bf16wg_s{S}")
        for T, N, K in cases:
            if K // 64 >= S:
                w = round_bf16(rng.standard_normal((N, K)).astype(np.float32)).astype(np.float64)
                wb = bf16_words(be, w)
                probe(lambda xb, out: gemm_bf16wg(be, xb, wb, None, out, splits=S), w, T, N, K)

if __name__ == "__main__":
    main()
