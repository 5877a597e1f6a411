// matvec.cu: one-warp-per-row bf16 matrix-vector product for decode (and small token counts).
//
//   y[t, n] (= or +=) sum_k x[t, k] * W[n, k] + bias[n]      W bf16 [N, K] row-major, x/y/bias f32
//
// Decode is memory-bound: each weight is used once per token, so the kernel's job is to stream W at full
// bandwidth. Each warp owns one output row; its 32 lanes read consecutive 16-byte chunks (8 bf16) of the
// row, software-pipelined (the next four chunks in flight while the current four are used), and reduce with
// shuffles (no shared memory). Inside a decode graph the first loads go out before pdl_wait (common.cuh).
// NT tokens share each weight load (NT accumulators per lane, compile-time indexed: no local memory);
// grid.y walks the tokens NT at a time. `accumulate` adds into y (the residual stream: x += W a in one pass).
// x is f32 and stays in L1/L2 (each warp of a block re-reads it); K % 8 != 0 takes a scalar path.
// Block = 4 warps (4 rows, or 4/splits rows of `splits` warps each): small N still spreads over the SMs; the
// host picks splits by shape (few rows, long K: the `down` and o/qkv projections of a 7B decode step).
// Roof (H200, 7B one stream, each kernel in a graph, tools/bench_kernels_graph.py): gate_up + SiLU 100% of the
// 4,296 GB/s bandwidth floor, down 83%, qkv + RoPE 82%, o 79%.
#include "common.cuh"

template <int NT>
__device__ __forceinline__ void fma8(const float* wf, const float* __restrict__ x, int K, int T, int t0, int k0,
                                     float* acc) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        if (t0 + j < T) {
            const float* xp = x + (size_t)(t0 + j) * K + k0;
            const float4 a = ldx4(xp), b = ldx4(xp + 4);
            acc[j] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w
                    + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
        }
    }
}

// The sums of row n (this warp's share when splits > 1) for tokens t0 .. t0+NT-1, reduced over the warp (every
// lane holds them) and, with splits > 1, over the row's warps through `red` (then valid in warp s == 0 only).
template <int NT>
__device__ __forceinline__ void matvec_row_sums(const bf16_t* __restrict__ W, const float* __restrict__ x, int N,
                                                int K, int T, int t0, int n, bool live, int s, int splits,
                                                float (*red)[NT], float* acc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j] = 0.0f;
    const bf16_t* w = W + (size_t)(live ? n : 0) * K;
    const int stride = 32 * splits;
    pdl_trigger();
    if (!live) {
        pdl_wait();
    } else if ((K & 7) == 0) {
        // software-pipelined: the next 4 chunks are loaded before the current 4 are used (8 x 16 bytes in flight
        // per lane); the first 4 are loaded before pdl_wait (weights: no earlier kernel writes them), so inside
        // a decode graph they stream while the previous kernel drains. Chunks are used in order c, c + stride,
        // ..., the one summation order for every NT.
        const uint4* w4 = reinterpret_cast<const uint4*>(w);
        const int K8 = K >> 3;
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        int c = s * 32 + lane;
        uint4 p0 = c < K8 ? ldg_early(w4 + c) : z, p1 = c + stride < K8 ? ldg_early(w4 + c + stride) : z,
              p2 = c + 2 * stride < K8 ? ldg_early(w4 + c + 2 * stride) : z,
              p3 = c + 3 * stride < K8 ? ldg_early(w4 + c + 3 * stride) : z;
        pdl_wait_on(early_word(p0) | early_word(p1) | early_word(p2) | early_word(p3));
        while (c < K8) {
            const int cn = c + 4 * stride;
            const uint4 n0 = cn < K8 ? ldg_stream(w4 + cn) : z,
                        n1 = cn + stride < K8 ? ldg_stream(w4 + cn + stride) : z,
                        n2 = cn + 2 * stride < K8 ? ldg_stream(w4 + cn + 2 * stride) : z,
                        n3 = cn + 3 * stride < K8 ? ldg_stream(w4 + cn + 3 * stride) : z;
            float wf[8];
            unpack8(p0, wf); fma8<NT>(wf, x, K, T, t0, 8 * c, acc);
            if (c + stride < K8) { unpack8(p1, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + stride), acc); }
            if (c + 2 * stride < K8) { unpack8(p2, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + 2 * stride), acc); }
            if (c + 3 * stride < K8) { unpack8(p3, wf); fma8<NT>(wf, x, K, T, t0, 8 * (c + 3 * stride), acc); }
            p0 = n0; p1 = n1; p2 = n2; p3 = n3;
            c = cn;
        }
    } else {
        pdl_wait();
        for (int k = s * 32 + lane; k < K; k += stride) {
            const float wk = bf16_to_f32(w[k]);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                if (t0 + j < T) acc[j] += wk * x[(size_t)(t0 + j) * K + k];
        }
    }
    if (splits > 1) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float v = warp_sum(acc[j]);
            if (lane == 0) red[warp][j] = v;
        }
        __syncthreads();
        if (!live || s != 0) return;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float v = red[warp][j];
            for (int i = 1; i < splits; ++i) v += red[warp + i][j];
            acc[j] = v;
        }
    } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[j] = warp_sum(acc[j]);
    }
}

