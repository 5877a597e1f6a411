// gemv_q4.cu: the one-token (decode) 4-bit GEMV over q4_marlin.cuh's layout (tensor cores, sm_80+; clusters sm_90+):
//   out[T, N] (= or +=) x[T, K] @ W^T (+ bias) for T <= 16 tokens, x f32 (the matvec's input), W the Marlin layout
//   the prefill GEMM reads (no second copy).
// Entry points: gemv_q4{z,m}[_t16][_c1|_c4] (the plain form; _t16: 9..16 tokens; _c1 / _c4: group size 32 / 128
// fixed at compile time), gemv_q4{z,m}_c{1,4}_nout (o / down also writing the next RMSNorm's x * g and sums of
// squares), gemv_q4{z,m}_{silu,rope}_c{1,4}[_nin] (paired forms: gate_up with SiLU x up, qkv with RoPE and the
// paged-cache write in the epilogue; _nin: the RMSNorm before them applied from the producer's sums).
//
// Memory: a warp owns one 32-column tile (nb) and a contiguous run of k32 blocks (kb), each one coalesced 512-byte
// load (16 bytes a lane), software-pipelined as matvec.cu is: the next GV_DEPTH loads go out before the current ones
// are used, the first ones before pdl_wait (weights are never written by a kernel: in a graph they stream while the
// previous kernel drains). The batches alternate between two sets of code registers (qa / qb, the loop unrolled
// twice; every load from a valid address: past its run a warp re-reads its first block), x and the codes come
// through running pointers. No barrier until the warps of a block (one tile, K split over them) meet at the end.
//
// Tensor cores, the codes as the A operand (m16 = 16 of the tile's columns: rows g and g + 8 of the mma are the
// lane's words 2j and 2j + 1, i.e. columns 16 j + g and 16 j + 8 + g) and x as B (n8 = the tokens):
//   - one lop3 turns two codes into a bf16x2 of (128 + q): the nibbles at bits 0..3 and 16..19 of (w >> 4p),
//     p = 0..3, give the pairs (nibble p, nibble p + 4). mma only needs A and B to agree on which k each slot
//     holds, so the slots take those pairs as they come and x is packed to match: slot pair (2t, 2t + 1) of k16
//     step 0 holds k (2t, 16 + 2t), pair (2t + 8, 2t + 9) holds (2t + 1, 17 + 2t); step 1 the same plus 8 (k
//     relative to 32 kb; the Marlin k of nibble j in q4_marlin.cuh).
//   - the codes enter raw (128 + q: exact in bf16), the scale and zero after the group's mma: per group
//     C = sum (128 + q) x and X = sum x (one more mma, ones against x, so X sums the same bf16 x), then
//       zero: acc += s (C - (128 + z) X) = sum (q - z) s x;   min: acc += s (C - 128 X) + m X = sum (q s + m) x.
//     The cancellation costs ~4 of the f32 accumulator's 24 bits; the weights are exact (not rounded to bf16),
//     x is rounded to bf16 as the GEMM paths round it. (tests/test_quant_marlin.py emulates this in numpy.)
//   Per 32 weights a lane: one 4-byte share of a load, 3 shifts + 4 lop3, 1 mma; per k32 block 2 ones mma and
//   x's B registers (4 float2 from L1, lanes of tokens < T only).
// A group's scale words are loaded once, a group ahead, and the group is followed by a counter (no division or
// modulo per k32 block); where G / 32 (CPG) is known at compile time (_c1 / _c4) the flush sits at fixed k32 blocks,
// each group's first mma starts from 0 and the scale words alternate between two buffers.
// K is split over the block's warps and over gridDim.y (S slices); the warps meet in shared memory in a fixed
// order; with S > 1 each block writes its f32 partial and the last block of the tile (a counter per tile, reset
// by that block) sums the S partials in slice order: deterministic, one launch. Launched as a cluster of the S
// slices (sm_90+, cuda.QuantLinearOps.gemv_q4), the blocks push their partials into the first block's shared memory
// instead (st.async, completing on its mbarrier: no fence) and that block sums them: the same sums in the same
// order, without the round trips through L2.
// GV_DEPTH and GV_MINB can be set with -D for A/Bs (`llmrs ptx-check -D` first: GV_MINB=5 spills).
//
// Roof (H200, the 7B AWQ): instruction-bound more than DRAM-bound (ncu, gate_up: 56% of the issue slots, 33% of DRAM
// bandwidth at 4 blocks an SM); down (S 4) 14.8 us in the step against its 8.4 us bandwidth floor (57%). What bounds
// it: probes/gemv_q4_ablate.cu.
#include "common.cuh"
#include "q4_marlin.cuh"

