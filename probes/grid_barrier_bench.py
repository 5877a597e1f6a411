"""Probe: what a dependent kernel boundary costs in a graphed decode chain, against a grid barrier in one kernel.
Last result (H200): 4.2 us for a dependent one-token 2048 x 2048 matvec whose rows were all loaded early.

What a kernel boundary costs in a graphed decode step, against a grid barrier inside one persistent kernel.

The one-stream decode step is a chain of dependent kernels (five a layer at one token), with
~3.6-4.7 us a layer of fixed cost per small projection (o, qkv) above its bytes on the 3B. This probe runs the same
work two ways, on a GPU (sm_90 for the PDL forms):

  chain:       L dependent one-token matvecs (o-shaped: N rows x K, bf16, one warp a row, the whole row loaded into
               registers before griddepcontrol.wait), one kernel each, launched with programmatic stream
               serialization and captured in a CUDA graph (what the engine's decode graph does);
  chain-nopdl: the same kernels without PDL;
  chain-flag:  the PDL chain with each kernel's dependency on the one before carried by a counter (each block adds 1
               after its stores; the next kernel's blocks, resident once all of this one's triggered, spin on it)
               instead of griddepcontrol.wait (which waits for the whole grid to complete and flush);
  chain-flag2: the same without the per-warp __threadfence (CUTLASS's barrier: bar.sync, then one red.release);
  chain-flag3: flag2 polling with __nanosleep(64) between the loads;
  chain4:      the PDL chain with 4-warp blocks (the engine's matvec blocks) instead of 16;
  chain-empty, chain4-empty: the PDL chains' launches and early loads with a trivial body (the boundary alone);
  persistent:  one kernel of one block an SM doing the L matvecs as phases, each warp loading its next row before
               a grid barrier (one atomic a block on a counter in global memory, thread 0 spinning on an acquire
               load) that orders phase p's outputs before phase p + 1's reads.

Each phase reads x (the previous phase's output) and writes y = x + W x (bits identical between the forms: same
summation order). Per phase it prints the time, GB/s and the fraction of the read-bandwidth ceiling.

    python -m probes.grid_barrier_bench --n 2048 --k 2048 --layers 72 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys

from llmrs.backends.cuda.kernels import with_common

# common.cuh's ldg_stream (weights), unpack8 and warp_sum; x through ld_x4, not common.cuh's ldx4: its "memory"
# clobber keeps the load below the persistent form's grid barrier (ldx4 relies on pdl_wait's asm order alone)
SRC = with_common(r"""
#include "common.cuh"
__device__ __forceinline__ float4 ld_x4(const float* p) {  // coherent: written by the previous phase
    float4 r;
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p)
                 : "memory");
    return r;
}
#define R 8  // 16-byte chunks a lane: K = 256 * R = 2048
__device__ __forceinline__ void load_row(const uint4* W, int n, int N, int K8, int lane, uint4 (&p)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const int c = lane + 32 * i;
        p[i] = (n < N && c < K8) ? ldg_stream(W + (size_t)n * K8 + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}
__device__ __forceinline__ float row_dot(const uint4 (&p)[R], const float* x, int K8, int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const int c = lane + 32 * i;
        if (c < K8) {
            float wf[8];
            unpack8(p[i], wf);
            const float4 a = ld_x4(x + 8 * c), b = ld_x4(x + 8 * c + 4);
            acc += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y
                   + wf[6] * b.z + wf[7] * b.w;
        }
    }
    return warp_sum(acc);
}
template <int WPB, bool BODY>
__device__ __forceinline__ void chain_impl(const uint4* __restrict__ W, const float* x, float* y, int N, int K8) {
    const int lane = threadIdx.x & 31, n = blockIdx.x * WPB + (threadIdx.x >> 5);
    uint4 p[R];
    load_row(W, n, N, K8, lane, p);
    unsigned v = 0u;
#pragma unroll
    for (int i = 0; i < R; ++i) v |= p[i].x;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" :: "r"(v) : "memory");
    if (n >= N) return;
    if (BODY) {
        const float s = row_dot(p, x, K8, lane);
        if (lane == 0) y[n] = x[n] + s;
    } else if (lane == 0) {  // the boundary alone: a trivial body after the wait
        y[n] = x[n] + __uint_as_float(v & 1u);
    }
}
extern "C" __global__ void __launch_bounds__(512, 1) chain_mv(const uint4* __restrict__ W, const float* x, float* y,
                                                              int N, int K8) {
    chain_impl<16, true>(W, x, y, N, K8);
}
extern "C" __global__ void __launch_bounds__(128) chain4_mv(const uint4* __restrict__ W, const float* x, float* y,
                                                            int N, int K8) {
    chain_impl<4, true>(W, x, y, N, K8);
}
extern "C" __global__ void __launch_bounds__(512, 1) chain_empty(const uint4* __restrict__ W, const float* x, float* y,
                                                                 int N, int K8) {
    chain_impl<16, false>(W, x, y, N, K8);
}
extern "C" __global__ void __launch_bounds__(128) chain4_empty(const uint4* __restrict__ W, const float* x, float* y,
                                                               int N, int K8) {
    chain_impl<4, false>(W, x, y, N, K8);
}
// the chain with the dependency carried by a counter instead of griddepcontrol.wait: each block of kernel l adds 1
// to ctr_out after its stores (fenced), kernel l + 1's blocks (resident: PDL launches them once every block of l has
// triggered, i.e. runs) spin on it with an acquire load; the first kernel waits on the grid before it (its x)
template <bool FENCE, int SLEEP>
__device__ __forceinline__ void chain_flag_impl(const uint4* __restrict__ W, const float* x, float* y, int N, int K8,
                                                const unsigned* ctr_in, unsigned* ctr_out, unsigned target) {
    const int lane = threadIdx.x & 31, n = blockIdx.x * 16 + (threadIdx.x >> 5);
    uint4 p[R];
    load_row(W, n, N, K8, lane, p);
    unsigned v = 0u;
#pragma unroll
    for (int i = 0; i < R; ++i) v |= p[i].x;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (ctr_in == nullptr) {
        asm volatile("griddepcontrol.wait;" :: "r"(v) : "memory");
    } else {
        if (threadIdx.x == 0) {
            unsigned seen;
            while (true) {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ctr_in), "r"(v) : "memory");
                if (seen >= target) break;
                if (SLEEP) __nanosleep(SLEEP);
            }
        }
        __syncthreads();
    }
    if (n < N) {
        const float s = row_dot(p, x, K8, lane);
        if (lane == 0) {
            y[n] = x[n] + s;
            if (FENCE) __threadfence();
        }
    }
    // CUTLASS's GenericBarrier form: the CTA barrier, then one release by thread 0 (cumulative over the block's
    // stores ordered before it by the barrier)
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(ctr_out) : "memory");
}
extern "C" __global__ void __launch_bounds__(512, 1) chain_flag_mv(const uint4* __restrict__ W, const float* x,
        float* y, int N, int K8, const unsigned* ctr_in, unsigned* ctr_out, unsigned target) {
    chain_flag_impl<true, 0>(W, x, y, N, K8, ctr_in, ctr_out, target);
}
extern "C" __global__ void __launch_bounds__(512, 1) chain_flag2_mv(const uint4* __restrict__ W, const float* x,
        float* y, int N, int K8, const unsigned* ctr_in, unsigned* ctr_out, unsigned target) {
    chain_flag_impl<false, 0>(W, x, y, N, K8, ctr_in, ctr_out, target);
}
extern "C" __global__ void __launch_bounds__(512, 1) chain_flag3_mv(const uint4* __restrict__ W, const float* x,
        float* y, int N, int K8, const unsigned* ctr_in, unsigned* ctr_out, unsigned target) {
    chain_flag_impl<false, 64>(W, x, y, N, K8, ctr_in, ctr_out, target);
}
__device__ __forceinline__ void grid_barrier(unsigned* ctr, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(ctr) : "memory");
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ctr) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}
// L phases; phase l reads xs[l % 2], writes xs[(l + 1) % 2]; W_l at W + l * N * K8
extern "C" __global__ void __launch_bounds__(512, 1) persistent_mv(const uint4* __restrict__ W, float* x0, float* x1,
                                                                   int N, int K8, int L, unsigned* ctr) {
    const int lane = threadIdx.x & 31;
    const int w = blockIdx.x * 16 + (threadIdx.x >> 5);
    uint4 p[R];
    load_row(W, w, N, K8, lane, p);
    for (int l = 0; l < L; ++l) {
        const float* x = (l & 1) ? x1 : x0;
        float* y = (l & 1) ? x0 : x1;
        float s = 0.0f;
        if (w < N) s = row_dot(p, x, K8, lane);
        if (l + 1 < L) load_row(W + (size_t)(l + 1) * N * K8, w, N, K8, lane, p);  // the next phase's row, early
        if (w < N && lane == 0) y[w] = x[w] + s;
        if (l + 1 < L) grid_barrier(ctr, (unsigned)(gridDim.x * (l + 1)));
    }
}
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=72)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--bandwidth-gbs", type=float, default=4296.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.k != 2048 or a.n > a.k:
        print("grid_barrier_bench: --k must be 2048 (R = 8 chunks a lane, compiled in) and --n at most --k (x is "
              "both the input and the output: the rows past N keep the first phase's values)", file=sys.stderr)
        return 2
    import cupy as cp
    import numpy as np

    from llmrs.backends.cuda.kernels import launch_ex

    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    chain, pers = mod.get_function("chain_mv"), mod.get_function("persistent_mv")
    flags_fns = {k: mod.get_function(f"chain_{k}_mv") for k in ("flag", "flag2", "flag3")}
    by_name = {k: mod.get_function(k) for k in ("chain4_mv", "chain_empty", "chain4_empty")}
    N, K, L = a.n, a.k, a.layers
    K8 = K // 8
    rng = np.random.default_rng(0)
    w32 = (rng.standard_normal((L, N, K), dtype=np.float32) * (1.0 / np.sqrt(K))).astype(np.float32)
    wbits = (w32.view(np.uint32) >> 16).astype(np.uint16)
    W = cp.asarray(wbits)
    del w32, wbits
    x_init = cp.asarray(rng.standard_normal(K, dtype=np.float32) * 0.1)
    xs = [cp.empty(K, dtype=cp.float32) for _ in range(2)]
    ctr = cp.zeros(1, dtype=cp.uint32)
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    nblk = -(-N // 16)
    if N > 16 * sms:
        print(f"grid_barrier_bench: --n {N} > {16 * sms} (a warp a row in the persistent form, 16 warps an SM)",
              file=sys.stderr)
        return 2
    stream = cp.cuda.Stream(non_blocking=True)

    def run_chain(pdl: bool) -> None:
        xs[0][...] = x_init
        xs[1][...] = x_init
        for l in range(L):
            launch_ex(chain, (nblk,), (512,), (W[l], xs[l % 2], xs[(l + 1) % 2], np.int32(N), np.int32(K8)),
                      pdl=pdl, stream=stream.ptr)

    flags = cp.zeros(L + 1, dtype=cp.uint32)

    def run_flag(kind: str) -> None:
        xs[0][...] = x_init
        xs[1][...] = x_init
        flags.fill(0)
        for l in range(L):
            cin = flags[l] if l else np.uint64(0)
            launch_ex(flags_fns[kind], (nblk,), (512,),
                      (W[l], xs[l % 2], xs[(l + 1) % 2], np.int32(N), np.int32(K8), cin, flags[l + 1],
                       np.uint32(nblk)), pdl=True, stream=stream.ptr)

    def run_named(name: str, wpb: int) -> None:
        xs[0][...] = x_init
        xs[1][...] = x_init
        for l in range(L):
            launch_ex(by_name[name], (-(-N // wpb),), (32 * wpb,),
                      (W[l], xs[l % 2], xs[(l + 1) % 2], np.int32(N), np.int32(K8)), pdl=True, stream=stream.ptr)

    def run_pers() -> None:
        xs[0][...] = x_init
        xs[1][...] = x_init
        ctr.fill(0)
        pers((sms,), (512,), (W, xs[0], xs[1], np.int32(N), np.int32(K8), np.int32(L), ctr))

    results = {}
    outs = {}
    for name, fn in (("chain", lambda: run_chain(True)), ("chain-nopdl", lambda: run_chain(False)),
                     ("chain-flag", lambda: run_flag("flag")), ("chain-flag2", lambda: run_flag("flag2")),
                     ("chain-flag3", lambda: run_flag("flag3")), ("persistent", run_pers),
                     ("chain4", lambda: run_named("chain4_mv", 4)),
                     ("chain-empty", lambda: run_named("chain_empty", 16)),
                     ("chain4-empty", lambda: run_named("chain4_empty", 4))):
        with stream:
            fn()
            stream.synchronize()
            stream.begin_capture()
            fn()
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            outs[name] = cp.asnumpy(xs[L % 2])
            times = []
            for _ in range(3):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(stream)
                for _ in range(a.replays):
                    graph.launch(stream)
                e1.record(stream)
                e1.synchronize()
                times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / a.replays)  # us a graph
        us = min(times) / L
        gbs = N * K * 2 / (us * 1e-6) / 1e9
        results[name] = {"us_per_phase": round(us, 3), "gbs": round(gbs, 1),
                         "fraction_of_ceiling": round(gbs / a.bandwidth_gbs, 4),
                         "graph_us": [round(t, 1) for t in times]}
    outs.pop("chain-empty"), outs.pop("chain4-empty")  # (their own sums)
    same = all(np.array_equal(outs["chain-nopdl"], o) for o in outs.values())
    if not same:
        print("differs from chain-nopdl:", [k for k, o in outs.items() if not np.array_equal(outs["chain-nopdl"], o)])
    floor_us = N * K * 2 / (a.bandwidth_gbs * 1e3)
    print(f"{N} x {K} bf16 one-token matvec, {L} dependent phases, floor {floor_us:.2f} us a phase "
          f"({a.bandwidth_gbs:.0f} GB/s), {sms} SMs; outputs identical across forms: {same}")
    for name, r in results.items():
        print(f"  {name:12s} {r['us_per_phase']:7.3f} us a phase  {r['gbs']:7.1f} GB/s  "
              f"{100 * r['fraction_of_ceiling']:5.1f}% of ceiling")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"n": N, "k": K, "layers": L, "sms": sms, "floor_us": floor_us, "identical": same,
                       "results": results, "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}, f,
                      indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
