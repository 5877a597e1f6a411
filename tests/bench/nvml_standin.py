"""A stand-in for pynvml with two GPUs whose readings are known: what llmrs.bench.telemetry samples in tests.

GPU i draws 300 + 100*i W, its energy counter grows by exactly that (in mJ per second since the module was
imported), its SM clock reads 1980 MHz, and from the second sample on GPU 1 reports a software power cap together
with the idle bit (idle is no slowdown). Temperature is not given by GPU 1 (NVMLError), as some boards do not.
"""

import time
from types import SimpleNamespace

NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
_T0 = time.perf_counter()
_reads = {0: 0, 1: 0}


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 2


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetClockInfo(h, which):
    return 1980 if which == NVML_CLOCK_SM else 2619


def nvmlDeviceGetPowerUsage(h):
    return (300 + 100 * h) * 1000  # mW


def nvmlDeviceGetTotalEnergyConsumption(h):
    return int((time.perf_counter() - _T0) * (300 + 100 * h) * 1000)  # mJ


def nvmlDeviceGetUtilizationRates(h):
    return SimpleNamespace(gpu=90 + h, memory=40)


def nvmlDeviceGetMemoryInfo(h):
    return SimpleNamespace(used=(1000 + h) * 2**20, total=80 * 2**30)


def nvmlDeviceGetTemperature(h, sensor):
    if h == 1:
        raise NVMLError("Not Supported")
    return 61


def nvmlDeviceGetCurrentClocksEventReasons(h):
    _reads[h] += 1
    return 0x4 | 0x1 if h == 1 and _reads[h] > 1 else 0
