// attention_o.cu: one token's decode attention fused with the o projection after it (x += W_o att), 128-dim heads,
// sm_90+: attention_cluster.cu's key splits in a cluster, each block then multiplying its head's output into its
// split's rows of o. Entry points: attn_o_cluster4, attn_o_cluster8 (16 warps a block), attn_o_cluster8_w8 (8).
// Roof: none recorded as a fraction; the kernel's time and % of its bandwidth floor in a step: `llmrs profile
// --synthetic qwen2.5-7b --context 512` (one stream), or tools/bench_kernels_graph.py.
#include "common.cuh"
#include "attention.cuh"

// attn_o_cluster{CL}: one token's decode attention fused with the o projection that follows it (x += W_o att), for
// 128-dim heads on sm_90+. The o projection's input is the whole attention output, so after attn_cluster the o
// kernel waits on a grid boundary (~1 us of release latency plus an L2 round trip for its input: 4.2 us for a
// dependent one-token 2048 x 2048 matvec whose rows were all loaded before its wait, against 1.95 us of bytes) on
// top of the attention's own. Here the o product is split
// along its input by head instead: o(att) = sum_h W_o[:, h D:(h+1) D] att_h, and the block of (head h, split s)
// multiplies its head's output into rows [s N / CL, (s+1) N / CL), so it needs only what its own cluster computed.
//   grid (T, Hq, CL), clusters of CL blocks along z (the key splits of one head), W warps a block (AO_WARPS, or 8).
//   Before the PDL wait: the block's o weights (rows of its split x its head's 128 columns: a lane's 16-byte chunks
//   in registers, RP of them), the split's block-table entries, the first keys' K / V rows (attn_first_keys).
//   Keys: warp w takes keys start + w, + W, ... (AO_CK at once: their dot products reduced together, then
//   the online softmax over them in key order), one head a warp (warp_sum: every lane has the dot product).
//   Merges: the block's warps through shared memory; the cluster's splits pushed into every block's shared memory
//   (st.async, completing on each block's mbarrier, which it waits on: no cluster barrier with release after the
//   pushes, a MEMBAR.ALL.GPU), each
//   block merging all D dims (so each has its head's whole output).
//   o: a half-warp a row (16 lanes x 8 columns), reduced by 4 shuffles; the block writes its rows' partial sums to
//   part[t][h][row], counts itself in for (t, s) (block_counts_last), and the last of the Hq heads' blocks of that
//   split adds sum_h part[t][h][row] (heads in order: deterministic) to x.
// The sums differ from attn_cluster + the o matvec's by float rounding (another association), not in kind; the host
// takes it only at one token (the backend's attention dispatch).
#define AO_WARPS 16
#define AO_CK 4   // keys a warp takes at once (a batch of AO_WARPS * AO_CK = 64 keys a block)
// RP: the 16-byte o weight chunks a lane holds (2 * RP rows a warp, at most 2 * RP * AO_WARPS a block): 8 with 8
// splits (256 rows), 16 with 4 (512 rows: the 3B's 2048 in clusters of 4, where 16 clusters of 8 did not fit at once)
template <int CL, int RP, int W>
__device__ __forceinline__ void attn_o_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ token_seq, const int* __restrict__ positions, const bf16_t* __restrict__ wo,
    float* __restrict__ part, int* __restrict__ counts, float* __restrict__ x, int Hq, int Hkv, int N,
    int block_size, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int DPL = 4, D = 128;
    pdl_trigger();
    __shared__ float s_m[W], s_l[W], s_e[W], s_M;
    __shared__ __align__(16) float s_acc[W][D];
    __shared__ float p_a[CL][D], p_m[CL], p_l[CL];  // every split's (A, M, L), pushed by the cluster's blocks
    __shared__ __align__(16) float s_att[D];
    __shared__ int s_tbl[ATTN_TABLE_STAGE];
    // the splits' pushes (st.async) complete on each block's mbarrier: initialized before the block arrives at the
    // cluster barrier that every push waits on (no barrier with release after the pushes: its MEMBAR.ALL.GPU)
    __shared__ __align__(8) unsigned long long p_bar;
    if (threadIdx.x == 0) mbar_init(&p_bar, 1);
    cluster_arrive_relaxed();  // this block runs (its shared memory there to push into): waited on before the pushes
    const int t = blockIdx.x, h = blockIdx.y, s = (int)cluster_rank();
    const int g = h / (Hq / Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int L = positions[t] + 1, chunk = (L + CL - 1) / CL;
    const int start = min(L, s * chunk), end = min(L, start + chunk);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    // the o weights: row r0 + warp * 2 * RP + 2 i + (lane >> 4) of the block's rows, columns h D + 8 (lane & 15)
    const int rpb = N / CL, r0 = s * rpb, K = Hq * D;
    uint4 wr[RP];
    unsigned word = 0u;
#pragma unroll
    for (int i = 0; i < RP; ++i) {
        const int row = warp * 2 * RP + 2 * i + (lane >> 4);
        wr[i] = row < rpb ? ldg_early(reinterpret_cast<const uint4*>(wo + (size_t)(r0 + row) * K + h * D) + (lane & 15))
                          : make_uint4(0u, 0u, 0u, 0u);
        word |= early_word(wr[i]);
    }
    const int pf0 = start + W * AO_CK;
    prefetch_kv_l2(k_cache, v_cache, table, pf0, min(end, L - 1), Hkv, g, block_size, D);
    const int* tb;
    int tb0;
    attn_stage_table(table, s_tbl, start, end, block_size, tb, tb0);
    typename Raw<DPL>::T kr[AO_CK], vr[AO_CK];
    attn_first_keys<DPL, AO_CK, W>(k_cache, v_cache, tb, tb0, start + warp, end, L - 1 - t, true, Hkv, g,
                                          block_size, D, lane, kr, vr, word);
    float qr[1][DPL], acc[1][DPL], m, l;
    attn_init<DPL, 1>(q, q_stride, t, h, 1, true, lane, D, scale, qr, acc, m, l);
#pragma unroll 1
    for (int j0 = start + warp; j0 < end; j0 += W * AO_CK) {
        if (j0 != start + warp) {
#pragma unroll
            for (int c = 0; c < AO_CK; ++c)
                load_kv<DPL>(k_cache, v_cache, tb, tb0, j0 + c * W, end, true, Hkv, g, block_size, D, lane,
                             kr[c], vr[c]);
        }
        float dk[AO_CK];
#pragma unroll
        for (int c = 0; c < AO_CK; ++c) {
            float kf[DPL];
            unpack_raw(kr[c], kf);
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) d += qr[0][i] * kf[i];
            dk[c] = d;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {  // the AO_CK butterflies side by side (warp_sum's order for each)
#pragma unroll
            for (int c = 0; c < AO_CK; ++c) dk[c] += __shfl_xor_sync(0xffffffffu, dk[c], o);
        }
#pragma unroll
        for (int c = 0; c < AO_CK; ++c) {
            if (j0 + c * W >= end) break;  // warp-uniform
            float vf[DPL];
            unpack_raw(vr[c], vf);
            const float mn = fmaxf(m, dk[c]);
            const float corr = __expf(m - mn), p = __expf(dk[c] - mn);
            l = l * corr + p;
            m = mn;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[0][i] = acc[0][i] * corr + p * vf[i];
        }
    }
    // the block's warps: (m, l, acc) into shared memory, the factors once, then (M, L, A) of dim d by thread d
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
    *reinterpret_cast<float4*>(&s_acc[warp][lane * DPL]) = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
    __syncthreads();
    if ((int)threadIdx.x < W) {
        float M = NEG_INF;
        for (int u = 0; u < W; ++u) M = fmaxf(M, s_m[u]);
        s_e[threadIdx.x] = M != NEG_INF ? expf(s_m[threadIdx.x] - M) : 0.0f;
        if (threadIdx.x == 0) s_M = M;
    }
    __syncthreads();
    cluster_wait();  // every block of the cluster runs (arrived at its start: its mbarrier initialized)
    if (threadIdx.x == 0) mbar_arrive_expect(&p_bar, CL * (D + 2) * 4);  // every split's A, M and L
    if ((int)threadIdx.x < D) {
        const int d = threadIdx.x;
        const float M = s_M;
        float Ls = 0.0f, A = 0.0f;
        if (M != NEG_INF) {
            for (int u = 0; u < W; ++u) {
                Ls += s_l[u] * s_e[u];
                A += s_acc[u][d] * s_e[u];
            }
        }
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            st_async_cluster(&p_a[s][d], r, A, &p_bar);
            if (d == 0) { st_async_cluster(&p_m[s], r, M, &p_bar); st_async_cluster(&p_l[s], r, Ls, &p_bar); }
        }
    }
    mbar_wait(&p_bar, 0);  // every split's pushes in (each block waits for its own: none leaves while pushed to)
    if ((int)threadIdx.x < D) {  // the splits, attn_merge's way, in split order: the head's output, dim d
        const int d = threadIdx.x;
        float M = NEG_INF;
#pragma unroll
        for (int r = 0; r < CL; ++r) M = fmaxf(M, p_m[r]);
        float Ls = 0.0f, A = 0.0f;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            if (p_m[r] == NEG_INF) continue;  // a split with no keys
            const float e = expf(p_m[r] - M);
            Ls += p_l[r] * e;
            A += p_a[r][d] * e;
        }
        s_att[d] = A / Ls;
    }
    __syncthreads();
    // o: the lane's rows times its 8 columns of the head's output, summed over the half-warp
    const float4 a0 = *reinterpret_cast<const float4*>(&s_att[8 * (lane & 15)]),
                 a1 = *reinterpret_cast<const float4*>(&s_att[8 * (lane & 15) + 4]);
    float y[RP];
