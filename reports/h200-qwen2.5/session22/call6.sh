#!/usr/bin/env bash
# Session 22, call 6 (carry .whl, ~2 min; run twice: the first time with one seed for all three, see COMMANDS.md): the 7B server at 256 concurrent (prompt 256, 256 new tokens) with the
# final sampler: greedy, then `llmrs bench --temperature 0.8 --top-p 0.9 --top-k 50`, then top_p 0.9 alone.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s22c6; mkdir -p $R
{
step "server: 256 concurrent, greedy / top_k + top_p / top_p"
if serve_up s22c6; then
  # a seed each: prompts new to the server (the same seed thrice let the prefix cache skip the later prefills)
  for v in "greedy:9961:" "t08-k50-p09:9962:--temperature 0.8 --top-p 0.9 --top-k 50" "t07-p09:9963:--temperature 0.7 --top-p 0.9"; do
    n=bench-7b-${v%%:*}; seed=$(echo "$v" | cut -d: -f2); v=${v#*:}
    timeout 100 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
      --workers 8 -o $R -c 256 -n 256 --seed $seed ${v#*:} --label $n --name $n > $R/$n.log 2>&1
  done
  serve_down
fi
bench_table $R
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
