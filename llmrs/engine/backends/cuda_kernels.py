"""The CUDA kernels of llmrs/kernels_cu/, compiled once per process through `cupy.RawModule` (NVRTC).

Each `.cu` file is compiled for the GPU's own architecture the first time a process asks for it; CuPy keeps
the compiled module on disk (~/.cupy/kernel_cache), so later processes only load it. `common.cuh` is
pasted into each source before compiling (rather than `-I`): the disk cache is keyed by the source text, so
an edit to the header must change the key. `get_kernels()` compiles every file and looks up every entry
point at once: the backend calls it at start (warm-up), never on a request's path.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels_cu"
OPTIONS = ("-std=c++17",)

# file -> entry points (extern "C")
ENTRY_POINTS: dict[str, list[str]] = {
    "embedding.cu": ["embedding_gather"],
    "rmsnorm.cu": ["rms_norm", "add_rms_norm", "rms_norm_bf16", "add_rms_norm_bf16"],
    "elementwise.cu": ["silu_mul", "add_bias", "add_inplace", "cast_f32_bf16", "silu_mul_bf16"],
    "rope_kv.cu": ["rope_write_kv", "write_kv"],
    "matvec.cu": ["matvec_bf16_t1", "matvec_bf16_t2", "matvec_bf16_t4", "matvec_bf16_t8"],
    "matvec_q4.cu": [f"matvec_{k}_t{nt}" for k in ("q4z", "q4m", "q8") for nt in (1, 2, 4, 8)]
                    + ["dequant_q4_bf16", "dequant_q8_bf16"],
    "attention.cu": ["attn_partial_d1", "attn_partial_d2", "attn_partial_d4", "attn_partial_d8", "attn_merge"],
    "attention_gqa.cu": ["attn_partial_gqa_d1", "attn_partial_gqa_d2", "attn_partial_gqa_d4", "attn_partial_gqa_d8"],
    "prefill_attention.cu": ["prefill_attn_d64", "prefill_attn_d128"],
    "sampling.cu": ["sample_tokens"],
    "gemm_q4.cu": [f"gemm_{k}_m{mt}" for k in ("q4z", "q4m") for mt in (1, 2, 4)] + ["gemm_q4_reduce"],
}

_lock = threading.Lock()
_cache: dict[int, "Kernels"] = {}


def kernel_source(name: str) -> str:
    """The file's source with `#include "common.cuh"` replaced by the header's text."""
    common = (KERNELS_DIR / "common.cuh").read_text().replace("#pragma once", "")
    src = (KERNELS_DIR / name).read_text()
    return re.sub(r'#include\s+"common\.cuh"', lambda _: common, src)


class Kernels:
    """Every entry point as a `cupy.RawKernel`-like callable: `k.rms_norm(grid, block, args)`."""

    def __init__(self, cp: Any):
        self.modules: dict[str, Any] = {}
        self.fns: dict[str, Any] = {}
        for fname, names in ENTRY_POINTS.items():
            mod = cp.RawModule(code=kernel_source(fname), options=OPTIONS)
            self.modules[fname] = mod
            for n in names:
                self.fns[n] = mod.get_function(n)  # compiles (or loads from the disk cache) now

    def __getattr__(self, name: str) -> Any:
        try:
            return self.fns[name]
        except KeyError:
            raise AttributeError(name) from None


def get_kernels() -> Kernels:
    """The current device's kernels, compiled on first use in this process."""
    import cupy as cp

    dev = cp.cuda.Device().id
    with _lock:
        if dev not in _cache:
            _cache[dev] = Kernels(cp)
        return _cache[dev]
