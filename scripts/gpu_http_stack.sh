#!/usr/bin/env bash
# One call on a lent H200 (carry .whl and .whl-uv; ~5 min): uvicorn's HTTP stack A/B for `llmrs serve`
# (LLMRS_HTTP_STACK): "h11" (asyncio + h11: what `pip install llmrs[serve]` gives) against "auto" with uvloop and
# httptools importable (the wheels in .whl-uv/, on the server's path only; the bench client stays on asyncio),
# alternated twice: the 7B's TTFT at prompts 1 and 256 (one request at a time, a fresh server: a cold prefix cache),
# then serve_bench (1 stream, 64 / 256 concurrent twice, prompt 256, 256 new tokens).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-stack}; mkdir -p "$OUT"; R=/tmp/res-stack; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-uv \
  .whl-uv/*.whl || exit 1
BASE_PATH=$PYTHONPATH
{
for round in 1 2; do
  for stack in h11 auto; do
    step "round $round, LLMRS_HTTP_STACK=$stack"
    SP=$BASE_PATH; [ $stack = auto ] && SP=$BASE_PATH:/tmp/site-uv
    PYTHONPATH=$SP LLMRS_HTTP_STACK=$stack python3 -c "import uvicorn.config as c; import importlib.util as u; \
print('uvloop', u.find_spec('uvloop') is not None, 'httptools', u.find_spec('httptools') is not None)"
    PYTHONPATH=$SP LLMRS_HTTP_STACK=$stack python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda \
      --max-num-seqs 256 --port 8123 >"$R/serve-$stack-r$round.log" 2>&1 &
    SRV=$!
    if wait_health 8123 150; then
      for n in 1 256; do
        name=ttft-$stack-r$round-in$n
        timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos \
          --workers 1 -o $R -c 1 -n 24 --seed $((round * 100 + n)) --label $name --name $name > "$R/$name.log" 2>&1
        ttft_line "$R/$name.json" $n "$stack r$round"
      done
      for c in 64 256; do
        name=bench-7b-$stack-r$round-c$c
        timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 \
          --ignore-eos --workers 8 -o $R -c $c -n 256 --seed $((round * 1000 + c)) --label $stack \
          --name $name > "$R/$name.log" 2>&1
      done
    fi
    kill -INT $SRV; wait $SRV
  done
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
