"""What a backend is to the rest of llmrs: the operations `Model.forward` (model/decoder.py) calls, and the handle a
launched step returns.

Two backends satisfy `Backend`: the numpy reference (cpu.py) and CuPy on a GPU (cuda/). The CUDA backend also runs
the whole step fused (`CUDABackend.forward`) and samples on the device (`sample_launch`, returning a `StepHandle`);
the runner (engine/runner.py) calls those through `CUDAModel`. A runner's `launch(batch, states)` always returns a
`StepHandle`: on the CPU an already-done `Launched`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from llmrs.engine.batch import StepBatch


class Backend(Protocol):
    """The operations the model needs. Tensors are backend-native (numpy arrays, CuPy arrays, ...)."""

    name: str
    # the backend's CUDA graph sets (decode steps, lone prefills), None where it has none (the CPU; graphs off)
    graphs: Any
    prefill_graphs: Any

    def upload(self, w: np.ndarray) -> Any: ...
    def upload_quantized(self, w: Any) -> Any: ...
    def embedding(self, table: Any, token_ids: Any) -> Any: ...
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any: ...
    def linear(self, x: Any, w: Any, bias: Any | None = None) -> Any: ...
    def rope(self, q: Any, k: Any, positions: Any) -> tuple[Any, Any]: ...
    def write_kv(self, layer: int, k: Any, v: Any, slot_mapping: Any) -> None: ...
    def attention(self, layer: int, q: Any, batch: StepBatch) -> Any: ...
    def silu_mul(self, gate_up: Any) -> Any: ...
    def add(self, x: Any, y: Any) -> Any: ...
    def gather_rows(self, x: Any, rows: Any) -> Any: ...
    def to_host(self, x: Any) -> np.ndarray: ...


class StepHandle(Protocol):
    """A launched step's sampling: `wait()` blocks until its SampleResults are on the host and returns them."""

    def wait(self) -> list: ...


class Launched:
    """A step whose sampled tokens are already on the host (the CPU runner; the GPU's host-sampler path)."""

    __slots__ = ("results",)

    def __init__(self, results: list) -> None:
        self.results = results

    def wait(self) -> list:
        return self.results