#define GV_WARPS 4
#define GV_CLUSTER_MAX 4  // K slices a cluster launch takes at most (cuda.quant_linear.GEMV_CLUSTER_MAX)
#ifndef GV_DEPTH
#define GV_DEPTH 4  // k32 blocks in flight a warp while the previous GV_DEPTH are used (registers)
#endif
#define GV_BF16_ONES 0x3F803F80u

__device__ __forceinline__ unsigned bf16x2_code(unsigned w) { return lop3_code<0x000F000Fu, 0x43004300u>(w); }
// x's B registers of one kb for the lane's token (zeros for a lane whose token is >= T): step 0 b0, b1, step 1 b0, b1
__device__ __forceinline__ uint4 gemv_xb(const float* __restrict__ xr, bool live) {
    if (!live) return make_uint4(0u, 0u, 0u, 0u);
    // x comes from the previous kernel: ldx2 (common.cuh's early-load rules)
    const float2 x0 = ldx2(xr), x1 = ldx2(xr + 8), x2 = ldx2(xr + 16), x3 = ldx2(xr + 24);
    return make_uint4(pack_bf16x2(x0.x, x2.x), pack_bf16x2(x0.y, x2.y), pack_bf16x2(x1.x, x3.x),
                      pack_bf16x2(x1.y, x3.y));
}

// one k32 block: two m16 tiles of codes (words 0, 1 and 2, 3) x two k16 steps against each n8 tile of tokens
// (xb[u]: tokens 8 u + g), and the ones mma for X of each
// first: the group's first k32 block, whose mma start c and cx from 0 (a constant after unrolling where the group
// size is: CPG), so the flush need not zero them
template <int NU>
__device__ __forceinline__ void gemv_kb(uint4 q, const uint4 (&xb)[NU], float (&c)[NU][2][4], float (&cx)[NU][4],
                                        bool first = false) {
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
    const unsigned ones[4] = {GV_BF16_ONES, GV_BF16_ONES, GV_BF16_ONES, GV_BF16_ONES};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const unsigned lo = wq[2 * j], hi = wq[2 * j + 1];
        const unsigned a0[4] = {bf16x2_code(lo), bf16x2_code(hi), bf16x2_code(lo >> 4), bf16x2_code(hi >> 4)};
        const unsigned a1[4] = {bf16x2_code(lo >> 8), bf16x2_code(hi >> 8), bf16x2_code(lo >> 12),
                                bf16x2_code(hi >> 12)};
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            if (first)
                mma_bf16_zc(c[u][j], a0, xb[u].x, xb[u].y);
            else
                mma_bf16(c[u][j], a0, xb[u].x, xb[u].y);
            mma_bf16(c[u][j], a1, xb[u].z, xb[u].w);
        }
    }
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        if (first)
            mma_bf16_zc(cx[u], ones, xb[u].x, xb[u].y);
        else
            mma_bf16(cx[u], ones, xb[u].x, xb[u].y);
        mma_bf16(cx[u], ones, xb[u].z, xb[u].w);
    }
}

// the group's scale and zero (min) into acc; sw[2 j + r]: the scale word of column 16 j + 8 r + g; c[u][j][2 r + h]
// is (that column, token 8 u + 2 t + h), cx[u][h] = X of that token. ZERO: c and cx start over (else the next
// group's first mma overwrites them).
template <int MODE, int NU, bool ZERO = true>
__device__ __forceinline__ void gemv_flush(const unsigned (&sw)[4], float (&c)[NU][2][4], float (&cx)[NU][4],
                                           float (&acc)[NU][2][4]) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned w = sw[2 * j + r];
            const float s = gq_f16_to_f32((unsigned short)(w & 0xffffu)), z = gq_f16_to_f32((unsigned short)(w >> 16));
