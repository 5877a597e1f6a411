"""Loading one tensor-parallel rank's shard of a safetensors checkpoint, reading only that rank's slices.

`load(spec)` reads every tensor of a checkpoint into host memory as float32 before `shard_tensors` slices it: a
70B bf16 checkpoint costs ~280 GB of host memory in each rank's process. Here each rank maps the checkpoint's
files (mmap, read-only) and copies out only its own slices, widened to float32, so its peak host memory is its
shard (plus one tensor's widening temporary), not the model:

    row slices (q/k/v, gate/up, embedding / lm_head vocabulary rows, biases): one contiguous byte range each;
    column slices (o_proj, down_proj): one strided range per row of the matrix, read through the mapping.

`load_rank_tensors(dir, plan, rank)` gives exactly what `shard_tensors(plan, load(dir).tensors, rank)` gives
(same names, shapes, float32 values bit for bit, vocabulary padding rows of zeros, no lm_head when tied), for
plain checkpoints: BF16 / F16 / F32 (F64) tensors. AWQ checkpoints (packed int32 qweight) and GGUF files go
through `load` as before.

NOTE: the page cache still holds the file pages a rank touched (the kernel reads whole pages, with read-ahead);
those are clean, shared between processes and reclaimable, unlike the float32 copies `load` makes.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmrs.model.weights import _read_safetensors_header, bf16_to_f32, safetensors_files
from llmrs.errors import UserError

# safetensors dtype -> the numpy dtype its bytes are viewed as (BF16: raw uint16, widened by bf16_to_f32)
_VIEW = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}


def reads_shards(source: Any) -> bool:
    """Whether each rank reads its own slices of this ModelSource: plain (not AWQ) Hugging Face checkpoints."""
    return source.kind == "hf" and not source.quantization


@dataclass(frozen=True, slots=True)
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # of the tensor's first byte in its file


def _widen(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A new float32 array from a view of stored values (the only place bytes leave the mapping): as `load`
    widens them, so the values are bit-identical."""
    if dtype == "BF16":
        return bf16_to_f32(raw)
    return raw.astype(np.float32)  # astype copies: never a view into the mapping


class SafetensorsCheckpoint:
    """Every tensor of a checkpoint directory's safetensors files (one file, or several with an index), mapped
    read-only. `rows`, `cols`, `take_rows` and `full` copy out only the bytes they return, as float32."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        self.entries: dict[str, _Entry] = {}
        self.bytes_by_dtype: dict[str, int] = {}
        self._maps: dict[Path, mmap.mmap] = {}
        for f in safetensors_files(self.model_dir):
            header = _read_safetensors_header(f)
            base = 8 + header["__header_len__"]
            for name, meta in header.items():
                if name.startswith("__"):
                    continue
                start, end = meta["data_offsets"]
                dt = meta["dtype"]
                self.bytes_by_dtype[dt] = self.bytes_by_dtype.get(dt, 0) + end - start
                self.entries[name] = _Entry(f, dt, tuple(int(x) for x in meta["shape"]), base + start)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name).shape

    def _entry(self, name: str) -> _Entry:
        try:
            return self.entries[name]
        except KeyError:
            raise UserError(f"{self.model_dir}: tensor {name} is missing from the checkpoint") from None

    def raw(self, name: str) -> np.ndarray:
        """The stored values as a read-only numpy view into the mapping (BF16 as uint16): reads nothing yet."""
        e = self._entry(name)
        if e.dtype not in _VIEW:
            raise UserError(f"{e.file}: tensor {name} is {e.dtype}; a rank reads only BF16 / F16 / F32 / F64 "
                            f"tensors (quantized checkpoints load whole)")
        mm = self._maps.get(e.file)
        if mm is None:
            with open(e.file, "rb") as fh:
                mm = self._maps[e.file] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        count = int(np.prod(e.shape, dtype=np.int64))
        return np.frombuffer(mm, dtype=_VIEW[e.dtype], count=count, offset=e.offset).reshape(e.shape)

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor (elements of a vector): one contiguous byte range."""
        return _widen(self.raw(name)[start:stop], self._entry(name).dtype)

    def cols(self, name: str, start: int, stop: int) -> np.ndarray:
        """Columns [start, stop) of a matrix, C-contiguous: `stop - start` values from each row."""
        return _widen(self.raw(name)[:, start:stop], self._entry(name).dtype)

    def take_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """The listed rows, in that order."""
        return _widen(self.raw(name)[np.asarray(rows, dtype=np.int64)], self._entry(name).dtype)

    def full(self, name: str) -> np.ndarray:
        return _widen(self.raw(name), self._entry(name).dtype)

    def close(self) -> None:
        """Drop the mappings (a view still held keeps its mapping alive until it goes)."""
        self._maps.clear()


def load_rank_tensors(model_dir: Path, plan: Any, rank: int) -> dict[str, np.ndarray]:
    """`shard_tensors(plan, load(model_dir).tensors, rank)`, reading only the rank's slices from disk."""
    ck = SafetensorsCheckpoint(Path(model_dir))
    if any(n.endswith(".qweight") for n in ck.entries):
        raise UserError(f"{model_dir}: packed .qweight tensors but no AWQ quantization_config in config.json")
    c = plan.config
    q0, q1 = rank * plan.q_heads * c.head_dim, (rank + 1) * plan.q_heads * c.head_dim  # plan.q_rows(rank)
    k0, k1 = rank * plan.kv_heads * c.head_dim, (rank + 1) * plan.kv_heads * c.head_dim  # plan.kv_rows(rank)
    s, e = plan.inter_range(rank)

    def vocab(name: str) -> np.ndarray:  # as tp._vocab_rows: the rank's rows, zero rows padding to vocab_shard
        vs, ve = plan.vocab_range(rank)
        part = ck.rows(name, vs, ve)
        pad = plan.vocab_shard - (ve - vs)
        return part if pad == 0 else np.concatenate([part, np.zeros((pad, part.shape[1]), dtype=np.float32)])

    out: dict[str, np.ndarray] = {"model.norm.weight": ck.full("model.norm.weight"),
                                  "model.embed_tokens.weight": vocab("model.embed_tokens.weight")}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = vocab("lm_head.weight")
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        out.update({
            p + "input_layernorm.weight": ck.full(p + "input_layernorm.weight"),
            p + "post_attention_layernorm.weight": ck.full(p + "post_attention_layernorm.weight"),
            p + "self_attn.q_proj.weight": ck.rows(p + "self_attn.q_proj.weight", q0, q1),
            p + "self_attn.k_proj.weight": ck.rows(p + "self_attn.k_proj.weight", k0, k1),
            p + "self_attn.v_proj.weight": ck.rows(p + "self_attn.v_proj.weight", k0, k1),
            p + "self_attn.o_proj.weight": ck.cols(p + "self_attn.o_proj.weight", q0, q1),
            p + "mlp.gate_proj.weight": ck.rows(p + "mlp.gate_proj.weight", s, e),
            p + "mlp.up_proj.weight": ck.rows(p + "mlp.up_proj.weight", s, e),
            p + "mlp.down_proj.weight": ck.cols(p + "mlp.down_proj.weight", s, e),
        })
        if c.attention_bias:
            out.update({p + "self_attn.q_proj.bias": ck.rows(p + "self_attn.q_proj.bias", q0, q1),
                        p + "self_attn.k_proj.bias": ck.rows(p + "self_attn.k_proj.bias", k0, k1),
                        p + "self_attn.v_proj.bias": ck.rows(p + "self_attn.v_proj.bias", k0, k1)})
    ck.close()
    return out
