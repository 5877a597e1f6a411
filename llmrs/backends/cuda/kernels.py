"""The CUDA kernels of llmrs/kernels_cu/, compiled once per process through `cupy.RawModule` (NVRTC).

Each `.cu` file is compiled for the GPU's own architecture the first time a process asks for it; CuPy keeps
the compiled module on disk (~/.cupy/kernel_cache), so later processes only load it. `common.cuh` is
pasted into each source before compiling (rather than `-I`): the disk cache is keyed by the source text, so
an edit to the header must change the key. `get_kernels()` compiles every file and looks up every entry
point at once: the backend calls it at start (warm-up), never on a request's path.

Programmatic dependent launch (PDL, sm_90+): the kernels in PDL_KERNELS follow common.cuh's contract
(pdl_trigger, then pdl_wait before touching what an earlier kernel wrote). While `Kernels.pdl` is set (the
decode-graph capture sets it, graphs.py) they are launched through the driver's cuLaunchKernelEx with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so in the graph each one starts while its predecessor
drains (the matvec streams its first weights meanwhile) instead of after a full drain and launch. Outside a
capture they launch through CuPy (a ctypes launch costs more host time than CuPy's). LLMRS_PDL=0 turns it off;
GPUs below compute capability 9.0 never use it.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

import llmrs
from llmrs import envs

KERNELS_DIR = Path(llmrs.__file__).resolve().parent / "kernels_cu"
NULL = np.uint64(0)  # a null pointer argument
# every file's options: LLMRS_CUDA_DEFINES="NAME[=VALUE],..." adds macros (probes such as LLMRS_ATTN_CLOCKS); read
# when the kernels are compiled
def options() -> tuple[str, ...]:
    return ("-std=c++17",) + tuple(f"-D{d}" for d in envs.LLMRS_CUDA_DEFINES)


# gemm_q4.cu's cp.async ring: stages per MT (m16 tiles of tokens a block), compiled in (-DGQ_STAGES_M<MT>) and sized
# at launch (dynamic shared memory, gemm_q4_smem_bytes)
GEMM_Q4_STAGES = {1: 4, 2: 4, 4: 3, 8: 2}
FILE_OPTIONS: dict[str, tuple[str, ...]] = {
    "gemm_q4.cu": tuple(f"-DGQ_STAGES_M{mt}={n}" for mt, n in sorted(GEMM_Q4_STAGES.items())),
}
STATIC_SMEM_LIMIT = 48 << 10  # above, a kernel must be allowed its dynamic shared memory first
# gemm_q4_wgmma.cu's kernels (the Hopper form of the 4-bit GEMM, gemm_q4wg{z,m} and gemm_q4w2{z,m}) need an
# arch-specific target (sm_90a), which CuPy's own compile (sm_90) lacks: Kernels.wgmma_fns() compiles that file for
# it through NVRTC (module_for_arch), where the GPU has one (WGMMA_ARCH); no other target compiles it. The backend
# takes them where QuantLinearOps.wgmma_takes / w2_takes (WGMMA / WGMMA_T256 False: never, for A/Bs).
WGMMA_ARCH: dict[int, str] = {90: "sm_90a"}
WGMMA = True
# the 4-bit wgmma form with 256 tokens a block (gemm_q4w2{z,m}, two warpgroups; where: QuantLinearOps.w2_takes)
WGMMA_T256 = True
WG_SPLITS = (1, 2, 3, 4)  # the cluster sizes (K slices) compiled: gemm_q4wg / q4w2{z,m}_s{S}
# resident at once, gemm_q4wg: __launch_bounds__(128, 2), <= 99 KB of ring each (ptx-check); gemm_q4w2: one
# (quant_linear.W2_BLOCKS_PER_SM)
WG_BLOCKS_PER_SM = 2
GEMM_Q4WG_KERNELS = tuple(f"gemm_q4wg{k}_s{s}" for k in ("z", "m") for s in WG_SPLITS)
GEMM_Q4W2_KERNELS = tuple(f"gemm_q4w2{k}_s{s}" for k in ("z", "m") for s in WG_SPLITS)
# their paired forms (SiLU x up in the epilogue: QuantLinearOps.gemm_q4_silu)
GEMM_Q4WG_PAIR_KERNELS, GEMM_Q4W2_PAIR_KERNELS = (
    tuple(f"gemm_q4{f}{k}_silu_s{s}" for k in ("z", "m") for s in WG_SPLITS) for f in ("wg", "w2"))
ARCH_ENTRY_POINTS: dict[str, list[str]] = {  # file -> its arch-specific entry points (compiled for WGMMA_ARCH only)
    "gemm_q4_wgmma.cu": [*GEMM_Q4WG_KERNELS, *GEMM_Q4W2_KERNELS, *GEMM_Q4WG_PAIR_KERNELS, *GEMM_Q4W2_PAIR_KERNELS]}
# dynamic shared memory, with 1 KB to align the stages to 1024 bytes: GemmQ4WgSmem, GQW_STAGES (4) stages of 16 KB x
# rows + 4 KB codes + 1 KB scale words
GEMM_Q4WG_SMEM_BYTES = 4 * (1024 + 256 + 64) * 16 + 1024
# GemmQ4W2Smem: Q2_STAGES (5) stages of 32 KB x rows (256 tokens) + 4 KB codes + 1 KB scale words; one block an SM
GEMM_Q4W2_SMEM_BYTES = 5 * (2048 + 256 + 64) * 16 + 1024
WGMMA_SMEM_BYTES = {**{n: GEMM_Q4WG_SMEM_BYTES for n in GEMM_Q4WG_KERNELS + GEMM_Q4WG_PAIR_KERNELS},
                    **{n: GEMM_Q4W2_SMEM_BYTES for n in GEMM_Q4W2_KERNELS + GEMM_Q4W2_PAIR_KERNELS}}


def wg_cluster(S: int) -> int:
    """The largest compiled cluster size (WG_SPLITS) of at most S K slices (1 for S < 1)."""
    return max(s for s in WG_SPLITS if s <= max(1, S))


GEMM_Q4_RED_LD = 132  # gemm_q4.cu's WG_RED_LD: floats a row of the accumulators staged in shared memory


def gemm_q4_smem_bytes(mt: int, stages: dict[int, int] | None = None, silu: bool = False) -> int:
    """Dynamic shared memory of gemm_q4{z,m}_m<MT>: GemmQ4Smem<MT> (x rows 16 MT x 8, weights 256, scale words 64;
    16-byte entries) per stage, for `stages` (a module compiled with other -DGQ_STAGES_M*; default GEMM_Q4_STAGES);
    `silu`: gemm_q4{z,m}_silu_m<MT>, whose one-slice epilogue puts the accumulators there too (16 MT rows of
    GEMM_Q4_RED_LD floats), the larger of the two."""
    ring = (GEMM_Q4_STAGES if stages is None else stages)[mt] * (16 * mt * 8 + 256 + 64) * 16
    return max(ring, 16 * mt * GEMM_Q4_RED_LD * 4) if silu else ring


# attn_cluster{CL}_d{DPL} (attention.cu): the cluster sizes of each head-dim form; _g4: a block per 4 query heads;
# _g4_w16: that with 16 warps a block (4 keys each where the 8-warp forms take 8)
ATTN_CLUSTER_KERNELS = [f"attn_cluster{cl}_d{d}" for d, sizes in ((4, (4, 8, 16)), (2, (8, 16))) for cl in sizes] + [
    f"attn_cluster{cl}_d{d}_g4{w}" for d in (4, 2) for cl in (8, 16) for w in ("", "_w16")]
# attn_o_cluster{CL} (attention.cu): one token's attention fused with the o projection (128-dim heads, sm_90+)
ATTN_O_CLUSTER_SIZES = (4, 8)
ATTN_O_KERNELS = [f"attn_o_cluster{cl}" for cl in ATTN_O_CLUSTER_SIZES] + ["attn_o_cluster8_w8"]  # (8 warps)


# the mma.sync GEMM's SiLU forms (gate_up with SiLU x up fused: QuantLinearOps.gemm_q4_silu, 33-192 tokens)
GEMM_Q4_SILU_MT = (4,)
GEMM_Q4_SILU_KERNELS = tuple(f"gemm_{k}_silu_m{mt}" for k in ("q4z", "q4m") for mt in GEMM_Q4_SILU_MT)


# gemv_q4's forms with the group size fixed at compile time (gemm_q4.cu's CPG: k32 blocks a group; G 32 and 128)
GEMV_CPG = (1, 4)
# its paired forms with the follower fused (gemm_q4.cu's GV_EPI_SILU / GV_EPI_ROPE; QuantLinearOps.gemv_q4_pair), each
# also as _nin (GV_NORM_IN: the RMSNorm before it from the producer's x * g and sums of squares)
GEMV_PAIR_KERNELS = [f"gemv_{k}_{e}_c{c}{n}" for e in ("silu", "rope") for k in ("q4z", "q4m") for c in GEMV_CPG
                     for n in ("", "_nin")]
# the plain form writing the next norm's x * g and sums of squares too (GV_NORM_OUT: o and down)
GEMV_NOUT_KERNELS = [f"gemv_{k}_c{c}_nout" for k in ("q4z", "q4m") for c in GEMV_CPG]

SAMPLE_MAX_BLOCKS = 32  # sampling.cu: blocks a row for the max / argmax (one warp merges their partials)
SAMPLE_MIN_SLICE = 8192  # logits a block's slice at least: below that the hand-off costs more than it saves


def sample_row_blocks(rows: int, vocab: int, num_sms: int) -> int:
    """Blocks a row of sample_tokens's grid (S, NB): a small batch (one stream: one row) spreads each row's max /
    argmax over up to SAMPLE_MAX_BLOCKS blocks, so the GPU's SMs share the read rather than one SM doing it; from
    half as many rows as SMs on, one block a row (a row's blocks never exceed the SMs: rows x NB <= num_sms, the
    size of the hand-off's buffers)."""
    return max(1, min(SAMPLE_MAX_BLOCKS, num_sms // max(1, rows), vocab // SAMPLE_MIN_SLICE))


MATVEC_ROWS_R = (4, 8, 16)  # matvec.cu's matvec_rows_bf16_r{R}: one token, rows up to 256 R bf16 held in registers
# file -> entry points (extern "C"): the one table of which kernel lives in which file of KERNELS_DIR
ENTRY_POINTS: dict[str, list[str]] = {
    "embedding.cu": ["embedding_gather", "feed_tokens"],
    "rmsnorm.cu": ["rms_norm", "add_rms_norm", "rms_norm_bf16", "add_rms_norm_bf16"],
    "elementwise.cu": ["silu_mul", "add_bias", "add_inplace", "cast_f32_bf16", "silu_mul_bf16", "silu_mul_bf16_bf16"],
    "rope_kv.cu": ["rope_write_kv", "write_kv"],
    "matvec.cu": [f"matvec_{k}_t{nt}" for k in ("bf16", "silu_bf16", "rope_bf16", "silu_norm_bf16", "rope_norm_bf16")
                  for nt in (1, 2, 4, 8)] + [f"matvec_rows_bf16_r{r}" for r in MATVEC_ROWS_R],
    "matvec_q4.cu": [f"matvec_{k}_t{nt}" for k in ("q4z", "q4m", "q8") for nt in (1, 2, 4, 8)]
                    + ["dequant_q4_bf16", "dequant_q8_bf16"],
    "attention.cu": ["attn_partial_d1", "attn_partial_d2", "attn_partial_d4", "attn_partial_d8", "attn_merge",
                    "attn_merge_bf16"],
    "attention_cluster.cu": ATTN_CLUSTER_KERNELS,
    "attention_o.cu": ATTN_O_KERNELS,
    "attention_gqa.cu": ["attn_partial_gqa_d1", "attn_partial_gqa_d2", "attn_partial_gqa_d4", "attn_partial_gqa_d8"],
    "prefill_attention.cu": ["prefill_attn_d64", "prefill_attn_d128", "prefill_attn_bf16_d64",
                             "prefill_attn_bf16_d128", "decode_attn_tc_d64", "decode_attn_tc_d128",
                             "decode_attn_tc_bf16_d64", "decode_attn_tc_bf16_d128"],
    "sampling.cu": ["sample_tokens"],
    "gemm_q4.cu": [f"gemm_{k}_m{mt}" for k in ("q4z", "q4m") for mt in (1, 2, 4, 8)] + list(GEMM_Q4_SILU_KERNELS)
                  + ["gemm_q4_reduce", "gemm_q4_reduce_silu"],
    "gemv_q4.cu": ["gemv_q4z", "gemv_q4m", "gemv_q4z_t16", "gemv_q4m_t16"]
                  + [f"gemv_{k}{t}_c{c}" for k in ("q4z", "q4m") for t in ("", "_t16") for c in GEMV_CPG]
                  + GEMV_PAIR_KERNELS + GEMV_NOUT_KERNELS,
    "dequant_marlin.cu": ["dequant_marlin_q4z_bf16", "dequant_marlin_q4m_bf16"],
}

# kernels that keep common.cuh's PDL contract (pdl_enter / pdl_trigger + pdl_wait before dependent reads and writes)
PDL_KERNELS = frozenset(
    ["embedding_gather", "rms_norm", "add_rms_norm", "rms_norm_bf16", "add_rms_norm_bf16", "silu_mul", "add_bias",
     "add_inplace", "cast_f32_bf16", "silu_mul_bf16", "silu_mul_bf16_bf16", "rope_write_kv", "attn_merge",
     "attn_merge_bf16", "gemm_q4_reduce", "gemm_q4_reduce_silu", "gemv_q4z", "gemv_q4m", "gemv_q4z_t16",
     "gemv_q4m_t16"] + list(GEMM_Q4_SILU_KERNELS)
    + [f"gemv_{k}{t}_c{c}" for k in ("q4z", "q4m") for t in ("", "_t16") for c in GEMV_CPG] + GEMV_PAIR_KERNELS
    + GEMV_NOUT_KERNELS
    + [f"matvec_{k}_t{nt}" for k in ("bf16", "silu_bf16", "rope_bf16", "silu_norm_bf16", "rope_norm_bf16")
       for nt in (1, 2, 4, 8)]
    + [f"matvec_{k}_t{nt}" for k in ("q4z", "q4m", "q8") for nt in (1, 2, 4, 8)]
    + [f"matvec_rows_bf16_r{r}" for r in MATVEC_ROWS_R]
    + [f"attn_partial_d{d}" for d in (1, 2, 4, 8)] + [f"attn_partial_gqa_d{d}" for d in (1, 2, 4, 8)]
    + ATTN_CLUSTER_KERNELS + ATTN_O_KERNELS
    + [f"gemm_{k}_m{mt}" for k in ("q4z", "q4m") for mt in (1, 2, 4, 8)] + list(GEMM_Q4WG_KERNELS)
    + list(GEMM_Q4W2_KERNELS) + list(GEMM_Q4WG_PAIR_KERNELS) + list(GEMM_Q4W2_PAIR_KERNELS)
    + [f"decode_attn_tc{o}_d{d}" for o in ("", "_bf16") for d in (64, 128)])
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6

_lock = threading.Lock()
_cache: dict[int, "Kernels"] = {}


def kernel_source(name: str) -> str:
    """The file's source with every kernels_cu header it includes inlined (`with_common`): what CuPy compiles."""
    return with_common((KERNELS_DIR / name).read_text())


def with_common(src: str) -> str:
    """CUDA source text with every `#include "NAME.cuh"` of llmrs/kernels_cu/ replaced by the header's text, each
    header once (CuPy compiles a string, so NVRTC has no include path to find them; kernel_source's, and probes'
    own kernels: probes/grid_barrier_bench.py)."""
    seen: set[str] = set()

    def inline(m: re.Match) -> str:
        name = m.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return re.sub(LOCAL_INCLUDE, inline, (KERNELS_DIR / name).read_text().replace("#pragma once", ""))

    return re.sub(LOCAL_INCLUDE, inline, src)


LOCAL_INCLUDE = r'#include\s+"([\w.]+\.cuh)"'


class _LaunchAttr(ctypes.Structure):  # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


_SCALARS = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64,
            "float32": ctypes.c_float, "uint32": ctypes.c_uint32}


def kernel_params(args: tuple) -> tuple[Any, list]:
    """cuLaunchKernelEx's `void **kernelParams` for `args` as CuPy passes them (device arrays -> their pointer,
    numpy scalars -> their C type); returns (the array, the values it points at: keep both alive)."""
    vals: list = []
    for a in args:
        data = getattr(a, "data", None)
        if hasattr(data, "ptr"):  # a cupy.ndarray (its view's own pointer)
            vals.append(ctypes.c_void_p(data.ptr))
        elif type(a).__name__ in _SCALARS:
            vals.append(_SCALARS[type(a).__name__](a.item()))
        else:
            raise TypeError(f"PDL launch: unsupported kernel argument {type(a).__name__} (use numpy scalars)")
    arr = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.addressof(v) for v in vals])
    return arr, vals


