# SASS of gemv_q4z (sm_90) from gemm_q4.cu as NVRTC sees it (common.cuh inlined), via nvcc -cubin + cuobjdump
set -u
PYTHONPATH=. python3 -c "
from llmrs.engine.backends.cuda_kernels import kernel_source
open('/tmp/gemm_q4_full.cu','w').write(kernel_source('gemm_q4.cu'))"
/usr/local/cuda/bin/nvcc -std=c++17 -cubin -arch=sm_90 -o /tmp/gq.cubin /tmp/gemm_q4_full.cu 2>&1 | tail -3
/usr/local/cuda/bin/cuobjdump -sass -fun gemv_q4z /tmp/gq.cubin > $OUT/gemv_q4z.sass 2>&1 || /usr/local/cuda/bin/cuobjdump -sass /tmp/gq.cubin > $OUT/all.sass
wc -l $OUT/*.sass
