// elementwise.cu: the small glue kernels of the forward pass (grid-stride loops, f32 unless named).
//   silu_mul:      out[t, i] = silu(gu[t, i]) * gu[t, I + i]      (gate/up fused: gu is [T, 2I])
//   add_bias:      y[t, n] += b[n]                                  (after a cuBLAS GEMM)
//   add_inplace:   x[i] += y[i]
//   cast_f32_bf16: y[i] = bf16(x[i])  (round to nearest even; GEMM operands, weights at upload)
#include "common.cuh"

extern "C" __global__ void silu_mul(const float* __restrict__ gu, float* __restrict__ out, int T, int I) {
    const size_t n = (size_t)T * I;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / I, i = idx % I;
        const float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
        out[idx] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ b, int T, int N) {
    const size_t n = (size_t)T * N;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x)
        y[idx] += b[idx % N];
}

extern "C" __global__ void add_inplace(float* __restrict__ x, const float* __restrict__ y, long long n) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += (long long)gridDim.x * blockDim.x)
        x[idx] += y[idx];
}

extern "C" __global__ void cast_f32_bf16(const float* __restrict__ x, bf16_t* __restrict__ y, long long n) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += (long long)gridDim.x * blockDim.x)
        y[idx] = f32_to_bf16(x[idx]);
}
