// attention_gqa.cu: attn_partial_gqa, a drop-in for attention.cu's attn_partial (same arguments, grid, causal
// limits, splits and outputs: attn_merge combines its partials) built for decode, where attn_partial is
// latency-bound: its warps walk one key at a time (block table, then K and V rows: dependent round trips) and
// pay a 5-step shuffle reduction per key per query head.
//
//   out[t, h] = softmax(scale * q[t, h] . K[0:L_t]) V[0:L_t],   L_t = positions[t] + 1 (causal),
// key j of kv head h / G in block block_tables[seq, j / bs] at offset j % bs of the [blocks, Hkv, bs, D] cache.
//
// Grid (T, Hkv * head_groups, splits), 4 warps; a block owns one kv head, up to GQA_MAXG of its query heads and
// keys [s*chunk, (s+1)*chunk), exactly as attn_partial. A warp takes 32 keys at a time (warp w: chunks w, w+4,
// ...), ONE KEY PER LANE. Per chunk:
//   1. the lane's row index comes from a block-table entry loaded one chunk earlier (prefetched);
//   2. the chunk's V rows start copying into the warp's shared tile (cp.async: no registers, coalesced 16-byte
//      pieces), so they arrive while the scores are computed;
//   3. scores: the lane reads its key's K row with 16-byte loads (the 16 rows of a cache block are contiguous:
//      16 lanes sweep 4 KB at D = 128) and computes its gn dot products against q (pre-scaled f32, staged once
//      in shared memory, read as broadcasts): no shuffles;
//   4. online softmax per chunk: one warp_max per head (the running max m is warp-uniform), each lane keeps its
//      own partial sum l (summed over the warp once, after the loop), the accumulator is rescaled once; the
//      probabilities p[key][head] go to the warp's slice of shared memory;
//   5. P.V from shared memory: lanes own DPL = D/32 head dims (as attn_partial), p read as broadcasts.
// The 4 warps then merge through shared memory (overlaying the q/p/V tiles) and write what attn_partial writes.
// Keys at or past the token's causal limit (and past the split) are never read: their lanes load no K row,
// their p is 0, their V rows are not copied and P.V stops at the chunk's last valid key (NaN in unused cache
// slots cannot leak in).
// DPL 2, 4, 8 need D == 32 * DPL (the backend's head dims 64, 128, 256); DPL 1 takes any even D <= 32 (16-byte
// K loads when D % 8 == 0, element loads otherwise; V copied in 4-byte pieces). D = 256 copies V in two 16-key
// halves (a 32-key tile would not fit 48 KB of static shared memory), the second not overlapped.
// f32 throughout, expf as attn_partial; sums run in another order, so results agree with attn_partial to float
// rounding (~1e-6), not bit for bit. Needs sm_80+ (cp.async).
// Register arrays are indexed only by unrolled constants (no local memory; ptx-check pins it).
// Roof (H200, 7B, 256 decodes at context 512): 28% of the bandwidth roof; prefill_attention.cu's decode_attn_tc
// (70%) takes those steps now.
#include "common.cuh"

#define GQA_WARPS 4
#define GQA_MAXG 8  // the backend's ATTN_MAXG: query heads per block, the same as attention.cuh's MAXG
// Blocks per SM that ptxas must fit in registers (__launch_bounds__' second argument): 4 (<= 128 registers) for
// D <= 128, 3 for D = 256 (4 would spill). -DGQA_MIN_BLOCKS_ALL=n overrides it (the GPU test times variants).
// ptx-check (sm_80/86/89/90): registers d1 96-100, d2 108-114, d4 122-124 (160 unbounded), d8 162-164; no spills.
// Static shared memory: d1 13.3 KB, d2 22.3 KB, d4 40.3 KB, d8 44.3 KB, so at D = 128 sm_90 (228 KB/SM) is
// register-bound at 4 blocks per SM, sm_80 (164 KB) fits 3, sm_86/89 (100 KB) 2.
#ifdef GQA_MIN_BLOCKS_ALL
#define GQA_MIN_BLOCKS(DPL) GQA_MIN_BLOCKS_ALL
#else
#define GQA_MIN_BLOCKS(DPL) ((DPL) == 8 ? 3 : 4)
#endif

