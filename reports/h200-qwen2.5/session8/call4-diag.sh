. scripts/gpu_lib.sh; use_wheels
for env in "X=1" "LLMRS_ATTN_AHEAD=1" "LLMRS_PDL=0" "LLMRS_ATTN_KERNEL=gqa" "LLMRS_KV_PREFETCH=0"; do
  echo "== $env"; env $env timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py -k replay 2>&1 | tail -1
done
