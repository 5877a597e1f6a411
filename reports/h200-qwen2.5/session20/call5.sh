#!/usr/bin/env bash
# session 20 call5 (one call, carry .whl): the README's one-stream figures again on a fresh lease, each its own
# process (`llmrs synth --decode-bench`, one run each: 7B three times, 3B twice), then TTFT at a 256-token prompt on
# two fresh servers (24 requests each).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s20c5; mkdir -p $R
{
step "decode benches, one run a process"
for p in qwen2.5-7b:1 qwen2.5-7b:2 qwen2.5-7b:3 qwen2.5-3b:1 qwen2.5-3b:2; do
  n=${p#*:}; p=${p%%:*}
  timeout 100 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 \
    --json $R/decode-$p-$n.json > $R/decode-$p-$n.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$p-$n.json')); print('$p run $n:', d['ms_per_token'], 'ms/token')"
done
for i in 1 2; do
  serve_up ttft-$i || continue
  ttft_bench ttft-$i 256 $((8300 + 10 * i)) "server $i"
  serve_down
done
echo "servers whose PDL check failed: $(grep -l 'capturing without it\|capturing that graph without it' $R/serve-*.log | wc -l)"
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
