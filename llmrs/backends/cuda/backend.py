"""CuPy CUDA backend: bf16 weights and a bf16 paged KV cache resident on the GPU, the forward pass in our
kernels (llmrs/kernels_cu/) and cuBLAS.

Numbers: matrices are stored bf16 (raw uint16 words: numpy and CuPy have no bfloat16); norms and biases as
f32 holding bf16-rounded values; the KV cache is bf16 in the contract layout
`[num_blocks, num_kv_heads, block_size, head_dim]` per layer. Activations and the residual stream stay f32,
so the CPU reference fed the same bf16-rounded weights differs only by bf16 K/V and, in GEMMs, bf16
activations (and gate/up).

The package, by concern:
- backend.py (here): `CUDABackend`: device buffers and workspace, weight upload, the step batch's copy to the
  GPU, the op-by-op Backend methods (`Model.forward`, kernel tests); `CUDAModel` runs the fused step instead;
- forward.py: the fused step (`forward`); dispatch.py: every shape rule that picks a kernel form, and
  `CudaOptions`; linear.py: matvec / cuBLAS / quantized linears and the norms feeding them; quant_linear.py: the
  4-bit GEMV / GEMM (Marlin layout); attention.py and prefill.py: decode and prefill attention; sampler.py: GPU
  sampling; graphs.py: CUDA graphs for decode steps and lone prefills; kernels.py: compiling and launching
  llmrs/kernels_cu/.

CUDA graphs: a pure decode step replays a graph captured per (batch bucket, context cap) over static buffers;
`LLMRS_CUDA_GRAPHS=0` turns them off. The KV cache holds one extra block (`pad_block`, never handed out by the block
pool) where the padding rows of a bucket write their K/V.

Profiling (`llmrs profile`): set `backend.profiler` to a `llmrs.profiling.profile.KernelTimer` and every launch of the
eager step is bracketed by CUDA events (`_span`); graphs are bypassed while it is set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import numpy as np

from llmrs import envs
from llmrs.backends.cuda.attention import AttentionOps
from llmrs.backends.cuda.batch import DeviceBatch, pack_batch, unpack_batch
from llmrs.backends.cuda.dispatch import MATVEC_MAX_TOKENS, CudaOptions, DispatchRules, gemm_rows, rope_threads
from llmrs.backends.cuda.forward import FusedStep
from llmrs.backends.cuda.kernels import NULL, get_kernels
from llmrs.backends.cuda.linear import LinearOps
from llmrs.backends.cuda.quant_linear import QuantLinearOps, row_form_needed
from llmrs.backends.cuda.sampler import Sampler
from llmrs.engine.batch import StepBatch
from llmrs.engine.config import ModelConfig
from llmrs.errors import UserError
from llmrs.model.decoder import Model, rope_inv_freq
from llmrs.model.quant import DeviceQuantWeight
from llmrs.model.weights import round_bf16

VIEW_CACHE_MAX = 4096  # workspace views `_buf` keeps (cleared when full)
CUBLAS_WORKSPACE_BYTES = 32 << 20
_NO_SPAN = contextlib.nullcontext()
_cublas_workspaces: dict[int, Any] = {}  # device id -> buffer: kept alive as long as the process (handles are shared)


def cuda_available() -> tuple[bool, str]:
    """(True, device name) when CuPy imports and sees a GPU; else (False, why). Never raises."""
    try:
        import cupy as cp
    except Exception as e:  # ImportError, or a CuPy built for another CUDA
        return False, f"CuPy is not installed ({type(e).__name__}); in the llmrs checkout, pip install -e '.[cuda13]' (or cuda12)"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"no usable CUDA driver/GPU ({e})"
    if n < 1:
        return False, "no CUDA GPU found"
    return True, gpu_name_memory(cp)[0]


def gpu_name_memory(cp: Any, device: int = 0) -> tuple[str, int]:
    """(name, total memory in bytes) of CUDA device `device`, through CuPy `cp`."""
    props = cp.cuda.runtime.getDeviceProperties(device)
    name = props["name"]
    return (name.decode() if isinstance(name, bytes) else str(name)), int(props["totalGlobalMem"])


def _import_cupy() -> Any:
    ok, why = cuda_available()
    if not ok:
        raise UserError(f"the CUDA backend needs CuPy and a GPU: {why}")
    import cupy as cp

    return cp


class CUDABackend(DispatchRules, LinearOps, QuantLinearOps, AttentionOps, FusedStep, Sampler):
    """The CUDA backend (module docstring). Every `CudaOptions` field is an attribute of the same name (the class's
    default, the constructor's `options` on an instance): the rules in dispatch.py read them there."""

    name = "cuda"

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 matvec_max_tokens: int = MATVEC_MAX_TOKENS, cuda_graphs: bool | None = None, tp: Any = None,
                 options: CudaOptions | None = None):
        cp = _import_cupy()
        from cupy_backends.cuda.libs import cublas

        if options is not None:  # else the class attributes: CudaOptions's defaults (or what a test set on the class)
            for f in dataclasses.fields(options):
                setattr(self, f.name, getattr(options, f.name))
        c = config
        D = c.head_dim
        if D <= 32:
            self.dpl = 1
        elif D in (64, 128, 256):
            self.dpl = D // 32
        else:
            raise UserError(f"the CUDA backend supports head_dim <= 32, 64, 128 or 256, not {D}")
        if D % 2:
            raise UserError(f"head_dim {D} is odd; rotary embedding needs pairs")
        self.cp, self.cublas = cp, cublas
        self.config = c
        self.tp = tp  # a TPRank (llmrs.engine.tp_nccl) on a tensor-parallel rank: `config` is then its shard's
        self.block_size = block_size
        self.num_blocks = num_blocks
        # bf16 weights: the matvec up to this many tokens, cuBLAS above; quantized weights: their decode kernels up
        # to quant_matvec_max_tokens (the GEMV's 8)
        self.matvec_max_tokens = matvec_max_tokens
        self.quant_matvec_max_tokens = 8
        self.attn_splits: int | None = None  # None: chosen per step; tests force values
        self.k = get_kernels()  # compiles every kernel now (warm-up), not on the first request
        if self.prefill_min_tokens is None or not self.prefill_supported() or self.prefill_min_tokens < 1:
            self.prefill_min_tokens = None
        self.pad_block = num_blocks  # one extra block: padding rows of a graph bucket write here, nothing reads it
        shape = (num_blocks + 1, c.num_key_value_heads, block_size, D)
        # NOTE: each layer's cache is a view of its first num_blocks blocks (the contract shape); the kernels
        # address the pad block past its end through the same base pointer
        self.k_cache = [cp.zeros(shape, dtype=cp.uint16)[:num_blocks] for _ in range(c.num_hidden_layers)]
        self.v_cache = [cp.zeros(shape, dtype=cp.uint16)[:num_blocks] for _ in range(c.num_hidden_layers)]
        self.inv_freq = cp.asarray(rope_inv_freq(c))
        self.scale = np.float32(1.0 / math.sqrt(D))
        self.num_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self._one, self._zero = np.array(1.0, dtype=np.float32), np.array(0.0, dtype=np.float32)
        self._one_ptr, self._zero_ptr = self._one.ctypes.data, self._zero.ctypes.data  # (cuBLAS alpha / beta)
        self._handle = cp.cuda.device.get_cublas_handle()
        self._set_cublas_workspace()
        self._ws: dict[str, Any] = {}  # device buffers only (the graphs swap in their own and check every pointer)
        self._cluster_counts: dict[str, int] = {}  # kernel -> clusters at once (`_max_clusters`)
        self._views: dict[tuple, tuple[Any, Any]] = {}  # (name, shape, dtype) -> (buffer, view of it): `_buf`
        self._pin: dict[str, np.ndarray] = {}
        self._staged: dict[str, tuple[int, list[Any]]] = {}  # name -> (last half used, its copies' events)
        # the sampler's output, kept until the next step's feed_tokens has read it (grown preserving its contents)
        self._samples = cp.zeros(256, dtype=cp.int32)
        self._launches = 0  # sample_launch calls: which half of the token read-back buffer a step uses
        self.profiler: Any = None  # a llmrs.profiling.profile.KernelTimer while `llmrs profile` measures
        self._raw_gemm: Any = None  # set by DecodeGraphs while capturing: CuPy's gemmEx refuses stream capture
        if cuda_graphs is None:
            cuda_graphs = envs.LLMRS_CUDA_GRAPHS
        self.graphs: Any = None
        if cuda_graphs:
            from llmrs.backends.cuda.graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self)
        # a lone prompt's prefill from graphs (on with the decode graphs; LLMRS_PREFILL_GRAPHS=0 turns it off)
        self.prefill_graphs: Any = None
        if cuda_graphs and envs.LLMRS_PREFILL_GRAPHS:
            from llmrs.backends.cuda.graphs import PrefillGraphs

            self.prefill_graphs = PrefillGraphs(self)

    def _set_cublas_workspace(self) -> None:
        """A fixed cuBLAS workspace, so that cuBLAS allocates nothing inside a graph capture."""
        dev = self.cp.cuda.Device().id
        ws = _cublas_workspaces.get(dev)
        if ws is None:
            ws = _cublas_workspaces[dev] = self.cp.empty(CUBLAS_WORKSPACE_BYTES, dtype=self.cp.uint8)
        try:
            self.cublas.setWorkspace(self._handle, ws.data.ptr, CUBLAS_WORKSPACE_BYTES)
        except AttributeError:  # an old CuPy without cublasSetWorkspace: cuBLAS keeps its own
            pass

    def _span(self, kind: str, name: str, *dims: Any) -> Any:
        """Times the launches inside it when a profiler is set (else a shared no-op context)."""
        p = self.profiler
        return _NO_SPAN if p is None else p.span(kind, name, dims)

    # ------------------------------------------------------------------ memory
    @staticmethod
    def kv_bytes_per_block(config: ModelConfig, block_size: int = 16) -> int:
        return 2 * config.num_hidden_layers * config.num_key_value_heads * block_size * config.head_dim * 2

    @staticmethod
    def device_sms() -> int:
        """The current GPU's streaming multiprocessors (before a backend exists: the KV sizing)."""
        return int(_import_cupy().cuda.Device().attributes["MultiProcessorCount"])

    @staticmethod
    def blocks_that_fit(config: ModelConfig, weight_bytes: int, gpu_memory_utilization: float = 0.9,
                        block_size: int = 16, activation_reserve: int = 1 << 30) -> int:
        """KV blocks that fit in utilization x total GPU memory after the weights and an activation reserve."""
        cp = _import_cupy()
        free, total = cp.cuda.runtime.memGetInfo()
        budget = gpu_memory_utilization * total - weight_bytes - activation_reserve - (total - free)
        return max(0, int(budget // CUDABackend.kv_bytes_per_block(config, block_size)))

    def _buf(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A persistent workspace view of `shape` (grown, never shrunk: no allocation once warm). The view itself is
        kept per (name, shape, dtype) and handed out again while the same buffer backs it: an eager step asks for
        ~10 of them a layer, and making two CuPy views (slice, reshape) each time cost more host time than the
        launch that uses it (a prefill's host time is the GPU's idle time)."""
        cur = self._ws.get(name)
        key = (name, shape, dtype)
        hit = self._views.get(key)
        if hit is not None and hit[0] is cur:  # (the decode graphs swap in their own workspace while capturing)
            return hit[1]
        n = int(np.prod(shape))
        # room for a GEMM's padding rows past a [T, X] view (gemm_rows; only `_linear` reads or writes them)
        room = gemm_rows(shape[0]) * int(np.prod(shape[1:])) if self.gemm_pad_rows and len(shape) == 2 else n
        if cur is None or cur.size < room or cur.dtype != np.dtype(dtype):
            cur = self.cp.empty(max(room, 1), dtype=dtype)
            self._ws[name] = cur
            self._views = {k: v for k, v in self._views.items() if k[0] != name}  # the old buffer's views go too
        if len(self._views) >= VIEW_CACHE_MAX:  # (step shapes vary with the batch: keep the cache bounded)
            self._views.clear()
        view = cur[:n].reshape(shape)
        self._views[key] = (cur, view)
        return view

    def _pinned(self, name: str, n: int, dtype: Any) -> np.ndarray:
        """A persistent page-locked host buffer (copies from it skip the driver's staging; grown, never shrunk)."""
        cur = self._pin.get(name)
        if cur is None or cur.size < n or cur.dtype != np.dtype(dtype):
            size = max(n, 1)
            mem = self.cp.cuda.alloc_pinned_memory(size * np.dtype(dtype).itemsize)
            cur = self._pin[name] = np.frombuffer(mem, dtype=dtype, count=size)
        return cur[:n]

    def _stage(self, name: str, a: np.ndarray) -> Any:
        """`a` in a device workspace buffer, by an async copy from a page-locked buffer. Two such buffers per name
        take turns, each refilled only once its last copy is done, so the host can stage step n+1's data while
        step n's copy may still wait in the stream (async scheduling)."""
        cp = self.cp
        half, events = self._staged.get(name, (1, [None, None]))
        half = 1 - half
        if events[half] is not None:
            events[half].synchronize()
        h = self._pinned(f"{name}.{half}", a.size, a.dtype)
        h[:] = a.reshape(-1)
        stream = cp.cuda.get_current_stream()
        d = self._buf(name, (a.size,), a.dtype)
        d.set(h, stream=stream)
        ev = events[half] or cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        events[half] = ev
        self._staged[name] = (half, events)
        return d

    def feed(self, token_ids: Any, feed: np.ndarray) -> None:
        """Rows of device `token_ids` with feed[t] >= 0 take sample feed[t] of the last sampled step (StepBatch.feed:
        async scheduling planned this step before those samples were on the host)."""
        T = int(feed.shape[0])
        self.k.feed_tokens((-(-T // 256),), (256,), (token_ids, self._stage("feed", feed.astype(np.int32, copy=False)),
                                                     self._samples, np.int32(T)))

    # ------------------------------------------------------------------ weights
    def upload(self, w: np.ndarray) -> Any:
        """Matrices -> bf16 words on the GPU (rounded there); vectors -> f32 holding bf16-rounded values."""
        cp = self.cp
        if w.ndim == 1:
            return cp.asarray(round_bf16(w))
        x = cp.asarray(np.ascontiguousarray(w, dtype=np.float32))
        out = cp.empty(x.shape, dtype=cp.uint16)
        self._cast_bf16(x, out)
        del x
        return out

    def upload_bf16(self, x_f32_device: Any) -> Any:
        """A device f32 matrix -> a new bf16 matrix (synthetic weights are drawn on the GPU)."""
        out = self.cp.empty(x_f32_device.shape, dtype=self.cp.uint16)
        self._cast_bf16(x_f32_device, out)
        return out

    def upload_quantized(self, w: Any) -> DeviceQuantWeight:
        """A llmrs.model.quant.QuantWeight (AWQ, GGUF Q4_0/Q4_1/Q8_0) stays quantized on the GPU, in its row-major
        form (matvec_q4.cu reads it; build_weights calls this for quantized linears)."""
        cp = self.cp
        if w.K % 32 or w.group_size % 32:
            raise UserError(f"quantized weight {w.shape}: K and the group size must be multiples of 32")
        dw = DeviceQuantWeight(w.source, w.N, w.K, w.group_size, cp.asarray(np.ascontiguousarray(w.qweight)),
                               cp.asarray(np.ascontiguousarray(w.scales).view(np.uint16)),
                               None if w.zeros is None else cp.asarray(np.ascontiguousarray(w.zeros).view(np.uint16)))
        return self.add_gemm_layout(dw)

    def add_gemm_layout(self, dw: DeviceQuantWeight) -> DeviceQuantWeight:
        """A 4-bit weight's reordered copy for the GEMV / GEMM (QuantLinearOps.to_marlin); its row form is released
        where no kernel reads it (quant_linear.row_form_needed), else both stay (~2x the 4-bit bytes)."""
        dw.marlin = self.to_marlin(dw)
        if dw.marlin is not None and not row_form_needed(dw.N, dw.K, self.num_sms, self.q4_gemv):
            dw.qweight = dw.scales = dw.zeros = None
        return dw

    # ------------------------------------------------------------------ batch
    def pack_batch(self, batch: StepBatch) -> tuple[np.ndarray, int]:
        """batch.pack_batch with this backend's prefill threshold (the layout the prefill graphs copy too)."""
        return pack_batch(batch, self.prefill_min_tokens)

    unpack_batch = staticmethod(unpack_batch)

    def device_batch(self, batch: StepBatch) -> DeviceBatch:
        packed, n_tiles = self.pack_batch(batch)
        d = self._stage("batch", packed)  # async: the host may run ahead of the GPU (async scheduling)
        db = self.unpack_batch(d, batch, n_tiles)
        if self.profiler is not None:
            db.kv_tokens = int(np.sum(batch.context_lens))
            db.qk_pairs = int(np.sum(batch.positions.astype(np.int64) + 1))
        return db

    def _counters(self, name: str, n: int) -> Any:
        """n int32 counters in the workspace, zeros once: the split hand-offs' (gemv_q4's K slices, the sampler's
        blocks of a row), each launch's last block of a tile or row putting its counter back to 0."""
        c = self._ws.get(name)
        if c is None:
            c = self._ws[name] = self.cp.zeros(n, dtype=self.cp.int32)
        return c

    # ------------------------------------------------------------------ Backend protocol (Model.forward, tests)
    def embedding(self, table: Any, token_ids: Any) -> Any:
        cp = self.cp
        ids = cp.asarray(np.asarray(token_ids, dtype=np.int32)) if isinstance(token_ids, np.ndarray) else token_ids
        T, H = int(ids.shape[0]), table.shape[1]
        out = cp.empty((T, H), dtype=cp.float32)
        self.k.embedding_gather((T,), (256,), (table, ids.astype(cp.int32), out, np.int32(H), np.int32(0),
                                               np.int32(table.shape[0])))
        return out

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        x = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        out = self.cp.empty_like(x)
        self._rms_norm(x, weight, eps, out)
        return out

    def add_rms_norm(self, x: Any, y: Any, weight: Any, eps: float) -> Any:
        """x += y in place (the residual), returns rms_norm(x)."""
        out = self.cp.empty_like(x)
        self._add_rms_norm(x, self.cp.ascontiguousarray(y), weight, eps, out)
        return out

    def linear(self, x: Any, w: Any, bias: Any | None = None) -> Any:
        x = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        out = self.cp.empty((x.shape[0], w.shape[0]), dtype=self.cp.float32)
        self._linear(x, w, bias, out)
        return out

    def rope(self, q: Any, k: Any, positions: Any) -> tuple[Any, Any]:
        cp, c = self.cp, self.config
        T, Hq, Hkv, D = q.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        buf = cp.zeros((T, (Hq + 2 * Hkv) * D), dtype=cp.float32)
        buf[:, : Hq * D] = q.reshape(T, -1)
        buf[:, Hq * D : (Hq + Hkv) * D] = k.reshape(T, -1)
        pos = cp.asarray(np.asarray(positions, dtype=np.int32)) if isinstance(positions, np.ndarray) else positions
        threads = rope_threads(Hq, Hkv, D)
        self.k.rope_write_kv((T,), (threads,), (buf, pos.astype(cp.int32), self.inv_freq, NULL, NULL, NULL,
                                                np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(self.block_size),
                                                NULL))
        return buf[:, : Hq * D].reshape(T, Hq, D), buf[:, Hq * D : (Hq + Hkv) * D].reshape(T, Hkv, D)

    def write_kv(self, layer: int, k: Any, v: Any, slot_mapping: Any) -> None:
        cp, c = self.cp, self.config
        T = k.shape[0]
        slots = cp.asarray(np.asarray(slot_mapping, dtype=np.int32))
        kk = cp.ascontiguousarray(k.reshape(T, -1), dtype=cp.float32)
        vv = cp.ascontiguousarray(v.reshape(T, -1), dtype=cp.float32)
        self.k.write_kv((T,), (min(1024, max(32, -(-c.kv_size // 32) * 32)),),
                        (kk, vv, slots, self.k_cache[layer], self.v_cache[layer], np.int32(c.num_key_value_heads),
                         np.int32(c.head_dim), np.int32(self.block_size)))

    def attention(self, layer: int, q: Any, batch: StepBatch) -> Any:
        cp, c = self.cp, self.config
        T = q.shape[0]
        qq = cp.ascontiguousarray(q.reshape(T, -1), dtype=cp.float32)
        out = cp.empty((T, c.q_size), dtype=cp.float32)
        self._attention(layer, qq, c.q_size, self.device_batch(batch), out)
        return out

    def silu_mul(self, gate_up: Any) -> Any:
        cp = self.cp
        gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
        T, I = gate_up.shape[0], gate_up.shape[1] // 2
        out = cp.empty((T, I), dtype=cp.float32)
        n = T * I
        self.k.silu_mul((max(1, min(65535, -(-n // 256))),), (256,), (gate_up, out, np.int32(T), np.int32(I)))
        return out

    def add(self, x: Any, y: Any) -> Any:
        cp = self.cp
        out = cp.array(x, dtype=cp.float32, copy=True, order="C")
        y = cp.ascontiguousarray(y, dtype=cp.float32)
        n = out.size
        self.k.add_inplace((max(1, min(65535, -(-n // 256))),), (256,), (out, y, np.int64(n)))
        return out

    def gather_rows(self, x: Any, rows: Any) -> Any:
        cp = self.cp
        r = cp.asarray(np.asarray(rows, dtype=np.int64)) if isinstance(rows, np.ndarray) else rows
        return cp.ascontiguousarray(x[r])

    def to_host(self, x: Any) -> np.ndarray:
        return self.cp.asnumpy(x).astype(np.float32, copy=False)

    def synchronize(self) -> None:
        self.cp.cuda.Device().synchronize()

class CUDAModel(Model):
    """The decoder on the CUDA backend: the fused step (`CUDABackend.forward`) instead of op-by-op."""

    backend: CUDABackend

    def forward(self, batch: StepBatch) -> np.ndarray:
        return self.backend.forward(self.w, batch)

    def forward_device(self, batch: StepBatch) -> Any:
        """Logits left on the GPU (feed them to `backend.sample`)."""
        return self.backend.forward(self.w, batch, to_host=False)


for _f in dataclasses.fields(CudaOptions):  # the defaults, for stand-ins made without __init__ (tests, scripts)
    setattr(CUDABackend, _f.name, _f.default)
del _f
