"""CUDA graphs for decode steps: one graph per (batch bucket, context cap), replayed over static buffers.

A decode step launches ~9 kernels per layer; from Python each launch costs several microseconds, so a small
model's step is host-bound. A graph replays the whole step in one launch. What a graph bakes in:
- every kernel's pointers: weights and KV cache (fixed), the step's index arrays (a static device buffer per
  graph, refilled by one host-to-device copy before each replay) and the activation workspace (a workspace
  dict of its own, shared by all graphs; if it ever has to grow, every older graph is dropped and re-captured);
- every launch's shape: T = the bucket (1, 2, 4, 8, 12, 16, 24, ... 512 sequences; the rows past the real
  batch are padding: token 0 at position 0, writing its K/V into the backend's `pad_block`, reading only
  that block), and the attention split count and chunk, chosen for the context cap (the longest key range
  rounded up to a power of two, at least 256): splits past a token's causal limit find no keys and the merge
  skips them (attention.cu), so the same graph serves every context up to its cap.

cuBLAS inside a capture: CuPy's wrappers refuse any cuBLAS call while a stream captures (its setStream
raises NotImplementedError), although cuBLAS itself supports capture given a fixed workspace (set by the
backend) and the handle bound to the capturing stream. So during capture the backend's GEMMs go through
`RawCublas`, ctypes calls into the libcublas CuPy already loaded.

Used for pure decode steps (one token per sequence, every sequence sampled); anything else, or a capture that
fails, runs eagerly. Replay gives the same math as the eager step of the padded shape: tokens equal to
eager's with the same split count (tests/backends/test_cuda_graphs.py).

Programmatic dependent launch: on sm_90+ the capture launches our kernels with the PDL attribute
(kernels.py), so inside a replay each kernel's blocks start (and the matvec's first weight loads go out)
while the previous kernel drains. If such a capture fails, or one replay of it differs from the eager step, the
backend captures without it from then on (and says so on stderr).

Prefill graphs (`PrefillGraphs`; on with the decode graphs, `LLMRS_PREFILL_GRAPHS=0` turns them off): a step that is
one sequence's prefill from position 0 (no cached prefix: the time-to-first-token case) is padded up to a bucket of
PREFILL_BUCKETS tokens and replayed from a graph captured per bucket, so the first token waits neither on the host's
launch speed (an eager 256-token prefill of a 7B enqueues ~230 launches) nor on cuBLAS's first call of each new
token count (~2.6 ms of host time, paid once per bucket at warm-up):
- the padded step (`padded_prefill`): the prompt's L tokens, then token 0 at positions L .. Tb-1; the block-table
  row extended with the backend's pad block, so padding tokens whose positions fall past the sequence's blocks
  write their K/V there (those in its last blocks write slots that the next tokens overwrite before any read);
  the sampled row L - 1. Causal attention keeps the real tokens from seeing the padding keys (they come after
  them), and no padding row's output is read;
- everything the kernels read comes from one static device buffer in `CUDABackend.pack_batch`'s layout, refilled
  by one async copy before each replay; positions and the prefill attention's tiles are the bucket's own (fixed);
- capture as DecodeGraphs does (cuBLAS through RawCublas, programmatic dependent launch kept only if a replay
  equals the eager step), in a workspace of its own.
The padded rows cost GPU work (at most the bucket's slack); a step that is anything else runs eagerly.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmrs.engine.batch import StepBatch, build_step_batch

BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
MIN_LEN_CAP = 256


def bucket_for(n: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest of `buckets` (ascending; the decode batch buckets) holding n; None past the largest."""
    for b in buckets:
        if b >= n:
            return b
    return None


def len_cap_for(max_len: int) -> int:
    """The context cap a graph is captured for: max_len rounded up to a power of two, at least MIN_LEN_CAP."""
    cap = MIN_LEN_CAP
    while cap < max_len:
        cap *= 2
    return cap


def is_pure_decode(batch: Any) -> bool:
    """One new token per sequence and every sequence's logits sampled, in order."""
    B, T = batch.num_seqs, batch.num_tokens
    S = int(batch.sample_rows.shape[0])
    return T == B and S == B and B > 0 and bool(np.array_equal(batch.sample_rows, np.arange(B)))


