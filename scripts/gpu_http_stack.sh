#!/usr/bin/env bash
# One call on a lent H200 (carry .whl and .whl-uv; ~5 min): uvicorn's HTTP stack A/B for `llmrs serve`
# (LLMRS_HTTP_STACK): "h11" (asyncio + h11: what `pip install llmrs[serve]` gives) against "auto" with uvloop and
# httptools importable (the wheels in .whl-uv/, on the server's path only; the bench client stays on asyncio),
# alternated twice: the 7B's TTFT at prompts 1 and 256 (one request at a time, a fresh server: a cold prefix cache),
# then 64 and 256 concurrent (prompt 256, 256 new tokens).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-stack}; mkdir -p "$OUT"; R=/tmp/res-stack; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-uv \
  .whl-uv/*.whl || exit 1
{
for round in 1 2; do
  for stack in h11 auto; do
    step "round $round, LLMRS_HTTP_STACK=$stack"
    SP=$PYTHONPATH; [ $stack = auto ] && SP=$PYTHONPATH:/tmp/site-uv
    serve_up $stack-r$round PYTHONPATH=$SP LLMRS_HTTP_STACK=$stack || continue
    for n in 1 256; do ttft_bench ttft-$stack-r$round-in$n $n $((round * 100 + n)) "$stack r$round"; done
    for c in 64 256; do load_bench bench-7b-$stack-r$round-c$c $c $((round * 1000 + c)); done
    serve_down
  done
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
