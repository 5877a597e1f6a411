#!/usr/bin/env bash
# session 21 call1 (one call, carry .whl): gemv_q4's stream-K form (LLMRS_Q4_GEMV_STREAMK, off by default) and the
# coalesced sampler's first pass (on main since this session):
#   1. GPU tests: the 4-bit GEMV (the new stream-K tests force the form), the sampling kernel tests; the 4-bit end to
#      end tests and the graph tests with the stream-K form on;
#   2. the sampler against session 20's kernel (bench_sample.py: same tokens, us at 256 rows);
#   3. scripts/bench_gemv_q4.py: every 7B / 3B decode shape, K slices (auto, 1) against stream-K plans, T = 1 and 4;
#   4. best of 3 a process, 7B AWQ and 3B AWQ, K slices / stream-K in one process (ablate_decode set:);
#   5. `llmrs synth --decode-bench` 7B AWQ, one run each way.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s21c1; mkdir -p $R
ms() { grep -E "^ +$2: " $1 | awk '{print $2}'; }
{
step "tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_q4_gpu.py tests/test_cuda_kernels.py \
  -k "not bandwidth" > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
LLMRS_Q4_GEMV_STREAMK=1 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_quant_gpu.py \
  tests/test_cuda_graphs.py > $R/tests-sk.log 2>&1
echo "with LLMRS_Q4_GEMV_STREAMK=1:"; grep -E "^(FAILED|ERROR)|passed|failed" $R/tests-sk.log | tail -8
step "sampler"
timeout 120 python3 reports/h200-qwen2.5/session20/next/bench_sample.py 2>&1 | tee $R/sample.log
step "bench_gemv_q4"
for p in qwen2.5-7b:1 qwen2.5-3b:1 qwen2.5-7b:4; do
  timeout 150 python3 scripts/bench_gemv_q4.py --preset ${p%%:*} --tokens ${p#*:} --splits 1 \
    --json $R/gemv-${p%%:*}-t${p#*:}.json > $R/gemv-${p%%:*}-t${p#*:}.log 2>&1
  echo "--- ${p}"; grep -vE "^variant" $R/gemv-${p%%:*}-t${p#*:}.log | tail -40
done
step "decode best of 3 a process: K slices / stream-K"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 150 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_streamk=True" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log
done
step "decode bench 7B AWQ, one run each"
for sk in 1 0; do
  LLMRS_Q4_GEMV_STREAMK=$sk timeout 100 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench \
    --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-awq-sk$sk.json > $R/decode-awq-sk$sk.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-awq-sk$sk.json')); print('stream-K $sk', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
