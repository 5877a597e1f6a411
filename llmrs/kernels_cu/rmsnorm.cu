// rmsnorm.cu: RMSNorm, f32 in, f32 weight (the bf16-rounded checkpoint values), f32 or bf16 out.
//   rms_norm:      out[i] = w * x[r] / sqrt(mean(x[r]^2) + eps), r = rows ? rows[i] : i
//                  (`rows` gathers the sampled rows before the final norm, in the same launch)
//   add_rms_norm:  x[i] += y[i] (the residual, in place), then out[i] = rms_norm(x[i])
//   rms_norm_bf16, add_rms_norm_bf16: the same, out as bf16 words (round to nearest even, as cast_f32_bf16):
//                  the input of a cuBLAS GEMM, written here instead of by a separate cast. The f32 value is the
//                  same expression as the f32 kernels' (one template), so bf16 out == cast_f32_bf16(f32 out)
//                  bit for bit at the same block size.
// One block per row; the sum of squares is a block reduction (f32), as numpy's mean in f32. Where H % 4 == 0 and
// the block's threads cover the row in at most RN_VEC float4s each (the 7B's 3584 with its 1024 threads: one), a
// thread loads its float4s of the row (x, and y for the fused residual) at once, keeps them in registers for the
// normalization, and issues its weight loads before the reduction: one dependent DRAM round trip a row instead of
// one per scalar of the strided loop (which the compiler left rolled: each thread waited out 4 loads in turn, then
// re-read x for the second pass). The squares are summed in another order than the scalar path's (each thread's
// float4 first), the same for the f32, residual and bf16 kernels (one template), so bf16 == cast(f32) still holds.
// H200 (eager profile, us a call, against the strided scalar loop): 1 row 5.1 vs 5.9, 256 rows 6.5 vs 7.4.
// Roof: no fraction recorded; each kernel's time and % of its bandwidth floor in a real step: `llmrs profile
// --synthetic qwen2.5-7b --batch 1,256 --context 512`.
#include "common.cuh"

#define RN_VEC 2  // float4s a thread in the register-held path (H <= 8 x threads)

__device__ __forceinline__ void store_out(float* o, int i, float v) { o[i] = v; }
__device__ __forceinline__ void store_out(bf16_t* o, int i, float v) { o[i] = f32_to_bf16(v); }

__device__ __forceinline__ void store4(float* o, int c, float4 v) { reinterpret_cast<float4*>(o)[c] = v; }
__device__ __forceinline__ void store4(bf16_t* o, int c, float4 v) {
    reinterpret_cast<uint2*>(o)[c] = make_uint2(bf16x2(v.x, v.y), bf16x2(v.z, v.w));
}

// The register-held path's norm weight (float4s c = threadIdx.x + j * blockDim.x < H4), then the PDL wait: no kernel
// writes the weight, so its DRAM round trip overlaps the kernel before instead of following the wait (common.cuh
// ldg_early / pdl_wait_on).
__device__ __forceinline__ void rn_weight_then_wait(const float* __restrict__ w, int H4, float4 (&wv)[RN_VEC]) {
    unsigned word = 0u;
#pragma unroll
    for (int j = 0; j < RN_VEC; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        const uint4 u = c < H4 ? ldg_early(reinterpret_cast<const uint4*>(w) + c) : make_uint4(0u, 0u, 0u, 0u);
        wv[j] = make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
        word |= early_word(u);
    }
    pdl_wait_on(word);
}

// The register-held path (H % 4 == 0, H / 4 <= RN_VEC * blockDim.x): v[j] holds float4 c = threadIdx.x + j * blockDim.x
// of the row (x, or x + y already written back by the caller), wv[j] the weight's; out = w * (x * inv) as the scalar
// path computes it.
template <typename OutT>
__device__ __forceinline__ void rms_norm_vec(const float4 (&v)[RN_VEC], const float4 (&wv)[RN_VEC],
                                             OutT* __restrict__ o, int H4, float eps, float* red, int H) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RN_VEC; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        if (c < H4) ss += (v[j].x * v[j].x + v[j].y * v[j].y) + (v[j].z * v[j].z + v[j].w * v[j].w);
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
#pragma unroll
    for (int j = 0; j < RN_VEC; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        if (c < H4)
            store4(o, c, make_float4(wv[j].x * (v[j].x * inv), wv[j].y * (v[j].y * inv), wv[j].z * (v[j].z * inv),
                                     wv[j].w * (v[j].w * inv)));
    }
}

