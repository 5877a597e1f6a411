#!/usr/bin/env bash
# Session 22, call 3 (carry .whl, ~7 min): the rewritten sampler (sampling.cu: a small batch's argmax over several
# blocks a row; radix select 8 bits a pass with fixed-point masses instead of 31 one-bit passes over stored weights;
# coalesced warp ranges) — call1's bench had the old one at 7.5 ms for 256 rows with top_k=50 top_p=0.9.
#   1. the sampling tests (new: several blocks a row, the CPU sampler's tokens at V 151936, ties cut by index), the
#      parity and graph tests;
#   2. bench_sample.py: before / now at 1 and 256 rows, five parameter sets;
#   3. `llmrs synth --decode-bench` one run a process (7B twice, 3B): one stream's greedy argmax now over 18 blocks;
#   4. one server: TTFT at a 256-token prompt (24 requests), 256 concurrent twice greedy, once at temperature 0.8.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s22c3; mkdir -p $R
{
step "tests"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -k "sampl" \
  tests/test_cuda_parity.py tests/test_cuda_graphs.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -12
step "sampler: before / now"
timeout 120 python3 reports/h200-qwen2.5/session22/bench_sample.py --json $R/sample.json 2>&1 | tee $R/sample.log
step "decode benches, one run a process"
for p in qwen2.5-7b:1 qwen2.5-7b:2 qwen2.5-3b:1; do
  n=${p#*:}; p=${p%%:*}
  timeout 100 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 \
    --json $R/decode-$p-$n.json > $R/decode-$p-$n.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-$n.json')); print('$p run $n:', d['ms_per_token'], 'ms/token')"
done
step "server: TTFT, 256 concurrent twice greedy, once at temperature 0.8"
if serve_up s22; then
  ttft_bench ttft-s22 256 8400 "server"
  load_runs bench-7b-s22 2 9800
  timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
    --workers 8 -o $R -c 256 -n 256 --seed 9900 --temperature 0.8 --label bench-7b-s22-t08 --name bench-7b-s22-t08 \
    > $R/bench-7b-s22-t08.log 2>&1
  serve_down
fi
bench_table $R
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
