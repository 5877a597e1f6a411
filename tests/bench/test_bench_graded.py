"""A bench whose runs are graded against the roofline, with GPU telemetry (a stand-in NVML with known readings) and
the server's /metrics series, end to end against real servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from llmrs.bench.bench import BenchOptions, run_bench
from llmrs.bench.dataset import WorkloadConfig
from llmrs.roofline.gpus import get_gpu
from llmrs.roofline.model_source import build_cost, resolve_model
from tests.bench_fixtures.serving import running

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_is_graded_with_telemetry_against_the_fake_server(tmp_path):
    """The fake server streams 10 tokens per request 20 ms apart after 100 ms: 8 requests of 16 prompt tokens, 4 at
    a time, graded as qwen2.5-0.5b on an H100 SXM; NVML is the stand-in (two GPUs drawing 300 and 400 W)."""
    with running(ttft_ms=100, gap_ms=20) as (url, _):
        o = BenchOptions(workload=WorkloadConfig(num_prompts=8, input_len=16, output_len=10, seed=1), url=url,
                         concurrency=4, workers=1, out_dir=tmp_path, name="graded", gpu="h100-sxm",
                         model_config="qwen2.5-0.5b", nvml_module="nvml_standin")
        path = run_bench(o, Console(quiet=True))
    doc = json.loads(path.read_text())
    obs = doc["observers"]
    assert obs["roofline"] == {"graded": True, "gpu": "h100-sxm", "gpu_name": "NVIDIA H100 SXM5 80GB",
                               "model": "qwen2.5-0.5b", "model_source": "--model-config", "weight_format": "bf16",
                               "ceilings": "datasheet"}
    assert obs["telemetry"]["csv"] == "graded.telemetry.csv" and (tmp_path / "graded.telemetry.csv").is_file()
    assert obs["server_series"]["csv"] is None and "off for engine" in obs["server_series"]["why"]
    (run,) = doc["runs"]
    r, s = run["roofline"], run["summary"]
    assert r["graded"] and r["schema"] == "llmrs.roofline-grade/1"
    assert r["output_tok_s"] == pytest.approx(s["output_throughput"])
    assert r["mean_context"] == pytest.approx(16 + 10 / 2)
    # mean decode batch: each request decodes ~180 ms (9 gaps of 20 ms) over the run's duration
    assert r["mean_decode_batch"] == pytest.approx(8 * 0.18 / s["duration_s"], rel=0.15)
    cost = build_cost(resolve_model("qwen2.5-0.5b"))
    one = cost.decode_step(1, 21)
    step = one.weight_bytes + r["mean_decode_batch"] * (one.bytes - one.weight_bytes)
    assert r["decode_step_bytes"] == pytest.approx(step)
    bw = get_gpu("h100-sxm", with_measured=False).bandwidth()
    assert r["mbu"] == pytest.approx(step / (s["tpot_ms"]["mean"] / 1e3) / bw, rel=1e-6)
    assert r["fraction_of_ideal"] == pytest.approx(r["output_tok_s"] / r["ideal_output_tok_s"])
    t = run["telemetry"]
    assert t["gpus"] == 2 and t["mean_power_w"] == pytest.approx(700.0) and t["samples"] >= 3
    assert t["output_tokens_per_joule"] == pytest.approx(s["total_output_tokens"] / t["energy_j"])
    assert run["window"]["t1"] - run["window"]["t0"] == pytest.approx(s["duration_s"])


def test_without_a_gpu_the_runs_say_why_they_are_not_graded(tmp_path):
    with running() as (url, _):
        o = BenchOptions(workload=WorkloadConfig(num_prompts=2, input_len=8, output_len=2, seed=1), url=url,
                         concurrency=2, workers=1, out_dir=tmp_path, name="ungraded", nvml_module="no_such_nvml",
                         scrape_metrics=True)
        path = run_bench(o, Console(quiet=True))
    doc = json.loads(path.read_text())
    obs = doc["observers"]
    # the fake server's model is no preset, and there is no GPU here
    assert obs["roofline"]["graded"] is False and "no cost model for 'fake-model'" in obs["roofline"]["why"]
    assert "NVML is not installed" in obs["telemetry"]["why"]
    assert obs["server_series"]["why"] == "the server's /metrics answered 404"  # asked for, and said why not
    (run,) = doc["runs"]
    assert run["roofline"]["graded"] is False and run["telemetry"] is None


def _llmrs(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "llmrs", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_llmrs_serve_is_scraped_and_graded_as_its_gguf(tmp_path):
    """`llmrs bench --gpu h100-sxm` against the llmrs serve it starts (the embedded SmolLM2 GGUF on the CPU): the
    cost model is the served GGUF's real tensor types, the /metrics series is on by default for llmrs, and the
    graded line is printed."""
    res = _llmrs("bench", "-n", "4", "-c", "2", "--input-len", "16", "--output-len", "6", "--ignore-eos",
                 "--workers", "1", "--gpu", "h100-sxm", "-o", str(tmp_path), "--name", "g")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["observers"]["roofline"]["weight_format"] == "q4_1"
    assert doc["observers"]["roofline"]["model_source"] == "the served model (smollm2-135m)"
    (run,) = doc["runs"]
    assert run["roofline"]["graded"] and run["server_series"]["polls"] >= 1
    assert run["server_series"]["generation_tokens_delta"] == 4 * 6  # every token, the polls bracketing the run
    out = " ".join(res.stdout.split())
    assert "roofline (h100-sxm, datasheet 3,350 GB/s" in out and "server /metrics (" in out


def test_bad_grading_options_are_one_line_errors(tmp_path):
    res = _llmrs("bench", "--url", "http://127.0.0.1:9", "--gpu", "no-such-gpu", "-o", str(tmp_path), timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = _llmrs("bench", "-n", "1", "--model-config", str(tmp_path / "nothing.gguf"), "-o", str(tmp_path),
                 timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--model-config" in res.stderr


@pytest.mark.parametrize("model, models, synthetic", [
    ("synthetic:qwen2.5-7b", [], True),
    ("qwen7", [{"id": "qwen7", "root": "synthetic:qwen2.5-7b-awq"}], True),
    ("Qwen/Qwen2.5-7B-Instruct", [{"id": "Qwen/Qwen2.5-7B-Instruct", "root": "/models/qwen"}], False),
])
def test_random_weights_skip_the_usage_round_trip_check(model, models, synthetic):
    """`llmrs serve --synthetic` samples random tokens, which never round-trip through a tokenizer: the bench skips
    the usage-vs-retokenized comparison there (doc["usage_check"] says so) instead of flagging every request."""
    from llmrs.bench.bench import _synthetic

    assert _synthetic(model, models) is synthetic
