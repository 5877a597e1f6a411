#!/usr/bin/env python3
"""Probe: decode_attn_tc's resident blocks an SM under each preferred shared-memory carveout.
Last result (H200): 3 blocks an SM under the driver's default carveout (2 at 75%, 1 at 50%): nothing to gain.

Blocks an SM of decode_attn_tc (prefill_attention.cu) as the occupancy calculator sees them, under each
preferred shared-memory carveout (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT), with its registers and
dynamic shared memory: whether the 7B's 256-decode step could hold three 68 KB blocks an SM instead of two.

    python -m probes.attn_occupancy [--head-dim 128]
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args()
    import cupy as cp

    from llmrs.backends.cuda.kernels import Kernels
    from llmrs.backends.cuda.prefill import TC_BLOCK_K, TC_WARPS

    D = a.head_dim
    k = Kernels(cp)
    smem = TC_WARPS * 2 * 2 * TC_BLOCK_K * D * 2 + 16 * D * 2
    for name in (f"decode_attn_tc_bf16_d{D}", f"decode_attn_tc_d{D}"):
        fn = k.fns[name]
        raw = getattr(fn, "raw", fn)
        raw.max_dynamic_shared_size_bytes = smem
        for carve in (-1, 50, 75, 100):
            raw.preferred_shared_memory_carveout = carve
            n = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(raw.kernel.ptr, TC_WARPS * 32, smem)
            print(f"{name}: {raw.num_regs} registers, {smem} B dynamic shared memory, carveout {carve:4d}: "
                  f"{n} blocks an SM")


if __name__ == "__main__":
    main()