class RawCublas:
    """cublasSetStream / cublasGemmEx through ctypes, on the libcublas this process has loaded (CuPy's)."""

    _lib: Any = None

    @classmethod
    def lib(cls) -> Any:
        if cls._lib is None:
            path = "libcublas.so"
            try:
                with open("/proc/self/maps") as f:
                    for line in f:
                        p = line.split()[-1] if len(line.split()) >= 6 else ""
                        if os.path.basename(p).startswith("libcublas.so"):
                            path = p
                            break
            except OSError:
                pass
            lib = ctypes.CDLL(path)
            vp, i = ctypes.c_void_p, ctypes.c_int
            lib.cublasSetStream_v2.argtypes = [vp, vp]
            lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
            cls._lib = lib
        return cls._lib

    @classmethod
    def set_stream(cls, handle: int, stream: int) -> None:
        status = cls.lib().cublasSetStream_v2(handle, stream)
        if status:
            raise RuntimeError(f"cublasSetStream failed: status {status}")

    @classmethod
    def gemm_ex(cls, handle: int, *args: Any) -> None:
        status = cls.lib().cublasGemmEx(handle, *args)
        if status:
            raise RuntimeError(f"cublasGemmEx failed: status {status}")


@dataclass(slots=True)
class _Graph:
    graph: Any
    host: np.ndarray  # packed int32 [tokens B | positions B | slots B | token_seq B | rows B | tables B*nb]
    dev: Any  # the same layout on the GPU: what the graph's kernels read
    logits: Any  # [B, vocab] in the graph workspace
    nb: int
    copied: Any = None  # event after the last host-to-device copy: `host` is free to refill once it has passed
    pdl: bool = False  # captured with programmatic dependent launches (kernels.PDL_KERNELS)