#pragma unroll
            for (int u = 0; u < NU; ++u)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float& a = acc[u][j][2 * r + h];
                    if (MODE == 0)
                        a = fmaf(s, fmaf(-(128.0f + z), cx[u][h], c[u][j][2 * r + h]), a);
                    else
                        a = fmaf(s, fmaf(-128.0f, cx[u][h], c[u][j][2 * r + h]), fmaf(z, cx[u][h], a));
                    if (ZERO) c[u][j][2 * r + h] = 0.0f;
                }
        }
    if (ZERO) {
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) cx[u][e] = 0.0f;
    }
}

// NU n8 tiles of tokens: T <= 8 NU. CPG: 0, the group's k32 blocks (G / 32) followed at run time by a counter;
// else G / 32 at compile time (the host's gemv_cpg: it divides GV_DEPTH, so with kpw a multiple of GV_DEPTH every
// batch holds whole groups): the flush sits at fixed k32 blocks and each group's first mma starts from 0.
// The paired forms (EPI): a block of 2 GV_WARPS warps takes two tiles whose columns pair up in an epilogue, each
// tile's warps exactly the plain form's (the same K runs, the same sums in the same order), so the pair's outputs
// are the plain kernel's bits and the epilogue is its follower's expression:
//   GV_EPI_SILU: gate_up [2I, K]; pair b = tiles (b, I / 32 + b); act[t, 32 b + lane] = silu(gate) * up (silu_mul's
//                silu_mul_f), into out [T, I];
//   GV_EPI_ROPE: qkv [(Hq + 2 Hkv) D, K] + bias; pair b of head h = b / (D / 64): tiles (h D / 32 + j, that + D /
//                64), j = b % (D / 64), columns h D + i and h D + i + D / 2 (i = 32 j + lane): q heads rotated in
//                out (= qkv), k heads rotated and v heads as they are into the paged caches (pair_rope_out,
//                rope_write_kv's math).
// NRM, the RMSNorm between two GEMVs carried by them (one n8 tile of tokens; cuda.QuantLinearOps.q4_norm_chain says where):
//   GV_NORM_OUT (the plain forms of o and down, accumulating into the residual stream x): the epilogue also writes
//     xg = x * g (g: the next norm's weight) and each (token, 32-column tile)'s sum of x^2 (a warp's shuffle tree)
//     into ssp [T, N / 32];
//   GV_NORM_IN (the paired forms of gate_up and qkv, over x = xg): the block that finishes a tile sums the token's
//     K / 32 partials (lane-strided, then the shuffle tree: a fixed order) and scales both tiles' sums by 1 /
//     sqrt(mean(x^2) + eps) before the bias and the follower. rms_norm + the GEMV by linearity, with x * g rounded
//     to bf16 instead of g * (x / rms) (within bf16 rounding, not the same bits), and no norm kernel: the main loop
//     is the plain form's (x * g and the squares folded into the GEMV's loop break its load pipelining under the
//     128-register bound).
#define GV_NORM_OUT 1
#define GV_NORM_IN 2
struct GvNorm {
    const float* g;  // OUT: the next norm's weight
    float* xg;       // OUT: x * g [T, N]
    float* ssp;      // OUT: written [T, N / 32]; IN: read [T, K / 32]
    float eps;       // IN
};
struct GvRope {  // what the rope epilogue writes with (rope_write_kv's arguments)
    const int* positions;
    const float* inv_freq;
    const int* slots;
    bf16_t* k_cache;
    bf16_t* v_cache;
    int Hq, Hkv, D, block_size;
};

// the tile of a paired block's half `sel` (0: the pair's first, whose columns index the epilogue)
template <int EPI>
__device__ __forceinline__ int gv_pair_tile(int b, int sel, int N, int D) {
    if (EPI == GV_EPI_SILU) return b + sel * (N >> 6);
    const int tph = D >> 6;  // a half head's tiles
    return (b / tph) * 2 * tph + b % tph + sel * tph;
}

