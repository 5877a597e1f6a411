#!/usr/bin/env bash
# final: all GPU tests; 7B AWQ profile at 64/128/256 + prefill 256 (the GEMM now stops at 64); serve AWQ and bf16
set -uo pipefail; export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh; use_wheels || exit 1
R=/tmp/res6; mkdir -p $R
gpu_tests
step "profile 7B AWQ B=64,128,256 + prefill 256"
timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,128,256 --context 512 --prefill-len 256 --steps 3 --top 14 \
    --out $R/profile-awq.json > $R/profile-awq.txt 2>&1
grep -E "step wall|busy" $R/profile-awq.txt | head -4
[ $SECONDS -lt 330 ] && SERVE_MODELS="qwen2.5-7b-awq qwen2.5-7b" R=$R bash -c '. scripts/gpu_lib.sh; export PYTHONPATH=$PWD:/tmp/site; for m in $SERVE_MODELS; do SERVE_MODEL=$m serve_bench $m; done'
echo "total ${SECONDS}s"
