#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~3 min): the 7B's TTFT at a 256-token prompt with the early write of an
# add to the engine core (LLMRS_EARLY_FLUSH=1, the default) against the write at the end of the event-loop pass
# (=0), alternated twice, each through llmrs bench's http1 client and httpx; then one traced run of each
# (LLMRS_TRACE_FILE: add_request -> cmd_sent -> core_recv -> step_planned / step_launched -> client_first).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-ttft}; mkdir -p "$OUT"; R=/tmp/res-ttft; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
N=${N:-24}
{
for round in 1 2; do
  for ef in 0 1; do
    step "round $round, LLMRS_EARLY_FLUSH=$ef"
    LLMRS_EARLY_FLUSH=$ef python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 \
      --port 8123 >"$R/serve-ef$ef-r$round.log" 2>&1 &
    SRV=$!
    if wait_health 8123 150; then
      for client in http1 httpx; do
        name=ttft-ef$ef-r$round-$client
        LLMRS_BENCH_HTTPX=$([ $client = httpx ] && echo 1 || echo 0) timeout 60 python3 -m llmrs bench \
          --url http://127.0.0.1:8123 --input-len 256 --output-len 2 --ignore-eos --workers 1 -o $R -c 1 -n $N \
          --seed $(( round * 10 + $([ $client = http1 ] && echo 1 || echo 2) )) --label $name --name $name > "$R/bench-$name.log" 2>&1
        ttft_line "$R/$name.json" 256 "early_flush=$ef $client"
      done
    fi
    kill -INT $SRV; wait $SRV
  done
done
for ef in 0 1; do
  step "traced, LLMRS_EARLY_FLUSH=$ef"
  rm -f $R/trace-ef$ef.txt
  LLMRS_EARLY_FLUSH=$ef LLMRS_TRACE_FILE=$R/trace-ef$ef.txt python3 -m llmrs serve --synthetic qwen2.5-7b \
    --device cuda --max-num-seqs 256 --port 8123 >"$R/serve-traced-ef$ef.log" 2>&1 &
  SRV=$!
  if wait_health 8123 150; then
    LLMRS_TRACE_FILE=$R/trace-ef$ef.txt timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 \
      --input-len 256 --output-len 2 --ignore-eos --workers 1 -o $R -c 1 -n $N --label traced-ef$ef \
      --name traced-ef$ef > "$R/bench-traced-ef$ef.log" 2>&1
    python3 scripts/ttft_trace.py $R/trace-ef$ef.txt --skip 2 --json $R/trace-ef$ef.json
  fi
  kill -INT $SRV; wait $SRV
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