#pragma unroll
    for (int i = 0; i < RP; ++i) {
        float wf[8];
        unpack8(wr[i], wf);
        y[i] = wf[0] * a0.x + wf[1] * a0.y + wf[2] * a0.z + wf[3] * a0.w + wf[4] * a1.x + wf[5] * a1.y
               + wf[6] * a1.z + wf[7] * a1.w;
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
#pragma unroll
        for (int i = 0; i < RP; ++i) y[i] += __shfl_xor_sync(0xffffffffu, y[i], o);
    }
    float* pt = part + ((size_t)t * Hq + h) * N + r0;
    if ((lane & 15) == 0) {
#pragma unroll
        for (int i = 0; i < RP; ++i) {
            const int row = warp * 2 * RP + 2 * i + (lane >> 4);
            if (row < rpb) pt[row] = y[i];
        }
    }
    const bool last = block_counts_last(&counts[t * CL + s], Hq);
    if (last) {  // the split's rows: every head's partial in, head order
        const float* pr = part + (size_t)t * Hq * N + r0;
        for (int row = threadIdx.x; row < rpb; row += blockDim.x) {
            float v = 0.0f;
            for (int u = 0; u < Hq; ++u) v += __ldcg(pr + (size_t)u * N + row);
            x[(size_t)t * N + r0 + row] += v;
        }
    }
