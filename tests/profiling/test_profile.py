"""`llmrs profile`: the pure parts (costs, aggregation, table, JSON) everywhere; a real profile on a GPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console

from llmrs.profiling import profile as prof
from llmrs.cli import main
from llmrs.cli.profile import parse_batches
from llmrs.errors import UserError


def records_of_one_decode_step():
    """Two steps' worth of launches of a 2-layer batch-1 decode: known bytes and times."""
    recs = []
    for _ in range(2):  # steps
        for _ in range(2):  # layers
            recs.append(prof.KernelRecord("matvec", "qkv", 0.010, 4.0e7, 2.0e7))
            recs.append(prof.KernelRecord("attention", "attn_partial_d4", 0.004, 1.0e6, 1.0e6))
            recs.append(prof.KernelRecord("rms_norm", "rms_norm", 0.002, 1.0e4, 4.0e3))
        recs.append(prof.KernelRecord("sample", "sample_tokens", 0.004, 1.0e6, 5.0e5))
    return recs


def test_matvec_cost_counts_weights_once_and_the_accumulated_output_twice():
    nbytes, flops = prof.kernel_cost("matvec", (1, 3584, 3584, True, False))
    assert nbytes == 2 * 3584 * 3584 + 4 * 3584 + 2 * 4 * 3584
    assert flops == 2 * 3584 * 3584
    gemm_bytes, _ = prof.kernel_cost("gemm", (64, 100, 200, False, False))
    assert gemm_bytes == 2 * 100 * 200 + 2 * 64 * 200 + 4 * 64 * 100  # bf16 x, f32 out
    bf16_out, _ = prof.kernel_cost("gemm", (64, 100, 200, False, False, 2))  # gate/up written as bf16
    assert bf16_out == 2 * 100 * 200 + 2 * 64 * 200 + 2 * 64 * 100


def test_sample_cost_reads_a_greedy_rows_logits_once():
    S, V = 256, 152064
    assert prof.kernel_cost("sample", (S, V, 0))[0] == 4 * S * V  # all greedy: the argmax pass only
    assert prof.kernel_cost("sample", (S, V, 3))[0] == 4 * S * V + 4 * 3 * V  # 3 rows read theirs again to draw
    assert prof.kernel_cost("sample", (S, V)) == prof.kernel_cost("sample", (S, V, S))  # profiles saved before


def test_silu_mul_cost_follows_its_input_and_output_types():
    T, I = 8, 96
    assert prof.kernel_cost("silu_mul", (T, I))[0] == (8 + 4) * T * I  # f32 gate and up in, f32 out
    assert prof.kernel_cost("silu_mul", (T, I, 2))[0] == (8 + 2) * T * I  # silu_mul_bf16: bf16 out
    assert prof.kernel_cost("silu_mul", (T, I, 2, 2))[0] == (4 + 2) * T * I  # silu_mul_bf16_bf16: bf16 in too


def test_quantized_matvec_cost_counts_the_packed_bytes():
    # AWQ G128 4608x3584: codes 4608*3584/2 + fp16 scale and zero per 128 = 4.25 bits a weight
    w_bytes = 4608 * 3584 // 2 + 2 * 2 * 4608 * 3584 // 128
    nbytes, flops = prof.kernel_cost("matvec_q", (1, 4608, 3584, False, False, w_bytes))
    assert nbytes == w_bytes + 4 * 3584 + 4 * 4608 and w_bytes * 8 / (4608 * 3584) == 4.25
    assert flops == 2 * 4608 * 3584
    assert prof.category("matvec_q", "decode") == "matrix multiply"


def test_dequantization_cost_reads_the_packed_weight_and_writes_bf16():
    """Above the 4-bit GEMM's token limit a quantized weight is expanded to bf16 each step: the profile counts it
    (it showed 0 GB/s), in "everything else" beside the GEMM that reads the result."""
    w_bytes = 37888 * 3584 // 2 + 2 * 2 * 37888 * 3584 // 128
    nbytes, flops = prof.kernel_cost("dequant", (37888, 3584, w_bytes))
    assert nbytes == w_bytes + 2 * 37888 * 3584 and flops == 37888 * 3584
    assert prof.category("dequant", "decode") == "everything else"


