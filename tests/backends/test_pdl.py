"""Programmatic dependent launch (PDL) on the CPU: the ctypes launch structures match CUDA's layout, kernel
arguments marshal as CuPy passes them, every kernel launched with the attribute keeps common.cuh's contract, and
the compiled PTX holds griddepcontrol on sm_90 only. (The launches themselves run in the GPU tests:
tests/backends/test_cuda_graphs.py.)"""

import ctypes
import re

import numpy as np
import pytest

from llmrs.backends.cuda import kernels as ck
from llmrs.ptx.compile import nvrtc_compile
from llmrs.ptx.toolchain import find_toolchain


def test_launch_structures_have_the_driver_layout():
    # CUlaunchConfig: 7 unsigned, then (8-aligned) the stream, the attribute pointer and their count: 56 bytes;
    # CUlaunchAttribute: the id, 4 bytes of padding, a 64-byte value union
    assert ctypes.sizeof(ck._LaunchConfig) == 56
    assert ck._LaunchConfig.hStream.offset == 32 and ck._LaunchConfig.attrs.offset == 40
    assert ctypes.sizeof(ck._LaunchAttr) == 72 and ck._LaunchAttr.value.offset == 8


class _Ptr:
    def __init__(self, p):
        self.ptr = p


class _DeviceArray:  # what kernel_params reads of a cupy.ndarray: .data.ptr
    def __init__(self, p):
        self.data = _Ptr(p)


def test_kernel_params_point_at_each_argument_in_its_c_type():
    args = (_DeviceArray(0x7F0000001000), np.int32(-7), np.float32(0.5), np.int64(1 << 40), np.uint64(0))
    arr, keep = ck.kernel_params(args)
    assert len(keep) == 5
    as_ = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_float, ctypes.c_int64, ctypes.c_uint64]
    got = [ctypes.cast(arr[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(as_)]
    assert got == [0x7F0000001000, -7, 0.5, 1 << 40, 0]


def test_launch_ex_passes_the_cluster_and_programmatic_attributes(monkeypatch):
    """What cuLaunchKernelEx receives: the grid, block and stream, then the attributes asked for in the driver's
    layout (programmatic stream serialization = 1; the cluster's dim3 in the value union's first three words)."""
    seen = {}

    class _Driver:
        def cuLaunchKernelEx(self, cfg_ref, fn, params, extra):
            cfg = ctypes.cast(cfg_ref, ctypes.POINTER(ck._LaunchConfig)).contents
            attrs = ctypes.cast(cfg.attrs, ctypes.POINTER(ck._LaunchAttr))
            seen["grid"] = (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ)
            seen["block"], seen["stream"] = (cfg.blockDimX, cfg.blockDimY), cfg.hStream
            seen["attrs"] = [(attrs[i].id, tuple(attrs[i].value[:3])) for i in range(cfg.numAttrs)]
            seen["fn"] = fn.value
            return seen.get("status", 0)

    monkeypatch.setattr(ck, "_driver", lambda: _Driver())
    raw = type("Raw", (), {"kernel": _Ptr(0x1234)})()
    ck.launch_ex(raw, (112, 4), (128,), (np.int32(1),), pdl=True, cluster=(1, 4, 1), stream=0x77)
    assert seen["grid"] == (112, 4, 1) and seen["block"] == (128, 1) and seen["stream"] == 0x77
    assert seen["fn"] == 0x1234
    assert seen["attrs"] == [(ck.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, (1, 0, 0)),
                             (ck.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (1, 4, 1))]
    ck.launch_ex(raw, 8, 32, (), cluster=(2, 1, 1), stream=0x77)
    assert seen["attrs"] == [(ck.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (2, 1, 1))]
    seen["status"] = 801
    with pytest.raises(RuntimeError, match="CUresult 801"):
        ck.launch_ex(raw, 8, 32, (), pdl=True, stream=0x77)


def test_kernel_params_refuse_python_numbers():
    with pytest.raises(TypeError, match="numpy scalars"):
        ck.kernel_params((3,))


def test_pdl_kernels_are_entry_points_of_files_that_wait():
    entry = {n: f for eps in (ck.ENTRY_POINTS, ck.ARCH_ENTRY_POINTS) for f, names in eps.items() for n in names}
    for name in ck.PDL_KERNELS:
        assert name in entry, f"{name} is not an entry point"
        src = ck.kernel_source(entry[name])
        assert "pdl_wait()" in src and "griddepcontrol.wait" in src, entry[name]


def _kernel_body(src: str, name: str) -> str:
    m = re.search(r'__global__ void (?:__launch_bounds__\([^)]*\)\s*)?' + re.escape(name) + r'\(', src)
    assert m, name
    i = src.index("{", m.end())
    return src[i:i + 400]


@pytest.mark.parametrize("fname", ["embedding.cu", "elementwise.cu", "rope_kv.cu"])
def test_plain_pdl_kernels_wait_before_their_first_statement(fname):
    """(rmsnorm.cu's kernels load their norm weight before the wait, as the matvecs their first
    weight chunks: tests/backends/test_early_loads.py counts what they load before it in the SASS.)"""
    src = (ck.KERNELS_DIR / fname).read_text()
    for name in ck.ENTRY_POINTS[fname]:
        if name in ck.PDL_KERNELS:
            body = _kernel_body(src, name)
            first = body[1:].strip().split("\n")[0]
            assert first == "pdl_enter();", f"{fname}:{name} starts with {first!r}"


@pytest.mark.parametrize("arch,expect", [("sm_80", False), ("sm_90", True)])
def test_griddepcontrol_is_compiled_for_hopper_only(arch, expect):
    tc = find_toolchain()
    path = ck.KERNELS_DIR / "matvec.cu"
    ptx, _, _ = nvrtc_compile(path, ck.kernel_source("matvec.cu"), arch, tc, [], [])
    assert ("griddepcontrol.wait" in ptx) is expect
    assert ("griddepcontrol.launch_dependents" in ptx) is expect


def test_pdl_is_off_when_the_environment_says_so(monkeypatch):
    monkeypatch.setenv("LLMRS_PDL", "0")
    assert ck.pdl_supported(object()) is False
