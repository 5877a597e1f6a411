#!/usr/bin/env bash
# Session 13, call 2 (carry .whl): attn_cluster (decode attention's splits as one thread-block cluster, merged in
# distributed shared memory: no attn_merge launch), never run before.
#   1. its GPU tests, and the attention / sum8 / kernel tests beside it;
#   2. attention alone inside graphs (scripts/bench_kernels_graph.py --only attention), 7B and 3B at context 512;
#   3. single-stream decode bench (prompt 256, 256 steps): 7B with LLMRS_ATTN_CLUSTER=16 / 0 / 8, 3B and 7B AWQ
#      with 16 / 0, alternated.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13c2; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
step "attn_cluster tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_attention_cluster_gpu.py \
  tests/test_attention_sum8_gpu.py tests/test_attention_tc_gpu.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Error" $R/tests.log | tail -12
for p in qwen2.5-7b qwen2.5-3b; do
  step "attention inside graphs, $p"
  timeout 120 python3 scripts/bench_kernels_graph.py --like $p --context 512 --only attention \
    --json $R/kgraph-$p.json > $R/kgraph-$p.txt 2>&1
  grep -E "attention (cluster|partial) splits=(16|32|33|[0-9]+ \(auto\))|choice" $R/kgraph-$p.txt | head -12
done
db() {  # db LABEL VALUE SYNTH-ARGS...
  local label=$1 v=$2; shift 2
  LLMRS_ATTN_CLUSTER=$v timeout 150 python3 -m llmrs synth "$@" --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$label-$v.json > $R/decode-$label-$v.log 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f'{sys.argv[2]:24s} cluster={sys.argv[3]:3s} {r[\"ms_per_token\"]:.3f} ms/token  {100*r[\"fraction_of_floor_measured\"]:.1f}% of floor')" \
    $R/decode-$label-$v.json $label $v 2>/dev/null || { echo "$label $v: FAILED"; tail -5 $R/decode-$label-$v.log; }
}
step "decode bench"
for v in 16 0 8; do db 7b $v --like qwen2.5-7b; done
for v in 16 0; do db 3b $v --like qwen2.5-3b; done
for v in 16 0; do db 7b-awq $v --like qwen2.5-7b --quant awq; done
db 7b-again 16 --like qwen2.5-7b
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
