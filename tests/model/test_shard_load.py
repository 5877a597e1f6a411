"""Loading a tensor-parallel rank's shard straight from a safetensors checkpoint (llmrs/model/shard_load.py):
exactly `shard_tensors` of the whole checkpoint, bit for bit, while copying out of the file mapping only the
rank's own bytes. Checkpoints are real files: transformers' own f32 save, re-saved as bf16 and as two files with
an index (safetensors.torch: numpy has no bfloat16)."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import write_tiny_model
from llmrs.model import shard_load
from llmrs.model.loader import load
from llmrs.model.shard_load import SafetensorsCheckpoint, load_rank_tensors
from llmrs.engine.tp import ShardPlan, shard_tensors
from llmrs.errors import UserError

TINY = dict(num_attention_heads=8, num_key_value_heads=4, intermediate_size=168)
# vocabularies N = 4 does not divide (and 401: nor N = 2), so the last rank holds zero padding rows
ARCHS = {"llama": dict(TINY, vocab_size=401),  # tied embeddings: no lm_head in the file
         "qwen2": dict(TINY, vocab_size=402, intermediate_size=170)}  # attention biases; 170 = 4 * 42 + 2
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def resave(src: Path, dst: Path, dtype: torch.dtype, files: int) -> Path:
    """`src`'s checkpoint in `dst`: its tensors cast to `dtype`, in one file or split over `files` files with a
    model.safetensors.index.json (names dealt round-robin, so one layer's tensors span files)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    tensors = {k: v.to(dtype).contiguous() for k, v in load_file(src / "model.safetensors").items()}
    if files == 1:
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
        return dst
    weight_map = {}
    for i in range(files):
        fname = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        part = {k: v for j, (k, v) in enumerate(sorted(tensors.items())) if j % files == i}
        save_file(part, dst / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    return dst


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[tuple[str, str, str], Path]:
    root = tmp_path_factory.mktemp("shard_load")
    out = {}
    for i, (arch, kw) in enumerate(ARCHS.items()):
        base = write_tiny_model(root / arch, arch, seed=i, **kw)
        out[arch, "f32", "single"] = base  # as transformers saved it
        out[arch, "f32", "sharded"] = resave(base, root / f"{arch}-f32-2", torch.float32, 2)
        out[arch, "bf16", "single"] = resave(base, root / f"{arch}-bf16", torch.bfloat16, 1)
        out[arch, "bf16", "sharded"] = resave(base, root / f"{arch}-bf16-2", torch.bfloat16, 2)
    return out


def assert_same_bits(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name]
        assert g.dtype == np.float32 and w.dtype == np.float32, name
        assert g.shape == w.shape, name
        assert np.array_equal(g.view(np.uint32), np.ascontiguousarray(w).view(np.uint32)), name


@pytest.mark.parametrize("layout", ["single", "sharded"])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("n", [2, 4])
def test_rank_tensors_read_from_disk_equal_shard_tensors_of_the_whole_checkpoint(ckpts, arch, dtype, layout, n):
    path = ckpts[arch, dtype, layout]
    loaded = load(str(path))
    assert set(loaded.source.bytes_by_dtype) == {dtype.upper()}
    plan = ShardPlan(loaded.config, n)
    for rank in range(n):
        got = load_rank_tensors(path, plan, rank)
        assert_same_bits(got, shard_tensors(plan, loaded.tensors, rank))
        assert ("lm_head.weight" in got) == (arch == "qwen2")
        assert ("model.layers.0.self_attn.q_proj.bias" in got) == (arch == "qwen2")
        s, e = plan.vocab_range(rank)
        assert got["model.embed_tokens.weight"].shape[0] == plan.vocab_shard
        assert not got["model.embed_tokens.weight"][e - s:].any()  # the padding rows (none on most ranks)
    padded = plan.vocab_shard * n > loaded.config.vocab_size
    assert padded == (n == 4 or arch == "llama")  # 401 pads at N = 2 and 4, 402 at N = 4 only


def test_reader_copies_out_only_the_rows_or_columns_asked_for(ckpts, monkeypatch):
    widened = []
    real_widen = shard_load._widen
    monkeypatch.setattr(shard_load, "_widen", lambda raw, dt: (widened.append(raw.nbytes), real_widen(raw, dt))[1])
    ck = SafetensorsCheckpoint(ckpts["qwen2", "bf16", "sharded"])
    name = "model.layers.1.mlp.down_proj.weight"  # [64, 170] bf16
    full = load(str(ckpts["qwen2", "bf16", "sharded"])).tensors[name]
    assert ck.shape(name) == (64, 170)
    assert np.array_equal(ck.rows(name, 10, 13), full[10:13]) and widened == [3 * 170 * 2]
    assert np.array_equal(ck.cols(name, 42, 85), full[:, 42:85]) and widened[1:] == [64 * 43 * 2]
    assert np.array_equal(ck.take_rows(name, [5, 1, 60]), full[[5, 1, 60]]) and widened[2:] == [3 * 170 * 2]
    # what it copies from is a view of the mapping, not a read of the tensor
    raw = ck.raw(name)
    assert not raw.flags.owndata and not raw.flags.writeable and raw.dtype == np.uint16


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ranks_together_copy_out_each_stored_byte_once_and_only_norms_on_every_rank(ckpts, arch, monkeypatch):
    """Summed over the ranks, the bytes leaving the mapping are the checkpoint's bytes (each slice read by one
    rank) plus the norm vectors every rank keeps: no rank reads another's slice or a whole matrix."""
    path = ckpts[arch, "bf16", "sharded"]
    widened = []
    real_widen = shard_load._widen
    monkeypatch.setattr(shard_load, "_widen", lambda raw, dt: (widened.append(raw.nbytes), real_widen(raw, dt))[1])
    ck = SafetensorsCheckpoint(path)
    plan = ShardPlan(load(str(path), read_tensors=False).config, 4)
    norm_bytes = sum(2 * int(np.prod(e.shape)) for k, e in ck.entries.items() if "norm" in k)
    per_rank = []
    for rank in range(4):
        widened.clear()
        load_rank_tensors(path, plan, rank)
        per_rank.append(sum(widened))
    assert sum(per_rank) == sum(ck.bytes_by_dtype.values()) + 3 * norm_bytes
    assert max(per_rank) < 0.3 * sum(ck.bytes_by_dtype.values())


def test_peak_host_memory_of_a_rank_is_its_shard_not_the_model(ckpts):
    path = ckpts["qwen2", "bf16", "single"]
    plan = ShardPlan(load(str(path), read_tensors=False).config, 4)

    def peak(fn):
        tracemalloc.start()  # numpy reports its array allocations to tracemalloc; a file mapping is not one
        try:
            result = fn()
            return result, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    shard, shard_peak = peak(lambda: load_rank_tensors(path, plan, 0))
    loaded, whole_peak = peak(lambda: load(str(path)))
    model_f32 = sum(t.nbytes for t in loaded.tensors.values())
    shard_f32 = sum(t.nbytes for t in shard.values())
    assert shard_f32 < 0.3 * model_f32
    assert whole_peak >= model_f32
    assert shard_peak < shard_f32 + 0.1 * model_f32, (shard_peak, shard_f32, model_f32)


def test_load_without_tensors_gives_the_engine_config_tokenizer_and_stop_ids(ckpts):
    path = str(ckpts["qwen2", "bf16", "sharded"])
    full, light = load(path), load(path, read_tensors=False)
    assert light.tensors is None and light.source.kind == "hf"
    assert light.config == full.config and light.stop_token_ids == full.stop_token_ids
    assert light.source.bytes_by_dtype == full.source.bytes_by_dtype
    assert light.tokenizer.encode("Hello world") == full.tokenizer.encode("Hello world")


@pytest.mark.parametrize("handed", ["nothing", "no tensors", "every tensor"])
def test_nccl_rank_load_reads_its_slices_or_slices_what_it_was_handed(ckpts, handed):
    """`_Rank.load` without a GPU (its CUDA parts stay unused with num_blocks given): a worker (handed nothing) and
    rank 0 handed `load(spec, read_tensors=False)` read their slices from disk; rank 0 handed every tensor (llmrs
    profile, the GPU tests) slices those at build, as before."""
    from llmrs.engine.tp_nccl import _Rank

    path = ckpts["llama", "bf16", "sharded"]
    full = load(str(path))
    plan = ShardPlan(full.config, 2)
    for rank in range(2):
        r = _Rank.__new__(_Rank)  # no CuPy device: __init__ is the GPU part
        r.rank, r.world_size = rank, 2
        given = {"nothing": None, "no tensors": load(str(path), read_tensors=False), "every tensor": load(str(path))}
        assert r.load(str(path), given[handed], 16, 0.9, num_blocks=7, max_blocks=100) == 7
        assert r.rank_config == plan.rank_config(rank)
        if handed == "every tensor":
            assert r.shard is None and r.loaded is given[handed]
        else:
            assert_same_bits(r.shard, shard_tensors(plan, full.tensors, rank))


def test_integer_tensors_without_an_awq_config_are_a_user_error(tmp_path, ckpts):
    path = resave(ckpts["llama", "f32", "single"], tmp_path / "ck", torch.float32, 1)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.mlp.down_proj.qweight"] = torch.zeros((8, 8), dtype=torch.int32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    plan = ShardPlan(load(str(path), read_tensors=False).config, 2)
    with pytest.raises(UserError, match="no AWQ quantization_config"):
        load_rank_tensors(path, plan, 0)


def test_a_missing_tensor_is_a_user_error_naming_it(tmp_path, ckpts):
    path = resave(ckpts["qwen2", "f32", "single"], tmp_path / "ck", torch.float32, 1)
    tensors = load_file(path / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    plan = ShardPlan(load(str(path), read_tensors=False).config, 2)
    with pytest.raises(UserError, match="tensor lm_head.weight is missing"):
        load_rank_tensors(path, plan, 1)


def test_nccl_rank_zero_handed_a_gguf_model_without_tensors_loads_it_whole():
    """GGUF (and AWQ) checkpoints keep today's path: every tensor on the host, sliced at build."""
    from llmrs.engine.tp_nccl import _Rank

    light = load("smollm2-135m", read_tensors=False)
    assert light.tensors is None and light.source.kind == "gguf" and light.tokenizer.encode("hi")
    r = _Rank.__new__(_Rank)
    r.rank, r.world_size = 0, 3  # SmolLM2 has 3 KV heads
    assert r.load("smollm2-135m", light, 16, 0.9, num_blocks=5, max_blocks=100) == 5
    assert r.shard is None and r.loaded.tensors is not None and "model.norm.weight" in r.loaded.tensors
