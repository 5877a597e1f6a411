#!/usr/bin/env bash
# 4-bit under load: GPU tests, AWQ profile B=256 + prefill 256 before/after, serve AWQ vs bf16 at 64/256
set -uo pipefail; export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh; use_wheels || exit 1
R=/tmp/res4; mkdir -p $R
step "GPU tests"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests > $R/gpu_tests.log 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | tail -8
for d in _base .; do
  step "profile 7B AWQ B=256 + prefill 256 ($d)"
  (cd $d && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 256 --context 512 \
    --prefill-len 256 --steps 3 --top 14 --out $R/profile-awq-b256-$(basename $(realpath $d)).json > $R/profile-awq-b256-$(basename $(realpath $d)).txt 2>&1)
  grep -E "step wall|dequant|silu|cast|gemm" $R/profile-awq-b256-$(basename $(realpath $d)).txt | head -24
done
step "decode 7B AWQ one stream"
timeout 150 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-7b-awq.json > $R/decode-7b-awq.log 2>&1; grep -E "ms_per_token" $R/decode-7b-awq.log
[ $SECONDS -lt 330 ] && SERVE_MODELS="qwen2.5-7b-awq qwen2.5-7b" R=$R bash -c '. scripts/gpu_lib.sh; export PYTHONPATH=$PWD:/tmp/site; for m in $SERVE_MODELS; do SERVE_MODEL=$m serve_bench $m; done'
echo "total ${SECONDS}s"
