#!/usr/bin/env bash
# Session 29, call 4 (carry .gguf with the GGUF's last part p03; p00-p02 in /tmp/models from calls 1-3, wheels in
# /tmp/site): the whole GPU suite with the SmolLM2 GGUF, then the server suite and the engine-process tests on cuda
# (the default engine-process mode): what session 28 wrote without a GPU run, and this session's idle spin.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s29}; mkdir -p "$OUT"; R=/tmp/res-s29c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_gguf_thirds || echo "no GGUF: its tests skip"
sha256sum /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-16
{
TEST_TIMEOUT=290 gpu_tests
step "server suite + engine-process tests on cuda (engine process)"
LLMRS_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_server.py \
  tests/test_engine_process.py > $R/server_cuda.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/server_cuda.log | tail -8
} 2>&1 | tee $OUT/call4.log
cp $R/*.log $R/*.jsonl $OUT/ 2>/dev/null