def test_attention_cost_reads_each_sequence_kv_once():
    # 4 sequences x 512 cached keys, qwen2.5-7b heads: K and V, bf16, 4 KV heads x 128 dims
    nbytes, flops = prof.kernel_cost("attention", (4, 28, 4, 128, 4 * 512, 4 * 512, 1))
    kv = 2 * 2 * 4 * 512 * 4 * 128
    assert nbytes == kv + 2 * 4 * 4 * 28 * 128
    assert flops == 4 * (4 * 512) * 28 * 128


def test_attention_and_o_cost_adds_the_o_weights_and_the_heads_partials():
    # one 3B token at 384 keys (16 query heads, 2 KV heads of 128 dims), o 2048 x 2048 bf16, 8 splits
    nbytes, flops = prof.kernel_cost("attn_o", (1, 16, 2, 128, 384, 384, 8, 2048))
    kv, w = 2 * 2 * 384 * 2 * 128, 2 * 2048 * 2048
    assert nbytes == kv + 4 * 16 * 128 + w + 2 * 4 * 16 * 2048 + 2 * 4 * 2048  # q, partials out + in, x in + out
    assert flops == 4 * 384 * 16 * 128 + 2 * 2048 * 2048
    assert prof.category("attn_o", "decode") == "decode attention"


def test_aggregate_gives_per_step_times_categories_busy_and_roof_fractions():
    p = prof.aggregate(records_of_one_decode_step(), steps=2, phase="decode", bandwidth=4e12, peak_flops=8e14,
                       label="decode B=1", batch=1, tokens=1, wall_ms=0.040)
    by = {s.kernel: s for s in p.kernels}
    qkv = by["matvec qkv"]
    assert qkv.calls == 2 and qkv.ms == pytest.approx(0.020) and qkv.nbytes == pytest.approx(8e7)
    assert qkv.gbs == pytest.approx(8e7 / 20e-6 / 1e9)  # 4,000 GB/s
    assert qkv.fraction_of_roof == pytest.approx(1.0)  # 8e7 B / 4e12 B/s = 20 us = its time
    assert qkv.bound == "memory"
    assert p.kernels[0].kernel == "matvec qkv"  # sorted by time
    assert p.kernel_ms == pytest.approx(0.020 + 0.008 + 0.004 + 0.004)
    assert p.categories["matrix multiply"] == pytest.approx(0.020)
    assert p.categories["decode attention"] == pytest.approx(0.008)
    assert p.categories["prefill attention"] == 0.0
    assert p.categories["everything else"] == pytest.approx(0.008)
    assert p.busy == pytest.approx(0.036 / 0.040)
    assert sum(p.share(c) for c in prof.CATEGORIES) == pytest.approx(1.0)


def test_collectives_count_as_communication_against_the_link_bandwidth():
    # qwen2.5-72b at TP=2, batch 1: one all-reduce of [1, 8192] f32 = 32 KiB payload; a ring moves 2(N-1)/N of it
    nbytes, _ = prof.kernel_cost("allreduce", (32768, 2))
    assert nbytes == 32768.0
    assert prof.kernel_cost("allreduce", (32768, 4))[0] == 1.5 * 32768
    assert prof.kernel_cost("allgather", (1000, 4))[0] == 3000.0
    recs = records_of_one_decode_step() + [prof.KernelRecord("allreduce", "all_reduce", 0.010, 4.5e6, 0.0)] * 2
    p = prof.aggregate(recs, steps=2, phase="decode", bandwidth=4e12, peak_flops=8e14, label="decode B=1", batch=1,
                       tokens=1, wall_ms=0.050, link_bandwidth=450e9)
    ar = next(s for s in p.kernels if s.kernel == "allreduce all_reduce")
    assert ar.category == "communication" and ar.bound == "link"
    assert ar.fraction_of_roof == pytest.approx(1.0)  # 4.5 MB / 450 GB/s = 10 us: its time
    assert p.categories["communication"] == pytest.approx(0.010)
    assert sum(p.share(c) for c in prof.CATEGORIES) == pytest.approx(1.0)


def test_attention_of_a_prefill_step_counts_as_prefill_attention():
    p = prof.aggregate(records_of_one_decode_step(), steps=2, phase="prefill", bandwidth=4e12, peak_flops=8e14,
                       label="prefill 512", batch=1, tokens=512, wall_ms=0.010)
    assert p.categories["prefill attention"] == pytest.approx(0.008)
    assert p.categories["decode attention"] == 0.0
    assert p.busy == 1.0  # capped: kernel time can't exceed the wall