template <int NT>
__device__ __forceinline__ void matvec_impl(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            const float* __restrict__ bias, float* __restrict__ y,
                                            int N, int K, int T, int accumulate, int splits) {
    // splits (1, 2 or 4) warps share one row: warp s of the row reads chunks s*32 + lane + i*32*splits, so the
    // row's warps together stream 512*splits contiguous bytes per step; the partial sums meet in shared memory
    // in a fixed order (deterministic; splits = 1 is the one-warp-per-row kernel, same summation order).
    __shared__ float red[4][NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int s = warp % splits;
    const int n = blockIdx.x * (blockDim.x >> 5) / splits + warp / splits;
    const bool live = n < N;
    if (splits == 1 && !live) return;  // (a block's last warps past N: no loads, no stores)
    const int t0 = blockIdx.y * NT;
    float acc[NT];
    matvec_row_sums<NT>(W, x, N, K, T, t0, n, live, s, splits, red, acc);
    if (!live || s != 0) return;
    const float b = bias ? bias[n] : 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float sum = acc[j];
        if (lane == 0 && t0 + j < T) {
            float* dst = y + (size_t)(t0 + j) * N + n;
            *dst = accumulate ? *dst + (sum + b) : sum + b;
        }
    }
}

// One token, a warp's whole row in registers before pdl_wait (K <= 256 * R: R 16-byte chunks a lane): inside a
// decode graph the row streams in while the previous kernel runs (the attention, before o), where matvec_bf16 has
// only its first 4 chunks a lane in flight by then. Registers, not shared memory: a block with a large shared-memory
// request waits for SMs to drain. The chunks are summed in matvec_bf16's order at
// one warp a row (c = lane, lane + 32, ...; fma8, warp_sum): the same bits as matvec_bf16_t1 at splits 1.
template <int R>
__device__ __forceinline__ void matvec_rows_impl(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                                 const float* __restrict__ bias, float* __restrict__ y, int N, int K,
                                                 int accumulate) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = blockIdx.x * (blockDim.x >> 5) + warp;
    if (n >= N) return;  // (a block's last warps past N: no loads, no stores)
    pdl_trigger();
    const uint4* w4 = reinterpret_cast<const uint4*>(W + (size_t)n * K);
    const int K8 = K >> 3;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    uint4 p[R];
#pragma unroll
    for (int i = 0; i < R; ++i) p[i] = lane + 32 * i < K8 ? ldg_early(w4 + lane + 32 * i) : z;
    pdl_wait_on(early_words(p));
    float acc[1] = {0.0f};
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const int c = lane + 32 * i;
        if (c < K8) {
            float wf[8];
            unpack8(p[i], wf);
            fma8<1>(wf, x, K, 1, 0, 8 * c, acc);
        }
    }
    const float sum = warp_sum(acc[0]);
    if (lane == 0) {
        const float b = bias ? bias[n] : 0.0f;
        y[n] = accumulate ? y[n] + (sum + b) : sum + b;
    }
}

