// matvec_q4.cu: matrix-vector products over quantized weights for decode (<= 8 tokens), and dequantization
// to bf16 for the GEMM path (prefill, large batches).
//
//   y[t, n] (= or +=) sum_k x[t, k] * W[n, k] + bias[n]       x, y, bias f32
//
// W is the row-major form of llmrs/engine/quant.py (AWQ repacked once at load; GGUF blocks split likewise):
//   q4: Q uint32 [N, K/8] (code of k = 8j + i in bits 4i of word j), S fp16 [N, K/G], Z fp16 [N, K/G] or null
//       matvec_q4z: W = (q - z) * s   (AWQ; Q4_0 passes Z = null: z = 8)
//       matvec_q4m: W = q * s + m     (Q4_1: Z holds m)
//   q8: Q int8 [N, K], S fp16 [N, K/32]: W = q * s  (Q8_0)
// G is a multiple of 32, K of 32 (checked on the host).
//
// Layout of the work, as matvec.cu: one warp per output row, 4 warps per block; lane L reads the row's 16-byte
// chunks L, L + 32, ... (a q4 chunk is 32 weights, a q8 chunk 16), two loads in flight before the first use.
// A chunk lies inside one group, so its scale (and zero) is loaded once for the chunk; the G/32 lanes that
// share a group read the same address in the same instruction (one transaction). Codes become floats with the
// magic-number trick: the bits 0x4B000000 | q are the float 2^23 + q, so one subtraction of (2^23 + z) gives
// q - z exactly: no integer-to-float conversion. The scale multiplies the chunk's partial dot once (q4z, q8);
// q4m adds m * sum(x) of the chunk. fp32 accumulate, shuffle reduction, NT tokens share each weight load.
// The per-weight cost is one shift+and+or+sub and one FMA per token; x (f32) comes from L1/L2.
//
// Registers: the 32 unpacked weights of a chunk live in registers (compile-time indices after unrolling);
// `llmrs ptx-check` must show no local memory for any entry point.
//
// NOTE: this is the memory-bound decode kernel. Above 8 tokens the backend dequantizes into a bf16 scratch
// (dequant_q4_bf16 / dequant_q8_bf16, bit-exact with the CPU's float32 dequantization rounded to bf16) and
// runs the cuBLAS GEMM: a Marlin-style 4-bit GEMM (mma fragments straight from reordered 4-bit weights) is the
// real target for prefill and batched decode, not written yet.
#include "common.cuh"

#define MAGIC 8388608.0f  // 2^23

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float code_f32(unsigned bits) { return __uint_as_float(0x4B000000u | bits); }

// One 32-weight q4 chunk against NT tokens. MODE 0: w = q - off' (off = 2^23 + z), acc += s * dot.
// MODE 1: w = q (off = 2^23), acc += s * dot + m * sum(x).
template <int NT, int MODE>
__device__ __forceinline__ void q4_chunk(uint4 w, float s, float off, float m, const float* __restrict__ x, int K,
                                         int T, int t0, int k0, float* acc) {
    float wf[32];
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) wf[8 * i + j] = code_f32((u[i] >> (4 * j)) & 0xFu) - off;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t0 + t < T) {
            const float4* xp = reinterpret_cast<const float4*>(x + (size_t)(t0 + t) * K + k0);
            float d = 0.0f, sx = 0.0f;
#pragma unroll
            for (int v = 0; v < 8; ++v) {
                const float4 a = xp[v];
                d += wf[4 * v] * a.x + wf[4 * v + 1] * a.y + wf[4 * v + 2] * a.z + wf[4 * v + 3] * a.w;
                if (MODE == 1) sx += (a.x + a.y) + (a.z + a.w);
            }
            acc[t] += MODE == 1 ? s * d + m * sx : s * d;
        }
    }
}

