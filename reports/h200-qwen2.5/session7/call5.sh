#!/usr/bin/env bash
# 4-bit under load, second pass: dequant from the GEMM layout wherever there is one; the gemm_q4 / dequant+cuBLAS
# crossover with the new dequant; profile + serve
set -uo pipefail; export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh; use_wheels || exit 1
R=/tmp/res5; mkdir -p $R
step "4-bit GPU tests"
timeout 200 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_gemm_q4_gpu.py tests/test_gemv_q4_gpu.py tests/test_quant_gpu.py > $R/q4_tests.log 2>&1; grep -E "^(FAILED|ERROR)|passed|failed|^N[0-9]+ K" $R/q4_tests.log | tail -30
step "profile 7B AWQ B=128,256 + prefill 256"
timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256 --context 512 --prefill-len 256 --steps 3 --top 14 \
    --out $R/profile-awq-b256.json > $R/profile-awq-b256.txt 2>&1
grep -E "step wall|dequant|silu|cast|gemm" $R/profile-awq-b256.txt | head -30
[ $SECONDS -lt 330 ] && SERVE_MODELS="qwen2.5-7b-awq" R=$R bash -c '. scripts/gpu_lib.sh; export PYTHONPATH=$PWD:/tmp/site; for m in $SERVE_MODELS; do SERVE_MODEL=$m serve_bench $m; done'
echo "total ${SECONDS}s"