def _dim3(d: Any) -> tuple[int, int, int]:
    t = tuple(int(v) for v in (d if isinstance(d, tuple) else (d,)))
    return (t + (1, 1, 1))[:3]


class PdlKernel:
    """A kernel of PDL_KERNELS: launched like a RawKernel; through cuLaunchKernelEx with programmatic stream
    serialization while its Kernels' `pdl` flag is set."""

    __slots__ = ("raw", "owner", "name")

    def __init__(self, raw: Any, owner: "Kernels", name: str):
        self.raw, self.owner, self.name = raw, owner, name

    def __call__(self, grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
        if not self.owner.pdl:
            self.raw(grid, block, args, shared_mem=shared_mem)
            return
        launch_ex(self.raw, grid, block, args, shared_mem, pdl=True, name=self.name)
        self.owner.pdl_launches += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def launch_ex(raw: Any, grid: Any, block: Any, args: tuple, shared_mem: int = 0, pdl: bool = False,
              cluster: Any = None, name: str = "kernel", stream: int | None = None) -> None:
    """Launch a cupy RawKernel through cuLaunchKernelEx on `stream` (default: CuPy's current one): with
    programmatic stream serialization (`pdl`) and / or as thread-block clusters of `cluster` blocks (a dim3;
    sm_90+; the grid a multiple of it), attributes CuPy's launch cannot give."""
    if stream is None:
        import cupy as cp

        stream = cp.cuda.get_current_stream().ptr
    g, b = _dim3(grid), _dim3(block)
    attrs = (_LaunchAttr * 2)()
    n = 0
    if pdl:
        attrs[n].id, attrs[n].value[0] = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1
        n += 1
    if cluster is not None:
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[n].value[0], attrs[n].value[1], attrs[n].value[2] = _dim3(cluster)
        n += 1
    cfg = _LaunchConfig(g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, stream, ctypes.addressof(attrs), n)
    params, _keep = kernel_params(args)
    status = _driver().cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(raw.kernel.ptr), params, None)
    if status:
        raise RuntimeError(f"cuLaunchKernelEx({name}) failed: CUresult {status}")


