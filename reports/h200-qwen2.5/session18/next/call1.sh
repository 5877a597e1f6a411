#!/usr/bin/env bash
# For the next lease (written at the end of session 18, not run): the GPU check of what session 18 left untested,
# run as the third of three back-to-back calls (carry .gguf/p02; the two before moved p00 / p01 of the SmolLM2 GGUF
# to /tmp/models and installed .whl into /tmp/site, as session18/call7 did):
#   1. the whole GPU suite (early loads on, decode attention's q through ldx1, prefill capture on pool blocks);
#   2. the decode benches, 7B / 3B / 0.5B bf16 and 7B AWQ, early loads on and off (LLMRS_EARLY_LOADS=0);
#   3. TTFT on two fresh servers, then 256 concurrent twice on one; every server log grepped for a failed PDL check.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_gguf_thirds || exit 1
R=/tmp/res-next1; mkdir -p $R
{
TEST_TIMEOUT=300 gpu_tests
cp $R/gpu_tests.log $OUT/
for early in 1 0; do
  for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b qwen2.5-7b:awq; do
    q=${p#*:}; [ "$q" = "$p" ] && q=""; p=${p%%:*}
    LLMRS_EARLY_LOADS=$early timeout 100 python3 -m llmrs synth --like $p ${q:+--quant $q} --decode-bench \
      --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-$p$q-e$early.json > $R/decode-$p$q-e$early.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-$p$q-e$early.json')); print('early=$early $p $q', d['ms_per_token'], 'ms/token')"
  done
done
for i in 1 2; do
  serve_up ttft-$i || continue
  ttft_bench ttft-$i 256 $((8100 + 10 * i)) "server $i"
  [ $i = 2 ] && load_runs bench-7b-next 2 9900
  serve_down
done
bench_table $R
echo "servers whose PDL check failed: $(grep -l 'capturing without it\|capturing that graph without it' $R/serve-*.log | wc -l)"
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
