// gemm_q4.cu: the Marlin-style 4-bit GEMM of the prefill / batched path (mma.sync, sm_80+):
//   out[T, N] (= or +=) x[T, K] @ W[N, K]^T (+ bias[N]),  x bf16 (the backend's `gemm_x` cast), out f32,
//   W 4-bit in q4_marlin.cuh's layout (zero / min modes, group size G). N % 32 == 0, K % 64 == 0, G % 32 == 0 (the
//   host asks N % 64, K % 64 and falls back else).
// Entry points: gemm_q4{z,m}_m{1,2,4,8} (MT m16 tiles of tokens a block), gemm_q4{z,m}_silu_m4 (gate_up with SiLU x
// up in the epilogue), gemm_q4_reduce / gemm_q4_reduce_silu (the split-K sums).
//
// Dequantization (q4_marlin.cuh): per weight ~0.5 shift + 1 lop3 + 1 fma (2 in min) + 0.5 cvt, amortized over MT
// m16 tiles of tokens.
//
// Work: 4 warps per block, 128 columns (32 per warp) x 16 MT token rows; each warp holds all MT m16 tiles of
// its 32 columns (acc 16 MT floats), so each dequantized B fragment feeds MT mma. K is walked in 64-wide
// stages (two 32-k sub-blocks, each inside one group) through a STAGES-deep cp.async ring in shared memory:
// x rows (16-byte chunks XOR-swizzled by row, ldmatrix.x4 conflict-free; rows >= T zero-filled), the warps'
// packed weights (lane L reads its 16 bytes at L: conflict-free), the scale rows of both sub-blocks.
// Split-K (gridDim.z > 1): each slice writes f32 partials [z][T][N], gemm_q4_reduce sums them in a fixed
// order and applies bias / accumulate (deterministic).
//
// Roof (H200): at 256+ tokens the kernel is bound inside the SM, ~300-350 TFLOP/s of mma.sync (about a third of the
// dense bf16 roof) for MT 8 at 2 blocks an SM; the wgmma forms (gemm_q4_wgmma.cu) take those token counts on Hopper.
#include "common.cuh"
#include "q4_marlin.cuh"

__device__ __forceinline__ void ldmatrix_x4(unsigned* a, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr)
                 : "memory");
}

// Pipeline stages per MT. The ring is dynamic shared memory (the host passes its size and raises the kernel's
// limit above 48 KB: cuda.kernels.GEMM_Q4_STAGES, which compiles these values in with -D; the defaults here are
// the same, for `llmrs ptx-check`). A stage is (16 MT 8 + 256 + 64) x 16 bytes: 21 KB at MT 8, 13 KB at 4.
// Deeper rings measured no faster on the H200 (probes/bench_gemm_q4.py, the 7B's AWQ linears at 128-512 tokens):
// the loads are hidden already; at 256+ tokens the kernel is bound inside the SM (252 registers at MT 8).
#ifndef GQ_STAGES_M1
#define GQ_STAGES_M1 4
#endif
#ifndef GQ_STAGES_M2
#define GQ_STAGES_M2 4
#endif
#ifndef GQ_STAGES_M4
#define GQ_STAGES_M4 3
#endif
#ifndef GQ_STAGES_M8
#define GQ_STAGES_M8 2
#endif

template <int MT>
struct GemmQ4Smem {
    static constexpr int STAGES =
        MT == 8 ? GQ_STAGES_M8 : MT == 4 ? GQ_STAGES_M4 : MT == 2 ? GQ_STAGES_M2 : GQ_STAGES_M1;
    static_assert(STAGES >= 2, "the ring needs a stage in flight while one is used");
    uint4 a[STAGES][16 * MT * 8];                   // x rows: 8 chunks of 16 bytes (64 bf16), swizzled
    uint4 b[STAGES][256];                           // [warp][kb][lane] packed weights
    uint4 s[STAGES][64];                            // [kb][128 columns] scale words
};



template <int MT, int MODE>
__device__ __forceinline__ void compute_stage(const GemmQ4Smem<MT>& sm, int st, int warp, int lane,
                                              float (&acc)[MT][4][4]) {
    const unsigned* S = reinterpret_cast<const unsigned*>(sm.s[st]);
    const unsigned a_base = smem_u32(sm.a[st]);
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
        const uint4 q = sm.b[st][(warp * 2 + kb) * 32 + lane];
        const unsigned wq[4] = {q.x, q.y, q.z, q.w};
        float sc[4], c12[4], c16[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            frag_consts<MODE>(S[kb * GQ_BN + warp * 32 + 8 * i + (lane >> 2)], sc[i], c12[i], c16[i]);
        }
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int r = mt * 16 + (lane & 15), cc = (kb * 2 + ks) * 2 + (lane >> 4);
                ldmatrix_x4(a[mt], a_base + (unsigned)(r * 8 + (cc ^ (r & 7))) * 16u);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                unsigned b0, b1;
                if (ks == 0)
                    frag_b<MODE, 0>(wq[i], sc[i], c12[i], c16[i], b0, b1);
                else
                    frag_b<MODE, 1>(wq[i], sc[i], c12[i], c16[i], b0, b1);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) mma_bf16(acc[mt][i], a[mt], b0, b1);
            }
        }
    }
}