// V tile of a warp: keys [k0, k0 + VK) of the chunk (only those < n), row k at s_v + (k - k0) * DMAX
template <int DPL, int VK>
__device__ __forceinline__ void gqa_copy_v(bf16_t* s_v, const bf16_t* __restrict__ v_cache, int row, int k0, int n,
                                           int D, int lane) {
    constexpr int DMAX = 32 * DPL;
    const unsigned dst0 = smem_u32(s_v);
    if constexpr (DPL == 1) {  // 4-byte pieces: any even D <= 32
        const int W = D >> 1, total = min(VK, n - k0) * W;
        for (int i0 = 0; i0 < total; i0 += 32) {  // warp-uniform trip count: every lane takes part in the shuffle
            const int idx = i0 + lane, k = idx / W, w = idx - k * W;
            const int r = __shfl_sync(0xffffffffu, row, (k0 + k) & 31);
            if (idx < total) cp_async4(dst0 + (unsigned)(k * DMAX + 2 * w) * 2u, v_cache + (size_t)r * D + 2 * w);
        }
    } else {  // 16-byte pieces, NP of them per row (D == DMAX)
        constexpr int NP = DMAX / 8;
#pragma unroll
        for (int it = 0; it < VK * NP / 32; ++it) {
            const int idx = it * 32 + lane, k = idx / NP, c = idx % NP;
            const int r = __shfl_sync(0xffffffffu, row, k0 + k);
            if (k0 + k < n) cp_async16(dst0 + (unsigned)(k * DMAX + 8 * c) * 2u, v_cache + (size_t)r * D + 8 * c);
        }
    }
    cp_async_commit();
}