template <int MODE, int NU, int CPG, int EPI = 0, int NRM = 0>
__device__ __forceinline__ void gemv_q4_impl(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ,
                                             const float* __restrict__ x, const float* __restrict__ bias,
                                             float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem,
                                             int T, int N, int K, int G, int accumulate, int kpw,
                                             const GvRope rp = GvRope{}, const GvNorm nm = GvNorm{}) {
    static_assert(CPG == 0 || GV_DEPTH % CPG == 0, "a fixed group size must divide GV_DEPTH (whole groups a batch)");
    static_assert(EPI == 0 || NU == 1, "the paired forms take one n8 tile of tokens");
    static_assert(NRM == 0 || (NU == 1 && (NRM == GV_NORM_IN) == (EPI != 0)), "norm out: plain forms; in: paired");
    pdl_trigger();
    constexpr int TOK = 8 * NU;
    constexpr int NW = EPI ? 2 * GV_WARPS : GV_WARPS;  // warps a block: one tile's, or a pair's (EPI)
    __shared__ float red[NW][TOK][36];  // [warp][token][column] (36: conflict-free stores)
    // a cluster launch (the K slices' merge below): block 0's mbarrier for the slices' pushes, initialized before
    // every block arrives at the cluster barrier that the pushes wait on
    __shared__ __align__(8) unsigned long long cbar;
    const unsigned ncl = NU == 1 ? cluster_blocks() : 1;
    if (ncl > 1) {
        if (cluster_rank() == 0 && threadIdx.x == 0) mbar_init(&cbar, 1);
        cluster_arrive_relaxed();
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wk = EPI ? warp % GV_WARPS : warp;  // the warp's K run among its tile's warps
    const int nb_a = EPI ? gv_pair_tile<EPI>(blockIdx.x, 0, N, rp.D) : blockIdx.x;
    const int nb_b = EPI ? gv_pair_tile<EPI>(blockIdx.x, 1, N, rp.D) : 0;
    const int nb = EPI && warp >= GV_WARPS ? nb_b : nb_a, KB = K >> 5, cpg = CPG ? CPG : G >> 5;
    const int kb_lo = min(KB, (blockIdx.y * GV_WARPS + wk) * kpw), kb_hi = min(KB, kb_lo + kpw);
    const uint4* wp = Bq + (size_t)nb * KB * 32 + lane;
    uint4 qa[GV_DEPTH], qb[GV_DEPTH];  // two batches' codes: one used while the other is loaded (no copies)
#pragma unroll
    for (int d = 0; d < GV_DEPTH; ++d) qa[d] = ldg_early(wp + (size_t)min(kb_lo + d, max(kb_hi - 1, 0)) * 32);
    pdl_wait_on(early_words(qa));  // x (and out, part) come from earlier kernels

    bool live[NU];
    const float* xr[NU];  // this batch's x of the lane's token (running pointers: no address product a block)
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        live[u] = 8 * u + g < T;
        xr[u] = x + (size_t)(live[u] ? 8 * u + g : 0) * K + 2 * t + 32 * kb_lo;
    }
    const uint4* wn = wp + (size_t)(kb_lo + GV_DEPTH) * 32;  // the next batch's codes
    const unsigned* szc = SZ + nb * 32 + g;  // + group * N + 16 j + 8 r
    float c[NU][2][4], cx[NU][4], acc[NU][2][4];
#pragma unroll
    for (int u = 0; u < NU; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[u][0][e] = c[u][1][e] = cx[u][e] = acc[u][0][e] = acc[u][1][e] = 0.0f;
    // the group's scale words (e = 2 j + r: column 16 j + 8 r + g) are loaded a group ahead (swn) and used at its
    // flush (swc); the group is followed by a counter (kin: k32 blocks of the group done), no division per block
    const int g_end = kb_hi > kb_lo ? (kb_hi - 1) / cpg + 1 : 0;
    int grp = kb_lo / cpg, kin = kb_lo - grp * cpg;
    // sw[0]: this group's words, sw[1]: the next group's; with CPG they alternate instead (group i in sw[i & 1],
    // i counted from the warp's first group: a constant in the unrolled loop) and no words are moved
    unsigned sw[2][4];
    const unsigned* sp = szc + (size_t)grp * N;  // then the words of the group after the next one
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        sw[0][e] = grp < g_end ? __ldg(sp + 8 * e) : 0u;
        sw[1][e] = grp + 1 < g_end ? __ldg(sp + N + 8 * e) : 0u;
    }
    sp += 2 * (size_t)N;
    // one batch: GV_DEPTH k32 blocks from base, its codes in q; the next batch's codes go out into qn first (from a
    // valid address always, so no register keeps an old value: past the run a load re-reads the run's first block)
    auto batch = [&](const uint4 (&q)[GV_DEPTH], uint4 (&qn)[GV_DEPTH], const int base, const int half) {
        uint4 xb[GV_DEPTH][NU];
#pragma unroll
        for (int d = 0; d < GV_DEPTH; ++d)
#pragma unroll
            for (int u = 0; u < NU; ++u) xb[d][u] = gemv_xb(xr[u] + 32 * d, live[u] && base + d < kb_hi);
#pragma unroll
        for (int u = 0; u < NU; ++u) xr[u] += 32 * GV_DEPTH;
#pragma unroll
        for (int d = 0; d < GV_DEPTH; ++d) qn[d] = ldg_stream(base + GV_DEPTH + d < kb_hi ? wn + 32 * d : wp);
        wn += 32 * GV_DEPTH;
#pragma unroll
        for (int d = 0; d < GV_DEPTH; ++d) {
            if (base + d < kb_hi) {
                gemv_kb<NU>(q[d], xb[d], c, cx, CPG && d % CPG == 0);
                if (CPG ? (d + 1) % CPG == 0 : ++kin == cpg || base + d + 1 == kb_hi) {
                    const int b = CPG ? (half * GV_DEPTH + d) / (CPG ? CPG : 1) & 1 : 0;
                    gemv_flush<MODE, NU, CPG == 0>(sw[b], c, cx, acc);
                    kin = 0;
                    ++grp;
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (!CPG) sw[0][e] = sw[1][e];
                        sw[CPG ? b : 1][e] = grp + 1 < g_end ? __ldg(sp + 8 * e) : 0u;
                    }
                    sp += N;
                }
            }
        }
    };
    for (int base = kb_lo; base < kb_hi; base += 2 * GV_DEPTH) {
        batch(qa, qb, base, 0);
        if (base + GV_DEPTH >= kb_hi) break;
        batch(qb, qa, base + GV_DEPTH, 1);
    }
    // GV_NORM_IN: warp m's lanes ask for token m's sums of squares now, so their round trip overlaps the reduction
    // below (the epilogue's threads of token m are warp m's: P == 1 in the paired forms)
    float ssl = 0.0f;
    if (NRM == GV_NORM_IN && warp < T) {
        const int nbk = K >> 5;
        for (int j = lane; j < nbk; j += 32) ssl += __ldcg(nm.ssp + (size_t)warp * nbk + j);
    }
    // lane (g, t): column 16 j + 8 r + g, token 8 u + 2 t + h in acc[u][j][2 r + h]
