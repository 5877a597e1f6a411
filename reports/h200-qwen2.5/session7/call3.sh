#!/usr/bin/env bash
# TTFT: where the host time beyond the prefill goes (async scheduling, the engine process), then kernels in graphs
set -uo pipefail; export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh; use_wheels || exit 1
R=/tmp/res3; mkdir -p $R
for v in "LLMRS_X=1" "LLMRS_ASYNC_SCHEDULING=0" "LLMRS_ENGINE_PROCESS=0" "LLMRS_ASYNC_SCHEDULING=0,LLMRS_ENGINE_PROCESS=0"; do
  step "TTFT with $v"
  ( export ${v//,/ }; python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 --port 8123 > $R/serve-${v//[=,]/_}.log 2>&1 ) &
  SRV=$!
  wait_health 8123 150 || { tail -5 $R/serve-${v//[=,]/_}.log; kill $SRV; continue; }
  for n in 1 256; do
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos --workers 1 \
      -o $R -c 1 -n 24 --label ttft-$n --name ttft-${v//[=,]/_}-in$n > /dev/null 2>&1
    python3 -c "
import json,sys; s=json.load(open('$R/ttft-${v//[=,]/_}-in$n.json'))['runs'][0]['summary']; t=s['ttft_ms']
print(f'prompt $n: TTFT min {t[\"min\"]:.2f} p50 {t[\"percentiles\"][\"p50\"]:.2f} mean {t[\"mean\"]:.2f} ({s[\"completed\"]} requests)')"
  done
  python3 -c "import httpx; print('\n'.join(l for l in httpx.get('http://127.0.0.1:8123/metrics').text.splitlines() if 'time_to_first_token_seconds_sum' in l or 'time_to_first_token_seconds_count' in l))"
  pkill -INT -f "llmrs serve"; wait $SRV; sleep 1
done
for p in qwen2.5-0.5b qwen2.5-3b; do
  step "kernels inside graphs, $p"
  timeout 120 python3 scripts/bench_kernels_graph.py --like $p --context 512 > $R/kg-$p.txt 2>&1; tail -32 $R/kg-$p.txt
done
echo "total ${SECONDS}s"