#else
    __trap();
#endif
}

// attn_o_cluster{CL}{NAME}: W warps a block, MINB blocks an SM. _w8: 8 warps, each lane holding 16 chunks of o (256
// rows a block, as the 16-warp form's), two blocks an SM (__launch_bounds__(256, 2): 128 registers), its warps walking
// 32 keys a batch (the 16-warp form 64): the H200 runs 30 of its clusters of 8 at once against 15, so the 3B's 16
// heads all run at once (the backend's choice there: 3B one stream 1.3% faster)
#define ATTN_O_CLUSTER_W(CL, RP, W, MINB, NAME)                                                                      \
    extern "C" __global__ void __launch_bounds__(W * 32, MINB) CLUSTER_DIMS(CL) attn_o_cluster##CL##NAME(            \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                               \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,                    \
        const int* __restrict__ token_seq, const int* __restrict__ positions, const bf16_t* __restrict__ wo,         \
        float* __restrict__ part, int* __restrict__ counts, float* __restrict__ x, int Hq, int Hkv, int N,           \
        int block_size, float scale) {                                                                               \
        attn_o_impl<CL, RP, W>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, token_seq, positions, wo,    \
                               part, counts, x, Hq, Hkv, N, block_size, scale);                                      \
    }
#define ATTN_O_CLUSTER(CL, RP) ATTN_O_CLUSTER_W(CL, RP, AO_WARPS, 1, )
ATTN_O_CLUSTER(4, 16)
ATTN_O_CLUSTER(8, 8)
ATTN_O_CLUSTER_W(8, 16, 8, 2, _w8)
