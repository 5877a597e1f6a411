#!/usr/bin/env bash
# session 18 call7c (main, prefill graphs on by default, long-K split rule; warm, carry .gguf/p02): the two calls
# before moved the SmolLM2 GGUF's p00 / p01 to /tmp/models and installed the wheels into /tmp/site. The whole GPU
# test suite (with the real SmolLM2 Q4_1 weights), the one-stream decode benches, TTFT on two fresh servers.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
export PYTHONPATH=$PWD:/tmp/site
cat /tmp/models/p00 /tmp/models/p01 .gguf/p02 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
export LLMRS_EMBEDDED_DIR=/tmp/models
R=/tmp/res-c7; mkdir -p $R
{
TEST_TIMEOUT=420 gpu_tests
cp $R/gpu_tests.log $OUT/
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b; do
  timeout 100 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 \
    --json $R/decode-$p.json > $R/decode-$p.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p.json')); print('$p', d['ms_per_token'], 'ms/token', d['fraction_of_floor_measured'])"
done
for i in 1 2; do
  serve_up ttft-$i || continue
  ttft_bench ttft-$i 256 $((8000 + 10 * i)) "default server $i"
  serve_down
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