// EPI GV_EPI_SILU (gemm_q4{z,m}_silu_m{MT}): gate_up with SiLU x up fused, the block's 128 columns 64 of gate and
// the matching 64 of up (the loader's n-blocks 2 b, 2 b + 1, then N / 64 further: warps 0, 1 gate, 2, 3 up). With
// one K slice the accumulators go through shared memory (the ring's space) and each thread writes silu(gate) x up of
// its column pairs as bf16 words to out16 [T, N / 2]; with several, each slice's partials go to part in that pair
// order ([z][T][N], block b's columns 128 b .. 128 b + 127) and gemm_q4_reduce_silu sums and finishes them. Either
// way the bits of the plain form's f32 output + silu_mul_bf16.
template <int MT, int MODE, int EPI = 0>
__device__ __forceinline__ void gemm_q4_impl(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,
                                             const uint4* __restrict__ X, const float* __restrict__ bias,
                                             float* __restrict__ out, float* __restrict__ part, int T, int N, int K,
                                             int G, int accumulate, int kt_per_split,
                                             bf16_t* __restrict__ out16 = nullptr) {
    pdl_enter();
    constexpr int STAGES = GemmQ4Smem<MT>::STAGES;
    extern __shared__ uint4 gq_smem[];  // GemmQ4Smem<MT>: its size is the launch's dynamic shared memory
    GemmQ4Smem<MT>& sm = *reinterpret_cast<GemmQ4Smem<MT>*>(gq_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nblk = blockIdx.x, m0 = blockIdx.y * 16 * MT;
    const int kt0 = blockIdx.z * kt_per_split, nk = min((K >> 6) - kt0, kt_per_split);
    // warp-uniform: the last block may reach past N (a SiLU pair's block never does: N % 128, the host's rule)
    const bool active = EPI || (nblk * 4 + warp) * 32 < N;

    float acc[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][i][e] = 0.0f;

    StageLoader<MT> ld;
    ld.init(sm, Bq, SZ, X, T, N, K, G, m0, wg_pair_nb0<EPI>(nblk), kt0, wg_pair_hi<EPI>(N));
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) ld.template load<GemmQ4Smem<MT>>(s);
        cp_async_commit();  // always: the group count stays uniform
    }
    int st_use = 0, st_load = STAGES - 1;  // stage indices by counters, not `% STAGES` each tile
    for (int it = 0; it < nk; ++it) {
        cp_async_wait<STAGES - 2>();  // stage `it` has landed (for this thread) ...
        __syncthreads();              // ... for every thread; and every warp is done with stage it - 1
        if (it + STAGES - 1 < nk) ld.template load<GemmQ4Smem<MT>>(st_load);
        cp_async_commit();
        if (active) compute_stage<MT, MODE>(sm, st_use, warp, lane, acc);
        st_use = st_use + 1 == STAGES ? 0 : st_use + 1;
        st_load = st_load + 1 == STAGES ? 0 : st_load + 1;
    }
    cp_async_wait<0>();
    if (!active) return;

    const int g = lane >> 2, t = lane & 3;
    if (EPI == GV_EPI_SILU && part == nullptr) {  // one slice: through shared memory to the pairs' threads
        __syncthreads();  // every warp is done with the ring: its space takes the accumulators
        float* red = reinterpret_cast<float*>(gq_smem);  // [16 MT rows][WG_RED_LD]
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<float2*>(red + (mt * 16 + g + 8 * h) * WG_RED_LD + warp * 32 + 8 * i + 2 * t) =
                        make_float2(acc[mt][i][2 * h], acc[mt][i][2 * h + 1]);
        __syncthreads();
        const int p = 2 * lane;  // a lane: gate columns p, p + 1 of its rows and their up columns p + 64, p + 65
        for (int r = warp; r < 16 * MT; r += 4) {
            const int m = m0 + r;
            if (m >= T) break;
            const float2 gv = *reinterpret_cast<const float2*>(red + r * WG_RED_LD + p);
            const float2 uv = *reinterpret_cast<const float2*>(red + r * WG_RED_LD + 64 + p);
            *reinterpret_cast<unsigned*>(out16 + (size_t)m * (N >> 1) + nblk * 64 + p) =
                bf16x2(silu_mul_f(gv.x, uv.x), silu_mul_f(gv.y, uv.y));
        }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = (nblk * 4 + warp) * 32 + 8 * i + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + mt * 16 + g + 8 * h;
                if (m >= T) continue;
                float v0 = acc[mt][i][2 * h], v1 = acc[mt][i][2 * h + 1];
                if (part) {
                    *reinterpret_cast<float2*>(part + ((size_t)blockIdx.z * T + m) * N + n) = make_float2(v0, v1);
                    continue;
                }
                if (bias) {
                    v0 += bias[n];
                    v1 += bias[n + 1];
                }
                float2* dst = reinterpret_cast<float2*>(out + (size_t)m * N + n);
                if (accumulate) {
                    const float2 o = *dst;
                    v0 = o.x + v0;
                    v1 = o.y + v1;
                }
                *dst = make_float2(v0, v1);
            }
        }
}

