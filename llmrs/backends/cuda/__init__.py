"""The CuPy CUDA backend (backend.py's docstring says what lives where). The names other packages import."""

from llmrs.backends.cuda.backend import (CUBLAS_WORKSPACE_BYTES, CUDABackend, CUDAModel, _cublas_workspaces,
                                         _import_cupy, cuda_available, gpu_name_memory)
from llmrs.backends.cuda.batch import DeviceBatch
from llmrs.backends.cuda.dispatch import (ATTN_MAXG, ATTN_O_MAX_ROWS, ATTN_THREADS, ATTN_TC_MIN_TOKENS,
                                          MATVEC_LONG_K_MIN_WARPS, MATVEC_MAX_TOKENS, CudaOptions, gemm_rows,
                                          rope_threads)
from llmrs.backends.cuda.kernels import NULL
from llmrs.backends.cuda.linear import room_bytes
from llmrs.backends.cuda.sampler import SampledOnDevice, needs_cpu_sampler

__all__ = ["ATTN_MAXG", "ATTN_O_MAX_ROWS", "ATTN_TC_MIN_TOKENS", "ATTN_THREADS", "CUBLAS_WORKSPACE_BYTES",
           "CUDABackend", "CUDAModel", "CudaOptions", "DeviceBatch", "MATVEC_LONG_K_MIN_WARPS", "MATVEC_MAX_TOKENS",
           "NULL", "SampledOnDevice", "_cublas_workspaces", "_import_cupy", "cuda_available", "gemm_rows",
           "gpu_name_memory", "needs_cpu_sampler", "room_bytes", "rope_threads"]