// the register-held path's condition: H a multiple of 4 within RN_VEC float4s a thread, every row 16-byte aligned
__device__ __forceinline__ bool rn_vec_fits(int H, const void* a, const void* b, const void* w, const void* o) {
    const unsigned long long any = (unsigned long long)a | (unsigned long long)b | (unsigned long long)w
                                   | (unsigned long long)o;
    return (H & 3) == 0 && (H >> 2) <= RN_VEC * (int)blockDim.x && (any & 15) == 0;
}

template <typename OutT>
__device__ __forceinline__ void rms_norm_row(const float* __restrict__ x, const int* __restrict__ rows,
                                             const float* __restrict__ w, OutT* __restrict__ out, int H, float eps) {
    __shared__ float red[32];
    const int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float* xr = x + (size_t)r * H;
    if (rn_vec_fits(H, x, x, w, out)) {
        const int H4 = H >> 2;
        float4 wv[RN_VEC], v[RN_VEC];
        rn_weight_then_wait(w, H4, wv);
#pragma unroll
        for (int j = 0; j < RN_VEC; ++j) {  // x is the previous kernel's: the coherent path (common.cuh ldx4)
            const int c = threadIdx.x + j * blockDim.x;
            v[j] = c < H4 ? ldx4(xr + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        rms_norm_vec(v, wv, out + (size_t)blockIdx.x * H, H4, eps, red, H);
        return;
    }
    pdl_wait();
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
    OutT* o = out + (size_t)blockIdx.x * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) store_out(o, i, w[i] * (xr[i] * inv));
}

template <typename OutT>
__device__ __forceinline__ void add_rms_norm_row(float* __restrict__ x, const float* __restrict__ y,
                                                 const float* __restrict__ w, OutT* __restrict__ out, int H,
                                                 float eps) {
    __shared__ float red[32];
    float* xr = x + (size_t)blockIdx.x * H;
    const float* yr = y + (size_t)blockIdx.x * H;
    if (rn_vec_fits(H, x, y, w, out)) {
        const int H4 = H >> 2;
        float4 wv[RN_VEC], v[RN_VEC];
        rn_weight_then_wait(w, H4, wv);
#pragma unroll
        for (int j = 0; j < RN_VEC; ++j) {
            const int c = threadIdx.x + j * blockDim.x;
            if (c < H4) {
                const float4 a = reinterpret_cast<const float4*>(xr)[c], b = ldx4(yr + 4 * c);
                v[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
                reinterpret_cast<float4*>(xr)[c] = v[j];
            } else {
                v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        rms_norm_vec(v, wv, out + (size_t)blockIdx.x * H, H4, eps, red, H);
        return;
    }
    pdl_wait();
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
    OutT* o = out + (size_t)blockIdx.x * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) store_out(o, i, w[i] * (xr[i] * inv));
}

extern "C" __global__ void rms_norm(const float* __restrict__ x, const int* __restrict__ rows,
                                    const float* __restrict__ w, float* __restrict__ out, int H, float eps) {
    pdl_trigger();  // rms_norm_row waits (after the norm weight's loads where it can)
    rms_norm_row(x, rows, w, out, H, eps);
}

extern "C" __global__ void rms_norm_bf16(const float* __restrict__ x, const int* __restrict__ rows,
                                         const float* __restrict__ w, bf16_t* __restrict__ out, int H, float eps) {
    pdl_trigger();  // rms_norm_row waits (after the norm weight's loads where it can)
    rms_norm_row(x, rows, w, out, H, eps);
}

extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ y,
                                        const float* __restrict__ w, float* __restrict__ out, int H, float eps) {
    pdl_trigger();  // add_rms_norm_row waits (after the norm weight's loads where it can)
    add_rms_norm_row(x, y, w, out, H, eps);
}

extern "C" __global__ void add_rms_norm_bf16(float* __restrict__ x, const float* __restrict__ y,
                                             const float* __restrict__ w, bf16_t* __restrict__ out, int H,
                                             float eps) {
    pdl_trigger();  // add_rms_norm_row waits (after the norm weight's loads where it can)
    add_rms_norm_row(x, y, w, out, H, eps);
}
