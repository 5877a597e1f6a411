// probes/attn_clocks.cu: where the decode attention's time goes after its PDL wait. A copy of
// llmrs/kernels_cu/attention_cluster.cu's attn_cluster{CL}_d{DPL}[_g4[_w16]] and attention_o.cu's attn_o_cluster*
// (same entry points, same math) with SM-cycle counters per phase; never imported by the package.
// Thread 0 of every block adds the clock64 cycles of each phase to attn_clocks[phase] and counts itself in
// attn_clocks[15] (attn_cluster) or attn_clocks[14] (attn_o_cluster; the last block of each split, whose cross-head
// sum is phase 9, in attn_clocks[13]); the host reads them (RawModule.get_global) after a run of graphed decode
// steps built with these kernels in place of the package's (probes/attn_clocks.py holds the phase names).
//   attn_cluster phases: 0 entry -> table staged, early loads issued; 1 -> past the PDL wait; 2 -> q and the keys
//   (warp 0); 3 -> every warp's keys; 4 -> the block's warps merged, pushed; 5 -> the pushes in; 6 -> the splits
//   merged, out written; 7 (empty: no second barrier).
//   attn_o_cluster phases: 0 -> o weights, table, early K / V loads issued; 1 -> past the wait; 2 -> the keys; 3 ->
//   the block's merge factors; 4 -> the block's (M, L, A) pushed; 5 -> every split's pushes in; 6 -> the head's
//   output; 7 -> o's partial sums stored; 8 -> counted in (block_counts_last); 9 -> the last block's cross-head sum.
//   -DLLMRS_ATTN_O_RED: every attn_o block adds its rows into x with float atomics instead (no partials, no count,
//   no last block, no fixed summation order: not deterministic): what that dependent phase costs the step.
// Last result (H200, 7B one stream, the 8-heads-a-block form): after its wait the attention took 8.3 us a layer, 4.9
// of them the keys' arithmetic (8 keys a warp, 8 warps on each of 32 SMs: issue-bound, not waiting on loads), 1.3
// the block merge, 1.9 the cluster barriers and merge; with 4 heads a block, each lane's own head's softmax state
// and the splits pushed into the merging block (what ships), 4.6 us.
#include "../llmrs/kernels_cu/common.cuh"
#include "../llmrs/kernels_cu/attention.cuh"

__device__ unsigned long long attn_clocks[16];
#define ATTN_CLOCK_START long long clk_prev_ = clock64();
#define ATTN_CLOCK_IN(i, COUNT)                                                              \
    if (threadIdx.x == 0) {                                                                  \
        const long long now_ = clock64();                                                    \
        atomicAdd(&attn_clocks[i], (unsigned long long)(now_ - clk_prev_));                  \
        clk_prev_ = now_;                                                                    \
        if ((i) == 0) atomicAdd(&attn_clocks[COUNT], 1ull);                                  \
    }
#define ATTN_CLOCK(i) ATTN_CLOCK_IN(i, 15)
#define ATTN_O_CLOCK(i) ATTN_CLOCK_IN(i, 14)
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
    ATTN_CLOCK_START
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
    ATTN_CLOCK(0)  // entry -> the table staged, the early loads issued
    attn_first_keys<DPL, CK, CW>(k_cache, v_cache, tb, tb0, start + warp, end, L - 1 - t, active, Hkv, g,
                                 block_size, D, lane, kr, vr);
    ATTN_CLOCK(1)  // -> past the PDL wait

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
    ATTN_CLOCK(2)  // -> q and the keys done (warp 0)
    // the block's warps, as attn_partial merges them
    attn_warp_out<DPL, CW, HG>(s_m, s_l, s_acc, warp, lane, gn, acc, m, l);
    __syncthreads();
    __shared__ float s_e[CW][HG], s_M[HG];
    attn_warp_scales<CW, HG>(s_m, s_e, s_M, gn);
    __syncthreads();
    ATTN_CLOCK(3)  // -> every warp's keys done
    // the block's split of each (head, dim) pushed into the shared memory of the block that merges it (rank pair /
    // SL; a head's M and L into each block merging some of its dims), one barrier, then each block merges its SL
    // pairs from its own shared memory: no remote reads on the way out and no second barrier
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
    ATTN_CLOCK(4)  // -> the block's warps merged, pushed
    mbar_wait(&p_bar, 0);  // every split's pushes in (each block waits for its own: none leaves while pushed to)
    ATTN_CLOCK(5)  // -> the pushes in
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
    ATTN_CLOCK(6)  // -> the splits merged, out written
    ATTN_CLOCK(7)  // (no second barrier: nothing reads another block's shared memory after the first)