def max_active_clusters(raw: Any, grid: Any, block: Any, shared_mem: int = 0) -> int:
    """How many clusters of a kernel with compiled-in cluster dimensions (a cupy RawKernel) the GPU runs at once
    (cuOccupancyMaxActiveClusters): a launch of more runs in waves."""
    g, b = _dim3(grid), _dim3(block)
    cfg = _LaunchConfig(g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, None, None, 0)
    n = ctypes.c_int(0)
    lib = _driver()
    fn = lib.cuOccupancyMaxActiveClusters
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    status = fn(ctypes.byref(n), ctypes.c_void_p(raw.kernel.ptr), ctypes.byref(cfg))
    if status:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed: CUresult {status}")
    return n.value


def launch_cluster(fn: Any, grid: Any, block: Any, args: tuple, cluster: Any) -> None:
    """Launch `fn` (a PdlKernel, or a plain RawKernel: bench variants) as clusters of `cluster` blocks, with
    programmatic stream serialization while its Kernels' `pdl` flag is set (a decode-graph capture)."""
    owner = getattr(fn, "owner", None)
    pdl = bool(owner is not None and owner.pdl)
    launch_ex(getattr(fn, "raw", fn), grid, block, args, pdl=pdl, cluster=cluster, name=getattr(fn, "name", "kernel"))
    if pdl:
        owner.pdl_launches += 1


