#!/usr/bin/env bash
# Session 8, call 9 (carry .whl): decode graphs captured at warm-up (LLMEngine.precapture_graphs). The graph tests
# (with the new warm-up one), then `llmrs serve --synthetic qwen2.5-7b --max-num-seqs 256` and, right after it
# answers, a burst of 256 concurrent requests (prompt 256, 256 new tokens): call5 measured the same burst without
# precapture at 13,065 output tok/s, TTFT mean 1,004 ms.
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c9}; mkdir -p $OUT; R=/tmp/res-s8c9; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
step "graph tests"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -2
step "serve 7B with precaptured graphs"
t0=$(date +%s.%N)
python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 --port 8123 > $R/serve.log 2>&1 &
srv=$!
wait_health 8123 150 || { tail -20 $R/serve.log; kill $srv; exit 1; }
echo "ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
  --workers 8 -o $R --sweep concurrency=256 -n 256 --label first-burst --name c256-first 2>&1 | grep -E "TTFT|TPOT|Output|output" | head -6
kill -INT $srv; wait $srv
grep -iE "capture|graph" $R/serve.log | head -5
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
