// elementwise.cu: the small glue kernels of the forward pass (grid-stride loops, f32 unless named).
//   silu_mul:      out[t, i] = silu(gu[t, i]) * gu[t, I + i]      (gate/up fused: gu is [T, 2I])
//   silu_mul_bf16: the same, out as bf16 words (round to nearest even): the down projection's GEMM input,
//                  written here instead of by a separate cast; the f32 value is silu_mul's own expression
//                  (silu_mul_f), so out == cast_f32_bf16(silu_mul out) bit for bit. Grid x: I / 16 (two
//                  chunks of 8 a thread when I % 8 == 0), else I / 4 (4 elements a thread) or I; y: tokens.
//   silu_mul_bf16_bf16: the same from gu as bf16 words (the gate/up GEMM's bf16 output): bf16 in, bf16 out
//                  (f32 math: silu_mul_f of the two widened values); grid as silu_mul_bf16.
//   add_bias:      y[t, n] += b[n]                                  (after a cuBLAS GEMM)
//   add_inplace:   x[i] += y[i]
//   cast_f32_bf16: y[i] = bf16(x[i])  (round to nearest even; GEMM operands, weights at upload)
// Roof: no fraction recorded; each kernel's time and % of its bandwidth floor in a real step: `llmrs profile
// --synthetic qwen2.5-7b --batch 1,256 --context 512`.
#include "common.cuh"

// 4 floats -> 4 bf16 words in one 8-byte store (element 0 in the low half of .x), each as f32_to_bf16 rounds it
__device__ __forceinline__ uint2 bf16x4(float a, float b, float c, float d) {
    return make_uint2(bf16x2(a, b), bf16x2(c, d));
}

extern "C" __global__ void silu_mul(const float* __restrict__ gu, float* __restrict__ out, int T, int I) {
    pdl_enter();
    const size_t n = (size_t)T * I;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / I, i = idx % I;
        out[idx] = silu_mul_f(gu[t * 2 * I + i], gu[t * 2 * I + I + i]);
    }
}

// 4 consecutive gate or up values as f32, from f32 (one 16-byte load) or bf16 words (one 8-byte load)
__device__ __forceinline__ float4 load4(const float* p, int i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ float4 load4(const bf16_t* p, int i) {
    const uint2 v = reinterpret_cast<const uint2*>(p)[i];
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xFFFF0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xFFFF0000u));
}
__device__ __forceinline__ float load1(const float* p, int i) { return p[i]; }
__device__ __forceinline__ float load1(const bf16_t* p, int i) { return bf16_to_f32(p[i]); }

// 8 consecutive gate or up values, raw (two 16-byte loads of f32, one of bf16 words) and then widened to f32
template <typename InT> struct Raw8;
template <> struct Raw8<float> { float4 a, b; };
template <> struct Raw8<bf16_t> { uint4 a; };
__device__ __forceinline__ Raw8<float> load8(const float* p, int c) {
    return {reinterpret_cast<const float4*>(p)[2 * c], reinterpret_cast<const float4*>(p)[2 * c + 1]};
}
__device__ __forceinline__ Raw8<bf16_t> load8(const bf16_t* p, int c) { return {reinterpret_cast<const uint4*>(p)[c]}; }
__device__ __forceinline__ void widen8(const Raw8<float>& r, float (&f)[8]) {
    f[0] = r.a.x; f[1] = r.a.y; f[2] = r.a.z; f[3] = r.a.w; f[4] = r.b.x; f[5] = r.b.y; f[6] = r.b.z; f[7] = r.b.w;
}
__device__ __forceinline__ void widen8(const Raw8<bf16_t>& r, float (&f)[8]) { unpack8(r.a, f); }

template <typename InT>
__device__ __forceinline__ void silu8_store(const Raw8<InT>& g, const Raw8<InT>& u, bf16_t* o, int c) {
    float a[8], b[8];
    widen8(g, a);
    widen8(u, b);
    reinterpret_cast<uint4*>(o)[c] = make_uint4(bf16x2(silu_mul_f(a[0], b[0]), silu_mul_f(a[1], b[1])),
                                                bf16x2(silu_mul_f(a[2], b[2]), silu_mul_f(a[3], b[3])),
                                                bf16x2(silu_mul_f(a[4], b[4]), silu_mul_f(a[5], b[5])),
                                                bf16x2(silu_mul_f(a[6], b[6]), silu_mul_f(a[7], b[7])));
}

