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

// The qkv pair's epilogue of matvec_rope_bf16 (matvec.cu) and gemv_q4's rope form (gemv_q4.cu) (a, c: rows h D + i
// and h D + i + D / 2 of token t, bias added): a q head rotated in place in y (= qkv), a k head rotated and a v head
// as it is, written to the paged caches as bf16 (rope_write_kv's math)
__device__ __forceinline__ void pair_rope_out(float a, float c, int h, int i, int half, int t, float* __restrict__ y,
                                              int N, const int* __restrict__ positions,
                                              const float* __restrict__ inv_freq, const int* __restrict__ slots,
                                              bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache, int Hq,
                                              int Hkv, int D, int block_size) {
    float* row = y + (size_t)t * N + h * D;
    if (h >= Hq + Hkv) {  // a v head: to the cache as it is
        const int sl = slots[t];
        const long long r = ((long long)(sl / block_size) * Hkv + (h - Hq - Hkv)) * block_size + sl % block_size;
        bf16_t* dst = v_cache + r * D;
        dst[i] = f32_to_bf16(a);
        dst[i + half] = f32_to_bf16(c);
        return;
    }
    float sn, cs;
    rope_sincos(__fmul_rn((float)positions[t], inv_freq[i]), &sn, &cs);
    const float y1 = a * cs - c * sn, y2 = c * cs + a * sn;
    if (h < Hq) {
        row[i] = y1;
        row[i + half] = y2;
    } else {
        const int sl = slots[t];
        const long long r = ((long long)(sl / block_size) * Hkv + (h - Hq)) * block_size + sl % block_size;
        bf16_t* dst = k_cache + r * D;
        dst[i] = f32_to_bf16(y1);
        dst[i + half] = f32_to_bf16(y2);
    }
}

// A 16-byte load of streamed data read once (decode weights: matvec.cu, matvec_q4.cu, gemv_q4): through the
// non-coherent path without allocating in L1, so the weight stream does not evict what the warps re-read from L1
// (x, the norm weight, scales). Measured on the H200 (bf16 single-stream decode, tools/gpu_ab.sh): 7B 4.662 ->
// 4.448 ms/token, 3B 2.895 -> 2.776, 0.5B 0.890 -> 0.868 against a plain __ldg.
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// Early weight loads under programmatic dependent launch. A kernel's first weight chunks are meant to stream while
// the previous kernel drains (they are loaded before pdl_wait), but ptxas is free to move a load past
// `griddepcontrol.wait` (SASS ACQBULK), and without these rules it does: no load of a matvec or gemv kernel comes
// before it (ptx-check --sass, sm_90), so nothing streams early. Two rules pin them:
//   ldg_early: the early chunk loads (ldg_stream's form);
//   pdl_wait_on(v): pdl_wait made to depend on v, a word of each early chunk, so the loads are issued (and land)
//     before the wait; the warp would wait for them right after it anyway;
//   ldx4 / ldx2: the activations an earlier kernel wrote (x), read after the wait through the coherent path:
//     ptxas may hoist a non-coherent (`ld.global.nc`, what `const __restrict__` compiles to) load above the wait,
//     which would read x before the previous kernel wrote it; a coherent load stays below an acquire. (Below
//     sm_90, no PDL: the non-coherent load.)
__device__ __forceinline__ uint4 ldg_early(const uint4* p) { return ldg_stream(p); }

__device__ __forceinline__ unsigned early_word(const uint4& a) { return a.x; }
__device__ __forceinline__ unsigned early_word(const uint2& a) { return a.x; }
__device__ __forceinline__ unsigned early_word(unsigned a) { return a; }
__device__ __forceinline__ unsigned early_word(unsigned short a) { return a; }

// pdl_wait_on's word over an array of early chunks: a word of each, or'ed onto v (another array's words)
template <int N>
__device__ __forceinline__ unsigned early_words(const uint4 (&p)[N], unsigned v = 0u) {
#pragma unroll
    for (int i = 0; i < N; ++i) v |= early_word(p[i]);
    return v;
}

__device__ __forceinline__ float ldx1(const float* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    float r;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(r) : "l"(p));
    return r;
#else
    return __ldg(p);
#endif
}

__device__ __forceinline__ float2 ldx2(const float* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    float2 r;
    asm volatile("ld.global.v2.f32 {%0, %1}, [%2];" : "=f"(r.x), "=f"(r.y) : "l"(p));
    return r;
#else
    return __ldg(reinterpret_cast<const float2*>(p));
#endif
}

__device__ __forceinline__ float4 ldx4(const float* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    float4 r;
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
    return r;
#else
    return *reinterpret_cast<const float4*>(p);
#endif
}