#pragma unroll
    for (int u = 0; u < NU; ++u)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) red[warp][8 * u + 2 * t + h][16 * j + 8 * r + g] = acc[u][j][2 * r + h];
    __syncthreads();
    // (token, column) pairs a thread: tid + 32 NW p of the TOK x 32; with EPI the same pair of both tiles (v, vb)
    constexpr int P = TOK / NW;
    static_assert(P * NW == TOK, "whole (token, column) pairs a thread");
    float v[P], vb[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int m = (tid >> 5) + NW * p;
        v[p] = 0.0f;
#pragma unroll
        for (int w = 0; w < GV_WARPS; ++w) v[p] += red[w][m][lane];
        vb[p] = 0.0f;
        if (EPI) {
#pragma unroll
            for (int w = GV_WARPS; w < NW; ++w) vb[p] += red[w][m][lane];
        }
    }
    const int n = nb_a * 32 + lane, n_b = nb_b * 32 + lane;
    if (ncl > 1) {
        // a cluster launch (sm_90+, GV_CLUSTER_MAX slices at most, one n8 tile of tokens: the t16 forms stay on the
        // hand-off below, whose registers the path would cost spills): the cluster is the tile's S slices (rank =
        // blockIdx.y); each block pushes its sums into block 0's shared memory (st.async, completing on block 0's
        // mbarrier: no cluster barrier with release, whose MEMBAR.ALL.GPU costs the 7B AWQ ~18 us a
        // step), and block 0 adds them in slice order from 0, the global hand-off's order below: the same bits, no
        // round trips through L2 (store, fence, atomic, loads)
        __shared__ float cpart[GV_CLUSTER_MAX][EPI ? 2 : 1][TOK][32];
        const unsigned rank = cluster_rank();
        cluster_wait();  // block 0's mbarrier initialized (every block arrived at its start)
        if (rank == 0 && tid == 0) mbar_arrive_expect(&cbar, ncl * (unsigned)T * 32u * 4u * (EPI ? 2u : 1u));
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                st_async_cluster(&cpart[rank][0][m][lane], 0, v[p], &cbar);
                if (EPI) st_async_cluster(&cpart[rank][EPI ? 1 : 0][m][lane], 0, vb[p], &cbar);
            }
        }
        if (rank != 0) return;
        mbar_wait(&cbar, 0);  // every slice's sums in
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                v[p] = 0.0f;
                for (unsigned z = 0; z < ncl; ++z) v[p] += cpart[z][0][m][lane];
                if (EPI) {
                    vb[p] = 0.0f;
                    for (unsigned z = 0; z < ncl; ++z) vb[p] += cpart[z][EPI ? 1 : 0][m][lane];
                }
            }
        }
    } else if (gridDim.y > 1) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                part[((size_t)blockIdx.y * T + m) * N + n] = v[p];
                if (EPI) part[((size_t)blockIdx.y * T + m) * N + n_b] = vb[p];
            }
        }
        if (!block_counts_last(sem + blockIdx.x, (int)gridDim.y)) return;
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                v[p] = 0.0f;
                for (int z = 0; z < (int)gridDim.y; ++z) v[p] += __ldcg(part + ((size_t)z * T + m) * N + n);
                if (EPI) {
                    vb[p] = 0.0f;
                    for (int z = 0; z < (int)gridDim.y; ++z) vb[p] += __ldcg(part + ((size_t)z * T + m) * N + n_b);
                }
            }
        }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int m = (tid >> 5) + NW * p;
        if (m < T) {
            if (NRM == GV_NORM_IN) {  // rms_norm's expression (rmsnorm.cu) from the token's partial sums
                const float inv = 1.0f / sqrtf(warp_sum(ssl) / (float)K + nm.eps);
                v[p] *= inv;
                vb[p] *= inv;
            }
            // the plain form's output expression (+ 0.0f without a bias: -0 sums become +0 the same way)
            const float o = v[p] + (bias ? bias[n] : 0.0f);
            if (EPI == GV_EPI_SILU) {
                out[(size_t)m * (N >> 1) + n] = silu_mul_f(o, vb[p] + (bias ? bias[n_b] : 0.0f));
            } else if (EPI == GV_EPI_ROPE) {
                const int half = rp.D >> 1;
                pair_rope_out(o, vb[p] + (bias ? bias[n_b] : 0.0f), n / rp.D, n % rp.D, half, m, out, N,
                              rp.positions, rp.inv_freq, rp.slots, rp.k_cache, rp.v_cache, rp.Hq, rp.Hkv, rp.D,
                              rp.block_size);
            } else {
                float* dst = out + (size_t)m * N + n;
                const float xn = accumulate ? *dst + o : o;
                *dst = xn;
                if (NRM == GV_NORM_OUT) {  // the warp's 32 columns of token m (m is the warp's)
                    nm.xg[(size_t)m * N + n] = xn * __ldg(nm.g + n);
                    const float q = warp_sum(xn * xn);
                    if (lane == 0) nm.ssp[(size_t)m * (N >> 5) + nb_a] = q;
                }
            }
        }
    }
}