template <int DPL>
__device__ __forceinline__ void attn_partial_gqa_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int Hq, int Hkv, int D, int block_size,
    int chunk, float scale) {
    pdl_trigger();
    constexpr int DMAX = 32 * DPL;                 // head dims of a block (D <= DMAX)
    constexpr int NP = DMAX / 8;                   // 16-byte pieces of a key row
    constexpr int VK = DPL == 8 ? 16 : 32;         // keys per V tile
    constexpr int QF = GQA_MAXG * DMAX;                   // floats: q * scale, [MAXG][DMAX]
    constexpr int PF = GQA_WARPS * 32 * GQA_MAXG;         // floats: p, [WARPS][32 keys][MAXG]
    constexpr int VF = GQA_WARPS * VK * DMAX / 2;         // floats holding bf16 V tiles, [WARPS][VK][DMAX]
    constexpr int AF = GQA_WARPS * GQA_MAXG * DMAX;       // floats: merge, [WARPS][MAXG][DMAX]
    constexpr int SMEM = QF + PF + VF > AF ? QF + PF + VF : AF;
    __shared__ __align__(16) float smem[SMEM];
    __shared__ float s_m[GQA_WARPS][GQA_MAXG], s_l[GQA_WARPS][GQA_MAXG];
    float* s_q = smem;
    float* s_acc = smem;  // after the key loop (overlays everything else)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float4* p4 = reinterpret_cast<float4*>(smem + QF + warp * 32 * GQA_MAXG);
    bf16_t* s_v = reinterpret_cast<bf16_t*>(smem + QF + PF) + warp * VK * DMAX;

    const int t = blockIdx.x, S = gridDim.z, s = blockIdx.z;
    const int G = Hq / Hkv, ngroups = (G + GQA_MAXG - 1) / GQA_MAXG;
    const int g = blockIdx.y / ngroups, h0 = (blockIdx.y % ngroups) * GQA_MAXG;
    const int gn = min(GQA_MAXG, G - h0);  // query heads of this block: g*G + h0 + [0, gn)
    const bool active = lane * DPL < D;
    const int L = positions[t] + 1;
    const int start = s * chunk, end = min(L, start + chunk);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    prefetch_kv_l2(k_cache, v_cache, table, start, min(end, L - 1), Hkv, g, block_size, D);
    pdl_wait();  // q and this token's K/V row are the previous kernels'

    for (int i = threadIdx.x; i < QF; i += blockDim.x) {
        const int h = i / DMAX, d = i % DMAX;
        // q: the previous kernel's, through the coherent path (common.cuh ldx1: never above pdl_wait)
        s_q[i] = (h < gn && d < D) ? ldx1(q + (size_t)t * q_stride + (size_t)(g * G + h0 + h) * D + d) * scale : 0.0f;
    }
    float acc[GQA_MAXG][DPL], m[GQA_MAXG], l[GQA_MAXG];
#pragma unroll
    for (int h = 0; h < GQA_MAXG; ++h) {
        m[h] = NEG_INF;
        l[h] = 0.0f;  // this lane's keys only; summed over the warp after the loop
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[h][i] = 0.0f;
    }
    __syncthreads();

    const float4* q4 = reinterpret_cast<const float4*>(s_q);
    constexpr int STEP = GQA_WARPS * 32;
    int j = start + warp * 32 + lane;  // this lane's key of the current chunk
    int blk = j < end ? table[j / block_size] : 0;
    for (int c0 = start + warp * 32; c0 < end; c0 += STEP, j += STEP) {
        const int jn = j + STEP;
        const int blk_next = jn < end ? table[jn / block_size] : 0;  // in flight while this chunk runs
        const bool valid = j < end;
        const int row = (blk * Hkv + g) * block_size + j % block_size;  // row of [blocks * Hkv * bs, D]
        const int n = min(32, end - c0);  // valid keys of the chunk: lanes [0, n)
        gqa_copy_v<DPL, VK>(s_v, v_cache, row, 0, n, D, lane);

        // scores: this lane's key against the gn query heads
        float sc[GQA_MAXG];
#pragma unroll
        for (int h = 0; h < GQA_MAXG; ++h) sc[h] = 0.0f;
        if (valid) {
            const bf16_t* kr = k_cache + (size_t)row * D;
#pragma unroll
            for (int c = 0; c < NP; ++c) {
                float kf[8];
                if constexpr (DPL == 1) {
                    if (c * 8 >= D) break;
                    if (D & 7) {  // rows not 16-byte aligned: element loads, nothing past D
#pragma unroll
                        for (int e = 0; e < 8; ++e) kf[e] = c * 8 + e < D ? bf16_to_f32(kr[c * 8 + e]) : 0.0f;
                    } else {
                        unpack8(reinterpret_cast<const uint4*>(kr)[c], kf);
                    }
                } else {
                    unpack8(reinterpret_cast<const uint4*>(kr)[c], kf);
                }
#pragma unroll
                for (int h = 0; h < GQA_MAXG; ++h) {
                    if (h < gn) {
                        const float4 a = q4[h * (DMAX / 4) + 2 * c], b = q4[h * (DMAX / 4) + 2 * c + 1];
                        float d = a.x * kf[0];
                        d = fmaf(a.y, kf[1], d); d = fmaf(a.z, kf[2], d); d = fmaf(a.w, kf[3], d);
                        d = fmaf(b.x, kf[4], d); d = fmaf(b.y, kf[5], d); d = fmaf(b.z, kf[6], d);
                        d = fmaf(b.w, kf[7], d);
                        sc[h] += d;
                    }
                }
            }
        }

        // online softmax over the chunk: one warp max per head
        float pr[GQA_MAXG];
#pragma unroll
        for (int h = 0; h < GQA_MAXG; ++h) {
            pr[h] = 0.0f;
            if (h < gn) {
                const float x = valid ? sc[h] : NEG_INF;
                const float mn = fmaxf(m[h], warp_max(x));  // finite: lane 0's key is always valid
                const float corr = expf(m[h] - mn);
                pr[h] = expf(x - mn);
                l[h] = l[h] * corr + pr[h];
                m[h] = mn;
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc[h][i] *= corr;
            }
        }
        p4[2 * lane] = make_float4(pr[0], pr[1], pr[2], pr[3]);
        p4[2 * lane + 1] = make_float4(pr[4], pr[5], pr[6], pr[7]);

        // P.V over the chunk's valid keys, V from the shared tile(s)
        for (int k0 = 0; k0 < n; k0 += VK) {
            if (k0) gqa_copy_v<DPL, VK>(s_v, v_cache, row, k0, n, D, lane);  // D = 256: the second half
            cp_async_wait<0>();
            __syncwarp();  // the warp's V pieces and p are visible to every lane
            const int kend = min(n, k0 + VK);
#pragma unroll 4
            for (int k = k0; k < kend; ++k) {
                float vf[DPL];
                const bf16_t* vr = s_v + (k - k0) * DMAX + lane * DPL;
                if constexpr (DPL == 8) {
                    unpack8(*reinterpret_cast<const uint4*>(vr), vf);
                } else if constexpr (DPL == 4) {
                    const uint2 u = *reinterpret_cast<const uint2*>(vr);
                    vf[0] = __uint_as_float(u.x << 16); vf[1] = __uint_as_float(u.x & 0xffff0000u);
                    vf[2] = __uint_as_float(u.y << 16); vf[3] = __uint_as_float(u.y & 0xffff0000u);
                } else if constexpr (DPL == 2) {
                    const unsigned u = *reinterpret_cast<const unsigned*>(vr);
                    vf[0] = __uint_as_float(u << 16); vf[1] = __uint_as_float(u & 0xffff0000u);
                } else {
                    vf[0] = active ? bf16_to_f32(vr[0]) : 0.0f;
                }
                const float4 a = p4[2 * k], b = p4[2 * k + 1];
                const float pk[GQA_MAXG] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int h = 0; h < GQA_MAXG; ++h) {
                    if (h < gn) {
#pragma unroll
                        for (int i = 0; i < DPL; ++i) acc[h][i] = fmaf(pk[h], vf[i], acc[h][i]);
                    }
                }
            }
            __syncwarp();  // the V tile and p are rewritten next
        }
        blk = blk_next;
    }
