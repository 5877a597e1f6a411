#!/usr/bin/env bash
# session 18 call6 (branch pg-rebased): what a new token count's first cuBLAS call costs
# (scripts/cublas_first_shape.py), then TTFT over prompts of varied lengths (192-576 tokens, each request its own
# length: --input-len 384 --range-ratio 0.5), eager prefill against LLMRS_PREFILL_GRAPHS=1, two fresh servers each.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh && use_wheels || exit 1
R=/tmp/res-c6; mkdir -p $R
{
timeout 120 python3 scripts/cublas_first_shape.py --json $R/first_shape.json | tail -12
for i in 1 2; do
  for pg in 0 1; do
    serve_up var-pg$pg-$i LLMRS_PREFILL_GRAPHS=$pg || continue
    for seed in 1 2; do
      timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 384 --range-ratio 0.5 --output-len 2 \
        --ignore-eos --workers 1 -o $R -c 1 -n 32 --seed $((7000 + 100 * i + 10 * seed)) --label var-pg$pg-$i-$seed \
        --name var-pg$pg-$i-$seed > $R/var-pg$pg-$i-$seed.log 2>&1
      ttft_line $R/var-pg$pg-$i-$seed.json 384 "LLMRS_PREFILL_GRAPHS=$pg server $i pass $seed (192-576)"
    done
    serve_down
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
