"""Per-kernel times inside CUDA graphs (as decode steps replay them), for the single-stream shapes of a preset.

`llmrs profile` times eager launches with CUDA events around each one, which inflates small kernels by the
launch and event overhead; decode steps replay graphs (with programmatic dependent launch on sm_90+). This
captures REPEAT back-to-back launches of one kernel into a graph the way DecodeGraphs does, replays it, and
reports the time per launch and the fraction of the bandwidth floor for the matvecs: the projections at every
warps-per-row split, the paired-epilogue kernels (with and without the folded RMSNorm), the RMSNorm and the
decode attention at a given context. Launch i reads copy i % n of its matrix, n copies spanning --l2-span-mb
(256 MB), so a small matrix (the 7B's qkv: 33 MB) streams from DRAM as a step's 28 layers do, not from the 60 MB
L2.

    python -m tools.bench_kernels_graph --like qwen2.5-7b --context 512 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", default="qwen2.5-7b")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=28)
    ap.add_argument("--bandwidth-gbs", type=float, default=4296.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", choices=("all", "attention"), default="all",
                    help="attention: only the decode attention rows (kernel x splits)")
    ap.add_argument("--l2-span-mb", type=float, default=256.0,
                    help="each matrix is cycled through enough copies to span this many MB, so back-to-back launches "
                         "stream from DRAM as a decode step's layers do (0: one copy; small matrices then sit in L2)")
    a = ap.parse_args()

    import cupy as cp

    from llmrs.backends.cuda import NULL, CUDABackend, rope_threads
    from llmrs.engine.batch import build_step_batch
    from llmrs.model.presets import preset_config

    c = preset_config(a.like)
    T, H, I = a.tokens, c.hidden_size, c.intermediate_size
    Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    bs = 16
    nbps = -(-(a.context + 1) // bs)
    be = CUDABackend(dataclasses.replace(c, num_hidden_layers=1), num_blocks=T * nbps + 1, cuda_graphs=False)
    gen = cp.random.default_rng(0)

    def mat(n, k):
        return be.upload_bf16(gen.standard_normal((n, k), dtype=cp.float32) * 0.02)

    n_qkv = (Hq + 2 * Hkv) * D
    shapes = {"qkv": (n_qkv, H), "o": (H, Hq * D), "gate_up": (2 * I, H), "down": (H, I)}
    # copies per matrix: launch i of a graph reads copy i % n (a layer's weights are its own in a real step)
    Ws = {k: [mat(n, kk) for _ in range(max(1, min(a.repeat, -(-int(a.l2_span_mb * 1e6) // (2 * n * kk)))))]
          for k, (n, kk) in shapes.items()}
    W = {k: v[0] for k, v in Ws.items()}
    bias = cp.zeros(n_qkv, dtype=cp.float32)
    x = {k: gen.standard_normal((T, w.shape[1]), dtype=cp.float32) for k, w in W.items()}
    y = {k: cp.zeros((T, w.shape[0]), dtype=cp.float32) for k, w in W.items()}
    for cache in (be.k_cache[0], be.v_cache[0]):
        cache[...] = (gen.standard_normal(cache.shape, dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
    batch = build_step_batch([([5], a.context, list(range(i * nbps, (i + 1) * nbps)), True) for i in range(T)], bs)
    db = be.device_batch(batch)
    stream = cp.cuda.Stream(non_blocking=True)

    def graph_us(fn) -> float:
        """Per-launch us of `fn(i)` (i = the launch's index in the graph) captured REPEAT times into one graph."""
        with stream:
            fn(0)  # warm-up (buffers, modules)
            stream.synchronize()
            be.k.pdl = be.k.pdl_capable
            stream.begin_capture()
            try:
                for i in range(a.repeat):
                    fn(i)
            finally:
                be.k.pdl = False
                g = stream.end_capture()
            g.launch(stream)
            stream.synchronize()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            for _ in range(10):
                g.launch(stream)
            e1.record(stream)
            e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) * 1e3 / (10 * a.repeat)

    def pick(name, i):
        return Ws[name][i % len(Ws[name])]

    rows = []

    def add(name, us, nbytes=None):
        r = {"kernel": name, "us": round(us, 2)}
        if nbytes:
            r["GB/s"] = round(nbytes / (us * 1e-6) / 1e9)
            r["of_floor"] = round(nbytes / (a.bandwidth_gbs * 1e9) / (us * 1e-6), 3)
        rows.append(r)
        print(f"{name:34s} {us:8.2f} us" + (f"  {r['GB/s']:6d} GB/s  {100 * r['of_floor']:5.1f}% of floor"
                                            if nbytes else ""), flush=True)

    qkv = cp.zeros((T, n_qkv), dtype=cp.float32)
    if a.only == "all":  # the matvecs, norms, RoPE and SiLU
        for name, w in W.items():
            N, K = w.shape
            for splits in (1, 2, 4):
                be.matvec_splits = splits
                us = graph_us(lambda i: be._linear(x[name], pick(name, i), None, y[name], name=name))
                add(f"matvec {name} splits={splits}", us, 2 * N * K)
            be.matvec_splits = 0
            print(f"  (backend's choice for {name}: splits={be._matvec_splits(N, K)})")
        act = cp.zeros((T, I), dtype=cp.float32)
        add("matvec gate_up+silu", graph_us(lambda i: be._matvec_pair("silu", x["gate_up"], pick("gate_up", i), act)),
            2 * 2 * I * H)
        add("matvec qkv+rope",
            graph_us(lambda i: be._matvec_pair("rope", x["qkv"], pick("qkv", i), qkv, bias=bias, db=db)), 2 * n_qkv * H)
        nw = cp.ones(H, dtype=cp.float32)
        add("matvec norm+gate_up+silu", graph_us(lambda i: be._matvec_pair(
            "silu", x["gate_up"], pick("gate_up", i), act, norm=(nw, 1e-6))), 2 * 2 * I * H)
        add("matvec norm+qkv+rope", graph_us(lambda i: be._matvec_pair(
            "rope", x["qkv"], pick("qkv", i), qkv, bias=bias, db=db, norm=(nw, 1e-6))), 2 * n_qkv * H)
        h = cp.zeros((T, H), dtype=cp.float32)
        add("rms_norm", graph_us(lambda i: be._rms_norm(x["qkv"], nw, 1e-6, h)))
        xx = x["qkv"].copy()
        add("add_rms_norm", graph_us(lambda i: be._add_rms_norm(xx, x["qkv"], nw, 1e-6, h)))
        threads = rope_threads(Hq, Hkv, D)
        add("rope_write_kv", graph_us(lambda i: be.k.rope_write_kv(
            (T,), (threads,), (qkv, db.positions, be.inv_freq, db.slots, be.k_cache[0], be.v_cache[0], np.int32(Hq),
                               np.int32(Hkv), np.int32(D), np.int32(bs), NULL))))
        gu = cp.zeros((T, 2 * I), dtype=cp.float32)
        add("silu_mul", graph_us(lambda i: be._silu_mul_for(W["down"], gu)))
    att = cp.zeros((T, Hq * D), dtype=cp.float32)
    kv_bytes = 2 * 2 * T * (a.context + 1) * Hkv * D

    def splits_of(kernel: str) -> int:  # the splits the backend gives `kernel` at this step (be.attn_splits applies)
        return be.decode_tc_splits(T, db.max_len) if kernel == "tc" else be._splits(T, db.max_len, kernel == "gqa")

    cluster = be.attn_cluster
    for kernel in ("partial", "gqa") + (("tc",) if be.decode_tc_supported() else ()):
        be.attn_kernel = kernel
        for S in (None, 1, 4, 8, 16, 32, 64):
            be.attn_splits = S
            for cl in ((0, 8, 16) if kernel == "partial" and S is None else (cluster,)):
                be.attn_cluster = cl  # attn_cluster{8,16} (one launch) where the backend takes it, else partial
                used = be._cluster_size(T, db.max_len) if kernel == "partial" else 0
                auto = used or splits_of(kernel)
                label = (f"attention {'cluster' if used else kernel} splits={S if S else auto}"
                         f"{' (auto)' if S is None else ''}")
                add(label, graph_us(lambda i: be._attention(0, qkv, n_qkv, db, att)), kv_bytes)
    be.attn_splits, be.attn_kernel, be.attn_cluster = None, "auto", cluster
    choice = be._attn_choice(T)
    print(f"  (backend's choice for attention at {T} token(s): {choice}, splits={splits_of(choice)})")
    out = {"attention_choice": choice, "preset": a.like, "tokens": T, "context": a.context,
           "repeat": a.repeat, "pdl": be.k.pdl_capable,
           "copies": {k: len(v) for k, v in Ws.items()},
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
