// matvec.cu: one-warp-per-row bf16 matrix-vector product for decode (and small token counts).
//
//   y[t, n] (= or +=) sum_k x[t, k] * W[n, k] + bias[n]      W bf16 [N, K] row-major, x/y/bias f32
//
// Decode is memory-bound: each weight is used once per token, so the kernel's job is to stream W at full
// bandwidth. Each warp owns one output row; its 32 lanes read consecutive 16-byte chunks (8 bf16) of the
// row, four chunks in flight per lane before the first use, and reduce with shuffles (no shared memory).
// NT tokens share each weight load (NT accumulators per lane, compile-time indexed: no local memory);
// grid.y walks the tokens NT at a time. `accumulate` adds into y (the residual stream: x += W a in one pass).
// x is f32 and stays in L1/L2 (each warp of a block re-reads it); K % 8 != 0 takes a scalar path.
// Block = 4 warps (4 rows): small N still spreads over the SMs.
#include "common.cuh"

template <int NT>
__device__ __forceinline__ void fma8(const float* wf, const float* __restrict__ x, int K, int T, int t0, int k0,
                                     float* acc) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        if (t0 + j < T) {
            const float4* xp = reinterpret_cast<const float4*>(x + (size_t)(t0 + j) * K + k0);
            const float4 a = xp[0], b = xp[1];
            acc[j] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w
                    + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
        }
    }
}

template <int NT>
__device__ __forceinline__ void matvec_impl(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            const float* __restrict__ bias, float* __restrict__ y,
                                            int N, int K, int T, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int t0 = blockIdx.y * NT;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j] = 0.0f;
    const bf16_t* w = W + (size_t)n * K;
    if ((K & 7) == 0) {
        const uint4* w4 = reinterpret_cast<const uint4*>(w);
        const int K8 = K >> 3;
        int c = lane;
        for (; c + 96 < K8; c += 128) {
            const uint4 w0 = __ldg(w4 + c), w1 = __ldg(w4 + c + 32), w2 = __ldg(w4 + c + 64), w3 = __ldg(w4 + c + 96);
            float wf[8];
            unpack8(w0, wf); fma8<NT>(wf, x, K, T, t0, 8 * c, acc);
            unpack8(w1, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + 32), acc);
            unpack8(w2, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + 64), acc);
            unpack8(w3, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + 96), acc);
        }
        for (; c < K8; c += 32) {
            float wf[8];
            unpack8(__ldg(w4 + c), wf);
            fma8<NT>(wf, x, K, T, t0, 8 * c, acc);
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            const float wk = bf16_to_f32(w[k]);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                if (t0 + j < T) acc[j] += wk * x[(size_t)(t0 + j) * K + k];
        }
    }
    const float b = bias ? bias[n] : 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float s = warp_sum(acc[j]);
        if (lane == 0 && t0 + j < T) {
            float* dst = y + (size_t)(t0 + j) * N + n;
            *dst = accumulate ? *dst + (s + b) : s + b;
        }
    }
}

#define MATVEC(NT)                                                                                        \
    extern "C" __global__ void matvec_bf16_t##NT(const bf16_t* __restrict__ W, const float* __restrict__ x, \
                                                 const float* __restrict__ bias, float* __restrict__ y,     \
                                                 int N, int K, int T, int accumulate) {                     \
        matvec_impl<NT>(W, x, bias, y, N, K, T, accumulate);                                              \
    }
MATVEC(1)
MATVEC(2)
MATVEC(4)
MATVEC(8)
