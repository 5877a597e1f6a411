// common.cuh: helpers shared by every kernel family in this directory.
//
// bf16 is handled as raw 16-bit words (no <cuda_bf16.h>), so NVRTC needs no CUDA headers at run time:
// a bf16 is the top half of an IEEE float32; float -> bf16 rounds to nearest even (as torch and numpy-side
// `round_bf16` do), NaN stays NaN. Reductions are warp shuffles, deterministic for a fixed launch shape.
#pragma once

typedef unsigned short bf16_t;

#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float(((unsigned)h) << 16); }

__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// two floats -> one word of two bf16 (lo in the low half), each rounded as f32_to_bf16 rounds it
__device__ __forceinline__ unsigned bf16x2(float lo, float hi) {
    return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
}

// 8 bf16 packed in 16 bytes -> 8 floats (element 0 is the low half of .x)
__device__ __forceinline__ void unpack8(uint4 w, float* f) {
    f[0] = __uint_as_float(w.x << 16); f[1] = __uint_as_float(w.x & 0xffff0000u);
    f[2] = __uint_as_float(w.y << 16); f[3] = __uint_as_float(w.y & 0xffff0000u);
    f[4] = __uint_as_float(w.z << 16); f[5] = __uint_as_float(w.z & 0xffff0000u);
    f[6] = __uint_as_float(w.w << 16); f[7] = __uint_as_float(w.w & 0xffff0000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `red` is __shared__ float[32]. Deterministic: fixed tree for a fixed block size.
__device__ __forceinline__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

// silu(gate) * up: the one expression of silu_mul / silu_mul_bf16 (elementwise.cu) and matvec_silu_bf16 (matvec.cu)
__device__ __forceinline__ float silu_mul_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Rotary angles reach tens of thousands of radians: the f32 angle (as numpy forms it) is reduced to [-pi, pi] in
// double, then __sincosf (abs error ~1e-6). Plain sincosf would carry its Payne-Hanek slow path, which lives in
// local memory (ptx-check flags it). Shared by rope_write_kv (rope_kv.cu) and matvec_rope_bf16 (matvec.cu).
__device__ __forceinline__ void rope_sincos(float angle, float* sn, float* cs) {
    const double two_pi = 6.283185307179586;
    const double a = (double)angle;
    const float r = (float)(a - rint(a / two_pi) * two_pi);
    __sincosf(r, sn, cs);
}

// A 16-byte load of streamed data read once (decode weights: matvec.cu, matvec_q4.cu, gemv_q4): through the
// non-coherent path without allocating in L1, so the weight stream does not evict what the warps re-read from L1
// (x, the norm weight, scales). Measured on the H200 (bf16 single-stream decode, scripts/gpu_ab.sh): 7B 4.662 ->
// 4.448 ms/token, 3B 2.895 -> 2.776, 0.5B 0.890 -> 0.868.
// -DLLMRS_NO_STREAM_LOADS (LLMRS_STREAM_LOADS=0) makes it a plain __ldg, for A/B runs.
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
#ifndef LLMRS_NO_STREAM_LOADS
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
#else
    return __ldg(p);
#endif
}

// Programmatic dependent launch (sm_90+; no-ops below, and when the kernel was launched without the attribute).
// Inside a decode graph the backend launches its kernels with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
// (cuda_kernels.PDL_KERNELS), so kernel n+1's blocks start while kernel n drains. The contract of every such kernel:
//   pdl_trigger() first (lets the next kernel launch once every block of this one has started), then
//   pdl_wait() before reading anything an earlier kernel of the stream wrote and before writing anything
//   (it returns once the previous kernel has finished and its writes are visible). Only data no kernel writes
//   (weights, norms, the step's index arrays copied before the graph) may be read before pdl_wait().
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// the usual prologue of a kernel that prefetches nothing
__device__ __forceinline__ void pdl_enter() {
    pdl_trigger();
    pdl_wait();
}

// Decode attention's prologue before pdl_wait(): pull the K and V rows of keys [start, stop) of kv head g into L2
// (the block's threads stride over (key, 128-byte line) pairs; block table = the token's, host-written). A
// prefetch hands nothing to the thread and L2 is the GPU's point of coherence, so this is safe for any row; the
// callers stop before the token's own key (L - 1, written by the kernel before them) anyway. In a decode graph
// the DRAM round trips then overlap the previous kernel's tail: after the wait, the reads hit L2.
// -DLLMRS_NO_KV_PREFETCH (LLMRS_KV_PREFETCH=0) leaves it out, for A/B runs.
__device__ __forceinline__ void prefetch_kv_l2(const bf16_t* k_cache, const bf16_t* v_cache,
                                               const int* table, int start, int stop, int Hkv, int g,
                                               int block_size, int D) {
#ifndef LLMRS_NO_KV_PREFETCH
    const int lines = (2 * D + 127) / 128;  // 128-byte lines of a bf16 row
    const int n = (stop - start) * lines;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = start + i / lines, c = i - (i / lines) * lines;
        const size_t off = (((size_t)table[j / block_size] * Hkv + g) * block_size + j % block_size) * D + c * 64;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(k_cache + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(v_cache + off));
    }
#endif
}
