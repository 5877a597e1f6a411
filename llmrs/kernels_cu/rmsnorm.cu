// rmsnorm.cu: RMSNorm, f32 in, f32 weight (the bf16-rounded checkpoint values), f32 or bf16 out.
//   rms_norm:      out[i] = w * x[r] / sqrt(mean(x[r]^2) + eps), r = rows ? rows[i] : i
//                  (`rows` gathers the sampled rows before the final norm, in the same launch)
//   add_rms_norm:  x[i] += y[i] (the residual, in place), then out[i] = rms_norm(x[i])
//   rms_norm_bf16, add_rms_norm_bf16: the same, out as bf16 words (round to nearest even, as cast_f32_bf16):
//                  the input of a cuBLAS GEMM, written here instead of by a separate cast. The f32 value is the
//                  same expression as the f32 kernels' (one template), so bf16 out == cast_f32_bf16(f32 out)
//                  bit for bit at the same block size.
// One block per row; the sum of squares is a block reduction (f32), as numpy's mean in f32.
#include "common.cuh"

__device__ __forceinline__ void store_out(float* o, int i, float v) { o[i] = v; }
__device__ __forceinline__ void store_out(bf16_t* o, int i, float v) { o[i] = f32_to_bf16(v); }

template <typename OutT>
__device__ __forceinline__ void rms_norm_row(const float* __restrict__ x, const int* __restrict__ rows,
                                             const float* __restrict__ w, OutT* __restrict__ out, int H, float eps) {
    __shared__ float red[32];
    const int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float* xr = x + (size_t)r * H;
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
    pdl_enter();
    rms_norm_row(x, rows, w, out, H, eps);
}

extern "C" __global__ void rms_norm_bf16(const float* __restrict__ x, const int* __restrict__ rows,
                                         const float* __restrict__ w, bf16_t* __restrict__ out, int H, float eps) {
    pdl_enter();
    rms_norm_row(x, rows, w, out, H, eps);
}

extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ y,
                                        const float* __restrict__ w, float* __restrict__ out, int H, float eps) {
    pdl_enter();
    add_rms_norm_row(x, y, w, out, H, eps);
}

extern "C" __global__ void add_rms_norm_bf16(float* __restrict__ x, const float* __restrict__ y,
                                             const float* __restrict__ w, bf16_t* __restrict__ out, int H,
                                             float eps) {
    pdl_enter();
    add_rms_norm_row(x, y, w, out, H, eps);
}