#define GEMM_Q4(MT)                                                                                               \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4z_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ, const uint4* __restrict__ X,    \
                       const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part, int T,   \
                       int N, int K, int G, int accumulate, int kt_per_split) {                                   \
        gemm_q4_impl<MT, 0>(Bq, SZ, X, bias, out, part, T, N, K, G, accumulate, kt_per_split);                    \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4m_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ, const uint4* __restrict__ X,    \
                       const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part, int T,   \
                       int N, int K, int G, int accumulate, int kt_per_split) {                                   \
        gemm_q4_impl<MT, 1>(Bq, SZ, X, bias, out, part, T, N, K, G, accumulate, kt_per_split);                    \
    }
GEMM_Q4(1)
GEMM_Q4(2)
GEMM_Q4(4)
GEMM_Q4(8)

// the SiLU forms of the mma.sync GEMM (gemm_q4_impl's EPI): MT 4, 33-192 tokens (on Hopper 33-64: the wgmma forms
// take 65 on), where cuda.QuantLinearOps.gemm_silu_takes. (An MT 2 form for 17-32 tokens measured slower inside the
// graphed step on the H200.)
#define GEMM_Q4_SILU(MT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4z_silu_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,                           \
                            const uint4* __restrict__ X, bf16_t* __restrict__ out16, float* __restrict__ part,    \
                            int T, int N, int K, int G, int kt_per_split) {                                       \
        gemm_q4_impl<MT, 0, GV_EPI_SILU>(Bq, SZ, X, nullptr, nullptr, part, T, N, K, G, 0, kt_per_split, out16);  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4m_silu_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,                           \
                            const uint4* __restrict__ X, bf16_t* __restrict__ out16, float* __restrict__ part,    \
                            int T, int N, int K, int G, int kt_per_split) {                                       \
        gemm_q4_impl<MT, 1, GV_EPI_SILU>(Bq, SZ, X, nullptr, nullptr, part, T, N, K, G, 0, kt_per_split, out16);  \
    }
GEMM_Q4_SILU(4)

// Split-K epilogue: out[t, n] (= or +=) sum over z of part[z, t, n] (z = 0, 1, ... in order) + bias[n].
extern "C" __global__ void gemm_q4_reduce(const float* __restrict__ part, const float* __restrict__ bias,
                                          float* __restrict__ out, int T, int N, int S, int accumulate) {
    pdl_enter();
    const long long total = (long long)T * N;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int z = 0; z < S; ++z) v += part[z * total + idx];
        if (bias) v += bias[idx % N];
        out[idx] = accumulate ? out[idx] + v : v;
    }
}

// The SiLU forms' split-K epilogue: out16[t, i] = bf16(silu(gate) x up), gate and up each the sum over z of part in
// order from 0.0f (gemm_q4_reduce's sums without a bias), part in the pair order: output column i = 64 b + j reads
// part's columns 128 b + j (gate) and 128 b + 64 + j (up).
extern "C" __global__ void gemm_q4_reduce_silu(const float* __restrict__ part, bf16_t* __restrict__ out16, int T,
                                               int N, int S) {
    pdl_enter();
    const long long total = (long long)T * N, half = total >> 1;
    const int I = N >> 1;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < half;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long t = idx / I;
        const int i = (int)(idx - t * I);
        const long long c = t * N + 128 * (i >> 6) + (i & 63);
        float gv = 0.0f, uv = 0.0f;
        for (int z = 0; z < S; ++z) {
            gv += part[z * total + c];
            uv += part[z * total + c + 64];
        }
        out16[idx] = f32_to_bf16(silu_mul_f(gv, uv));
    }
}