_libcuda: Any = None


def _driver() -> Any:
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuLaunchKernelEx.restype = ctypes.c_int
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.cuFuncSetAttribute.restype = ctypes.c_int
        _libcuda = lib
    return _libcuda


CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14


def allow_nonportable_cluster(raw: Any) -> None:
    """Let a kernel (a cupy RawKernel) run in clusters of more than 8 blocks (sm_90: up to 16)."""
    lib = _driver()
    status = lib.cuFuncSetAttribute(ctypes.c_void_p(raw.kernel.ptr),
                                    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if status:
        raise RuntimeError(f"cuFuncSetAttribute(non-portable cluster size) failed: CUresult {status}")


def pdl_supported(cp: Any) -> bool:
    """Compute capability 9.0+ (griddepcontrol), a driver with cuLaunchKernelEx, and LLMRS_PDL not 0."""
    if not envs.LLMRS_PDL:
        return False
    try:
        if int(cp.cuda.Device().compute_capability) < 90:
            return False
        _driver()
    except (OSError, AttributeError, ValueError):
        return False
    return True


def module_for_arch(cp: Any, source: str, options: tuple[str, ...], arch: str) -> Any:
    """A RawModule of `source` compiled by NVRTC for `arch` (e.g. 'sm_90a') and loaded from a cubin, cached on disk
    beside CuPy's modules (keyed by the source, the options and NVRTC's version; CuPy's `-ftz=true` kept)."""
    import hashlib

    from cupy_backends.cuda.libs import nvrtc

    opts = (*options, "-ftz=true", f"--gpu-architecture={arch}")
    key = hashlib.sha256(repr((source, opts, nvrtc.getVersion())).encode()).hexdigest()[:40]
    cache = Path(envs.external("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")  # CuPy's own default
    path = cache / f"llmrs_{arch}_{key}.cubin"
    if not path.exists():
        prog = nvrtc.createProgram(source, f"llmrs_{arch}.cu", (), ())
        try:
            try:
                nvrtc.compileProgram(prog, opts)
            except nvrtc.NVRTCError as e:
                raise RuntimeError(f"NVRTC for {arch} failed:\n{nvrtc.getProgramLog(prog)}") from e
            cubin = nvrtc.getCUBIN(prog)
        finally:
            nvrtc.destroyProgram(prog)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)  # atomic: concurrent processes write the same bytes
    return cp.RawModule(path=str(path))


class Kernels:
    """Every entry point as a `cupy.RawKernel`-like callable: `k.rms_norm(grid, block, args)`."""

    def __init__(self, cp: Any):
        self.modules: dict[str, Any] = {}
        self.fns: dict[str, Any] = {}
        self.pdl = False  # set while a decode graph is captured (graphs.py), when `pdl_capable`
        self.pdl_capable = pdl_supported(cp)
        self.cc = int(cp.cuda.Device().compute_capability)
        self.pdl_launches = 0
        opts = options()
        for fname, names in ENTRY_POINTS.items():
            mod = cp.RawModule(code=kernel_source(fname), options=opts + FILE_OPTIONS.get(fname, ()))
            self.modules[fname] = mod
            for n in names:
                raw = mod.get_function(n)  # compiles (or loads from the disk cache) now
                m = re.fullmatch(r"gemm_q4[zm](_silu)?_m(\d+)", n)
                if m and gemm_q4_smem_bytes(int(m.group(2)), silu=bool(m.group(1))) > STATIC_SMEM_LIMIT:
                    raw.max_dynamic_shared_size_bytes = gemm_q4_smem_bytes(int(m.group(2)), silu=bool(m.group(1)))
                if n.startswith("attn_cluster16") and self.cc >= 90:
                    allow_nonportable_cluster(raw)  # 16 blocks a cluster (8 is the portable limit)
                self.fns[n] = PdlKernel(raw, self, n) if n in PDL_KERNELS else raw
        # the wgmma GEMMs: compiled now (warm-up) where the backend is to take them
        self.wgmma_arch = WGMMA_ARCH.get(self.cc)
        self._cp, self._wg_fns, self._wg_lock = cp, None, threading.Lock()
        self.wgmma = bool(WGMMA and self.wgmma_arch)  # the 4-bit GEMM's wgmma form (QuantLinearOps.wgmma_takes)
        self.wgmma_t256 = bool(WGMMA_T256 and self.wgmma)  # its 256-token form (QuantLinearOps.w2_takes)
        if self.wgmma:
            self.wgmma_fns()

    def wgmma_fns(self) -> dict[str, Any]:
        """The arch-specific kernels (ARCH_ENTRY_POINTS), compiled for this GPU's target on first use; RuntimeError
        on a GPU without one (WGMMA_ARCH)."""
        with self._wg_lock:
            if self._wg_fns is None:
                if not self.wgmma_arch:
                    raise RuntimeError(f"the wgmma GEMM needs compute capability 9.0 (sm_90a); this GPU: {self.cc}")
                (fname, names), = ARCH_ENTRY_POINTS.items()
                mod = module_for_arch(self._cp, kernel_source(fname), options() + FILE_OPTIONS.get(fname, ()),
                                      self.wgmma_arch)
                fns = {}
                for n in names:
                    raw = mod.get_function(n)
                    raw.max_dynamic_shared_size_bytes = WGMMA_SMEM_BYTES[n]
                    fns[n] = PdlKernel(raw, self, n)
                self._wg_fns = fns
            return self._wg_fns

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
