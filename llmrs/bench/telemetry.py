"""GPU telemetry while a bench runs: NVML sampled every ~100 ms in a process of its own, as a CSV time series.

Each row is one GPU at one instant: `t` (time.perf_counter(): on Linux CLOCK_MONOTONIC, the clock the request
timings use, so the series lines up with them), SM and memory clocks (MHz), power (W), GPU and memory-controller
utilization (%), memory used (MiB), temperature (C), the clock-event (throttle) reasons as a bitmask, and the
driver's energy counter (mJ since it loaded; empty where the GPU has none). A value NVML will not give is left
empty; the sampler never stops a bench. The file is written row by row, so what was sampled survives any ending.

`summarize(rows, t0, t1, output_tokens)` folds one run's window into mean and peak power, energy (the energy
counter's difference where every GPU has one, else power integrated over time), output tokens per joule, mean SM
clock, peak memory and temperature, and the throttle reasons seen (idle left out: it is no slowdown).

The NVML module is named, not imported here: `pynvml` (nvidia-ml-py) normally; tests name a stand-in module.
"""

from __future__ import annotations

import csv
import importlib
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("t", "gpu", "sm_mhz", "mem_mhz", "power_w", "util_gpu_pct", "util_mem_pct", "mem_used_mib", "temp_c",
           "throttle", "energy_mj")
INTERVAL_S = 0.1

# NVML's clock-event reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*)
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NOT_A_SLOWDOWN = {"gpu_idle", "applications_clocks_setting", "display_clock_setting"}


def available(nvml_module: str = "pynvml") -> tuple[bool, str]:
    """(True, "N GPU(s)") where NVML answers and sees a GPU, else (False, why) in words a user can act on."""
    try:
        nvml = importlib.import_module(nvml_module)
    except ImportError:
        return False, "NVML is not installed (in the llmrs checkout: pip install -e '.[bench]', which brings nvidia-ml-py)"
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False, f"no NVIDIA driver or GPU here ({e})"
    try:
        n = nvml.nvmlDeviceGetCount()
        return (n > 0, f"{n} GPU(s)" if n > 0 else "NVML sees no GPU")
    except Exception as e:  # noqa: BLE001
        return False, f"NVML failed: {e}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _read(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - a field this GPU or driver does not give: left empty
        return None


def sample_once(nvml, handles: list) -> list[list]:
    """One row per GPU, at this instant."""
    now = time.perf_counter()
    rows = []
    for i, h in enumerate(handles):
        util = _read(nvml.nvmlDeviceGetUtilizationRates, h)
        mem = _read(nvml.nvmlDeviceGetMemoryInfo, h)
        power = _read(nvml.nvmlDeviceGetPowerUsage, h)
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        rows.append([
            f"{now:.6f}", i,
            _read(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
            _read(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
            None if power is None else round(power / 1000.0, 3),
            None if util is None else util.gpu,
            None if util is None else util.memory,
            None if mem is None else round(mem.used / 2**20, 1),
            _read(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
            _read(reasons_fn, h) if reasons_fn else None,
            _read(nvml.nvmlDeviceGetTotalEnergyConsumption, h),
        ])
    return rows


def _sample_loop(path: str, nvml_module: str, interval_s: float, stop, parent: int) -> None:
    """The sampler process: rows until `stop` is set or the bench that started it is gone."""
    nvml = importlib.import_module(nvml_module)
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            nxt = time.perf_counter()
            while not stop.is_set() and os.getppid() == parent:
                w.writerows(["" if v is None else v for v in row] for row in sample_once(nvml, handles))
                f.flush()
                nxt += interval_s
                stop.wait(max(0.0, nxt - time.perf_counter()))
    finally:
        nvml.nvmlShutdown()


@dataclass(slots=True)
class Sampler:
    """Samples NVML into `path` from start() to stop(); a context manager. Where NVML is not there, `why` says so
    and nothing runs (`active` False)."""

    path: Path
    nvml_module: str = "pynvml"
    interval_s: float = INTERVAL_S
    active: bool = False
    why: str = ""
    _proc: object = None
    _stop: object = None

    def start(self) -> Sampler:
        ok, why = available(self.nvml_module)
        self.why = why
        if not ok:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w", newline="") as f:
            csv.writer(f).writerow(COLUMNS)
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_sample_loop, daemon=True, name="llmrs-telemetry",
                                 args=(str(self.path), self.nvml_module, self.interval_s, self._stop, os.getpid()))
        self._proc.start()
        self.active = True
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        self._stop.set()
        self._proc.join(timeout=5.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5.0)
        self._proc = None

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def summarize(rows: list[dict], t0: float, t1: float, output_tokens: int) -> dict | None:
    """One run's window [t0, t1] of the series: None where no sample falls in it."""
    win = [r for r in rows if r["t"] is not None and t0 <= r["t"] <= t1]
    if not win:
        return None
    gpus = sorted({int(r["gpu"]) for r in win})
    by_t: dict[float, list[dict]] = {}
    for r in win:
        by_t.setdefault(r["t"], []).append(r)
    times = sorted(by_t)
    power = [sum(r["power_w"] for r in by_t[t] if r["power_w"] is not None) for t in times]
    have_power = any(r["power_w"] is not None for r in win)
    energy_j = None
    counters = {g: [r["energy_mj"] for r in win if int(r["gpu"]) == g and r["energy_mj"] is not None] for g in gpus}
    if all(len(c) >= 2 for c in counters.values()):
        energy_j = sum((c[-1] - c[0]) / 1000.0 for c in counters.values())
        energy_from = "counter"
    elif have_power and len(times) >= 2:
        energy_j = sum((times[k + 1] - times[k]) * (power[k] + power[k + 1]) / 2 for k in range(len(times) - 1))
        energy_from = "power"
    else:
        energy_from = None
    seen: set[str] = set()
    for r in win:
        if r["throttle"] is not None:
            seen.update(throttle_names(int(r["throttle"])))

    def mean(key: str) -> float | None:
        v = [r[key] for r in win if r[key] is not None]
        return sum(v) / len(v) if v else None

    def peak(key: str) -> float | None:
        v = [r[key] for r in win if r[key] is not None]
        return max(v) if v else None

    return {
        "gpus": len(gpus),
        "samples": len(times),
        "mean_power_w": sum(power) / len(power) if have_power else None,
        "peak_power_w": max(power) if have_power else None,
        "energy_j": energy_j,
        "energy_from": energy_from,
        "output_tokens_per_joule": output_tokens / energy_j if energy_j else None,
        "mean_sm_mhz": mean("sm_mhz"),
        "mean_util_gpu_pct": mean("util_gpu_pct"),
        "peak_mem_used_mib": peak("mem_used_mib"),
        "peak_temp_c": peak("temp_c"),
        "throttle_reasons": sorted(seen - NOT_A_SLOWDOWN),
    }
