"""Who was measured and on what: server identity (/v1/models, Server header), GPUs (pynvml), the client host."""

from __future__ import annotations

import os
import platform

import httpx

import llmrs


def server_identity(base_url: str, api_key: str | None = None) -> dict:
    """The server's /v1/models (ids, owners, max_model_len) and HTTP `server` header; {} fields when absent."""
    info: dict = {"url": base_url, "models": [], "server_header": None}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=10.0, trust_env=False) as c:
            r = c.get(f"{base_url.rstrip('/')}/v1/models", headers=headers)
            info["server_header"] = r.headers.get("server")
            if r.status_code == 200:
                info["models"] = [
                    {k: m.get(k) for k in ("id", "owned_by", "max_model_len", "root") if m.get(k) is not None}
                    for m in r.json().get("data", [])
                ]
            else:
                info["models_error"] = f"HTTP {r.status_code}"
    except (httpx.HTTPError, ValueError) as e:
        info["models_error"] = f"{type(e).__name__}: {e}"
    return info


def gpu_info() -> list[dict]:
    """Name, driver and memory of each NVIDIA GPU via pynvml (nvidia-ml-py); [] where there is none."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / no GPU
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "memory_gib": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1),
            })
        return out
    except Exception:  # noqa: BLE001 - partial NVML support: report nothing rather than crash a bench
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def client_host() -> dict:
    return {
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "llmrs_version": llmrs.__version__,
    }
