#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~6 min): a lone prompt's prefill from CUDA graphs (LLMRS_PREFILL_GRAPHS=1,
# cuda_prefill_graphs; branch exp/prefill-graphs, written without a GPU). Its GPU tests and the decode-graph,
# parity files (the branch moved DecodeGraphs' capture into _capture_db and device_batch's packing into
# pack_batch / unpack_batch), then with it on; TTFT, one 256-token prompt at a time, four fresh servers each way;
# two 256-concurrent runs with it on (no regression?).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-pg}; mkdir -p "$OUT"; R=/tmp/res-pg; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
TEST_TIMEOUT=300 TEST_PATHS="tests/test_prefill_graphs.py tests/test_cuda_graphs.py tests/test_cuda_parity.py" gpu_tests
step "graph + parity tests with LLMRS_PREFILL_GRAPHS=1"
LLMRS_PREFILL_GRAPHS=1 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py \
  tests/test_cuda_parity.py tests/test_prefill_graphs.py > $R/tests-pg.log 2>&1; tail -3 $R/tests-pg.log
for i in 1 2 3 4; do
  for pg in 0 1; do
    serve_up ttft-pg$pg-$i LLMRS_PREFILL_GRAPHS=$pg || continue
    ttft_bench ttft-pg$pg-$i 256 $((6000 + 10 * i + pg)) "LLMRS_PREFILL_GRAPHS=$pg server $i"
    serve_down
  done
done
serve_up load-pg LLMRS_PREFILL_GRAPHS=1 && { load_runs bench-7b-pg 2 6900; serve_down; }
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
