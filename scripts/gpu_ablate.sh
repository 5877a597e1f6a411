#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~3 min): single-stream decode with classes of launches left out of the
# graphed step (scripts/ablate_decode.py): what each costs inside the graph, for the 7B, 7B AWQ, 3B and 0.5B.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-ablate}; mkdir -p "$OUT"; R=/tmp/res-ablate; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
V="full/-norm/-attn/-norm-attn/-o/-qkv/-head/-norm-attn-o-qkv-head/-mlp"
for p in "qwen2.5-7b" "qwen2.5-7b awq" "qwen2.5-3b" "qwen2.5-0.5b"; do
  set -- $p; name=$1${2:+-$2}
  step "ablation $name"
  timeout 150 python3 scripts/ablate_decode.py --like $1 ${2:+--quant $2} --variants "$V" --json $R/ablate-$name.json \
    > $R/ablate-$name.log 2>&1
  sed -n '/^---/,$p' $R/ablate-$name.log; tail -2 $R/ablate-$name.log | grep -i error
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
