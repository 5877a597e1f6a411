#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU machine (nvidia-h200-x2 here): the TP tests, the whole server suite at
# TP=2, then (unless SKIP_BENCH=1) the synthetic Qwen2.5-72B figures: roofline --tp 2, profile, bench at 1 / 64 /
# 256 concurrent. Results land in $OUT. Expects wheels of what the machine lacks in .whl/.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/llmrs-tp-out}; mkdir -p "$OUT"
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
TP=${TP:-2}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "GPUs"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m | head -5
  # a test still running after 90 s prints every thread's stack (and each worker its own, LLMRS_TP_STACKS) before
  # the outer timeout can kill it, so a hang shows where it waits
  step "TP tests"; LLMRS_TP_STACKS=90 LLMRS_GPU_REPORT=$OUT/tp_figures.jsonl timeout ${TP_TEST_TIMEOUT:-300} \
    python3 -m pytest -x -v -s -p no:cacheprovider --durations=0 -o faulthandler_timeout=90 tests/gpu/test_tp_gpu.py 2>&1 \
    | tee "$OUT/tp_tests.log" \
    | grep -E "PASS|FAIL|ERROR|Error|error|passed|failed|slowest|s call|Timeout|File " | head -60
fi
if [ "${SKIP_SERVER:-0}" != 1 ]; then
  # SmolLM2 (3 KV heads) with its heads widened so TP divides them (the same logits: tests/tp_widen.py); a random
  # Qwen2.5-0.5B (2 KV heads) where the embedded GGUF is absent (its near-uniform sampling makes the seeded test flaky)
  if python3 -m tests.tp_widen smollm2-135m /tmp/smollm2-tp$TP --tp $TP >/dev/null 2>"$OUT/widen.err"; then
    TM=/tmp/smollm2-tp$TP
  else
    cat "$OUT/widen.err" | tail -2; timeout 120 python3 -m llmrs synth --like qwen2.5-0.5b --out /tmp/q05 >/dev/null; TM=/tmp/q05
  fi
  step "server suite at TP=$TP on $TM"
  LLMRS_TEST_DEVICE=cuda LLMRS_TEST_TP=$TP LLMRS_TEST_MODEL=$TM timeout ${SERVER_TIMEOUT:-240} python3 -m pytest -q \
    -p no:cacheprovider tests/server/test_server.py 2>&1 | tee "$OUT/server_tp_tests.log" | tail -15
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
M=${M:-qwen2.5-72b}
step "roofline $M --tp $TP"; python3 -m llmrs roofline -m $M --gpu h200 --tp $TP --batch 1,64,256 --context 512 2>&1 | tail -20
step "profile $M TP=$TP"; timeout 300 python3 -m llmrs profile --synthetic $M --tensor-parallel-size $TP --batch 1,64 \
  --context 512 --steps 5 -o "$OUT/profile-$M-tp$TP.json" 2>&1 | tee "$OUT/profile-$M-tp$TP.txt" | head -40
step "bench $M TP=$TP: 1, 64, 256 concurrent (prompt 256, 256 new tokens)"
python3 -m llmrs serve --synthetic $M --tensor-parallel-size $TP --device cuda --max-num-seqs 256 --port 8124 \
  >"$OUT/serve-$M-tp$TP.log" 2>&1 &
SRV=$!
wait_health 8124 300
B="python3 -m llmrs bench --url http://127.0.0.1:8124 --input-len 256 --ignore-eos --workers 8 -o $OUT"
timeout 90 $B -c 1 -n 2 --output-len 256 --label llmrs-h200x$TP-$M --name bench-$M-tp$TP-c1 2>&1 | tail -4
timeout ${BENCH_TIMEOUT:-240} $B --sweep concurrency=64,256 -n 256 --output-len 256 --label llmrs-h200x$TP-$M \
  --name bench-$M-tp$TP 2>&1 | tail -8
kill -INT $SRV; wait $SRV
