"""How many clusters of each attn_cluster form the GPU runs at once (cuOccupancyMaxActiveClusters), against the
clusters a one-token step of each Qwen2.5 shape launches (Hkv x heads-per-kv / 4 of the _g4 forms)."""
from llmrs.engine.backends.cuda import CUDABackend
from llmrs.engine.backends.cuda_kernels import max_active_clusters
from llmrs.engine.loader import load

b = CUDABackend(load("synthetic:qwen2.5-7b").config, num_blocks=64, block_size=16)
for cl in (8, 16):
    for name, threads in ((f"attn_cluster{cl}_d4_g4_w16", 512), (f"attn_cluster{cl}_d4_g4", 256),
                          (f"attn_cluster{cl}_d4", 256)):
        fn = getattr(b.k, name, None)
        if fn is None:
            continue
        n = max_active_clusters(fn.raw, (1, b.num_sms // cl, cl), (threads,))
        print(f"{name}: {n} clusters of {cl} at once (SMs {b.num_sms})")
for preset, hkv, hq in (("0.5b", 2, 14), ("1.5b", 2, 12), ("3b", 2, 16), ("7b", 4, 28)):
    print(f"qwen2.5-{preset}: {hkv * -(-(hq // hkv) // 4)} clusters a one-token step (g4)")
