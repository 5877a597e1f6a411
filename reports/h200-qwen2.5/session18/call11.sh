#!/usr/bin/env bash
# session 18 call11 (main + early loads pinned before pdl_wait, default on; LLMRS_EARLY_LOADS=0 the code before):
# the last ~4 device minutes. Best-of-3 one-stream decode (scripts/ablate_decode.py), early loads on vs off in
# separate processes (a compiled-in switch), with matvec_rows for o as a variant; the GPU tests that check it
# between the A/Bs (graph replay = eager step, with PDL; the matvec kernels; the 4-bit GEMV).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh && use_wheels >/dev/null || exit 1
ab() {  # PRESET EARLY VARIANTS [QUANT]
  LLMRS_EARLY_LOADS=$2 timeout 60 python3 scripts/ablate_decode.py --like $1 ${4:+--quant $4} --rounds 3 \
    --variants "$3" --json $OUT/ab-$1${4:+-$4}-early$2.json 2>&1 | sed -n '/^---/,$p' | sed "s/^/[early=$2] /"
}
{
ab qwen2.5-7b 1 "full/set:matvec_rows=True"
ab qwen2.5-7b 0 "full"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -2
ab qwen2.5-3b 1 "full/set:matvec_rows=True"
ab qwen2.5-3b 0 "full"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -k "matvec or long_k" 2>&1 | tail -2
ab qwen2.5-7b 1 "full" awq
ab qwen2.5-7b 0 "full" awq
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_quant_gpu.py -k "gemv" 2>&1 | tail -2
} 2>&1 | tee $OUT/summary.txt