template <int NT>
__device__ __forceinline__ void store_rows(const float* acc, const float* __restrict__ bias, float* __restrict__ y,
                                           int n, int N, int T, int t0, int lane, int accumulate) {
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

template <int NT, int MODE>
__device__ __forceinline__ void matvec_q4_impl(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,
                                               const unsigned short* __restrict__ Z, const float* __restrict__ x,
                                               const float* __restrict__ bias, float* __restrict__ y, int N, int K,
                                               int T, int G, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int t0 = blockIdx.y * NT;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j] = 0.0f;
    const int C = K >> 5, KG = K / G, cpg = G >> 5;  // chunks per row, groups per row, chunks per group
    const uint4* q = Q + (size_t)n * C;
    const unsigned short* s = S + (size_t)n * KG;
    const unsigned short* z = Z ? Z + (size_t)n * KG : nullptr;
    const float zdef = MODE == 0 ? 8.0f : 0.0f;  // Q4_0: z = 8; a Q4_1 without mins is not a format
    int c = lane;
    for (; c + 32 < C; c += 64) {
        const uint4 a = __ldg(q + c), b = __ldg(q + c + 32);
        const int ga = c / cpg, gb = (c + 32) / cpg;
        const float sa = f16_to_f32(__ldg(s + ga)), sb = f16_to_f32(__ldg(s + gb));
        const float za = z ? f16_to_f32(__ldg(z + ga)) : zdef, zb = z ? f16_to_f32(__ldg(z + gb)) : zdef;
        q4_chunk<NT, MODE>(a, sa, MODE == 0 ? MAGIC + za : MAGIC, za, x, K, T, t0, 32 * c, acc);
        q4_chunk<NT, MODE>(b, sb, MODE == 0 ? MAGIC + zb : MAGIC, zb, x, K, T, t0, 32 * (c + 32), acc);
    }
    for (; c < C; c += 32) {
        const uint4 a = __ldg(q + c);
        const int ga = c / cpg;
        const float sa = f16_to_f32(__ldg(s + ga));
        const float za = z ? f16_to_f32(__ldg(z + ga)) : zdef;
        q4_chunk<NT, MODE>(a, sa, MODE == 0 ? MAGIC + za : MAGIC, za, x, K, T, t0, 32 * c, acc);
    }
    store_rows<NT>(acc, bias, y, n, N, T, t0, lane, accumulate);
}

// One 16-weight q8 chunk: signed bytes b -> (b ^ 0x80) = b + 128 as an unsigned byte, minus (2^23 + 128).
template <int NT>
__device__ __forceinline__ void q8_chunk(uint4 w, float s, const float* __restrict__ x, int K, int T, int t0, int k0,
                                         float* acc) {
    float wf[16];
    const unsigned u[4] = {w.x ^ 0x80808080u, w.y ^ 0x80808080u, w.z ^ 0x80808080u, w.w ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) wf[4 * i + j] = code_f32((u[i] >> (8 * j)) & 0xFFu) - (MAGIC + 128.0f);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t0 + t < T) {
            const float4* xp = reinterpret_cast<const float4*>(x + (size_t)(t0 + t) * K + k0);
            float d = 0.0f;
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const float4 a = xp[v];
                d += wf[4 * v] * a.x + wf[4 * v + 1] * a.y + wf[4 * v + 2] * a.z + wf[4 * v + 3] * a.w;
            }
            acc[t] += s * d;
        }
    }
}

template <int NT>
__device__ __forceinline__ void matvec_q8_impl(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,
                                               const float* __restrict__ x, const float* __restrict__ bias,
                                               float* __restrict__ y, int N, int K, int T, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int t0 = blockIdx.y * NT;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j] = 0.0f;
    const int C = K >> 4;  // 16-byte chunks per row; the scale of chunk c is block c / 2
    const uint4* q = Q + (size_t)n * C;
    const unsigned short* s = S + (size_t)n * (K >> 5);
    int c = lane;
    for (; c + 32 < C; c += 64) {
        const uint4 a = __ldg(q + c), b = __ldg(q + c + 32);
        const float sa = f16_to_f32(__ldg(s + (c >> 1))), sb = f16_to_f32(__ldg(s + ((c + 32) >> 1)));
        q8_chunk<NT>(a, sa, x, K, T, t0, 16 * c, acc);
        q8_chunk<NT>(b, sb, x, K, T, t0, 16 * (c + 32), acc);
    }
    for (; c < C; c += 32) q8_chunk<NT>(__ldg(q + c), f16_to_f32(__ldg(s + (c >> 1))), x, K, T, t0, 16 * c, acc);
    store_rows<NT>(acc, bias, y, n, N, T, t0, lane, accumulate);
}

