#!/usr/bin/env bash
# One call on a lent H200 (carry .whl and _silu, ~6 min), what session 12 left unmeasured:
#   1. exp/silu-template (silu_mul_bf16 and silu_mul_bf16_bf16 from one template; ptx-check clean, never run on a
#      GPU): `mkdir _silu && git archive exp/silu-template llmrs tests | tar -x -C _silu` before the call; its kernel
#      and parity tests from that tree; merge it if they pass (the same math as main's two copies);
#   2. the whole GPU suite on main;
#   3. the final default's server figures on this lease: TTFT at a 256-token prompt (fresh prompts), 64 / 256
#      concurrent twice (session 12: TTFT median 9.79-10.00 ms; 256 concurrent 14,857-15,183 tok/s on its leases).
# A second call, if the first leaves time: exp/attn-tc-prefetch (decode_attn_tc prefetching its K/V into L2 before
# pdl_wait, written in session 9 and never run): `git merge exp/attn-tc-prefetch` (it merges cleanly), then
# `bash scripts/gpu_tc_prefetch_check.sh`; if tc wins at one token, ATTN_TC_MIN_TOKENS = 1.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-next}; mkdir -p "$OUT"; R=/tmp/res-next; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
if [ -d _silu ]; then
  step "exp/silu-template: kernel and parity tests"
  (cd _silu && PYTHONPATH=$PWD:/tmp/site timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_cuda_kernels.py tests/test_cuda_parity.py 2>&1 | tail -4)
fi
TEST_TIMEOUT=300 gpu_tests
server_figures next 1207
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
