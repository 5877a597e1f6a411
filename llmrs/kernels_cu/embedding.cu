// embedding.cu: out[t, :] = float(table[ids[t] - start, :]) for ids in [start, start + rows), zeros otherwise
// (bf16 table [rows, H] -> f32 rows [T, H]). One GPU passes start 0 and rows = vocab; a tensor-parallel rank
// holds the vocabulary slice [start, start + rows) and the all-reduce after it sums the ranks' rows.
// One block per token; threads stride over the row (the gather reads one row per token: tiny traffic).
// Roof: no fraction recorded; each kernel's time and % of its bandwidth floor in a real step: `llmrs profile
// --synthetic qwen2.5-7b --batch 1,256 --context 512`.
#include "common.cuh"

extern "C" __global__ void embedding_gather(const bf16_t* __restrict__ table, const int* __restrict__ ids,
                                            float* __restrict__ out, int H, int start, int rows) {
    pdl_enter();
    const int t = blockIdx.x;
    const int local = ids[t] - start;
    float* o = out + (size_t)t * H;
    if (local < 0 || local >= rows) {
        for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    const bf16_t* row = table + (size_t)local * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = bf16_to_f32(row[i]);
}

// feed_tokens: ids[t] = prev[feed[t]] where feed[t] >= 0, else ids[t] unchanged. Async scheduling: a step planned
// before the previous step's samples reached the host takes them here, from the sampler's output on the device.
extern "C" __global__ void feed_tokens(int* __restrict__ ids, const int* __restrict__ feed,
                                       const int* __restrict__ prev, int T) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T && feed[t] >= 0) ids[t] = prev[feed[t]];
}
