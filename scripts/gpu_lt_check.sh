#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~6 min): the bf16 GEMMs through cuBLASLt (LLMRS_CUBLASLT=1, cuda_lt.LtGemm,
# written in the sixteenth session without device time) against cublasGemmEx:
#   1. tests/test_cuda_lt_gpu.py (the bindings: Lt equals gemmEx up to summation order), then the graph and parity
#      tests with the switch on (decode graphs capture the Lt calls too);
#   2. scripts/prefill_host_profile.py off / on: the 7B's 256-token eager prefill, host enqueue and GPU (session 16
#      call9: 7.05-7.40 ms enqueue, cuBLAS ~26 us a call);
#   3. TTFT, one 256-token prompt at a time, four fresh servers each way (untraced);
#   4. the 7B one-stream decode bench and the 256-concurrent server with it on (no regression?).
# If it is right and the enqueue drops: on by default (cuda.py, LLMRS_CUBLASLT), README and the report updated.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-lt}; mkdir -p "$OUT"; R=/tmp/res-lt; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
TEST_TIMEOUT=120 TEST_PATHS="tests/test_cuda_lt_gpu.py" gpu_tests
step "graph and parity tests with LLMRS_CUBLASLT=1"
LLMRS_CUBLASLT=1 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py \
  tests/test_cuda_parity.py > $R/tests-lt.log 2>&1; tail -3 $R/tests-lt.log
for lt in 0 1; do
  step "prefill host profile, LLMRS_CUBLASLT=$lt"
  LLMRS_CUBLASLT=$lt timeout 150 python3 scripts/prefill_host_profile.py --prompts 6 --top 12 \
    > $R/prefill-host-lt$lt.txt 2>&1; head -3 $R/prefill-host-lt$lt.txt
done
for i in 1 2 3 4; do
  for lt in 0 1; do
    serve_up ttft-lt$lt-$i LLMRS_CUBLASLT=$lt || continue
    ttft_bench ttft-lt$lt-$i 256 $((5000 + 10 * i + lt)) "LLMRS_CUBLASLT=$lt server $i"
    serve_down
  done
done
step "7B one stream and 256 concurrent with LLMRS_CUBLASLT=1"
LLMRS_CUBLASLT=1 timeout 100 python3 -m llmrs synth --like qwen2.5-7b --decode-bench --bandwidth-gbs 4296 \
  --prompt-len 256 --steps 256 --json $R/decode-7b-lt.json > $R/decode-7b-lt.log 2>&1
python3 -c "import json,sys; print('7B one stream', round(json.load(open(sys.argv[1]))['ms_per_token'], 3), 'ms')" \
  $R/decode-7b-lt.json 2>/dev/null || tail -3 $R/decode-7b-lt.log
serve_up bench-lt LLMRS_CUBLASLT=1 && { load_bench bench-7b-lt-c256 256 5900; serve_down; }
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
