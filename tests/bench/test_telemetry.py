"""GPU telemetry (llmrs.bench.telemetry): the sampler process against a stand-in NVML with known readings, the
per-run summary, and a clean "no GPU" where NVML is absent."""

import time

import pytest

from llmrs.bench import series, telemetry


def test_the_sampler_writes_a_series_and_the_summary_folds_it(tmp_path):
    path = tmp_path / "run.telemetry.csv"
    with telemetry.Sampler(path, nvml_module="nvml_standin", interval_s=0.05) as s:
        assert s.active and s.why == "2 GPU(s)"
        t0 = time.perf_counter()
        deadline = t0 + 20.0
        while len(series.read_rows(path)) < 2 * 8 and time.perf_counter() < deadline:
            time.sleep(0.05)
        t1 = time.perf_counter()
    rows = series.read_rows(path)
    assert {int(r["gpu"]) for r in rows} == {0, 1}
    assert all(r["sm_mhz"] == 1980 and r["mem_mhz"] == 2619 for r in rows)
    assert all(r["temp_c"] is None for r in rows if r["gpu"] == 1)  # not given: empty, not 0
    win = [r for r in rows if t0 <= r["t"] <= t1]
    assert len(win) >= 2 * 6
    summary = telemetry.summarize(rows, t0, t1, output_tokens=7000)
    assert summary["gpus"] == 2 and summary["mean_power_w"] == pytest.approx(700.0)
    assert summary["peak_power_w"] == pytest.approx(700.0)
    # the counters' difference over the samples in the window: 700 J a second between the first and last sample
    ts = sorted({r["t"] for r in win})
    assert summary["energy_from"] == "counter"
    assert summary["energy_j"] == pytest.approx(700.0 * (ts[-1] - ts[0]), rel=0.05, abs=0.05)
    assert summary["output_tokens_per_joule"] == pytest.approx(7000 / summary["energy_j"])
    assert summary["throttle_reasons"] == ["sw_power_cap"]  # idle is no slowdown
    assert summary["peak_temp_c"] == 61 and summary["peak_mem_used_mib"] == pytest.approx(1001.0)


def test_energy_from_power_where_there_is_no_counter():
    rows = [{"t": t, "gpu": 0.0, "power_w": p, "energy_mj": None, "throttle": 0.0, "sm_mhz": 1500.0,
             "util_gpu_pct": 50.0, "mem_used_mib": 10.0, "temp_c": 50.0}
            for t, p in [(10.0, 100.0), (11.0, 300.0), (13.0, 300.0)]]
    s = telemetry.summarize(rows, 10.0, 13.0, output_tokens=800)
    # trapezoids: 1 s at (100+300)/2 + 2 s at 300 = 800 J
    assert s["energy_from"] == "power" and s["energy_j"] == pytest.approx(800.0)
    assert s["output_tokens_per_joule"] == pytest.approx(1.0)
    assert s["mean_power_w"] == pytest.approx(700 / 3) and s["peak_power_w"] == 300.0
    assert telemetry.summarize(rows, 20.0, 30.0, output_tokens=1) is None  # no sample in the window


def test_without_nvml_nothing_runs_and_the_reason_is_clear(tmp_path):
    s = telemetry.Sampler(tmp_path / "t.csv", nvml_module="no_such_nvml_module").start()
    assert not s.active and "NVML is not installed" in s.why and "nvidia-ml-py" in s.why
    s.stop()
    assert not (tmp_path / "t.csv").exists()


def test_throttle_bits_are_named():
    assert telemetry.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