#define MATVEC_ROWS(R)                                                                                          \
    extern "C" __global__ void matvec_rows_bf16_r##R(const bf16_t* __restrict__ W, const float* __restrict__ x, \
                                                     const float* __restrict__ bias, float* __restrict__ y,     \
                                                     int N, int K, int accumulate) {                             \
        matvec_rows_impl<R>(W, x, bias, y, N, K, accumulate);                                                  \
    }
MATVEC_ROWS(4)
MATVEC_ROWS(8)
MATVEC_ROWS(16)

// Paired rows with a fused epilogue: one warp computes both rows of a pair (a block's 4 warps: pairs
// blockIdx.x * 4 + warp), so each 16-byte chunk of x is loaded once for the two rows; lane j finishes token t0 + j.
// The row sums are matvec_impl's (same chunks, same order), the epilogues the same expressions as the kernels they
// replace, so the outputs are bit-identical to matvec + that kernel.
//   matvec_silu_bf16: W = gate_up [2I, K]; pair i = (gate row i, up row I + i); act[t, i] = silu(g) * u (f32)
//                     (silu_mul in elementwise.cu).
//   matvec_rope_bf16: W = qkv [(Hq + 2 Hkv) D, K] + bias; pair p = head h = p / (D/2), i = p % (D/2): rows
//                     (h D + i, h D + i + D/2); q heads rotated in place in y (= qkv), k heads rotated and v heads
//                     as they are written to the paged caches as bf16 (rope_write_kv in rope_kv.cu).
// The *_norm_* kernels also fold the RMSNorm before the projection into it (x is then the residual stream, g the
// norm's weight): the sums take x[k] * g[k] and each token's sum of squares of x rides along in the same pass;
// after the reduction both rows are scaled by 1 / sqrt(mean(x^2) + eps). The projection of rms_norm(x) by
// linearity, with other roundings than rms_norm + matvec (within f32 tolerance, not bit-identical), and one
// launch less per norm.
#define EPI_SILU 1
#define EPI_ROPE 2

// x chunk at k0 (times g when NORM) against two rows' 8 weights; with NORM also ss[j] += x^2 (before g)
template <int NT, bool NORM>
__device__ __forceinline__ void fma8x2(const float* wa, const float* wb, const float* __restrict__ x,
                                       const float* __restrict__ g, int K, int T, int t0, int k0, float* acc_a,
                                       float* acc_b, float* ss) {
    float gf[8];
    if (NORM) {
        const float4* gp = reinterpret_cast<const float4*>(g + k0);
        const float4 a = gp[0], b = gp[1];
        gf[0] = a.x; gf[1] = a.y; gf[2] = a.z; gf[3] = a.w; gf[4] = b.x; gf[5] = b.y; gf[6] = b.z; gf[7] = b.w;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        if (t0 + j < T) {
            const float* xp = x + (size_t)(t0 + j) * K + k0;
            const float4 a = ldx4(xp), b = ldx4(xp + 4);
            float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            if (NORM) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    ss[j] += v[i] * v[i];
                    v[i] *= gf[i];
                }
            }
            acc_a[j] += wa[0] * v[0] + wa[1] * v[1] + wa[2] * v[2] + wa[3] * v[3]
                      + wa[4] * v[4] + wa[5] * v[5] + wa[6] * v[6] + wa[7] * v[7];
            acc_b[j] += wb[0] * v[0] + wb[1] * v[1] + wb[2] * v[2] + wb[3] * v[3]
                      + wb[4] * v[4] + wb[5] * v[5] + wb[6] * v[6] + wb[7] * v[7];
        }
    }
}