#pragma unroll
    for (int h = 0; h < GQA_MAXG; ++h)
        if (h < gn) l[h] = warp_sum(l[h]);

    // merge the warps of the block (as attn_partial)
    __syncthreads();  // every warp is done with the q, p and V tiles: s_acc overlays them
#pragma unroll
    for (int h = 0; h < GQA_MAXG; ++h) {
        if (h < gn) {
            if (lane == 0) { s_m[warp][h] = m[h]; s_l[warp][h] = l[h]; }
#pragma unroll
            for (int i = 0; i < DPL; ++i) s_acc[(warp * GQA_MAXG + h) * DMAX + lane * DPL + i] = acc[h][i];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < gn * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        float M = NEG_INF;
        for (int w = 0; w < GQA_WARPS; ++w) M = fmaxf(M, s_m[w][h]);
        float Ls = 0.0f, A = 0.0f;
        if (M != NEG_INF) {
            for (int w = 0; w < GQA_WARPS; ++w) {
                const float e = expf(s_m[w][h] - M);
                Ls += s_l[w][h] * e;
                A += s_acc[(w * GQA_MAXG + h) * DMAX + d] * e;
            }
        }
        const int head = g * G + h0 + h;
        if (S == 1) {
            out[(size_t)t * Hq * D + (size_t)head * D + d] = A / Ls;
        } else {
            const size_t pi = ((size_t)t * Hq + head) * S + s;
            part_acc[pi * D + d] = A;
            if (d == 0) { part_ml[2 * pi] = M; part_ml[2 * pi + 1] = Ls; }
        }
    }
}

#define ATTN_GQA(DPL)                                                                                          \
    extern "C" __global__ void __launch_bounds__(GQA_WARPS * 32, GQA_MIN_BLOCKS(DPL))                          \
    attn_partial_gqa_d##DPL(                                                                                   \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                         \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,              \
        const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out,         \
        float* __restrict__ part_acc, float* __restrict__ part_ml, int Hq, int Hkv, int D, int block_size,     \
        int chunk, float scale) {                                                                              \
        attn_partial_gqa_impl<DPL>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, token_seq,         \
                                   positions, out, part_acc, part_ml, Hq, Hkv, D, block_size, chunk, scale);   \
    }
ATTN_GQA(1)
ATTN_GQA(2)
ATTN_GQA(4)
ATTN_GQA(8)
