// embedding.cu: out[t, :] = float(table[ids[t], :])  (bf16 table [V, H] -> f32 rows [T, H]).
// One block per token; threads stride over the row (the gather reads one row per token: tiny traffic).
#include "common.cuh"

extern "C" __global__ void embedding_gather(const bf16_t* __restrict__ table, const int* __restrict__ ids,
                                            float* __restrict__ out, int H) {
    const int t = blockIdx.x;
    const bf16_t* row = table + (size_t)ids[t] * H;
    float* o = out + (size_t)t * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = bf16_to_f32(row[i]);
}
