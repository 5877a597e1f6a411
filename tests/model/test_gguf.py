"""GGUF: exact dequantization of every supported tensor type, the llama.cpp q/k permutation undone, and a
GGUF written by the test giving the same logits as transformers on the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from llmrs.engine.batch import build_step_batch
from llmrs.model.loader import load
from llmrs.engine.runner import ModelRunner
from llmrs.model.weights import GGUFFile, unpermute_qk

QTYPES = {
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_0": gguf.GGMLQuantizationType.Q4_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
    "F16": gguf.GGMLQuantizationType.F16,
    "BF16": gguf.GGMLQuantizationType.BF16,
    "F32": gguf.GGMLQuantizationType.F32,
}
# llama.cpp's k-quants and Q5_0 / Q5_1: (block bytes, weights a block, byte offsets of the block's f16 scales)
RAW_QTYPES = {"Q5_0": (22, 32, (0,)), "Q5_1": (24, 32, (0, 2)), "Q2_K": (84, 256, (80, 82)),
              "Q3_K": (110, 256, (108,)), "Q4_K": (144, 256, (0, 2)), "Q5_K": (176, 256, (0, 2)),
              "Q6_K": (210, 256, (208,))}
QTYPES.update({k: getattr(gguf.GGMLQuantizationType, k) for k in RAW_QTYPES})


def raw_blocks(kind: str, n_blocks: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """Random block bytes of a k-quant (gguf-py cannot quantize to them): every bit pattern is a valid block once
    its f16 scales are finite; `scale` keeps the decoded weights small enough for a forward pass."""
    size, _, f16_at = RAW_QTYPES[kind]
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for at in f16_at:
        d = (rng.normal(size=n_blocks) * scale).astype(np.float16)
        raw[:, at:at + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(arr: np.ndarray, qtype) -> np.ndarray:
    if qtype.name in RAW_QTYPES:  # random blocks of the tensor's shape, seeded by it, scaled to ~its weights
        size, per, _ = RAW_QTYPES[qtype.name]
        rng = np.random.default_rng(arr.size + int(1e6 * float(np.abs(arr).sum())))
        blocks = raw_blocks(qtype.name, arr.size // per, rng, scale=float(np.abs(arr).mean()) / 200)
        return blocks.reshape(arr.shape[0], -1)
    if qtype == gguf.GGMLQuantizationType.F32:
        return arr.astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return arr.astype(np.float16)
    return gguf.quants.quantize(arr.astype(np.float32), qtype)


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.random.default_rng(0).normal(size=(6 * 8, 5)).astype(np.float32)
    for heads in (1, 2, 6):
        assert np.array_equal(unpermute_qk(llama_cpp_permute(w, heads), heads), w)


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs.weight for a Llama 3.x rope scaling: per rotary pair the
    divisor of its frequency (1 for short wavelengths, `factor` for long ones, smoothed between)."""
    rp = cfg["rope_parameters"]
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (rp["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def write_gguf(hf_dir: Path, out: Path, types: dict[str, str], rope_freqs: bool = True) -> Path:
    """Convert a tiny HF llama checkpoint to GGUF the way llama.cpp does (names, permutation, tokenizer, a Llama 3
    rope scaling as rope_freqs.weight unless rope_freqs=False)."""
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(str(hf_dir / "model.safetensors"))
    tj = json.loads((hf_dir / "tokenizer.json").read_text())
    tcfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    for t in tj["added_tokens"]:
        vocab[t["content"]] = t["id"]
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {t["content"] for t in tj["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    w = gguf.GGUFWriter(str(out), "llama")
    rp = cfg["rope_parameters"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[tcfg["bos_token"]])
    w.add_eos_token_id(vocab[tcfg["eos_token"]])
    w.add_chat_template(tcfg["chat_template"])
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names.update({p + "input_layernorm.weight": f"blk.{i}.attn_norm.weight",
                      p + "post_attention_layernorm.weight": f"blk.{i}.ffn_norm.weight",
                      p + "self_attn.q_proj.weight": f"blk.{i}.attn_q.weight",
                      p + "self_attn.k_proj.weight": f"blk.{i}.attn_k.weight",
                      p + "self_attn.v_proj.weight": f"blk.{i}.attn_v.weight",
                      p + "self_attn.o_proj.weight": f"blk.{i}.attn_output.weight",
                      p + "mlp.gate_proj.weight": f"blk.{i}.ffn_gate.weight",
                      p + "mlp.up_proj.weight": f"blk.{i}.ffn_up.weight",
                      p + "mlp.down_proj.weight": f"blk.{i}.ffn_down.weight"})
    for hf_name, arr in tensors.items():
        if hf_name not in names:
            continue
        if "q_proj" in hf_name:
            arr = llama_cpp_permute(arr, cfg["num_attention_heads"])
        elif "k_proj" in hf_name:
            arr = llama_cpp_permute(arr, cfg["num_key_value_heads"])
        kind = "F32" if arr.ndim == 1 else types.get(hf_name.split(".")[-2], "F32")
        qtype = QTYPES[kind]
        if kind == "BF16":
            data = (arr.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16
            w.add_tensor(names[hf_name], data, raw_shape=arr.shape, raw_dtype=qtype)
        else:
            w.add_tensor(names[hf_name], encode(arr, qtype), raw_dtype=qtype if kind not in ("F32", "F16") else None)
    if rope_freqs and rp.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def reference_tensors(gf: GGUFFile, config) -> dict[str, np.ndarray]:
    """Every model tensor of the file as llama.cpp's reference code (gguf.quants) decodes it, HF names and q/k
    row order."""
    from llmrs.model.weights import gguf_to_hf_name

    out = {}
    for name, t in gf.tensors.items():
        hf = gguf_to_hf_name(name)
        if hf is None:  # rope_freqs: part of the config
            continue
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        if "q_proj" in hf:
            w = unpermute_qk(w, config.num_attention_heads)
        elif "k_proj" in hf:
            w = unpermute_qk(w, config.num_key_value_heads)
        out[hf] = w
    return out


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "F16", "BF16"])
def test_each_tensor_type_dequantizes_exactly(tiny_llama, tmp_path, kind):
    path = write_gguf(tiny_llama, tmp_path / f"m-{kind}.gguf", {"gate_proj": kind, "o_proj": kind, "q_proj": kind})
    gf = GGUFFile(path)
    for name in ("blk.0.ffn_gate.weight", "blk.1.attn_output.weight", "blk.2.attn_q.weight"):
        t = gf.tensors[name]
        assert t.tensor_type.name == kind
        ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)  # llama.cpp's own reference
        ours = gf.tensor_f32(name)
        assert ours.shape == ref.shape and np.array_equal(ours, ref.astype(np.float32))


def test_gguf_with_rope_freqs_matches_transformers_with_llama3_scaling(tiny_llama, tmp_path):
    """A Llama 3 GGUF as llama.cpp writes it (the rope scaling as rope_freqs.weight, no metadata): the same logits
    as transformers with the checkpoint's llama3 rope scaling, over a prompt long enough for it to matter; the file
    read without its factors would not match."""
    from transformers import AutoModelForCausalLM

    loaded = load(str(write_gguf(tiny_llama, tmp_path / "f32r.gguf", {})))
    assert loaded.config.rope_scaling["rope_type"] == "freq_factors"
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ids = loaded.tokenizer.encode(" ".join(["The quick brown fox jumps over the lazy dog."] * 8))
    assert len(ids) > 64  # past the original context of the scaling (64 in the tiny config)
    runner = ModelRunner(loaded, num_blocks=16)
    ours = runner.execute(build_step_batch([(ids, 0, list(range(16)), True)], 16))[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1].numpy()
    assert np.abs(ours - ref).max() < 1e-3
    plain = load(str(tmp_path / "f32r.gguf"))
    plain.config.rope_scaling = None  # what loading ignored rope_freqs.weight before
    wrong = ModelRunner(plain, num_blocks=16).execute(build_step_batch([(ids, 0, list(range(16)), True)], 16))[0]
    assert np.abs(wrong - ref).max() > 1e-2


def test_gguf_rope_freqs_of_the_wrong_size_is_a_clear_error(tiny_llama, tmp_path):
    from llmrs.errors import UserError

    path = write_gguf(tiny_llama, tmp_path / "bad.gguf", {}, rope_freqs=False)
    gf = GGUFFile(path)
    w = gguf.GGUFWriter(str(tmp_path / "bad2.gguf"), "llama")
    for key, field in gf.reader.fields.items():  # copy the metadata and tensors, add a 3-element rope_freqs
        if key.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, t in gf.tensors.items():
        w.add_tensor(name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                     raw_dtype=t.tensor_type)
    w.add_tensor("rope_freqs.weight", np.ones(3, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UserError, match="rope_freqs.weight holds 3 factors"):
        load(str(tmp_path / "bad2.gguf"))


def test_gguf_f32_matches_transformers_after_unpermute(tiny_llama, tmp_path):
    """All-F32 GGUF of a GQA llama without rope_freqs: q/k rows permuted in the file, same logits as transformers
    without the rope scaling (the file does not carry it)."""
    from transformers import AutoModelForCausalLM

    loaded = load(str(write_gguf(tiny_llama, tmp_path / "f32.gguf", {}, rope_freqs=False)))
    cfg = loaded.config
    assert (cfg.model_type, cfg.num_key_value_heads, cfg.tie_word_embeddings) == ("llama", 2, True)
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    # the GGUF carries no llama3 rope scaling: compare against the same model without it
    hf_plain = AutoModelForCausalLM.from_config(hf.config.__class__(**{
        **hf.config.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}}))
    hf_plain.load_state_dict(hf.state_dict())
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    assert ids == load(str(tiny_llama)).tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    runner = ModelRunner(loaded, num_blocks=8)
    ours = runner.execute(build_step_batch([(ids, 0, [0, 1], True)], 16))[0]
    with torch.no_grad():
        ref = hf_plain.eval()(torch.tensor([ids])).logits[0, -1].numpy()
    assert np.abs(ours - ref).max() < 1e-3


def test_quantized_gguf_loads_through_the_same_mapping(tiny_llama, tmp_path):
    """A GGUF mixing every type gives the logits of the same weights dequantized by llama.cpp's reference code."""
    types = {"q_proj": "Q8_0", "k_proj": "Q4_0", "v_proj": "Q4_1", "o_proj": "Q8_0", "gate_proj": "Q4_1",
             "up_proj": "BF16", "down_proj": "F16", "embed_tokens": "Q8_0"}
    q = load(str(write_gguf(tiny_llama, tmp_path / "q.gguf", types)))
    gf = GGUFFile(tmp_path / "q.gguf")
    ref_tensors = reference_tensors(gf, q.config)
    assert set(ref_tensors) == set(q.tensors)
    ref = load(str(tmp_path / "q.gguf"))
    ref.tensors = ref_tensors
    ids = q.tokenizer.encode("Paged attention stores keys")
    batch = build_step_batch([(ids, 0, [0], True)], 16)
    lq = ModelRunner(q, num_blocks=4).execute(batch)[0]
    lr = ModelRunner(ref, num_blocks=4).execute(batch)[0]
    assert np.array_equal(lq, lr)


@pytest.mark.parametrize("kind", sorted(RAW_QTYPES))
def test_k_quants_and_q5_dequantize_as_llama_cpp(kind):
    """Q2_K .. Q6_K (what Q4_K_M / Q5_K_M / Q6_K files hold) and Q5_0 / Q5_1: our numpy decoding equals gguf-py's
    reference (llama.cpp's dequantize_row_*) bit for bit on random blocks, every bit pattern of the quants."""
    from llmrs.model.weights import _DEQUANT

    qtype = QTYPES[kind]
    for seed in range(3):
        raw = raw_blocks(kind, 40, np.random.default_rng(seed))
        ref = gguf.quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        ours = _DEQUANT[int(qtype)](raw.reshape(-1))
        assert ours.dtype == np.float32 and np.array_equal(ours, ref)


@pytest.fixture(scope="module")
def llama_256(tmp_path_factory) -> Path:
    """A tiny llama whose rows (256, 512) are whole k-quant super-blocks."""
    from tests.conftest import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("k") / "llama", "llama", hidden_size=256, intermediate_size=512,
                            num_attention_heads=4, num_key_value_heads=2)


def test_k_quant_gguf_loads_and_runs_as_its_reference_weights(llama_256, tmp_path):
    """A GGUF whose projections are Q2_K .. Q6_K, Q5_0 and Q5_1 tensors (a llama.cpp Q4_K_M file mixes Q4_K and
    Q6_K the same way) loads through `llmrs` with every tensor as gguf-py decodes it, and gives those weights'
    logits; `llmrs roofline` reads the file's real bits per weight."""
    from llmrs.roofline.model_source import resolve_model

    types = {"q_proj": "Q4_K", "k_proj": "Q5_K", "v_proj": "Q6_K", "o_proj": "Q3_K", "gate_proj": "Q4_K",
             "up_proj": "Q2_K", "down_proj": "Q6_K"}
    path = write_gguf(llama_256, tmp_path / "k.gguf", types)
    q = load(str(path))
    gf = GGUFFile(path)
    assert gf.tensors["blk.0.attn_q.weight"].tensor_type.name == "Q4_K"
    ref_tensors = reference_tensors(gf, q.config)
    assert set(ref_tensors) == set(q.tensors)
    for hf, w in ref_tensors.items():
        assert np.array_equal(q.tensors[hf], w), hf
    ref = load(str(path))
    ref.tensors = ref_tensors
    ids = q.tokenizer.encode("Paged attention stores keys")
    batch = build_step_batch([(ids, 0, [0], True)], 16)
    lq = ModelRunner(q, num_blocks=4).execute(batch)[0]
    assert np.isfinite(lq).all()
    assert np.array_equal(lq, ModelRunner(ref, num_blocks=4).execute(batch)[0])
    src = resolve_model(str(path))
    assert src.default_format == "q4_k"  # the most common projection type, by weights