def test_table_and_json_show_every_category_and_kernel():
    p = prof.aggregate(records_of_one_decode_step(), steps=2, phase="decode", bandwidth=4e12, peak_flops=8e14,
                       label="decode B=1", batch=1, tokens=1, wall_ms=0.040)
    meta = {"model": "synthetic:qwen2.5-7b", "gpu_name": "NVIDIA H200", "bandwidth_gbs": 4000.0,
            "peak_tflops": 800.0, "context": 512}
    console = Console(record=True, width=200)
    prof.render(console, [p], meta)
    text = console.export_text()
    for needle in ("matrix multiply", "decode attention", "prefill attention", "everything else", "GPU busy",
                   "90.0%", "matvec qkv", "100%", "4,000"):
        assert needle in text, needle
    data = json.loads(json.dumps(prof.to_json([p], meta)))
    assert data["model"] == "synthetic:qwen2.5-7b"
    step = data["steps"][0]
    assert step["busy"] == pytest.approx(0.9) and step["categories"]["matrix multiply"] == pytest.approx(0.02)
    assert {k["kernel"] for k in step["kernels"]} == {"matvec qkv", "attention attn_partial_d4", "rms_norm",
                                                      "sample sample_tokens"}


def test_plot_writes_a_roofline_chart(tmp_path):
    pytest.importorskip("matplotlib")
    p = prof.aggregate(records_of_one_decode_step(), steps=2, phase="decode", bandwidth=4e12, peak_flops=8e14,
                       label="decode B=1", batch=1, tokens=1, wall_ms=0.040)
    out = prof.plot([p], {"bandwidth_gbs": 4000.0, "peak_tflops": 800.0, "model": "m", "gpu_name": "g"},
                    tmp_path / "roof.png")
    assert out.stat().st_size > 1000


def test_a_saved_profile_is_shown_again_without_a_gpu(tmp_path, capsys):
    """`llmrs profile --from FILE` (a profile saved with --out on the GPU machine): the same tables, --json, --plot;
    a file that is not one, or --from with a model, is one error line."""
    pytest.importorskip("matplotlib")
    p = prof.aggregate(records_of_one_decode_step(), steps=2, phase="decode", bandwidth=4e12, peak_flops=8e14,
                       label="decode B=1", batch=1, tokens=1, wall_ms=0.040)
    meta = {"model": "synthetic:qwen2.5-7b", "gpu_name": "NVIDIA H200", "bandwidth_gbs": 4000.0,
            "peak_tflops": 800.0, "context": 512, "ceilings": "datasheet", "note": "n"}
    saved = tmp_path / "p.json"
    prof.save_json(saved, [p], meta)
    steps, meta2 = prof.from_json(prof.read_json(saved))
    assert steps == [p] and meta2 == meta  # to_json's inverse
    main(["profile", "--from", str(saved), "--plot", str(tmp_path / "roof.png"), "--out", str(tmp_path / "again.json")])
    out = capsys.readouterr().out
    assert "What the GPU was doing" in out and "synthetic:qwen2.5-7b" in out and "matvec qkv" in out
    assert (tmp_path / "roof.png").stat().st_size > 1000
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(saved.read_text())
    main(["profile", "--from", str(saved), "--json"])
    assert json.loads(capsys.readouterr().out)["steps"][0]["label"] == "decode B=1"
    (tmp_path / "bad.json").write_text('{"steps": [{"label": 1}]}')
    for args in (["profile", "--from", str(tmp_path / "bad.json")], ["profile", "--from", str(tmp_path / "no.json")],
                 ["profile", "--from", str(saved), "--synthetic", "qwen2.5-0.5b"]):
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and "Traceback" not in err, err


def test_batch_list_is_parsed_and_checked():
    assert parse_batches("1, 64,256") == [1, 64, 256]
    with pytest.raises(UserError):
        parse_batches("1,x")
    with pytest.raises(UserError):
        parse_batches("0")


def test_profile_without_a_gpu_is_one_clear_error(capsys):
    from llmrs.backends.cuda import cuda_available

    if cuda_available()[0]:
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit) as e:
        main(["profile", "--synthetic", "qwen2.5-0.5b", "--batch", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: llmrs profile") and "GPU" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--prefill-seqs", "--prefill-len", "--steps"])