// Rows na and nb of W for tokens t0 .. t0+NT-1 over one warp (every lane gets the sums): matvec_row_sums's
// chunk order and pipeline (4 chunks of each row in use, the next 4 in flight, the first ones before pdl_wait).
// The weight stream of a row pair (chunks of 8 bf16, lane-strided), software-pipelined as matvec_row_sums: pair_first
// loads each row's first 4 chunks (before pdl_wait: weights), pair_stream then loads the next 4 before the current 4
// are used and hands each chunk to use(wa, wb, cc): the 8 weights of rows a and b at chunk cc.
__device__ __forceinline__ void pair_first(const uint4* a4, const uint4* b4, int K8, bool live, uint4 (&pa)[4],
                                           uint4 (&pb)[4]) {
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    const int c = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        pa[i] = live && c + 32 * i < K8 ? ldg_early(a4 + c + 32 * i) : z;
        pb[i] = live && c + 32 * i < K8 ? ldg_early(b4 + c + 32 * i) : z;
    }
}

template <typename Use>
__device__ __forceinline__ void pair_stream(const uint4* a4, const uint4* b4, int K8, uint4 (&pa)[4], uint4 (&pb)[4],
                                            Use use) {
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    int c = threadIdx.x & 31;
    while (c < K8) {
        const int cn = c + 128;
        uint4 qa[4], qb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            qa[i] = cn + 32 * i < K8 ? ldg_stream(a4 + cn + 32 * i) : z;
            qb[i] = cn + 32 * i < K8 ? ldg_stream(b4 + cn + 32 * i) : z;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int cc = c + 32 * i;
            if (cc < K8) {
                float wa[8], wb[8];
                unpack8(pa[i], wa);
                unpack8(pb[i], wb);
                use(wa, wb, cc);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) { pa[i] = qa[i]; pb[i] = qb[i]; }
        c = cn;
    }
}

template <int NT, bool NORM>
__device__ __forceinline__ void matvec_pair_sums(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                                 const float* __restrict__ g, int K, int T, int t0, int na, int nb,
                                                 float* acc_a, float* acc_b, float* ss) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < NT; ++j) acc_a[j] = acc_b[j] = ss[j] = 0.0f;
    if ((K & 7) == 0) {
        const uint4* a4 = reinterpret_cast<const uint4*>(W + (size_t)na * K);
        const uint4* b4 = reinterpret_cast<const uint4*>(W + (size_t)nb * K);
        const int K8 = K >> 3;
        uint4 pa[4], pb[4];
        pair_first(a4, b4, K8, true, pa, pb);
        pdl_wait_on(early_words(pb, early_words(pa)));
        pair_stream(a4, b4, K8, pa, pb, [&](const float* wa, const float* wb, int cc) {
            fma8x2<NT, NORM>(wa, wb, x, g, K, T, t0, 8 * cc, acc_a, acc_b, ss);
        });
    } else {
        pdl_wait();
        const bf16_t* wa = W + (size_t)na * K;
        const bf16_t* wb = W + (size_t)nb * K;
        for (int k = lane; k < K; k += 32) {
            const float fa = bf16_to_f32(wa[k]), fb = bf16_to_f32(wb[k]);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (t0 + j < T) {
                    float v = x[(size_t)(t0 + j) * K + k];
                    if (NORM) {
                        ss[j] += v * v;
                        v *= g[k];
                    }
                    acc_a[j] += fa * v;
                    acc_b[j] += fb * v;
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        acc_a[j] = warp_sum(acc_a[j]);
        acc_b[j] = warp_sum(acc_b[j]);
        if (NORM) ss[j] = warp_sum(ss[j]);
    }
}

// One token (NT = 1) with the norm folded, K % 8 == 0 and K <= NORM_STAGE_MAX_K (the host gives K * 4 bytes of
// dynamic shared memory then): the block stages x * g once in shared memory, and the token's sum of squares in a
// block reduction, while the warps' first weight loads are in flight; the loop then reads the staged x * g (no
// norm-weight loads, no squares per chunk). ra / rb: rows na / nb already scaled by 1 / sqrt(mean(x^2) + eps),
// in every lane. Every warp of the block takes part (the barrier), live or not; dead warps load no weights.
#define NORM_STAGE_MAX_K 12288
// the staging: every thread of the (4-warp) block stores its float4s of x * g and adds its squares of x; returns
// 1 / sqrt(mean(x^2) + eps), the same in every thread (after the block's barrier)
__device__ __forceinline__ float norm_stage(const float* __restrict__ x, const float* __restrict__ g, float eps, int K,
                                            float4* s_xg, float* s_red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float ss = 0.0f;
    for (int k4 = threadIdx.x; k4 < (K >> 2); k4 += blockDim.x) {
        const float4 v = ldx4(x + 4 * k4), w = g4[k4];
        ss += v.x * v.x;
        ss += v.y * v.y;
        ss += v.z * v.z;
        ss += v.w * v.w;
        s_xg[k4] = make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w);
    }
    ss = warp_sum(ss);
    if (lane == 0) s_red[warp] = ss;
    __syncthreads();
    return 1.0f / sqrtf((s_red[0] + s_red[1] + s_red[2] + s_red[3]) / (float)K + eps);
}

