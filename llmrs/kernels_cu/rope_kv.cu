// rope_kv.cu: rotary embedding (HF rotate_half layout) fused with writing K and V into the paged cache.
//
// qkv is [T, (Hq + 2 Hkv) * D] f32 (the fused q/k/v projection). For token t at position p, each pair
// (i, i + D/2) of a head rotates by angle p * inv_freq[i] (inv_freq already holds llama3 scaling):
//   y_i = x_i cos - x_{i+D/2} sin,   y_{i+D/2} = x_{i+D/2} cos + x_i sin.
// q is rotated in place. With k_cache != nullptr the rotated k and the unrotated v are written as bf16 to
// slot s = slot_mapping[t]: cache[(s / bs) , head, s % bs, :] of the [blocks, Hkv, bs, D] layout; with
// k_cache == nullptr k is rotated in place instead (the Backend.rope protocol path). With bias != nullptr
// (Qwen2's q/k/v bias, [(Hq + 2 Hkv) * D]) each value is x + bias first: the same f32 add as add_bias after the
// GEMM, one launch fewer (the bias then reaches q in the buffer and k, v in the cache; v stays unbiased in qkv
// when the cache is written, as nothing reads it there).
//   write_kv: the protocol's separate cache write: k, v [T, Hkv * D] f32 -> the two caches.
// One block per token. The angle's sine and cosine: rope_sincos (common.cuh). matvec_rope_bf16 (matvec.cu) does
// the same work in the q/k/v projection's epilogue for decode-sized steps.
// Roof: no fraction recorded; each kernel's time and % of its bandwidth floor in a real step: `llmrs profile
// --synthetic qwen2.5-7b --batch 1,256 --context 512`.
#include "common.cuh"

#define ROPE_MAX_HALF 128  // D <= 256 (the backend's head dims)

extern "C" __global__ void rope_write_kv(float* __restrict__ qkv, const int* __restrict__ positions,
                                         const float* __restrict__ inv_freq, const int* __restrict__ slots,
                                         bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache,
                                         int Hq, int Hkv, int D, int block_size, const float* __restrict__ bias) {
    pdl_enter();
    const int t = blockIdx.x, half = D / 2;
    const float pos = (float)positions[t];
    float* row = qkv + (size_t)t * (Hq + 2 * Hkv) * D;
    const bool write = k_cache != nullptr;
    long long blk = 0;
    int off = 0;
    if (write) {
        const int s = slots[t];
        blk = s / block_size;
        off = s % block_size;
    }
    // the angle depends on (position, i) only: each pair's sine and cosine once a token, not once per head (the
    // same values: 32 + 4 heads of the 7B recomputed them, double-precision range reduction included)
    __shared__ float s_sn[ROPE_MAX_HALF], s_cs[ROPE_MAX_HALF];
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_sincos(__fmul_rn(pos, inv_freq[i]), &s_sn[i], &s_cs[i]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < (Hq + Hkv) * half; idx += blockDim.x) {
        const int h = idx / half, i = idx % half;
        const float sn = s_sn[i], cs = s_cs[i];
        float* p = row + (size_t)h * D;
        float x1 = p[i], x2 = p[i + half];
        if (bias != nullptr) {
            x1 += bias[h * D + i];
            x2 += bias[h * D + i + half];
        }
        const float y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
        if (h < Hq || !write) {
            p[i] = y1;
            p[i + half] = y2;
        } else {
            bf16_t* dst = k_cache + ((blk * Hkv + (h - Hq)) * block_size + off) * (size_t)D;
            dst[i] = f32_to_bf16(y1);
            dst[i + half] = f32_to_bf16(y2);
        }
    }
    float* v = row + (size_t)(Hq + Hkv) * D;
    const float* vb = bias != nullptr ? bias + (size_t)(Hq + Hkv) * D : nullptr;
    if (!write) {
        if (vb != nullptr)
            for (int idx = threadIdx.x; idx < Hkv * D; idx += blockDim.x) v[idx] += vb[idx];
        return;
    }
    for (int idx = threadIdx.x; idx < Hkv * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        float x = v[idx];
        if (vb != nullptr) x += vb[idx];
        v_cache[((blk * Hkv + h) * block_size + off) * (size_t)D + d] = f32_to_bf16(x);
    }
}

extern "C" __global__ void write_kv(const float* __restrict__ k, const float* __restrict__ v,
                                    const int* __restrict__ slots, bf16_t* __restrict__ k_cache,
                                    bf16_t* __restrict__ v_cache, int Hkv, int D, int block_size) {
    const int t = blockIdx.x, s = slots[t];
    const long long blk = s / block_size;
    const int off = s % block_size;
    for (int idx = threadIdx.x; idx < Hkv * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        const size_t dst = ((blk * Hkv + h) * block_size + off) * (size_t)D + d;
        k_cache[dst] = f32_to_bf16(k[(size_t)t * Hkv * D + idx]);
        v_cache[dst] = f32_to_bf16(v[(size_t)t * Hkv * D + idx]);
    }
}