#else
    __trap();
#endif
}

// attn_cluster{CL}_d{DPL}{NAME}: HG query heads of a kv head a block. _g4: 4, not 8: twice the blocks (SMs) at the
// same cluster size, half the per-key arithmetic a warp (the keys are issue-bound on 8 warps an SM); each K / V row is read by two blocks (from L2 the second time). The same keys a warp in
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

// ---------------------------------------------------------------------------------------------------------------
// attn_o_cluster{CL}: one token's decode attention fused with the o projection that follows it (x += W_o att), for
// 128-dim heads on sm_90+. The o projection's input is the whole attention output, so after attn_cluster the o
// kernel waits on a grid boundary on top of the attention's own. Here the o product is split
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
// takes it only at one token.
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
    ATTN_CLOCK_START
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
    ATTN_O_CLOCK(0)  // entry -> the o weights, the table, the early K / V loads issued
    attn_first_keys<DPL, AO_CK, W>(k_cache, v_cache, tb, tb0, start + warp, end, L - 1 - t, true, Hkv, g,
                                          block_size, D, lane, kr, vr, word);
    ATTN_O_CLOCK(1)  // -> past the PDL wait
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
    ATTN_O_CLOCK(2)  // -> q and the keys (warp 0)
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
    ATTN_O_CLOCK(3)  // -> every warp's keys, the block's merge factors
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
    ATTN_O_CLOCK(4)  // -> the cluster's blocks running, the block's (M, L, A) pushed
    mbar_wait(&p_bar, 0);  // every split's pushes in (each block waits for its own: none leaves while pushed to)
    ATTN_O_CLOCK(5)  // -> every split's pushes in
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
    ATTN_O_CLOCK(6)  // -> the splits merged: the head's output
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
#ifdef LLMRS_ATTN_O_RED
    // timing probe (-DLLMRS_ATTN_O_RED): every block adds its rows' partial sums straight into x
    // (atomicAdd, compiled to RED.ADD.F32: the heads in whatever order the L2 takes them, so not deterministic), no
    // partials, no count and no last block's sum: what the cross-head reduction's dependent phase costs
    (void)part; (void)counts;
    if ((lane & 15) == 0) {
#pragma unroll
        for (int i = 0; i < RP; ++i) {
            const int row = warp * 2 * RP + 2 * i + (lane >> 4);
            if (row < rpb) atomicAdd(x + (size_t)t * N + r0 + row, y[i]);
        }
    }
    ATTN_O_CLOCK(7)  // -> o's rows added into x
#else
    float* pt = part + ((size_t)t * Hq + h) * N + r0;
    if ((lane & 15) == 0) {
#pragma unroll
        for (int i = 0; i < RP; ++i) {
            const int row = warp * 2 * RP + 2 * i + (lane >> 4);
            if (row < rpb) pt[row] = y[i];
        }
    }
    ATTN_O_CLOCK(7)  // -> o's rows, their partial sums stored
    const bool last = block_counts_last(&counts[t * CL + s], Hq);
    ATTN_O_CLOCK(8)  // -> counted in (block_counts_last: barrier, fence, atomic)
    if (last) {  // the split's rows: every head's partial in, head order
        const float* pr = part + (size_t)t * Hq * N + r0;
        for (int row = threadIdx.x; row < rpb; row += blockDim.x) {
            float v = 0.0f;
            for (int u = 0; u < Hq; ++u) v += __ldcg(pr + (size_t)u * N + row);
            x[(size_t)t * N + r0 + row] += v;
        }
        __syncthreads();  // (thread 0's clock after every row; `last` is the block's)
        ATTN_O_CLOCK(9)  // -> the last block's cross-head sum into x
        if (threadIdx.x == 0) atomicAdd(&attn_clocks[13], 1ull);
    }
#endif
#else
    __trap();
#endif
}

// attn_o_cluster{CL}{NAME}: W warps a block, MINB blocks an SM. _w8: 8 warps, each lane holding 16 chunks of o (256
// rows a block, as the 16-warp form's), two blocks an SM (__launch_bounds__(256, 2): 128 registers), its warps walking
// 32 keys a batch (the 16-warp form 64): the H200 runs 30 of its clusters of 8 at once against 15, so the 3B's 16
// heads all run at once
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
