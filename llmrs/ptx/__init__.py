"""`llmrs ptx-check`: compile the CUDA kernels to PTX (NVRTC) and SASS (ptxas), count local memory use.

A kernel whose accumulators spilled to local memory is correct and several times slow; no test notices.
This package reads the compiled code instead: `ld.local`/`st.local` in the PTX, and ptxas's registers,
spill bytes, stack frame and shared memory, per entry function and architecture. Needs no GPU: NVRTC comes
from `cuda-bindings` + `nvidia-cuda-nvrtc`, ptxas from `nvidia-cuda-nvcc` (`pip install -e '.[ptx]'` in the checkout).
"""
