"""`llmrs gpus` and `llmrs roofline` through the real CLI (llmrs.cli.main in a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def llmrs(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    if cache:
        env["LLMRS_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "llmrs", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_gpus_lists_the_database_and_json_has_sources(tmp_path):
    p = llmrs("gpus", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "rtx-a5000" in p.stdout and "h200" in p.stdout and "b200" in p.stdout
    j = json.loads(llmrs("gpus", "--json", cache=tmp_path).stdout)
    assert {g["key"] for g in j} >= {"rtx-a5000", "h200"}
    one = llmrs("gpus", "h200", cache=tmp_path)
    assert one.returncode == 0 and "4800" in one.stdout and "datasheet" in one.stdout


def test_roofline_a5000_qwen7b_prints_the_worked_figures(tmp_path):
    p = llmrs("roofline", "--gpu", "rtx-a5000", "--model", "qwen2.5-7b", "--context", "400", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for s in ("ridge 144.7 FLOP/byte", "15.23 GB", "19.83 ms", "18.41 ms", "57,344 bytes/token", "1.47 GB",
              "0.859 PFLOP", "0.930 PFLOP"):
        assert s in out, s


def test_roofline_json_plot_and_measured_overlay(tmp_path):
    measured = tmp_path / "points.json"
    measured.write_text(json.dumps({"points": [
        {"label": "llm-rs bf16", "batch": 1, "tokens_per_s": 35.5},
        {"label": "vLLM bf16", "batch": 1, "tokens_per_s": 27.0},
        {"label": "gemm", "flops": 2 * 4096**3, "bytes": 3 * 2 * 4096**2, "seconds": 0.005},
    ]}))
    plot = tmp_path / "roof.png"
    p = llmrs("roofline", "--gpu", "rtx-a5000", "--model", "qwen2.5-7b", "--format", "awq", "--batch", "1,64",
              "--plot", str(plot), "--measured", str(measured), "--json", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["decode_floor_s"] * 1e3 == pytest.approx(5.93, abs=0.05)
    assert j["ridge_flop_per_byte"] == pytest.approx(144.7, abs=0.1)
    assert [pt["batch"] for pt in j["points"]] == [1, 64]
    mp = {m["label"]: m for m in j["measured_points"]}
    # 35.5 tok/s against the AWQ ceiling of ~168 tok/s at context 512
    assert mp["llm-rs bf16"]["fraction_of_ceiling"] == pytest.approx(35.5 / 167.0, rel=0.02)
    assert mp["gemm"]["intensity"] == pytest.approx(4096 / 3)
    assert plot.is_file() and plot.stat().st_size > 10_000
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "nope", "--model", "qwen2.5-7b"], "unknown GPU"),
    (["--gpu", "h200", "--model", "gpt-5"], "unknown model"),
    (["--gpu", "h200", "--model", "qwen2.5-7b", "--format", "q3"], "unknown weight format"),
    (["--gpu", "h200", "--model", "qwen2.5-7b", "--batch", "1,x"], "--batch"),
    (["--gpu", "h200", "--plot", "roof.png"], "--plot needs a MODEL"),
    (["--gpu", "h200", "--tp", "2"], "--tp needs a MODEL"),
    (["qwen2.5-7b", "--gpu", "h200", "--model", "qwen2.5-3b"], "two models given"),
    (["--gpu", "rtx-a5000", "--model", "qwen2.5-7b", "--compute-dtype", "fp8"], "no fp8"),
])
def test_roofline_user_mistakes_print_one_line_and_exit_2(tmp_path, args, needle):
    p = llmrs("roofline", *args, cache=tmp_path)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_bad_measured_file_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"label": "x", "batch": 1}]))
    p = llmrs("roofline", "--gpu", "h200", "--model", "qwen2.5-7b", "--measured", str(bad), cache=tmp_path)
    assert p.returncode == 2 and "tokens_per_s" in p.stderr


def test_measure_without_a_gpu_fails_clearly(tmp_path):
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: --measure would really measure")
    except ImportError:
        pass
    p = llmrs("roofline", "--measure", cache=tmp_path)
    assert p.returncode == 2
    assert "--measure" in p.stderr and "Traceback" not in p.stderr


def test_help_shows_defaults():
    p = llmrs("roofline", "--help")
    assert p.returncode == 0
    assert "1,8,64,256" in p.stdout and "512" in p.stdout
    p = llmrs("ptx-check", "--help")
    assert "sm_80,sm_86,sm_89,sm_90" in p.stdout


def test_roofline_gpu_alone_shows_its_roofs_and_every_presets_decode_floor(tmp_path):
    """`llmrs roofline --gpu a5000` as typed: the roofs per datatype, then each preset's batch-1 decode floor
    (streamed bytes / 768 GB/s) and compute-bound batch; the 7B's floor is the worked 18.41 ms."""
    from llmrs.model.presets import preset_names

    p = llmrs("roofline", "--gpu", "a5000", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "NVIDIA RTX A5000" in out and "768 GB/s" in out and "144.7" in out and "111.1" in out
    rows = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("│")}
    assert set(rows) == set(preset_names())
    assert "18.41 ms" in rows["qwen2.5-7b"] and "54.3" in rows["qwen2.5-7b"]
    assert "(> GPU)" in rows["qwen2.5-72b"] and "(> GPU)" not in rows["qwen2.5-7b"]
    j = json.loads(llmrs("roofline", "--gpu", "a5000", "--format", "awq", "--json", cache=tmp_path).stdout)
    assert j["gpu"] == "rtx-a5000" and j["peaks"]["fp8"] is None
    assert j["ridge_flop_per_byte"]["bf16"] == pytest.approx(144.7, abs=0.1)
    seven = next(r for r in j["presets"] if r["preset"] == "qwen2.5-7b")
    assert seven["decode_floor_s"] * 1e3 == pytest.approx(5.93, abs=0.05)  # as `--model qwen2.5-7b --format awq`
    assert seven["compute_bound_batch"] > 1


def test_roofline_model_positional_or_option_and_no_short_c(tmp_path):
    by_arg = llmrs("roofline", "qwen2.5-7b", "--gpu", "h200", "--json", cache=tmp_path)
    by_opt = llmrs("roofline", "--model", "qwen2.5-7b", "--gpu", "h200", "--json", cache=tmp_path)
    assert by_arg.returncode == by_opt.returncode == 0, by_arg.stderr + by_opt.stderr
    assert json.loads(by_arg.stdout) == json.loads(by_opt.stdout)
    p = llmrs("roofline", "qwen2.5-7b", "--gpu", "h200", "-c", "400", cache=tmp_path)  # -c is bench's --concurrency
    assert p.returncode == 2 and "-c" in p.stderr and "Traceback" not in p.stderr