#define MATVEC_Q(NT)                                                                                              \
    extern "C" __global__ void matvec_q4z_t##NT(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,  \
                                                const unsigned short* __restrict__ Z, const float* __restrict__ x,  \
                                                const float* __restrict__ bias, float* __restrict__ y, int N,       \
                                                int K, int T, int G, int accumulate) {                              \
        matvec_q4_impl<NT, 0>(Q, S, Z, x, bias, y, N, K, T, G, accumulate);                                       \
    }                                                                                                             \
    extern "C" __global__ void matvec_q4m_t##NT(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,  \
                                                const unsigned short* __restrict__ Z, const float* __restrict__ x,  \
                                                const float* __restrict__ bias, float* __restrict__ y, int N,       \
                                                int K, int T, int G, int accumulate) {                              \
        matvec_q4_impl<NT, 1>(Q, S, Z, x, bias, y, N, K, T, G, accumulate);                                       \
    }                                                                                                             \
    extern "C" __global__ void matvec_q8_t##NT(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,   \
                                               const float* __restrict__ x, const float* __restrict__ bias,         \
                                               float* __restrict__ y, int N, int K, int T, int accumulate) {        \
        matvec_q8_impl<NT>(Q, S, x, bias, y, N, K, T, accumulate);                                                \
    }
MATVEC_Q(1)
MATVEC_Q(2)
MATVEC_Q(4)
MATVEC_Q(8)

// ---------------------------------------------------------------------- dequantization for the GEMM path
// W[n, k] as bf16, computed exactly as the CPU reference computes it in float32 ((q - z) * s and d * q are
// exact products; q * s + m rounds once, as numpy does), then rounded to nearest even. One thread per 8
// weights (one q4 word, or two q8 words), one 16-byte store; grid-stride over the matrix.
extern "C" __global__ void dequant_q4_bf16(const unsigned* __restrict__ Q, const unsigned short* __restrict__ S,
                                           const unsigned short* __restrict__ Z, uint4* __restrict__ out, int N,
                                           int K, int G, int mode) {
    const int W8 = K >> 3;
    const long long words = (long long)N * W8;
    const float zdef = mode == 0 ? 8.0f : 0.0f;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < words;
         idx += (long long)gridDim.x * blockDim.x) {
        const int n = (int)(idx / W8), j = (int)(idx % W8);
        const long long g = (long long)n * (K / G) + (8 * j) / G;
        const float s = f16_to_f32(S[g]);
        const float z = Z ? f16_to_f32(Z[g]) : zdef;
        const unsigned w = Q[idx];
        unsigned o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float v[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float q = code_f32((w >> (8 * i + 4 * h)) & 0xFu) - MAGIC;
                v[h] = mode == 0 ? __fmul_rn(q - z, s) : __fadd_rn(__fmul_rn(s, q), z);
            }
            o[i] = (unsigned)f32_to_bf16(v[0]) | ((unsigned)f32_to_bf16(v[1]) << 16);
        }
        out[idx] = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

extern "C" __global__ void dequant_q8_bf16(const uint2* __restrict__ Q, const unsigned short* __restrict__ S,
                                           uint4* __restrict__ out, int N, int K) {
    const long long n8 = (long long)N * (K >> 3);
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n8;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long k8 = idx * 8;  // flat index of the first weight; K % 32 == 0, so one row and one block
        const float s = f16_to_f32(S[k8 >> 5]);
        const uint2 w = Q[idx];
        const unsigned u[2] = {w.x ^ 0x80808080u, w.y ^ 0x80808080u};
        unsigned o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned word = u[i >> 1], sh = 16 * (i & 1);
            const float a = code_f32((word >> sh) & 0xFFu) - (MAGIC + 128.0f);
            const float b = code_f32((word >> (sh + 8)) & 0xFFu) - (MAGIC + 128.0f);
            o[i] = (unsigned)f32_to_bf16(__fmul_rn(s, a)) | ((unsigned)f32_to_bf16(__fmul_rn(s, b)) << 16);
        }
        out[idx] = make_uint4(o[0], o[1], o[2], o[3]);
    }
}