#ifndef GV_MINB
#define GV_MINB 4
#endif
#define GEMV_Q4(NAME, MODE, NU, MINB, CPG)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * GV_WARPS, MINB)                                             \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part,                   \
             int* __restrict__ sem, int T, int N, int K, int G, int accumulate, int kpw) {                        \
        gemv_q4_impl<MODE, NU, CPG>(Bq, SZ, x, bias, out, part, sem, T, N, K, G, accumulate, kpw);                \
    }
GEMV_Q4(gemv_q4z, 0, 1, GV_MINB, 0)
GEMV_Q4(gemv_q4m, 1, 1, GV_MINB, 0)
GEMV_Q4(gemv_q4z_t16, 0, 2, 3, 0)  // 9..16 tokens: two n8 tiles of tokens, every code decoded once for both
GEMV_Q4(gemv_q4m_t16, 1, 2, 3, 0)
GEMV_Q4(gemv_q4z_c4, 0, 1, GV_MINB, 4)  // group 128 (AWQ)
GEMV_Q4(gemv_q4m_c4, 1, 1, GV_MINB, 4)
GEMV_Q4(gemv_q4z_t16_c4, 0, 2, 3, 4)
GEMV_Q4(gemv_q4m_t16_c4, 1, 2, 3, 4)
GEMV_Q4(gemv_q4z_c1, 0, 1, GV_MINB, 1)  // group 32 (GGUF Q4_0, Q4_1)
GEMV_Q4(gemv_q4m_c1, 1, 1, GV_MINB, 1)
GEMV_Q4(gemv_q4z_t16_c1, 0, 2, 3, 1)
GEMV_Q4(gemv_q4m_t16_c1, 1, 2, 3, 1)
// GV_NORM_OUT: o / down writing the next norm's x * g and sums of squares too (up to 8 tokens, G 32 / 128)
#define GEMV_Q4_NOUT(NAME, MODE, CPG)                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * GV_WARPS, GV_MINB)                                          \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem, int T, int N, int K, int G, \
             int accumulate, int kpw, const float* __restrict__ gn, float* __restrict__ xg,                      \
             float* __restrict__ ssp) {                                                                           \
        gemv_q4_impl<MODE, 1, CPG, 0, GV_NORM_OUT>(Bq, SZ, x, nullptr, out, part, sem, T, N, K, G, accumulate,    \
                                                   kpw, GvRope{}, GvNorm{gn, xg, ssp, 0.0f});                     \
    }