// silu(gate) * up as bf16 words, gu f32 or bf16 [T, 2I]. I % 8 == 0 with 16-byte aligned rows (every real model):
// 8 elements a chunk, a thread takes two chunks a blockDim apart and issues all four loads (gate and up of each)
// before using them. At 256 tokens of the 7B (bf16 in, 29 MB moved; eager profile with CUDA events around each
// launch) this form takes 13.1 us a call, a one-chunk-of-4 form 13.6. Else 4 elements a thread when I % 4 == 0, else one. Every form covers the rows for any grid
// (grid-stride), the values are the same expression (silu_mul_f, then f32_to_bf16 rounding) in each.
template <typename InT>
__device__ __forceinline__ void silu_mul_to_bf16(const InT* __restrict__ gu, bf16_t* __restrict__ out, int T, int I) {
    const bool vec8 = (I & 7) == 0 && (((unsigned long long)gu | (unsigned long long)out) & 15) == 0;
    if (vec8) {
        const int n8 = I >> 3;
        for (int t = blockIdx.y; t < T; t += gridDim.y) {
            const InT* g = gu + (size_t)t * 2 * I;
            bf16_t* o = out + (size_t)t * I;
            for (int c0 = blockIdx.x * blockDim.x * 2 + threadIdx.x; c0 < n8; c0 += gridDim.x * blockDim.x * 2) {
                const int c1 = c0 + blockDim.x;
                const Raw8<InT> g0 = load8(g, c0), u0 = load8(g + I, c0);
                Raw8<InT> g1 = g0, u1 = u0;
                if (c1 < n8) {
                    g1 = load8(g, c1);
                    u1 = load8(g + I, c1);
                }
                silu8_store<InT>(g0, u0, o, c0);
                if (c1 < n8) silu8_store<InT>(g1, u1, o, c1);
            }
        }
        return;
    }
    const bool vec = (I & 3) == 0;
    const int n = vec ? I >> 2 : I;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        const InT* g = gu + (size_t)t * 2 * I;
        bf16_t* o = out + (size_t)t * I;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
            if (vec) {
                const float4 a = load4(g, i), b = load4(g + I, i);
                reinterpret_cast<uint2*>(o)[i] = bf16x4(silu_mul_f(a.x, b.x), silu_mul_f(a.y, b.y),
                                                        silu_mul_f(a.z, b.z), silu_mul_f(a.w, b.w));
            } else {
                o[i] = f32_to_bf16(silu_mul_f(load1(g, i), load1(g + I, i)));
            }
        }
    }
}

extern "C" __global__ void silu_mul_bf16(const float* __restrict__ gu, bf16_t* __restrict__ out, int T, int I) {
    pdl_enter();
    silu_mul_to_bf16(gu, out, T, I);
}

extern "C" __global__ void silu_mul_bf16_bf16(const bf16_t* __restrict__ gu, bf16_t* __restrict__ out, int T,
                                              int I) {
    pdl_enter();
    silu_mul_to_bf16(gu, out, T, I);
}

extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ b, int T, int N) {
    pdl_enter();
    const size_t n = (size_t)T * N;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x)
        y[idx] += b[idx % N];
}

extern "C" __global__ void add_inplace(float* __restrict__ x, const float* __restrict__ y, long long n) {
    pdl_enter();
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += (long long)gridDim.x * blockDim.x)
        x[idx] += y[idx];
}

// 4 elements a thread (a 16-byte load, an 8-byte store) where n % 4 == 0 and both pointers allow it, else 1; the
// host sizes the grid for 4 (the backend's _cast_bf16); the grid-stride loops cover any n either way
extern "C" __global__ void cast_f32_bf16(const float* __restrict__ x, bf16_t* __restrict__ y, long long n) {
    pdl_enter();
    const long long stride = (long long)gridDim.x * blockDim.x;
    if ((n & 3) == 0 && ((unsigned long long)x & 15ull) == 0 && ((unsigned long long)y & 7ull) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        uint2* y4 = reinterpret_cast<uint2*>(y);
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n >> 2); i += stride) {
            const float4 v = x4[i];
            y4[i] = bf16x4(v.x, v.y, v.z, v.w);
        }
        return;
    }
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += stride)
        y[idx] = f32_to_bf16(x[idx]);
}