// ldc: 2 / 4 / 8 / 16 raw bytes an earlier kernel of the step wrote (the decode attention's current K / V row), read
// after the wait through the coherent path, as ldx* (a plain load below sm_90)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned short ldc(const unsigned short* p) {
    unsigned short r;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ unsigned ldc(const unsigned* p) {
    unsigned r;
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ uint2 ldc(const uint2* p) {
    uint2 r;
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
__device__ __forceinline__ uint4 ldc(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
#else
template <typename R>
__device__ __forceinline__ R ldc(const R* p) { return *p; }
#endif

// Programmatic dependent launch (sm_90+; no-ops below, and when the kernel was launched without the attribute).
// Inside a decode graph the backend launches its kernels with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
// (cuda.kernels.PDL_KERNELS), so kernel n+1's blocks start while kernel n drains. The contract of every such kernel:
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

// pdl_wait after the loads that produced v (see ldg_early): both branches wait; the predicate makes ptxas issue the
// loads first.
__device__ __forceinline__ void pdl_wait_on(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred q;\n setp.eq.u32 q, %0, 0x7fc00001;\n @q griddepcontrol.wait;\n"
                 " @!q griddepcontrol.wait;\n}" :: "r"(v) : "memory");
#else
    (void)v;
    pdl_wait();
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
__device__ __forceinline__ void prefetch_kv_l2(const bf16_t* k_cache, const bf16_t* v_cache,
                                               const int* table, int start, int stop, int Hkv, int g,
                                               int block_size, int D) {
    const int lines = (2 * D + 127) / 128;  // 128-byte lines of a bf16 row
    const int n = (stop - start) * lines;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = start + i / lines, c = i - (i / lines) * lines;
        const size_t off = (((size_t)table[j / block_size] * Hkv + g) * block_size + j % block_size) * D + c * 64;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(k_cache + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(v_cache + off));
    }
}


// The hand-off of a split's partials through L2 (gemv_q4's K slices, sample_tokens's blocks of a row, attn_o's heads):
// once the block's threads have stored their share of its partial, every thread calls this; it counts the block in
// on *count (n blocks share it a launch) and tells every thread whether the block came last. That block may read
// every block's partial (through __ldcg), and has put the counter back to 0 for the next launch (stream order: every
// block of this one has counted in). Cooperative groups' grid sync's pattern: the block's barrier orders its
// threads' stores before thread 0's fence, which (cumulative) releases them all with the count, and thread 0's
// fence after a last count acquires every block's before the second barrier hands them on; fence.acq_rel
// (MEMBAR.ALL.GPU) by one thread, not __threadfence (MEMBAR.SC.GPU) by every thread before the count.
__device__ __forceinline__ bool block_counts_last(int* count, int n) {
    __shared__ int last;
    __syncthreads();  // the block's stores of its partial, before thread 0's release
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        last = atomicAdd(count, 1) == n - 1;
        if (last) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            *count = 0;
        }
    }
    __syncthreads();
    return last;
}

// ---------------------------------------------------------------------- thread-block clusters (sm_90+)
// NAME(): the special register REG (sm_90+), FALLBACK before sm_90
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CLUSTER_SREG(NAME, REG, FALLBACK)                        \
    __device__ __forceinline__ unsigned NAME() {                  \
        unsigned r;                                               \
        asm volatile("mov.u32 %0, %%" REG ";" : "=r"(r));        \
        return r;                                                 \
    }
#else
#define CLUSTER_SREG(NAME, REG, FALLBACK) \
    __device__ __forceinline__ unsigned NAME() { return FALLBACK; }
#endif
CLUSTER_SREG(cluster_rank, "cluster_ctarank", 0u)     // this block's rank in its cluster
CLUSTER_SREG(cluster_blocks, "cluster_nctarank", 1u)  // blocks in its cluster (1 outside a cluster launch)
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// the cluster barrier in halves: arrive (relaxed: orders no memory) now, wait later (cluster_wait); between them a
// thread may not arrive again
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
// the shared-state-space (32-bit) address of a pointer into this block's shared memory
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// the same address through inline PTX (cvta.to.shared + cvt): the form gemm_q4.cu and attention_gqa.cu were tuned
// with; their PTX differs from smem_addr's, so each keeps the form it was measured with
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
// cp.async, global -> shared without registers (sm_80+): 16 bytes through L2 only (.cg), of which src_bytes are
// read and the rest zero-filled (0: all zeros; src must still be a valid address); 4 bytes through L1 (.ca); the
// group commit and wait (PENDING: how many of the newest groups may still be in flight). Empty below sm_80, where
// no kernel that uses them is launched.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define LLMRS_CP_ASYNC(...) asm volatile(__VA_ARGS__)
#else
#define LLMRS_CP_ASYNC(...) ((void)0)
#endif
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    LLMRS_CP_ASYNC("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    LLMRS_CP_ASYNC("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src) {
    LLMRS_CP_ASYNC("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { LLMRS_CP_ASYNC("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    LLMRS_CP_ASYNC("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}
#undef LLMRS_CP_ASYNC
// the shared::cluster address of block `rank`'s shared memory at the address of `p` in this block's (mapa)
__device__ __forceinline__ unsigned cluster_addr(const void* p, unsigned rank) {
    unsigned ra = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(smem_addr(p)), "r"(rank));
#endif
    return ra;
}
// v into block `rank`'s shared memory at the address of `p` in this block's
__device__ __forceinline__ void st_cluster(float* p, unsigned rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned ra = cluster_addr(p, rank);
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(ra), "f"(v) : "memory");
#endif
}
// the float2 at `p` (8-byte aligned) in block `rank`'s shared memory
__device__ __forceinline__ float2 ld_cluster2(const float* p, unsigned rank) {
    float2 v = make_float2(0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned ra = cluster_addr(p, rank);
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(ra) : "memory");
#endif
    return v;
}
// the float4 at `p` (16-byte aligned) in block `rank`'s shared memory
__device__ __forceinline__ float4 ld_cluster4(const float* p, unsigned rank) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned ra = cluster_addr(p, rank);
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(ra)
                 : "memory");
