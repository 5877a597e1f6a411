// matvec.cu: one-warp-per-row bf16 matrix-vector product for decode (and small token counts).
//
//   y[t, n] (= or +=) sum_k x[t, k] * W[n, k] + bias[n]      W bf16 [N, K] row-major, x/y/bias f32
//
// Decode is memory-bound: each weight is used once per token, so the kernel's job is to stream W at full
// bandwidth. Each warp owns one output row; its 32 lanes read consecutive 16-byte chunks (8 bf16) of the
// row, software-pipelined (the next four chunks in flight while the current four are used), and reduce with
// shuffles (no shared memory). Inside a decode graph the first loads go out before pdl_wait (common.cuh).
// NT tokens share each weight load (NT accumulators per lane, compile-time indexed: no local memory);
// grid.y walks the tokens NT at a time. `accumulate` adds into y (the residual stream: x += W a in one pass).
// x is f32 and stays in L1/L2 (each warp of a block re-reads it); K % 8 != 0 takes a scalar path.
// Block = 4 warps (4 rows, or 4/splits rows of `splits` warps each): small N still spreads over the SMs; the
// host picks splits by shape (few rows, long K: the `down` and o/qkv projections of a 7B decode step).
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
                                            int N, int K, int T, int accumulate, int splits) {
    // splits (1, 2 or 4) warps share one row: warp s of the row reads chunks s*32 + lane + i*32*splits, so the
    // row's warps together stream 512*splits contiguous bytes per step; the partial sums meet in shared memory
    // in a fixed order (deterministic; splits = 1 is the one-warp-per-row kernel, same summation order).
    __shared__ float red[4][NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int s = warp % splits;
    const int n = blockIdx.x * (blockDim.x >> 5) / splits + warp / splits;
    const bool live = n < N;
    if (splits == 1 && !live) return;  // (a block's last warps past N: no loads, no stores)
    const int t0 = blockIdx.y * NT;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j] = 0.0f;
    const bf16_t* w = W + (size_t)(live ? n : 0) * K;
    const int stride = 32 * splits;
    pdl_trigger();
    if (!live) {
    } else if ((K & 7) == 0) {
        // software-pipelined: the next 4 chunks are loaded before the current 4 are used (8 x 16 bytes in flight
        // per lane); the first 4 are loaded before pdl_wait (weights: no earlier kernel writes them), so inside
        // a decode graph they stream while the previous kernel drains. Chunks are used in order c, c + stride,
        // ..., the one summation order for every NT.
        const uint4* w4 = reinterpret_cast<const uint4*>(w);
        const int K8 = K >> 3;
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        int c = s * 32 + lane;
        uint4 p0 = c < K8 ? __ldg(w4 + c) : z, p1 = c + stride < K8 ? __ldg(w4 + c + stride) : z,
              p2 = c + 2 * stride < K8 ? __ldg(w4 + c + 2 * stride) : z,
              p3 = c + 3 * stride < K8 ? __ldg(w4 + c + 3 * stride) : z;
        pdl_wait();
        while (c < K8) {
            const int cn = c + 4 * stride;
            const uint4 n0 = cn < K8 ? __ldg(w4 + cn) : z, n1 = cn + stride < K8 ? __ldg(w4 + cn + stride) : z,
                        n2 = cn + 2 * stride < K8 ? __ldg(w4 + cn + 2 * stride) : z,
                        n3 = cn + 3 * stride < K8 ? __ldg(w4 + cn + 3 * stride) : z;
            float wf[8];
            unpack8(p0, wf); fma8<NT>(wf, x, K, T, t0, 8 * c, acc);
            if (c + stride < K8) { unpack8(p1, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + stride), acc); }
            if (c + 2 * stride < K8) { unpack8(p2, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + 2 * stride), acc); }
            if (c + 3 * stride < K8) { unpack8(p3, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + 3 * stride), acc); }
            p0 = n0; p1 = n1; p2 = n2; p3 = n3;
            c = cn;
        }
    } else {
        pdl_wait();
        for (int k = s * 32 + lane; k < K; k += stride) {
            const float wk = bf16_to_f32(w[k]);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                if (t0 + j < T) acc[j] += wk * x[(size_t)(t0 + j) * K + k];
        }
    }
    if (splits > 1) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float v = warp_sum(acc[j]);
            if (lane == 0) red[warp][j] = v;
        }
        __syncthreads();
        if (!live || s != 0) return;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float v = red[warp][j];
            for (int i = 1; i < splits; ++i) v += red[warp + i][j];
            acc[j] = v;
        }
    } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[j] = warp_sum(acc[j]);
    }
    const float b = bias ? bias[n] : 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float sum = acc[j];
        if (lane == 0 && t0 + j < T) {
            float* dst = y + (size_t)(t0 + j) * N + n;
            *dst = accumulate ? *dst + (sum + b) : sum + b;
        }
    }
}

#define MATVEC(NT)                                                                                        \
    extern "C" __global__ void matvec_bf16_t##NT(const bf16_t* __restrict__ W, const float* __restrict__ x, \
                                                 const float* __restrict__ bias, float* __restrict__ y,     \
                                                 int N, int K, int T, int accumulate, int splits) {         \
        matvec_impl<NT>(W, x, bias, y, N, K, T, accumulate, splits);                                      \
    }
MATVEC(1)
MATVEC(2)
MATVEC(4)
MATVEC(8)
