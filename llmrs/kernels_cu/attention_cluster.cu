// attention_cluster.cu: one token's (or a chunk's) paged causal GQA attention, attention.cu's attn_partial and
// attn_merge in one kernel, the key splits meeting in a thread-block cluster (sm_90+).
//   out[t, h] = softmax(scale * q[t, h] . K[0:L_t]) V[0:L_t],   L_t = positions[t] + 1 (causal).
// Entry points: attn_cluster{CL}_d{DPL}[_g4[_w16]] (CL blocks a cluster; DPL = D / 32 dims a lane; _g4: 4 query
// heads a block, not 8; _w16: 16 warps a block).
// Roof: none recorded as a fraction; the kernel's time and % of its bandwidth floor in a step: `llmrs profile
// --synthetic qwen2.5-7b --context 512` (one stream), or tools/bench_kernels_graph.py.
#include "common.cuh"
#include "attention.cuh"

// attn_cluster{CL}_d{DPL}: attn_partial's work and attn_merge's in one kernel (sm_90+). grid (T, Hkv * head_groups,
// CL), a thread-block cluster of (1, 1, CL): the CL blocks of one (token, kv head, head group) are the splits of its
// keys, chunk = ceil(L / CL) keys a block (L = the token's length). A block has CW warps; warp w takes keys
// start + w, start + w + CW, ... and loads the K / V rows of up to CK of them at once (one round trip for all,
// not one a key), then runs attn_partial's per-key math on them in order (the same expressions: dot products,
// warp_sum8, online softmax). The warps meet in shared memory as in attn_partial (M, L, A per head and dim); the
// block pushes each (head, dim)'s (M, L, A) into the shared memory of the block that merges that pair (mapa +
// st.async, completing on that block's mbarrier: each block expects the bytes its pairs get and waits for them, with
// no cluster barrier with release and its MEMBAR.ALL.GPU; every block merges 1 / CL of the pairs), and each block's
// threads combine their pairs over the CL splits from their own shared memory, in block
// order with attn_merge's expressions: out = sum_s A_s e^(M_s - M) / sum_s L_s e^(M_s - M).
// So the step has no partials in global memory and no attn_merge launch. Below sm_90 the entry points exist and
// trap (the host never launches them there: the backend's cluster rule checks the compute capability).
// CW warps a cluster block, CK keys a warp loads at once: 8 x 8 (a split of 64 keys, the host's
// ATTN_CLUSTER_KEYS_PER_SPLIT, in one batch), or 16 x 4 (the _w16 forms: the same 64 keys over twice the warps, each
// with half the keys' dependent chain; 4 heads a block only)
template <int DPL, int CL, int HG, int CW, int CK>
__device__ __forceinline__ void attn_cluster_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out, int Hq, int Hkv,
    int D, int block_size, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    pdl_trigger();
    __shared__ float s_m[CW][HG], s_l[CW][HG];
    __shared__ float s_acc[CW][HG][32 * DPL];
    // the (head, dim) pairs h * 32 * DPL + d of the cluster's heads, SL of them merged by each block: every block's
    // split of those pairs (A) and of their heads (M, L), pushed here by the blocks
    constexpr int SL = HG * 32 * DPL / CL;
    static_assert(SL <= CW * 32 && SL * CL == HG * 32 * DPL, "a pair a thread");
    __shared__ float p_a[CL][SL], p_m[CL][HG], p_l[CL][HG];
    // the pushes (st.async) complete on the receiving block's mbarrier, initialized before the block arrives at the
    // cluster barrier every push waits on (attn_o_impl's way: no cluster barrier with release, a MEMBAR.ALL.GPU)
    __shared__ __align__(8) unsigned long long p_bar;
    if (threadIdx.x == 0) mbar_init(&p_bar, 1);
    cluster_arrive_relaxed();  // this block runs (its shared memory there to push into): waited on before the pushes
    __shared__ int s_tbl[ATTN_TABLE_STAGE];
    const int t = blockIdx.x, s = (int)cluster_rank();
    const int G = Hq / Hkv, ngroups = (G + HG - 1) / HG;
    const int g = blockIdx.y / ngroups, h0 = (blockIdx.y % ngroups) * HG;
    const int gn = min(HG, G - h0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool active = lane * DPL < D;
    const int L = positions[t] + 1, chunk = (L + CL - 1) / CL;
    const int start = min(L, s * chunk), end = min(L, start + chunk);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    const int pf0 = start + CW * CK;  // the first batch is loaded outright (attn_first_keys): the L2 prefetch after it
    prefetch_kv_l2(k_cache, v_cache, table, pf0, min(end, L - 1), Hkv, g, block_size, D);
    const int* tb;
    int tb0;
    attn_stage_table(table, s_tbl, start, end, block_size, tb, tb0);
    // the first batch's K / V rows, before the wait where an earlier step wrote them (attn_first_keys)
    typename Raw<DPL>::T kr[CK], vr[CK];
    attn_first_keys<DPL, CK, CW>(k_cache, v_cache, tb, tb0, start + warp, end, L - 1 - t, active, Hkv, g,
                                 block_size, D, lane, kr, vr);

    float qr[HG][DPL], acc[HG][DPL], m, l;
    attn_init<DPL, HG>(q, q_stride, t, g * G + h0, gn, active, lane, D, scale, qr, acc, m, l);
#pragma unroll 1
    for (int j0 = start + warp; j0 < end; j0 += CW * CK) {
        if (j0 != start + warp) {
#pragma unroll
            for (int c = 0; c < CK; ++c)
                load_kv<DPL>(k_cache, v_cache, tb, tb0, j0 + c * CW, end, active, Hkv, g, block_size, D, lane,
                             kr[c], vr[c]);
        }
#pragma unroll
        for (int c = 0; c < CK; ++c) {
            if (j0 + c * CW >= end) break;  // warp-uniform
            float kf[DPL], vf[DPL];
            unpack_raw(kr[c], kf);
            unpack_raw(vr[c], vf);
            attn_key<DPL, HG>(qr, kf, vf, acc, m, l);
        }
    }
    // the block's warps, as attn_partial merges them
    attn_warp_out<DPL, CW, HG>(s_m, s_l, s_acc, warp, lane, gn, acc, m, l);
    __syncthreads();
    __shared__ float s_e[CW][HG], s_M[HG];
    attn_warp_scales<CW, HG>(s_m, s_e, s_M, gn);
    __syncthreads();
    // the block's split of each (head, dim) pushed into the shared memory of the block that merges it (rank pair /
    // SL; a head's M and L into each block merging some of its dims), one barrier, then each block merges its SL
    // pairs from its own shared memory: no remote reads on the way out and no second barrier (reading the other
    // blocks' shared memory instead costs 3 dependent rounds of remote loads while the others wait at a second
    // barrier)
    cluster_wait();  // every block of the cluster runs (arrived at its start: its mbarrier initialized)
    if (threadIdx.x == 0) {
        // the bytes this block receives from each split: the A of its pairs [s SL, (s + 1) SL) that are real (head <
        // gn, dim < D), and M and L of every head whose pairs [h 32 DPL, (h + 1) 32 DPL) reach into them (the loop
        // below sends exactly these)
        const int lo = s * SL, hi = lo + SL;
        unsigned n = 0;
        for (int h = 0; h < gn; ++h) {
            const int b = h * 32 * DPL;
            n += (unsigned)max(0, min(hi, b + D) - max(lo, b));
            if (b < hi && b + 32 * DPL > lo) n += 2;
        }
        mbar_arrive_expect(&p_bar, CL * n * 4);
    }
    for (int idx = threadIdx.x; idx < gn * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D, pi = h * 32 * DPL + d;
        float M, Ls, A;
        attn_warp_merge<DPL, CW, HG>(s_M, s_e, s_l, s_acc, h, d, M, Ls, A);
        st_async_cluster(&p_a[s][pi % SL], pi / SL, A, &p_bar);
        if (d == 0) {
            for (int o = pi / SL; o <= (pi + 32 * DPL - 1) / SL; ++o) {
                st_async_cluster(&p_m[s][h], o, M, &p_bar);
                st_async_cluster(&p_l[s][h], o, Ls, &p_bar);
            }
        }
    }
    mbar_wait(&p_bar, 0);  // every split's pushes in (each block waits for its own: none leaves while pushed to)
    if ((int)threadIdx.x < SL) {  // the splits, attn_merge's way, in block order
        const int pi = s * SL + threadIdx.x, h = pi / (32 * DPL), d = pi % (32 * DPL);
        if (h < gn && d < D) {
            float M = NEG_INF;
#pragma unroll
            for (int r = 0; r < CL; ++r) M = fmaxf(M, p_m[r][h]);
            float Ls = 0.0f, A = 0.0f;
#pragma unroll
            for (int r = 0; r < CL; ++r) {
                const float mr = p_m[r][h];
                if (mr == NEG_INF) continue;  // a split with no keys
                const float e = expf(mr - M);
                Ls += p_l[r][h] * e;
                A += p_a[r][threadIdx.x] * e;
            }
            out[(size_t)t * Hq * D + (size_t)(g * G + h0 + h) * D + d] = A / Ls;
        }
    }
#else
    __trap();
#endif
}

