"""User mistakes found by an audit, through the real `llmrs` command: each is one `error:` line and exit 2 (no
traceback, no half-written file), or does what the user meant (synth replacing its own earlier checkpoint)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.cli.test_cli import assert_user_error, llmrs
from tests.profiling.test_profile import records_of_one_decode_step

from llmrs.profiling import profile as prof
from llmrs.bench import checkpoint as synth


def no_gpu() -> bool:
    from llmrs.backends.cuda import cuda_available

    return not cuda_available()[0]


@pytest.fixture
def saved_profile(tmp_path) -> Path:
    p = prof.aggregate(records_of_one_decode_step(), steps=2, phase="decode", bandwidth=4e12, peak_flops=8e14,
                       label="decode B=1", batch=1, tokens=1, wall_ms=0.040)
    meta = {"model": "synthetic:qwen2.5-7b", "gpu_name": "NVIDIA H200", "bandwidth_gbs": 4000.0,
            "peak_tflops": 800.0, "context": 512, "ceilings": "datasheet", "note": "n"}
    path = tmp_path / "p.json"
    prof.save_json(path, [p], meta)
    return path


# ---------------------------------------------------------------------- synth --out into a used folder
def test_synth_replaces_an_earlier_sharded_checkpoint_so_the_new_weights_are_served(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    monkeypatch.setattr(synth, "SHARD_BYTES", 4 << 20)  # the earlier checkpoint: sharded, with an index
    old = synth.write_checkpoint("smollm2-135m", out, overrides={"num_hidden_layers": 2})
    assert len(old["files"]) > 1 and (out / "model.safetensors.index.json").exists()
    res = llmrs("synth", "--like", "smollm2-135m", "--quant", "awq", "--group-size", "64", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "replaced the earlier checkpoint" in res.stderr and old["files"][0] in res.stderr
    assert sorted(p.name for p in out.glob("*.safetensors*")) == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()
    info = llmrs("info", str(out), "--json")
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["quantization"].startswith("awq 4-bit, group 64") and data["layers"] == 30
    assert set(data["bytes_by_dtype"]) == {"F16", "I32"}  # the new file's tensors, none of the old bf16 shards'


def test_synth_refuses_a_folder_holding_another_models_checkpoint(tiny_llama, tmp_path):
    out = tmp_path / "real"
    shutil.copytree(tiny_llama, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = llmrs("synth", "--like", "smollm2-135m", "--out", str(out))
    assert_user_error(res, "--out", "did not write", "new or empty folder")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing deleted or overwritten


def test_a_synth_write_that_fails_leaves_no_truncated_weights(tmp_path, monkeypatch, capsys):
    """A full disk half-way through the weights (no real disk fills on demand: the writer raises ENOSPC after a
    few tensors): one error line, and no model.safetensors (nor its temporary) for a loader to find."""
    from llmrs.cli import main

    calls = []
    real = synth._bf16_random

    def filling_up(name, shape, rng):
        calls.append(name)
        if len(calls) > 5:
            raise OSError(28, "No space left on device")
        return real(name, shape, rng)

    monkeypatch.setattr(synth, "_bf16_random", filling_up)
    with pytest.raises(SystemExit) as e:
        main(["synth", "--like", "smollm2-135m", "--out", str(tmp_path / "ckpt")])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: --out") and len(calls) == 6
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == []


@pytest.mark.parametrize("value", ["0", "-64", "48"])
def test_synth_group_size_must_be_a_positive_multiple_of_32(tmp_path, value):
    out = tmp_path / "ckpt"
    res = llmrs("synth", "--like", "smollm2-135m", "--quant", "awq", "--group-size", value, "--out", str(out))
    assert_user_error(res, f"--group-size {value}", "multiple of 32")
    assert not out.exists()


def test_synth_decode_bench_without_a_gpu_names_decode_bench_not_measure():
    if not no_gpu():
        pytest.skip("a GPU is present")
    res = llmrs("synth", "--like", "smollm2-135m", "--decode-bench")
    assert_user_error(res, "--decode-bench", "GPU")
    assert "--measure" not in res.stderr


# ---------------------------------------------------------------------- model files
@pytest.mark.parametrize("cmd", [["info", "{d}"], ["generate", "--model", "{d}", "-p", "x"],
                                 ["roofline", "--gpu", "h200", "--model", "{d}"]])
def test_a_config_json_that_is_not_an_object_is_named(tmp_path, cmd):
    (tmp_path / "config.json").write_text("[1, 2]")
    res = llmrs(*[a.format(d=tmp_path) for a in cmd])
    assert_user_error(res, str(tmp_path / "config.json"), "expected a JSON object")


@pytest.mark.parametrize("text, says", [("[1, 2]", "expected a JSON object"), ('{"eos_token_id": "x"}', "eos_token_id"),
                                         ('{"eos_token_id": [1, null]}', "eos_token_id"), ("{bad", "not valid JSON")])
def test_a_bad_generation_config_is_named(tmp_path, text, says):
    out = tmp_path / "m"
    synth.write_checkpoint("smollm2-135m", out, overrides={"num_hidden_layers": 1})
    assert llmrs("info", str(out)).returncode == 0
    (out / "generation_config.json").write_text(text)
    assert_user_error(llmrs("info", str(out)), str(out / "generation_config.json"), says)
    (out / "generation_config.json").write_text('{"eos_token_id": [7, 9]}')
    assert llmrs("info", str(out)).returncode == 0


@pytest.mark.parametrize("cmd", [["info", "{f}"], ["roofline", "--gpu", "h200", "--model", "{f}"]])
@pytest.mark.parametrize("size", [100, 5_000_000])  # cut in the metadata, and in the tensors
def test_a_truncated_gguf_says_truncated(smollm2_path, tmp_path, cmd, size):
    bad = tmp_path / "bad.gguf"
    with open(smollm2_path, "rb") as src:
        bad.write_bytes(src.read(size))
    res = llmrs(*[a.format(f=bad) for a in cmd])
    assert_user_error(res, "bad.gguf", "truncated GGUF file", f"{size:,} bytes")


# ---------------------------------------------------------------------- roofline
@pytest.mark.parametrize("value", ["0", "-5"])
def test_roofline_tp_link_bandwidth_must_be_positive(value):
    res = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-7b", "--tp", "2", "--tp-link-gbs", value)
    assert_user_error(res, f"--tp-link-gbs {value}", "positive")


def test_roofline_plot_format_is_checked_and_a_bare_name_reports_the_png_it_wrote(tmp_path):
    pytest.importorskip("matplotlib")
    res = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-7b", "--plot", str(tmp_path / "roof.txt"))
    assert_user_error(res, "roof.txt", ".png, .svg, .pdf")
    assert not (tmp_path / "roof.txt").exists()
    bare = tmp_path / "chart"
    res = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-7b", "--plot", str(bare))
    assert res.returncode == 0, res.stderr
    assert f"plot written to {bare}.png" in res.stdout.replace("\n", "")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-7b", "--plot", str(tmp_path / "c2"), "--json")
    assert json.loads(res.stdout)["plot"] == f"{tmp_path / 'c2'}.png" and (tmp_path / "c2.png").is_file()


def test_roofline_measured_points_a_directory_or_a_negative_throughput_are_user_errors(tmp_path):
    res = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-7b", "--measured", str(tmp_path))
    assert_user_error(res, str(tmp_path), "a directory")
    points = tmp_path / "points.json"
    points.write_text(json.dumps([{"label": "slow", "batch": 1, "tokens_per_s": -4.0}]))
    res = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-7b", "--measured", str(points))
    assert_user_error(res, "'slow'", "tokens_per_s -4 must be positive")


# ---------------------------------------------------------------------- profile
def test_profile_plot_format_and_unwritable_out_are_user_errors(saved_profile, tmp_path):
    res = llmrs("profile", "--from", str(saved_profile), "--plot", str(tmp_path / "prof.txt"))
    assert_user_error(res, "prof.txt", ".png, .svg, .pdf")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = llmrs("profile", "--from", str(saved_profile), "-o", str(blocker / "p.json"))
    assert_user_error(res, "--out", "cannot write")
    res = llmrs("profile", "--from", str(saved_profile), "-o", "/proc/nope/p.json")
    assert_user_error(res, "--out /proc/nope/p.json", "cannot write")


@pytest.mark.parametrize("value", ["-3", "0"])
def test_profile_top_below_one_is_refused(saved_profile, value):
    assert_user_error(llmrs("profile", "--from", str(saved_profile), "--top", value), f"--top {value}")


@pytest.mark.parametrize("args,words", [(["/nonexistent/model"], ["model not found", "/nonexistent/model"]),
                                        (["--synthetic", "nosuch"], ["unknown model preset", "nosuch"])])
def test_profile_names_a_bad_model_before_a_missing_gpu(args, words):
    res = llmrs("profile", *args)
    assert_user_error(res, *words)
    assert "CuPy" not in res.stderr
