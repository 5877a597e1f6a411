"""The kernel sources exactly as the CUDA backend hands them to CuPy (`kernels.kernel_source`: one string, headers
inlined, no include path) compile with NVRTC and define every entry point the backend looks up. Runs on the CPU with
the NVRTC wheel, so a header the backend fails to inline is caught without a GPU."""

from __future__ import annotations

import re

import pytest

from llmrs.backends.cuda import kernels as ck
from llmrs.ptx.compile import nvrtc_compile
from llmrs.ptx.toolchain import find_toolchain

FILES = [(f, "sm_90") for f in ck.ENTRY_POINTS] + [(f, a) for f in ck.ARCH_ENTRY_POINTS for a in ck.WGMMA_ARCH.values()]


def test_every_local_include_is_inlined():
    for name, _ in FILES:
        src = ck.kernel_source(name)
        assert not re.search(r'#include\s+"', src), f"{name}: a kernels_cu header is left to an include path"


@pytest.mark.parametrize("name,arch", FILES)
def test_the_source_cupy_compiles_defines_every_entry_point(tmp_path, name, arch):
    tc = find_toolchain()
    options = [*ck.options(), *ck.FILE_OPTIONS.get(name, ())]
    # a path in an empty folder: NVRTC gets no include path to the kernels, as with CuPy's RawModule
    ptx, _, _ = nvrtc_compile(tmp_path / name, ck.kernel_source(name), arch, tc, [], options)
    entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx))
    wanted = ck.ENTRY_POINTS.get(name) or ck.ARCH_ENTRY_POINTS[name]
    assert set(wanted) <= entries, f"{name}: missing {sorted(set(wanted) - entries)[:5]}"