class DecodeGraphs:
    """Captures and replays decode-step graphs for one CUDABackend (see the module docstring)."""

    # a programmatic-launch capture whose replay differs from the eager step turns programmatic launch off for every
    # later capture of the backend (PrefillGraphs: for that graph only)
    pdl_failure_is_global = True

    def __init__(self, backend: Any):
        self.b = backend
        self.cp = backend.cp
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.failed: set[tuple[int, int]] = set()
        self.ws: dict[str, Any] = {}
        self.stream = self.cp.cuda.Stream(non_blocking=True)
        self.replays = 0
        self.captures = 0

    def run(self, w: Any, batch: Any) -> Any | None:
        """The step's logits [S, vocab] (device view, overwritten by the next replay) from a graph, or None when
        this step must run eagerly."""
        if not is_pure_decode(batch):
            return None
        n = batch.num_seqs
        B = bucket_for(n)
        max_len = int(batch.positions.max()) + 1
        cap = len_cap_for(max_len)
        if B is None:
            return None
        key = (B, cap)
        g = self.graphs.get(key)
        if g is None:
            if key in self.failed:
                return None
            g = self._capture(w, B, cap)
            if g is None:
                return None
        if g.copied is not None:
            g.copied.synchronize()  # (already passed when the last step's tokens were read back)
        self._fill(g, batch, B)
        stream = self.cp.cuda.get_current_stream()
        g.dev.set(g.host, stream=stream)  # pinned: an async copy
        if batch.feed is not None:  # tokens still on the device (async scheduling)
            self.b.feed(g.dev[:n], batch.feed)
        g.copied = g.copied or self.cp.cuda.Event(disable_timing=True)
        g.copied.record(stream)
        g.graph.launch(stream=self.cp.cuda.get_current_stream())
        self.replays += 1
        return g.logits[:n]

    def precapture(self, w: Any, max_seqs: int, max_cap: int) -> int:
        """Captures the graph of every bucket up to `max_seqs` sequences for every context cap up to `max_cap`
        before serving (`LLMEngine.warmup`), so that the first burst of requests does not stop for captures (a
        256-request burst right after start on the H200, 7B: ~30 graphs captured on the way, TTFT mean 1.0 s).
        Largest first: the workspace grows once, and no capture drops the graphs before it. Returns the number
        captured. Not on tensor-parallel ranks (their captures go together with the step's NCCL calls)."""
        if self.b.tp is not None:
            return 0
        top = bucket_for(max_seqs) or BUCKETS[-1]
        caps = [MIN_LEN_CAP]
        while caps[-1] * 2 <= max_cap:
            caps.append(caps[-1] * 2)
        n = 0
        for cap in reversed(caps):
            for B in reversed([b for b in BUCKETS if b <= top]):
                key = (B, cap)
                if key not in self.graphs and key not in self.failed and self._capture(w, B, cap) is not None:
                    n += 1
        return n

    # ------------------------------------------------------------------ internals
    def _pad_host(self, B: int, nb: int) -> np.ndarray:
        """The packed index arrays of a batch of B padding rows."""
        pad = self.b.pad_block
        h = np.empty(5 * B + B * nb, dtype=np.int32)
        h[:B] = 0  # token ids
        h[B:2 * B] = 0  # positions
        h[2 * B:3 * B] = pad * self.b.block_size  # slots: the pad block
        h[3 * B:4 * B] = np.arange(B)  # token_seq
        h[4 * B:5 * B] = np.arange(B)  # sample rows
        h[5 * B:] = pad  # block tables
        return h

    def _fill(self, g: _Graph, batch: Any, B: int) -> None:
        n, nb, h = batch.num_seqs, g.nb, g.host
        pad = self.b.pad_block
        h[:n] = batch.token_ids
        h[n:B] = 0
        h[B:B + n] = batch.positions
        h[B + n:2 * B] = 0
        h[2 * B:2 * B + n] = batch.slot_mapping
        h[2 * B + n:3 * B] = pad * self.b.block_size
        tables = h[5 * B:].reshape(B, nb)
        bt = batch.block_tables
        w = min(nb, bt.shape[1])
        tables[:n, :w] = bt[:, :w]
        tables[:n, w:] = pad
        tables[n:] = pad
        # NOTE: -1 padding inside a real row is never read (keys past the context), but keep it harmless
        real = tables[:n]
        real[real < 0] = pad

    def _record(self, w: Any, db: Any, pdl: bool) -> tuple[Any, Any]:
        """One capture of the step on self.stream: (logits view, graph). With `pdl` the kernels of
        kernels.PDL_KERNELS are captured with programmatic launch edges."""
        b = self.b
        b._raw_gemm = RawCublas.gemm_ex
        b.k.pdl = pdl
        self.stream.begin_capture()
        try:
            logits = b._forward_device(w, db)
        finally:
            b._raw_gemm = None
            b.k.pdl = False
            graph = self.stream.end_capture()
        return logits, graph

    def _replays_like(self, graph: Any, logits: Any, ref: Any) -> bool:
        """Replays `graph` once (on the padding batch it was captured with) and compares its logits with the
        eager step's `ref`: the guard that keeps a programmatic-launch graph only if it computes the same step
        (the same kernels and shapes: equal up to cuBLAS's choice of algorithm inside a capture)."""
        cp = self.cp
        graph.launch(stream=self.stream)
        self.stream.synchronize()
        scale = float(cp.abs(ref).max()) if ref.size else 0.0
        return bool(cp.allclose(logits, ref, rtol=1e-3, atol=1e-3 * max(scale, 1e-6)))

    def _capture(self, w: Any, B: int, cap: int) -> _Graph | None:
        from llmrs.backends.cuda.batch import DeviceBatch

        cp, b = self.cp, self.b
        nb = -(-cap // b.block_size)
        host = b._pinned(f"graph_{B}_{cap}", 5 * B + B * nb, np.int32)
        host[:] = self._pad_host(B, nb)
        dev = cp.asarray(host)
        o = np.cumsum([0, B, B, B, B, B])
        db = DeviceBatch(T=B, S=B, token_ids=dev[o[0]:o[1]], positions=dev[o[1]:o[2]], slots=dev[o[2]:o[3]],
                         token_seq=dev[o[3]:o[4]], sample_rows=dev[o[4]:o[5]], block_tables=dev[o[5]:],
                         max_blocks=nb, max_len=cap)
        return self._capture_db(w, (B, cap), host, dev, db, nb, f"batch {B}, context {cap}")

    def _capture_db(self, w: Any, key: tuple[int, int], host: np.ndarray, dev: Any, db: Any, nb: int,
                    what: str) -> _Graph | None:
        """Captures the step over `db` (views of `dev`, the device copy of `host`) in this object's workspace,
        keeps it under `key`; None (and `key` marked failed) where the driver refuses it."""
        cp, b = self.cp, self.b
        saved = b._ws
        b._ws = self.ws
        try:
            before = {k: v.data.ptr for k, v in self.ws.items()}
            cp.cuda.Device().synchronize()
            with self.stream:
                # warm-up: sizes the workspace, loads modules, picks cuBLAS algorithms; its logits check the replay
                ref = b._forward_device(w, db).copy()
                self.stream.synchronize()
                if any(self.ws[k].data.ptr != p for k, p in before.items()):
                    self.graphs.clear()  # a buffer moved: older graphs point at freed memory
                RawCublas.set_stream(b._handle, self.stream.ptr)
                # NOTE: not on tensor-parallel ranks: the check replays NCCL calls, which all ranks must do together
                pdl = b.k.pdl_capable and b.tp is None
                try:
                    logits, graph = self._record(w, db, pdl=pdl)
                    if pdl and not self._replays_like(graph, logits, ref):
                        raise RuntimeError("its replay's logits differ from the eager step's")
                except Exception as e:
                    if not pdl:
                        raise
                    if self.pdl_failure_is_global:
                        print(f"llmrs: CUDA graph capture with programmatic dependent launch failed ({e}); "
                              "capturing without it", file=sys.stderr)
                        b.k.pdl_capable = False
                    else:  # (PrefillGraphs: this graph only, the decode graphs keep it)
                        print(f"llmrs: CUDA graph capture with programmatic dependent launch failed for {what} "
                              f"({e}); capturing that graph without it", file=sys.stderr)
                    pdl = False
                    logits, graph = self._record(w, db, pdl=False)
            self.stream.synchronize()
        except Exception as e:  # a capture the driver refuses: this shape runs eagerly from now on
            self.failed.add(key)
            print(f"llmrs: CUDA graph capture failed for {what} ({e}); running eagerly", file=sys.stderr)
            return None
        finally:
            b._ws = saved
            b.cublas.setStream(b._handle, cp.cuda.get_current_stream().ptr)
        g = _Graph(graph=graph, host=host, dev=dev, logits=logits, nb=nb, pdl=pdl)
        self.graphs[key] = g
        self.captures += 1
        return g


# ------------------------------------------------------------------ prefill graphs
PREFILL_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def prefill_bucket(n: int, min_tokens: int) -> int | None:
    """The bucket a lone prefill of n tokens is padded to: None below min_tokens or past the largest."""
    return None if n < min_tokens else bucket_for(n, PREFILL_BUCKETS)


def is_lone_prefill(batch: StepBatch) -> bool:
    """One sequence, every token new from position 0, its last row sampled."""
    T = batch.num_tokens
    return (batch.num_seqs == 1 and T > 1 and int(batch.positions[0]) == 0 and int(batch.context_lens[0]) == T
            and batch.sample_rows.shape[0] == 1 and int(batch.sample_rows[0]) == T - 1)


def padded_prefill(batch: StepBatch, Tb: int, pad_block: int, block_size: int) -> StepBatch:
    """The lone prefill `batch` (L tokens) padded to Tb tokens (module docstring): a block-table row of Tb /
    block_size entries (the sequence's own, -1 and past them the pad block), slots from it, sample row L - 1."""
    L = batch.num_tokens
    assert is_lone_prefill(batch) and L <= Tb and Tb % block_size == 0
    nb = Tb // block_size
    table = np.full(nb, pad_block, dtype=np.int64)
    own = np.asarray(batch.block_tables[0][:nb], dtype=np.int64)
    table[:own.size] = np.where(own < 0, pad_block, own)
    tokens = np.zeros(Tb, dtype=np.int64)
    tokens[:L] = batch.token_ids
    out = build_step_batch([(tokens.tolist(), 0, table.tolist(), True)], block_size)
    out.sample_rows[:] = L - 1
    return out


def capture_blocks(Tb: int, block_size: int, num_blocks: int) -> list[int] | None:
    """Distinct blocks for a Tb-token capture batch (blocks 0 .. Tb / block_size - 1 of the pool), or None where the
    pool has fewer. Only while no sequence holds a block (the engine's precapture, right after its warm-up)."""
    nb = Tb // block_size
    return list(range(nb)) if nb <= num_blocks else None


class PrefillGraphs(DecodeGraphs):
    """Captures and replays lone-prefill graphs for one CUDABackend, one per bucket (module docstring)."""

    # The capture's check (its replay against the eager step) runs on the bucket's own batch. With every token's
    # K/V in the one pad block, tokens 16 positions apart share a slot and write different (rotated) values in an
    # unordered race, so the eager step and the replay could read different keys. So the precapture (an idle engine:
    # no block holds anything) gives the batch distinct blocks (`capture_blocks`), and a failure here costs only that
    # graph its programmatic launch, not every later capture's.
    pdl_failure_is_global = False

    def run(self, w: Any, batch: StepBatch) -> Any | None:  # type: ignore[override]
        """The step's logits [1, vocab] (a device view, overwritten by the next replay) from a graph, or None
        when the step must run eagerly."""
        b = self.b
        if b.tp is not None or b.prefill_min_tokens is None or not is_lone_prefill(batch):
            return None
        Tb = prefill_bucket(batch.num_tokens, b.prefill_min_tokens)
        if Tb is None:
            return None
        key = (Tb, 0)
        g = self.graphs.get(key)
        if g is None:
            if key in self.failed:
                return None
            g = self._capture_prefill(w, Tb)
            if g is None:
                return None
        if g.copied is not None:
            g.copied.synchronize()
        packed, _ = b.pack_batch(padded_prefill(batch, Tb, b.pad_block, b.block_size))
        g.host[:] = packed
        stream = self.cp.cuda.get_current_stream()
        g.dev.set(g.host, stream=stream)
        g.copied = g.copied or self.cp.cuda.Event(disable_timing=True)
        g.copied.record(stream)
        g.graph.launch(stream=stream)
        self.replays += 1
        return g.logits[:1]

    def precapture(self, w: Any, max_tokens: int, max_cap: int = 0,  # type: ignore[override]
                   pool_blocks: bool = False) -> int:
        """Captures every bucket up to `max_tokens` now, largest first (the workspace grows once). pool_blocks: no
        sequence holds a block and the caller forgets the prefix cache after (an idle engine): the capture batches
        then write their K/V into the pool's first blocks, distinct ones (`capture_blocks`). Returns how many."""
        b = self.b
        if b.tp is not None or b.prefill_min_tokens is None:
            return 0
        n = 0
        for Tb in reversed([t for t in PREFILL_BUCKETS if t <= max_tokens]):
            key = (Tb, 0)
            if (key not in self.graphs and key not in self.failed
                    and self._capture_prefill(w, Tb, capture_blocks(Tb, b.block_size, b.num_blocks)
                                              if pool_blocks else None) is not None):
                n += 1
        return n

    def _capture_prefill(self, w: Any, Tb: int, blocks: list[int] | None = None) -> _Graph | None:
        """The bucket's graph, captured on its own padding step: Tb tokens of one sequence over `blocks` (distinct
        blocks nothing holds: the precapture's), or all in the pad block (a capture while serving)."""
        b = self.b
        table = blocks if blocks is not None else [b.pad_block] * (Tb // b.block_size)
        shape = build_step_batch([([0] * Tb, 0, table, True)], b.block_size)
        packed, n_tiles = b.pack_batch(shape)
        host = b._pinned(f"prefill_graph_{Tb}", packed.size, np.int32)
        host[:] = packed
        dev = self.cp.asarray(host)
        return self._capture_db(w, (Tb, 0), host, dev, b.unpack_batch(dev, shape, n_tiles), Tb // b.block_size,
                                f"a {Tb}-token prefill")