GEMV_Q4_NOUT(gemv_q4z_c4_nout, 0, 4)
GEMV_Q4_NOUT(gemv_q4m_c4_nout, 1, 4)
GEMV_Q4_NOUT(gemv_q4z_c1_nout, 0, 1)
GEMV_Q4_NOUT(gemv_q4m_c1_nout, 1, 1)

// the paired forms (up to 8 tokens, G 32 / 128): 2 GV_WARPS warps a block, half as many blocks an SM (the same
// registers a thread and warps an SM as the plain form)
#define GEMV_Q4_SILU(NAME, MODE, CPG)                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem, int T, int N, int K, int G, \
             int kpw) {                                                                                           \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_SILU>(Bq, SZ, x, nullptr, out, part, sem, T, N, K, G, 0, kpw);          \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME##_nin(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,    \
                   float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem, int T, int N, int K,  \
                   int G, int kpw, float* __restrict__ ssp, float eps) {                                          \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_SILU, GV_NORM_IN>(Bq, SZ, x, nullptr, out, part, sem, T, N, K, G, 0,    \
                                                            kpw, GvRope{}, GvNorm{nullptr, nullptr, ssp, eps});   \
    }
#define GEMV_Q4_ROPE(NAME, MODE, CPG)                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part,                   \
             int* __restrict__ sem, int T, int N, int K, int G, int kpw, const int* __restrict__ positions,       \
             const float* __restrict__ inv_freq, const int* __restrict__ slots, bf16_t* __restrict__ k_cache,     \
             bf16_t* __restrict__ v_cache, int Hq, int Hkv, int D, int block_size) {                              \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_ROPE>(Bq, SZ, x, bias, out, part, sem, T, N, K, G, 0, kpw,              \
                                                GvRope{positions, inv_freq, slots, k_cache, v_cache, Hq, Hkv, D,  \
                                                       block_size});                                              \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME##_nin(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,    \
                   const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part,             \
                   int* __restrict__ sem, int T, int N, int K, int G, int kpw, const int* __restrict__ positions, \
                   const float* __restrict__ inv_freq, const int* __restrict__ slots,                             \
                   bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache, int Hq, int Hkv, int D,            \
                   int block_size, float* __restrict__ ssp, float eps) {                                          \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_ROPE, GV_NORM_IN>(                                                      \
            Bq, SZ, x, bias, out, part, sem, T, N, K, G, 0, kpw,                                                  \
            GvRope{positions, inv_freq, slots, k_cache, v_cache, Hq, Hkv, D, block_size},                         \
            GvNorm{nullptr, nullptr, ssp, eps});                                                                  \
    }
GEMV_Q4_SILU(gemv_q4z_silu_c4, 0, 4)
GEMV_Q4_SILU(gemv_q4m_silu_c4, 1, 4)
GEMV_Q4_SILU(gemv_q4z_silu_c1, 0, 1)
GEMV_Q4_SILU(gemv_q4m_silu_c1, 1, 1)
GEMV_Q4_ROPE(gemv_q4z_rope_c4, 0, 4)
GEMV_Q4_ROPE(gemv_q4m_rope_c4, 1, 4)
GEMV_Q4_ROPE(gemv_q4z_rope_c1, 0, 1)
GEMV_Q4_ROPE(gemv_q4m_rope_c1, 1, 1)