__device__ __forceinline__ void pair_norm_staged(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                                 const float* __restrict__ g, float eps, int K, int na, int nb,
                                                 bool live, float& ra, float& rb) {
    extern __shared__ float4 s_xg[];  // K / 4
    __shared__ float s_red[4];
    const uint4* a4 = reinterpret_cast<const uint4*>(W + (size_t)na * K);
    const uint4* b4 = reinterpret_cast<const uint4*>(W + (size_t)nb * K);
    const int K8 = K >> 3;
    uint4 pa[4], pb[4];
    pair_first(a4, b4, K8, live, pa, pb);
    pdl_wait_on(early_words(pb, early_words(pa)));
    const float inv = norm_stage(x, g, eps, K, s_xg, s_red);
    float acc_a = 0.0f, acc_b = 0.0f;
    if (live) {
        pair_stream(a4, b4, K8, pa, pb, [&](const float* wa, const float* wb, int cc) {
            const float4 u = s_xg[2 * cc], v4 = s_xg[2 * cc + 1];
            const float v[8] = {u.x, u.y, u.z, u.w, v4.x, v4.y, v4.z, v4.w};
            acc_a += wa[0] * v[0] + wa[1] * v[1] + wa[2] * v[2] + wa[3] * v[3]
                   + wa[4] * v[4] + wa[5] * v[5] + wa[6] * v[6] + wa[7] * v[7];
            acc_b += wb[0] * v[0] + wb[1] * v[1] + wb[2] * v[2] + wb[3] * v[3]
                   + wb[4] * v[4] + wb[5] * v[5] + wb[6] * v[6] + wb[7] * v[7];
        });
    }
    ra = warp_sum(acc_a) * inv;
    rb = warp_sum(acc_b) * inv;
}

template <int NT, int EPI, bool NORM>
__device__ __forceinline__ void matvec_pair_impl(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                                 const float* __restrict__ g, float eps,
                                                 const float* __restrict__ bias, float* __restrict__ y, int N,
                                                 int K, int T, const int* __restrict__ positions,
                                                 const float* __restrict__ inv_freq, const int* __restrict__ slots,
                                                 bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache,
                                                 int Hq, int Hkv, int D, int block_size) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int P = N / 2;  // pairs
    const int p = blockIdx.x * 4 + warp;
    const bool live = p < P;
    pdl_trigger();
    const int half = D / 2;
    const int h = EPI == EPI_ROPE ? p / half : 0, i = EPI == EPI_ROPE ? p % half : p;
    const int na = !live ? 0 : EPI == EPI_SILU ? p : h * D + i;
    const int nb = !live ? 0 : EPI == EPI_SILU ? P + p : h * D + i + half;
    const int t0 = blockIdx.y * NT;
    float a = 0.0f, c = 0.0f;
    if (NORM && NT == 1 && (K & 7) == 0 && K <= NORM_STAGE_MAX_K) {
        pair_norm_staged(W, x, g, eps, K, na, nb, live, a, c);  // (every warp: a block barrier inside)
        if (!live || lane != 0 || t0 >= T) return;
    } else {
        if (!live) return;  // (no loads, no stores)
        float acc_a[NT], acc_b[NT], ss[NT];
        matvec_pair_sums<NT, NORM>(W, x, g, K, T, t0, na, nb, acc_a, acc_b, ss);
        // lane j takes token t0 + j (register arrays indexed by unrolled constants only)
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (lane == j) { a = acc_a[j]; c = acc_b[j]; s = ss[j]; }
        }
        if (lane >= NT || t0 + lane >= T) return;
        if (NORM) {
            const float inv = 1.0f / sqrtf(s / (float)K + eps);  // rms_norm's expression (rmsnorm.cu)
            a *= inv;
            c *= inv;
        }
    }
    a += bias ? bias[na] : 0.0f;  // (+ 0.0f without a bias, as matvec_impl: -0 sums become +0 the same way)
    c += bias ? bias[nb] : 0.0f;
    const int t = t0 + lane;
    if (EPI == EPI_SILU) {
        y[(size_t)t * P + p] = silu_mul_f(a, c);
        return;
    }
    pair_rope_out(a, c, h, i, half, t, y, N, positions, inv_freq, slots, k_cache, v_cache, Hq, Hkv, D, block_size);
}