// attn_cluster{CL}_d{DPL}{NAME}: HG query heads of a kv head a block. _g4: 4, not 8: twice the blocks (SMs) at the
// same cluster size, half the per-key arithmetic a warp (the keys are issue-bound on 8 warps an SM:
// probes/attn_clocks.cu); each K / V row is read by two blocks (from L2 the second time). The same keys a warp in
// the same order, and every head's sums and softmax expressions as in the 8-head form: the same bits.
#define ATTN_CLUSTER_HG(CL, DPL, HG, CW, CK, NAME)                                                             \
    extern "C" __global__ void __launch_bounds__(CW * 32, 1) CLUSTER_DIMS(CL) attn_cluster##CL##_d##DPL##NAME( \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                        \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,             \
        const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out, int Hq, \
        int Hkv, int D, int block_size, float scale) {                                                        \
        attn_cluster_impl<DPL, CL, HG, CW, CK>(q, q_stride, k_cache, v_cache, block_tables, max_blocks,        \
                                               token_seq, positions, out, Hq, Hkv, D, block_size, scale);      \
    }
#define ATTN_CLUSTER(CL, DPL) ATTN_CLUSTER_HG(CL, DPL, MAXG, 8, 8, )
#define ATTN_CLUSTER_G4(CL, DPL) ATTN_CLUSTER_HG(CL, DPL, 4, 8, 8, _g4)
#define ATTN_CLUSTER_G4_W16(CL, DPL) ATTN_CLUSTER_HG(CL, DPL, 4, 16, 4, _g4_w16)
ATTN_CLUSTER(4, 4)
ATTN_CLUSTER(8, 4)
ATTN_CLUSTER(16, 4)
ATTN_CLUSTER(8, 2)
ATTN_CLUSTER(16, 2)
ATTN_CLUSTER_G4(8, 4)
ATTN_CLUSTER_G4(16, 4)
ATTN_CLUSTER_G4(8, 2)
ATTN_CLUSTER_G4(16, 2)
ATTN_CLUSTER_G4_W16(8, 4)
ATTN_CLUSTER_G4_W16(16, 4)
ATTN_CLUSTER_G4_W16(8, 2)
ATTN_CLUSTER_G4_W16(16, 2)