def test_profile_refuses_a_count_below_one_before_looking_for_a_gpu(capsys, flag):
    with pytest.raises(SystemExit) as e:
        main(["profile", "--synthetic", "qwen2.5-0.5b", "--batch", "1", flag, "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--prefill-seqs must be at least 1" in err and "Traceback" not in err


def test_profile_needs_exactly_one_model(capsys):
    with pytest.raises(SystemExit) as e:
        main(["profile", "--synthetic", "qwen2.5-0.5b", "--model", "x"])
    assert e.value.code == 2
    assert "exactly one of" in capsys.readouterr().err


@pytest.mark.gpu
def test_profile_of_real_steps_on_the_gpu(tmp_path):
    from tests.cuda_helpers import require_gpu
    from tests.conftest import write_tiny_model

    require_gpu()
    path = write_tiny_model(tmp_path / "qwen2", "qwen2")
    profiles, meta = prof.run_profile(str(path), [1, 4, 12], context=40, prefill_len=30, steps=3, gpu="auto")
    assert [p.label for p in profiles] == ["decode B=1", "decode B=4", "decode B=12", "prefill 30"]
    for p in profiles:
        assert p.kernel_ms > 0 and 0 < p.busy <= 1
        assert sum(p.categories.values()) == pytest.approx(p.kernel_ms)
        assert p.categories["matrix multiply"] > 0
        names = {k.kernel for k in p.kernels}
        # decode: the input RMSNorm folded in and RoPE in the epilogue of the qkv matvec (fuse_norm,
        # fuse_epilogues); prefill: the GEMM + rope_write_kv
        assert names & {"matvec norm+qkv+rope", "matvec qkv", "gemm qkv"}
        assert all(k.calls >= 1 and k.nbytes > 0 for k in p.kernels)
    layers = 3
    qkv = next(k for k in profiles[0].kernels if k.kernel == "matvec norm+qkv+rope")
    assert qkv.calls == layers
    assert profiles[-1].categories["prefill attention"] > 0 and profiles[0].categories["decode attention"] > 0
    prof.save_json(tmp_path / "p.json", profiles, meta)
    assert json.loads((tmp_path / "p.json").read_text())["steps"][2]["batch"] == 12


@pytest.mark.gpu
def test_profile_of_a_prefill_step_of_several_prompts(tmp_path):
    """--prefill-seqs: one prefill step of several prompts (a loaded server's chunked step), each its own blocks
    and its own sampled row; the step's tokens are all the prompts' and its attention is prefill attention."""
    from tests.cuda_helpers import require_gpu
    from tests.conftest import write_tiny_model

    require_gpu()
    path = write_tiny_model(tmp_path / "qwen2", "qwen2")
    profiles, meta = prof.run_profile(str(path), [2], context=20, prefill_len=24, steps=2, gpu="auto",
                                      prefill_seqs=5)
    assert [p.label for p in profiles] == ["decode B=2", "prefill 5x24"]
    p = profiles[-1]
    assert (p.batch, p.tokens) == (5, 120) and meta["prefill_seqs"] == 5
    assert p.categories["prefill attention"] > 0 and p.categories["decode attention"] == 0
    assert sum(p.categories.values()) == pytest.approx(p.kernel_ms)
    gemm = [k for k in p.kernels if k.kernel.startswith(("gemm ", "matvec "))]
    assert gemm and all(k.calls >= 1 for k in gemm)


@pytest.mark.gpu
def test_profile_of_a_synthetic_awq_preset_runs_its_packed_weights():
    """`llmrs profile --synthetic qwen2.5-0.5b-awq`: the 4-bit linears drawn packed (as `llmrs serve` draws them),
    timed as quantized kernels against their packed bytes; not the preset's bf16 weights."""
    from tests.cuda_helpers import require_gpu

    require_gpu()
    profiles, _ = prof.run_profile("synthetic:qwen2.5-0.5b-awq", [1, 4], context=40, prefill_len=30, steps=2,
                                   gpu="auto")
    for p in profiles[:2]:
        names = [k.kernel for k in p.kernels]
        assert any(n.startswith("matvec_q ") for n in names), names
        assert not any(n.startswith("matvec qkv") or n.startswith("matvec gate_up") for n in names), names


def test_decode_batch_is_one_new_token_per_sequence_after_its_context():
    """The decode step `llmrs profile` and `--timeline` both time: B sequences, each one token at position
    `context` in its own blocks; greedy sampling states."""
    b = prof.decode_batch(np.random.default_rng(0), 100, 3, 40, 3, 16)
    assert b.positions.tolist() == [40, 40, 40] and b.context_lens.tolist() == [41, 41, 41]
    assert b.block_tables.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert prof.greedy_state().params.temperature == 0.0