#define MATVEC(NT)                                                                                        \
    extern "C" __global__ void matvec_bf16_t##NT(const bf16_t* __restrict__ W, const float* __restrict__ x, \
                                                 const float* __restrict__ bias, float* __restrict__ y,     \
                                                 int N, int K, int T, int accumulate, int splits) {         \
        matvec_impl<NT>(W, x, bias, y, N, K, T, accumulate, splits);                                      \
    }
MATVEC(1)
MATVEC(2)
MATVEC(4)
MATVEC(8)

#define MATVEC_SILU(NT)                                                                                         \
    extern "C" __global__ void matvec_silu_bf16_t##NT(const bf16_t* __restrict__ W, const float* __restrict__ x, \
                                                      float* __restrict__ act, int N, int K, int T) {            \
        matvec_pair_impl<NT, EPI_SILU, false>(W, x, nullptr, 0.0f, nullptr, act, N, K, T, nullptr, nullptr,     \
                                              nullptr, nullptr, nullptr, 0, 0, 2, 0);                            \
    }                                                                                                           \
    extern "C" __global__ void matvec_silu_norm_bf16_t##NT(                                                     \
        const bf16_t* __restrict__ W, const float* __restrict__ x, const float* __restrict__ g, float eps,     \
        float* __restrict__ act, int N, int K, int T) {                                                         \
        matvec_pair_impl<NT, EPI_SILU, true>(W, x, g, eps, nullptr, act, N, K, T, nullptr, nullptr, nullptr,    \
                                             nullptr, nullptr, 0, 0, 2, 0);                                      \
    }
MATVEC_SILU(1)
MATVEC_SILU(2)
MATVEC_SILU(4)
MATVEC_SILU(8)

#define MATVEC_ROPE(NT, NAME, NORM)                                                                              \
    extern "C" __global__ void NAME(                                                                             \
        const bf16_t* __restrict__ W, const float* __restrict__ x, const float* __restrict__ g, float eps,       \
        const float* __restrict__ bias, float* __restrict__ qkv, int N, int K, int T,                            \
        const int* __restrict__ positions, const float* __restrict__ inv_freq, const int* __restrict__ slots,    \
        bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache, int Hq, int Hkv, int D, int block_size) {    \
        matvec_pair_impl<NT, EPI_ROPE, NORM>(W, x, g, eps, bias, qkv, N, K, T, positions, inv_freq, slots,       \
                                             k_cache, v_cache, Hq, Hkv, D, block_size);                          \
    }
MATVEC_ROPE(1, matvec_rope_bf16_t1, false)
MATVEC_ROPE(2, matvec_rope_bf16_t2, false)
MATVEC_ROPE(4, matvec_rope_bf16_t4, false)
MATVEC_ROPE(8, matvec_rope_bf16_t8, false)
MATVEC_ROPE(1, matvec_rope_norm_bf16_t1, true)
MATVEC_ROPE(2, matvec_rope_norm_bf16_t2, true)
MATVEC_ROPE(4, matvec_rope_norm_bf16_t4, true)
MATVEC_ROPE(8, matvec_rope_norm_bf16_t8, true)
