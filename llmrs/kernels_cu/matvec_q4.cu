// matvec_q4.cu: matrix-vector products over quantized weights for decode (<= 8 tokens), and dequantization
// to bf16 for the GEMM path (prefill, large batches).
//
//   y[t, n] (= or +=) sum_k x[t, k] * W[n, k] + bias[n]       x, y, bias f32
//
// W is the row-major form of llmrs/model/quant.py (AWQ repacked once at load; GGUF blocks split likewise):
//   q4: Q uint32 [N, K/8] (code of k = 8j + i in bits 4i of word j), S fp16 [N, K/G], Z fp16 [N, K/G] or null
//       matvec_q4z: W = (q - z) * s   (AWQ; Q4_0 passes Z = null: z = 8)
//       matvec_q4m: W = q * s + m     (Q4_1: Z holds m)
//   q8: Q int8 [N, K], S fp16 [N, K/32]: W = q * s  (Q8_0)
// G is a multiple of 32, K of 32 (checked on the host).
//
// Layout of the 4-bit matvec: a block (4 warps, the host's 32 * MATVEC_ROWS_PER_BLOCK threads) owns Q4_ROWS = 4
// output rows, and every warp works on all four: thread i of the block takes the 16-byte chunks i, i + 128, ... of
// each row (a chunk is 32 weights; the block streams 2 KB of each row per step, four 16-byte loads in flight per
// thread). Per chunk the thread loads its 32 activations of each token once (8 float4 from L1/L2) and applies
// them to the four rows' codes: x is read once per block, not once per row (the one-warp-per-row kernel read 128
// bytes of x per 16 bytes of codes and was L1-bound at ~0.4 TB/s on the H200). The partial sums meet through a
// transposed warp reduction (4 * NT values in 4 * NT - 1 + log2(32 / (4 * NT)) shuffles) and shared memory, in a
// fixed order: deterministic for a fixed launch shape. Rows past N read row N - 1 and store nothing.
//
// A chunk lies inside one group, so its scale (and zero) is loaded once per row for the chunk; the G/32 threads that
// share a group read the same address in the same instruction. Codes become floats with the magic-number trick,
// without shifts: the nibble at bits 4p..4p+3 of a word (p = 0..3; the high half of the word after one >> 16) ORed
// with the exponent of 2^(23 - 4p) is the float 2^(23 - 4p) + q (its ULP is 2^-4p), so one LOP3 and one subtraction
// of (2^(23 - 4p) + z) give q - z exactly. q4z: acc += s * sum((q - z) x) per chunk; q4m: w = q, acc += s * dot +
// m * sum(x) (sum(x) shared by the four rows). fp32 throughout, NT tokens share each weight load.
// Per weight and token: ~1.1 integer ops + 1 FADD (decode, once per weight) + 1 FFMA (per token).
//
// Registers: decoded weights live in registers 4 per row at a time (compile-time indices after unrolling).
// Left alone, ptxas hoists every decode of a chunk (~200 registers at NT = 1, 3 blocks an SM); __launch_bounds__
// caps them by token count (Q4_MIN_BLOCKS): sm_80..sm_90, NVRTC 13.5: 72 / 96 / 128 / 255 registers at NT = 1 / 2 /
// 4 / 8, no spills. A tighter cap spilled (64 at NT = 1 on sm_90, 80 at NT = 2). The chunk loop stays rolled
// (unroll 1): unrolled, it hoists the next chunk's loads and decodes and needs the registers again.
// `llmrs ptx-check` must show no local memory for any entry point.
//
// The 8-bit matvec (Q8_0) is still one warp per output row, as matvec.cu.
//
// NOTE: this is the memory-bound decode kernel of the weights without the Marlin layout (gemm_q4.cu, gemv_q4.cu
// take those that have it). Above 8 tokens the backend dequantizes into a bf16 scratch (dequant_q4_bf16 /
// dequant_q8_bf16, bit-exact with the CPU's float32 dequantization rounded to bf16) and runs the cuBLAS GEMM.
// Roof: no fraction recorded; each kernel's time and % of its bandwidth floor in a real step: `llmrs profile
// --synthetic qwen2.5-7b --batch 1,256 --context 512`.
#include "common.cuh"

