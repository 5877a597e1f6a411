"""Find NVRTC and ptxas in the pip-installed NVIDIA packages (no system CUDA, no GPU needed).

NVRTC: `cuda.bindings.nvrtc` (package cuda-bindings) loads libnvrtc from nvidia-cuda-nvrtc through
cuda-pathfinder. ptxas: the `bin/ptxas` of nvidia-cuda-nvcc (site-packages/nvidia/cu13/bin or, for CUDA 12
wheels, nvidia/cuda_nvcc/bin). $LLMRS_PTXAS overrides; a ptxas on PATH is the last resort and is reported.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from llmrs import envs
from llmrs.errors import UserError

INSTALL_HINT = "in the llmrs checkout: pip install -e '.[ptx]'  (cuda-bindings, nvidia-cuda-nvrtc, nvidia-cuda-nvcc)"


@dataclass(slots=True)
class Toolchain:
    """Where the compilers are and which versions they are."""

    nvrtc_version: str
    ptxas: Path
    ptxas_version: str
    ptxas_origin: str  # "pip" | "env" | "PATH"
    include_dirs: list[Path]


def _site_nvidia_dirs() -> list[Path]:
    """Every `nvidia/` namespace directory on sys.path (pip's NVIDIA wheels install there)."""
    out = []
    for entry in sys.path:
        p = Path(entry) / "nvidia"
        if p.is_dir():
            out.append(p)
    return out


def find_nvdisasm() -> Path:
    """nvdisasm (for `ptx-check --sass`): $LLMRS_NVDISASM, the pip wheel (nvidia-cuda-nvdisasm), then PATH;
    UserError naming the package when none."""
    env = envs.LLMRS_NVDISASM
    if env:
        if not Path(env).is_file():
            raise UserError(f"LLMRS_NVDISASM={env}: no such file")
        return Path(env)
    for nv in _site_nvidia_dirs():
        for cand in [*sorted(nv.glob("cu*/bin/nvdisasm")), nv / "cuda_nvdisasm" / "bin" / "nvdisasm"]:
            if cand.is_file():
                return cand
    which = shutil.which("nvdisasm")
    if which:
        return Path(which)
    raise UserError("nvdisasm not found (needed by --sass); in the llmrs checkout: pip install -e '.[ptx]' "
                    "(nvidia-cuda-nvdisasm)")


def find_ptxas() -> tuple[Path, str]:
    """(path, origin) of ptxas: $LLMRS_PTXAS, then the pip wheels, then PATH; UserError when none."""
    env = envs.LLMRS_PTXAS
    if env:
        if not Path(env).is_file():
            raise UserError(f"LLMRS_PTXAS={env}: no such file")
        return Path(env), "env"
    for nv in _site_nvidia_dirs():
        for cand in [*sorted(nv.glob("cu*/bin/ptxas")), nv / "cuda_nvcc" / "bin" / "ptxas"]:
            if cand.is_file():
                return cand, "pip"
    try:  # cuda-pathfinder knows the other layouts (conda, CUDA_HOME)
        from cuda.pathfinder import find_nvidia_binary_utility

        found = find_nvidia_binary_utility("ptxas")
        if found:
            return Path(found), "pip" if "site-packages" in str(found) else "PATH"
    except Exception:
        pass
    which = shutil.which("ptxas")
    if which:
        return Path(which), "PATH"
    raise UserError(f"ptxas not found; {INSTALL_HINT}")


def include_dirs() -> list[Path]:
    """CUDA headers shipped in the pip wheels (cuda_bf16.h, cuda_fp16.h, ...), for NVRTC's -I."""
    out = []
    for nv in _site_nvidia_dirs():
        for cand in [*sorted(nv.glob("cu*/include")), nv / "cuda_runtime" / "include", nv / "cuda_nvrtc" / "include"]:
            if (cand / "cuda_fp16.h").is_file() and cand not in out:
                out.append(cand)
    return out


def supported_archs() -> list[int]:
    """The sm_NN numbers this NVRTC compiles for (nvrtcGetSupportedArchs; empty where it cannot say)."""
    try:
        err, archs = nvrtc_module().nvrtcGetSupportedArchs()
    except (AttributeError, UserError):
        return []
    return [int(a) for a in archs] if int(err) == 0 else []


def nvrtc_module():  # type: ignore[no-untyped-def]
    """The cuda.bindings.nvrtc module, with libnvrtc loadable; UserError with the install hint otherwise."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # type: ignore[no-redef]  # cuda-python < 12.6 layout
        except ImportError:
            raise UserError(f"NVRTC not available (cuda-bindings missing); {INSTALL_HINT}") from None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # libnvrtc.so not found
        raise UserError(f"NVRTC library not loadable ({e}); {INSTALL_HINT}") from None
    return nvrtc


def find_toolchain() -> Toolchain:
    """Locate both compilers once; UserError (exit 2) naming what to install when either is missing."""
    nvrtc = nvrtc_module()
    _, major, minor = nvrtc.nvrtcVersion()
    ptxas, origin = find_ptxas()
    try:
        out = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError as e:
        raise UserError(f"{ptxas}: cannot run ({e}); {INSTALL_HINT}") from None
    version = next((ln.split("release", 1)[1].strip() for ln in out.splitlines() if "release" in ln), out.strip())
    return Toolchain(nvrtc_version=f"{major}.{minor}", ptxas=ptxas, ptxas_version=version, ptxas_origin=origin,
                     include_dirs=include_dirs())