#endif
    return v;
}

// Pushes into another block's shared memory that complete on its mbarrier (sm_90+): st.async with
// mbarrier::complete_tx, the receiving block waiting on the mbarrier's phase for the bytes it expects. A cluster
// barrier arrived with .release (cluster_sync) orders plain st.shared::cluster pushes but costs a MEMBAR.ALL.GPU
// before the arrive (nvdisasm, sm_90); these need no fence. The mbarrier must be initialized (mbar_init,
// with its fence) before any block pushes into it: a cluster barrier (relaxed arrive, then wait) between the two.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// one arrival on this block's mbarrier that also makes it expect `bytes` more of pushes
__device__ __forceinline__ void mbar_arrive_expect(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
#endif
}
// v into block `rank`'s shared memory at the address of `p` in this block's, completing 4 bytes on that block's
// mbarrier at the address of `bar` in this block's
__device__ __forceinline__ void st_async_cluster(float* p, unsigned rank, float v, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(cluster_addr(p, rank)), "r"(__float_as_uint(v)), "r"(cluster_addr(bar, rank)) : "memory");
#endif
}
// until this block's mbarrier completes the phase of `parity` (its pushes visible to the caller)
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n.reg .pred done;\nMBAR_WAIT_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra MBAR_WAIT_%=;\n}" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
}

// ---------------------------------------------------------------------- wgmma (sm_90a: arch-specific)
// Defined only where the target has them (__CUDA_ARCH_FEAT_SM90_ALL: NVRTC's sm_90a, cuda.kernels.module_for_arch);
// LLMRS_WGMMA says so. Operands: bf16, f32 accumulators in the m64nNk16 D layout (per warp of the warpgroup 16
// rows; a thread's d[4 i + 2 h + e] is row 16 warp + g + 8 h, column 8 i + 2 t + e); shared-memory operands
// K-major with the 128-byte swizzle (16-byte chunk c of row r at r * 128 + ((c ^ (r % 8)) * 16), 1024-byte aligned
// 8-row groups); a k16 step further along K is +32 bytes on the descriptor's start address.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMRS_WGMMA 1
// the shared-memory matrix descriptor of a K-major bf16 tile with 128-byte swizzle: start address >> 4, leading
// byte offset unused (1), stride byte offset 1024 (8 rows of 128 bytes) >> 4, swizzle mode 1 (128 bytes)
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// keeps the compiler from moving accumulator reads or writes across a wgmma fence / wait
template <int N>
__device__ __forceinline__ void wg_fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// the accumulators of an m64n128 wgmma (64 a thread) and an m64n256 one (128) as asm operand lists: the first 64
// and the next 64 (WG_R*: their %N names, WG_OPS*: the "+f" operands of d[])
#define WG_R0_63                                                                                                       \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_R64_127                                                                                                     \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                 \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                 \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                     \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_OPS0_63(d)                                                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                    \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),              \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),            \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),            \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),            \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),            \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),            \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_OPS64_127(d)                                                                                                \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),            \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),            \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),            \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),            \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),        \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),    \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),    \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define WG_D64_REGS "{" WG_R0_63 "}"
#define WG_D64(d) WG_OPS0_63(d)
#define WG_D128_REGS "{" WG_R0_63 ", " WG_R64_127 "}"
#define WG_D128(d) WG_OPS0_63(d), WG_OPS64_127(d)

// d[64] += A (registers, m64 x k16 bf16) * B (descriptor, k16 x n128 bf16, K-major)
__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], const unsigned (&a)[4], unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64_REGS ", {%64, %65, %66, %67}, %68, "
                 "p, 1, 1, 0;\n}\n"
                 : WG_D64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// d[128] += A (registers, m64 x k16 bf16) * B (descriptor, k16 x n256 bf16, K-major): the m64n256 D layout, a
// thread's d[4 i + 2 h + e] row 16 warp + g + 8 h, column 8 i + 2 t + e (i < 32)
__device__ __forceinline__ void wgmma_m64n256(float (&d)[128], const unsigned (&a)[4], unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_D128_REGS ", {%128, %129, %130, %131}, "
                 "%132, p, 1, 1, 0;\n}\n"
                 : WG_D128(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
#endif