#define MAGIC 8388608.0f  // 2^23

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float code_f32(unsigned bits) { return __uint_as_float(0x4B000000u | bits); }

#define Q4_ROWS 4  // output rows per block (the backend's MATVEC_ROWS_PER_BLOCK: the grid is ceil(N / 4) blocks)
#define Q4_WARPS 4  // warps per block: the host launches 32 * MATVEC_ROWS_PER_BLOCK threads (the launch bound)

// The exponent word of 2^(23 - 4p): ORed with a nibble in place at bits 4p..4p+3 it is the float 2^(23 - 4p) + q.
__device__ __forceinline__ unsigned q4_expo(int p) { return (150u - 4u * (unsigned)p) << 23; }

__device__ __forceinline__ unsigned word_of(uint4 a, int i) { return i == 0 ? a.x : i == 1 ? a.y : i == 2 ? a.z : a.w; }

// One 32-weight chunk of each of the Q4_ROWS rows against NT tokens: w[r] the codes, s[r] the scale, z[r] the zero
// (MODE 0) or the min (MODE 1); acc[r * NT + t]. x rows past T repeat row T - 1 (computed, never stored).
template <int NT, int MODE>
__device__ __forceinline__ void q4_chunk_rows(const uint4* w, const float* s, const float* z,
                                              const float* __restrict__ x, int K, int T, int t0, int k0, float* acc) {
    float off[Q4_ROWS][4];
#pragma unroll
    for (int r = 0; r < Q4_ROWS; ++r)
#pragma unroll
        for (int p = 0; p < 4; ++p)
            off[r][p] = MODE == 0 ? __uint_as_float(q4_expo(p)) + z[r] : __uint_as_float(q4_expo(p));
    float d[Q4_ROWS * NT], sx[NT];
#pragma unroll
    for (int i = 0; i < Q4_ROWS * NT; ++i) d[i] = 0.0f;
#pragma unroll
    for (int t = 0; t < NT; ++t) sx[t] = 0.0f;
#pragma unroll
    for (int v = 0; v < 8; ++v) {  // weights 4v..4v+3 of the chunk: nibbles 4 (v & 1) .. +3 of word v >> 1
        float wf[Q4_ROWS][4];
#pragma unroll
        for (int r = 0; r < Q4_ROWS; ++r) {
            const unsigned u = word_of(w[r], v >> 1), b = (v & 1) ? u >> 16 : u;
#pragma unroll
            for (int p = 0; p < 4; ++p) wf[r][p] = __uint_as_float((b & (0xFu << (4 * p))) | q4_expo(p)) - off[r][p];
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int tt = min(t0 + t, T - 1);
            const float4 a = __ldg(reinterpret_cast<const float4*>(x + (size_t)tt * K + k0) + v);
#pragma unroll
            for (int r = 0; r < Q4_ROWS; ++r) {
                float& dd = d[r * NT + t];
                dd = fmaf(wf[r][0], a.x, dd);
                dd = fmaf(wf[r][1], a.y, dd);
                dd = fmaf(wf[r][2], a.z, dd);
                dd = fmaf(wf[r][3], a.w, dd);
            }
            if (MODE == 1) sx[t] += (a.x + a.y) + (a.z + a.w);
        }
    }
#pragma unroll
    for (int r = 0; r < Q4_ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
            acc[r * NT + t] += MODE == 1 ? s[r] * d[r * NT + t] + z[r] * sx[t] : s[r] * d[r * NT + t];
}

// Sums each of V values (V = 2^LV <= 32) over the warp in V - 1 + 5 - LV shuffles instead of 5 V: each halving step
// (H values kept, offset O) a lane swaps half of its values with lane ^ O and keeps the half its bit O selects.
// Afterwards every lane holds the full sum of value L >> (5 - LV) (checked by a numpy simulation of the exchange).
// A template recursion, not a loop: the loop was left rolled, its array in local memory.
template <int H, int O>
__device__ __forceinline__ void transpose_halve(float* v, int lane) {
    if constexpr (H >= 1) {
        const unsigned up = (lane & O) ? 0xffffffffu : 0u;
#pragma unroll
        for (int i = 0; i < H; ++i) {
            // NOTE: bit masks, not `up ? v[i] : v[i + H]`: the compiler may turn that into a select of addresses
            const unsigned lo = __float_as_uint(v[i]), hi = __float_as_uint(v[i + H]);
            const float send = __uint_as_float((lo & up) | (hi & ~up)), keep = __uint_as_float((hi & up) | (lo & ~up));
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
        }
        transpose_halve<H / 2, O / 2>(v, lane);
    }
}

template <int V>
__device__ __forceinline__ float warp_sum_transposed(float* v, int lane) {
    transpose_halve<V / 2, 16>(v, lane);
    float r = v[0];
#pragma unroll
    for (int o = 16 / V; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
    return r;
}

template <int NT, int MODE>
__device__ __forceinline__ void matvec_q4_impl(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,
                                               const unsigned short* __restrict__ Z, const float* __restrict__ x,
                                               const float* __restrict__ bias, float* __restrict__ y, int N, int K,
                                               int T, int G, int accumulate) {
    pdl_enter();
    constexpr int V = Q4_ROWS * NT;  // partial sums per thread: 4, 8, 16 or 32
    constexpr int LV = V == 4 ? 2 : V == 8 ? 3 : V == 16 ? 4 : 5;
    __shared__ float red[Q4_WARPS][V];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int row0 = blockIdx.x * Q4_ROWS, t0 = blockIdx.y * NT;
    const int C = K >> 5, KG = K / G, cpg = G >> 5;  // chunks per row, groups per row, chunks per group
    const int gsh = (cpg & (cpg - 1)) == 0 ? __ffs(cpg) - 1 : -1;  // G / 32 a power of two: a shift
    const uint4* q[Q4_ROWS];
    int srow[Q4_ROWS];  // first scale (zero) of each row
#pragma unroll
    for (int r = 0; r < Q4_ROWS; ++r) {
        const int n = min(row0 + r, N - 1);
        q[r] = Q + (size_t)n * C;
        srow[r] = n * KG;
    }
    const float zdef = MODE == 0 ? 8.0f : 0.0f;  // Q4_0: z = 8; a Q4_1 without mins is not a format
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    const int step = 32 * nw;
    int c = threadIdx.x;
#pragma unroll 1
    for (; c < C; c += step) {
        uint4 wa[Q4_ROWS];
#pragma unroll
        for (int r = 0; r < Q4_ROWS; ++r) wa[r] = ldg_stream(q[r] + c);
        const int ga = gsh >= 0 ? c >> gsh : c / cpg;
        float sa[Q4_ROWS], za[Q4_ROWS];
#pragma unroll
        for (int r = 0; r < Q4_ROWS; ++r) {
            sa[r] = f16_to_f32(__ldg(S + srow[r] + ga));
            za[r] = Z ? f16_to_f32(__ldg(Z + srow[r] + ga)) : zdef;
        }
        q4_chunk_rows<NT, MODE>(wa, sa, za, x, K, T, t0, 32 * c, acc);
    }
    // acc[r * NT + t]: warp sums, then the block's warps in order
    const float sum = warp_sum_transposed<V>(acc, lane);
    if ((lane & ((32 >> LV) - 1)) == 0) red[warp][lane >> (5 - LV)] = sum;
    __syncthreads();
    if (threadIdx.x < V) {
        const int i = threadIdx.x, r = i / NT, t = i % NT, n = row0 + r;
        if (n < N && t0 + t < T) {
            float v = red[0][i];
            for (int w = 1; w < nw; ++w) v += red[w][i];
            const float b = bias ? bias[n] : 0.0f;
            float* dst = y + (size_t)(t0 + t) * N + n;
            *dst = accumulate ? *dst + (v + b) : v + b;
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
    pdl_enter();
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
        const uint4 a = ldg_stream(q + c), b = ldg_stream(q + c + 32);
        const float sa = f16_to_f32(__ldg(s + (c >> 1))), sb = f16_to_f32(__ldg(s + ((c + 32) >> 1)));
        q8_chunk<NT>(a, sa, x, K, T, t0, 16 * c, acc);
        q8_chunk<NT>(b, sb, x, K, T, t0, 16 * (c + 32), acc);
    }
    for (; c < C; c += 32) q8_chunk<NT>(ldg_stream(q + c), f16_to_f32(__ldg(s + (c >> 1))), x, K, T, t0, 16 * c, acc);
    store_rows<NT>(acc, bias, y, n, N, T, t0, lane, accumulate);
}

#define Q4_MIN_BLOCKS(NT) ((NT) == 1 ? 7 : (NT) == 2 ? 5 : (NT) == 4 ? 4 : 2)  // blocks an SM: the register cap
#define MATVEC_Q(NT)                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * Q4_WARPS, Q4_MIN_BLOCKS(NT))                                \
        matvec_q4z_t##NT(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,                       \
                         const unsigned short* __restrict__ Z, const float* __restrict__ x,                       \
                         const float* __restrict__ bias, float* __restrict__ y, int N, int K, int T, int G,       \
                         int accumulate) {                                                                        \
        matvec_q4_impl<NT, 0>(Q, S, Z, x, bias, y, N, K, T, G, accumulate);                                       \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * Q4_WARPS, Q4_MIN_BLOCKS(NT))                                \
        matvec_q4m_t##NT(const uint4* __restrict__ Q, const unsigned short* __restrict__ S,                       \
                         const unsigned short* __restrict__ Z, const float* __restrict__ x,                       \
                         const float* __restrict__ bias, float* __restrict__ y, int N, int K, int T, int G,       \
                         int accumulate) {                                                                        \
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
// weights (one q4 word, or two q8 words), one 16-byte store; grid-stride over the matrix. dequant_q4_bf16: a warp
// takes 128 consecutive words a pass, each lane 4 of them 32 apart (its 4 loads in flight together; every load and
// store instruction of the warp stays one coalesced run). On the H200, the 7B's down: 85 us a layer with one word
// a thread a pass, 78 us so (46% of the roof); the backend expands a weight's GEMM layout instead where it has one
// (dequant_marlin_q4{z,m}_bf16, dequant_marlin.cu: 49 us), so this one serves the shapes without it.
__device__ __forceinline__ uint4 dequant_q4_word(unsigned w, float s, float z, int mode) {
    unsigned o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float q = code_f32((w >> (8 * i + 4 * h)) & 0xFu) - MAGIC;
            v[h] = mode == 0 ? __fmul_rn(q - z, s) : __fadd_rn(__fmul_rn(s, q), z);
        }
        o[i] = bf16x2(v[0], v[1]);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

#define DQ_WORDS 4  // words a lane a pass (32 apart)

extern "C" __global__ void dequant_q4_bf16(const unsigned* __restrict__ Q, const unsigned short* __restrict__ S,
                                           const unsigned short* __restrict__ Z, uint4* __restrict__ out, int N,
                                           int K, int G, int mode) {
    const int W8 = K >> 3, KG = K / G;
    const long long words = (long long)N * W8;
    const float zdef = mode == 0 ? 8.0f : 0.0f;
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long base = (blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5)) * (32 * DQ_WORDS) + lane;
         base < words; base += warps * 32 * DQ_WORDS) {
        unsigned w[DQ_WORDS];
#pragma unroll
        for (int j = 0; j < DQ_WORDS; ++j) w[j] = base + 32 * j < words ? __ldg(Q + base + 32 * j) : 0u;
#pragma unroll
        for (int j = 0; j < DQ_WORDS; ++j) {
            const long long idx = base + 32 * j;
            if (idx < words) {
                const int n = (int)(idx / W8), k = 8 * (int)(idx - (long long)n * W8);
                const long long g = (long long)n * KG + k / G;
                out[idx] = dequant_q4_word(w[j], f16_to_f32(__ldg(S + g)), Z ? f16_to_f32(__ldg(Z + g)) : zdef, mode);
            }
        }
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
            o[i] = bf16x2(__fmul_rn(s, a), __fmul_rn(s, b));
        }
        out[idx] = make_uint4(o[0], o[1], o[2], o[3]);
    }
}
