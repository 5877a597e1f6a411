#!/usr/bin/env bash
# session 20 call3 (one call, carry .whl): attn_cluster's splits pushed into the merging block's shared memory
# (new default; LLMRS_ATTN_CLUSTER_PUSH=0 = the pull form before it, a second barrier), then the figures:
#   1. the cluster / reduce-scatter bit-identity tests and the parity tests;
#   2. attn_cluster's phase clocks, push / pull (7B);
#   3. best of 3 a process, push / pull / push again (7B, 3B); the winner (7B) exported for what follows;
#   4. `llmrs synth --decode-bench` one run each (7B, 3B, 0.5B, 7B AWQ: the README's figures);
#   5. one server: TTFT at a 256-token prompt (24 requests), then 256 concurrent twice.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s20c3; mkdir -p $R
ms() { grep -E '^ +full:' $1 | awk '{print $2}'; }
{
step "tests"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cluster_gpu.py \
  tests/test_attention_sum8_gpu.py tests/test_cuda_parity.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
step "phase clocks (7B)"
for push in 1 0; do
  LLMRS_ATTN_CLUSTER_PUSH=$push timeout 90 python3 scripts/attn_clocks.py --like qwen2.5-7b \
    --json $R/clk-push$push.json > $R/clk-push$push.log 2>&1
  echo "push $push:"; tail -10 $R/clk-push$push.log
done
step "decode best of 3 a process"
for p in qwen2.5-7b qwen2.5-3b; do
  for run in 1 0 1b; do
    LLMRS_ATTN_CLUSTER_PUSH=${run%b} timeout 90 python3 scripts/ablate_decode.py --like $p --rounds 3 \
      --variants full --json $R/ab-$p-push$run.json > $R/ab-$p-push$run.log 2>&1
    echo "$p push $run: $(ms $R/ab-$p-push$run.log) ms/token"
  done
done
best=$(python3 -c "import sys; a=min(float(x) for x in sys.argv[1:3]); print(1 if a <= float(sys.argv[3]) else 0)" \
  $(ms $R/ab-qwen2.5-7b-push1.log) $(ms $R/ab-qwen2.5-7b-push1b.log) $(ms $R/ab-qwen2.5-7b-push0.log) 2>/dev/null || echo 1)
export LLMRS_ATTN_CLUSTER_PUSH=$best
step "decode benches (LLMRS_ATTN_CLUSTER_PUSH=$best), one run each"
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b qwen2.5-7b:awq; do
  q=${p#*:}; [ "$q" = "$p" ] && q=""; p=${p%%:*}
  timeout 100 python3 -m llmrs synth --like $p ${q:+--quant $q} --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$p$q.json > $R/decode-$p$q.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p$q.json')); print('$p $q', d['ms_per_token'], 'ms/token')"
done
step "server: TTFT, then 256 concurrent twice"
if serve_up s20; then
  ttft_bench ttft-s20 256 8200 "server"
  load_runs bench-7b-s20 2 9700
  serve_down
fi
bench_table $R
echo "servers whose PDL check failed: $(grep -l 'capturing without it\|capturing that graph without it' $R/serve-*.log | wc -l)"
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
