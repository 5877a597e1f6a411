#!/usr/bin/env bash
# One call on a lent H200: every GPU test, the 4-bit decode figures, the decode attention kernels side by side
# (llmrs profile), and the 7B through the server at 64 / 256 concurrent with the chosen kernel.
# Results: $OUT/summary.txt + $OUT/results.tgz (everything). Expects wheels in .whl/.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-final}; mkdir -p "$OUT"; R=/tmp/res; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
use_gguf
{
step "GPU tests"; LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu \
  -p no:cacheprovider -rs tests -s > $R/gpu_tests.log 2>&1; grep -E "^(FAILED|ERROR)|passed|failed|SKIPPED" $R/gpu_tests.log | tail -15
grep -E "GB/s|TFLOP/s" $R/gpu_tests.log | grep -v "prefill_attn" | head -30
if [ -n "${LLMRS_EMBEDDED_DIR:-}" ]; then
  step "server suite on cuda (SmolLM2)"; LLMRS_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/test_server.py 2>&1 | tail -4
fi
for p in qwen2.5-0.5b qwen2.5-7b; do
  step "decode bench $p awq"; timeout 100 python3 -m llmrs synth --like $p --quant awq --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$p-awq.json 2>&1 | grep -E "ms_per_token|fraction_of_floor_meas|rror"
done
for k in ${PROFILE_KERNELS-partial gqa}; do
  step "profile 7B decode, attention kernel $k"
  LLMRS_ATTN_KERNEL=$k timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 512 \
    --prefill-len 256 --steps 4 --top 6 --out $R/profile-7b-$k.json > $R/profile-7b-$k.txt 2>&1
  sed -n 1,16p $R/profile-7b-$k.txt; grep -E "attn_|attention" $R/profile-7b-$k.txt | head -6
done
step "serve synthetic qwen2.5-7b (attention ${SERVE_ATTN:-auto}): 1, 64, 256 concurrent"
LLMRS_ATTN_KERNEL=${SERVE_ATTN:-auto} python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 \
  --port 8123 >$R/serve-7b.log 2>&1 &
SRV=$!
wait_health 8123 120
timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos --workers 8 \
  -o $R -c 1 -n 3 --label llmrs-h200-7b --name bench-7b-final-c1 2>&1 | grep -E "TTFT|TPOT" | head -4
timeout 150 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos --workers 8 \
  -o $R --sweep concurrency=64,256 -n 256 --label llmrs-h200-7b --name bench-7b-final 2>&1 | tail -8
kill -INT $SRV; wait $SRV
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
