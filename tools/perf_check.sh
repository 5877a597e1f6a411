#!/usr/bin/env bash
# One lent H200 (or GPU 0 of a bigger machine): every GPU test, then the issue-8 figures for synthetic Qwen2.5
# (reports/h200/): single-stream decode (0.5B, 3B, 7B bf16 and the 7B AWQ), the 7B through the server at
# 1 stream (C1_REQUESTS, default 16: TTFT, TPOT) and 64 / 256 concurrent (prompt 256, 256 new tokens), and the 7B
# profile at 1 / 64 / 256. Expects wheels of what the machine lacks in .whl/; the SmolLM2 GGUF (for its parity and
# server tests) as /tmp/models/part1 from an earlier call of the same lease + .gguf/part2 carried (joined here).
# Results: $OUT/summary.txt + $OUT/results.tgz. SKIP_TESTS=1 / SKIP_BENCH=1 skip parts.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-perf-out}; mkdir -p "$OUT"; R=/tmp/res-perf; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
use_gguf
{
step "GPU"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "GPU tests"; LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rs tests > $R/gpu_tests.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|SKIPPED" $R/gpu_tests.log | tail -15
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
for p in qwen2.5-0.5b qwen2.5-3b qwen2.5-7b; do
  step "decode bench $p"; timeout 100 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json "$R/decode-$p.json" 2>&1 | grep -E "ms_per_token|fraction_of_floor|rror"
done
step "decode bench qwen2.5-7b awq"; timeout 150 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench \
  --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json "$R/decode-qwen2.5-7b-awq.json" 2>&1 \
  | grep -E "ms_per_token|fraction_of_floor|rror"
step "serve synthetic qwen2.5-7b: 1, 64, 256 concurrent"
python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 --port 8123 >"$R/serve-7b.log" 2>&1 &
SRV=$!
wait_health 8123 120
B="python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos --workers 8 -o $R"
timeout 90 $B -c 1 -n ${C1_REQUESTS:-16} --label llmrs-h200-7b --name bench-7b-c1 2>&1 | tail -8
timeout 150 $B --sweep concurrency=64,256 -n 256 --label llmrs-h200-7b --name bench-7b 2>&1 | tail -8
kill -INT $SRV; wait $SRV
step "profile qwen2.5-7b"; timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1,64,256 --context 512 \
  --steps 5 --top 10 --out "$R/profile-7b.json" >"$R/profile-7b.txt" 2>&1; head -14 "$R/profile-7b.txt"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
