// rmsnorm.cu: RMSNorm, f32 in and out, f32 weight (the bf16-rounded checkpoint values).
//   rms_norm:      out[i] = w * x[r] / sqrt(mean(x[r]^2) + eps), r = rows ? rows[i] : i
//                  (`rows` gathers the sampled rows before the final norm, in the same launch)
//   add_rms_norm:  x[i] += y[i] (the residual, in place), then out[i] = rms_norm(x[i])
// One block per row; the sum of squares is a block reduction (f32), as numpy's mean in f32.
#include "common.cuh"

extern "C" __global__ void rms_norm(const float* __restrict__ x, const int* __restrict__ rows,
                                    const float* __restrict__ w, float* __restrict__ out, int H, float eps) {
    __shared__ float red[32];
    const int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float* xr = x + (size_t)r * H;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
    float* o = out + (size_t)blockIdx.x * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ y,
                                        const float* __restrict__ w, float* __restrict__ out, int H, float eps) {
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
    float* o = out + (size_t)blockIdx.x * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}
