"""common.cuh's early-load rules, checked in the SASS ptxas makes for sm_90 (no GPU: NVRTC, ptxas, nvdisasm as
`llmrs ptx-check --sass` runs them). Before session 18 ptxas had moved every matvec / gemv kernel's "before
pdl_wait" weight loads below `griddepcontrol.wait` (SASS ACQBULK): nothing streamed while the previous kernel drained.
Now the wait depends on a word of each early chunk (pdl_wait_on), so the main path issues them first; and x, which
the previous kernel writes, is read through the coherent path (ldx4 / ldx2), which ptxas does not hoist above it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmrs.roofline.ptx.compile import compile_file
from llmrs.roofline.ptx.toolchain import find_nvdisasm, find_toolchain

KERNELS = Path(__file__).resolve().parent.parent / "llmrs" / "kernels_cu"


def sass_of(cu: str, defines: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """kernel -> its SASS instructions (sm_90)."""
    c = compile_file(KERNELS / cu, "sm_90", find_toolchain(), [], [f"-D{d}" for d in defines],
                     nvdisasm=find_nvdisasm())
    out = {}
    for m in re.finditer(r"\.text\.([A-Za-z0-9_]+):", c.sass):
        seg = c.sass[m.end():]
        j = seg.find(".text.")
        seg = seg[: j if j > 0 else len(seg)]
        out[m.group(1)] = [ln.strip() for ln in seg.splitlines() if ln.strip().startswith("/*")]
    return out


def early_weight_loads(ins: list[str]) -> int:
    """Streamed (L1::no_allocate: LDG.E.NA) loads laid out before the kernel's last ACQBULK: the main path's early
    chunks (the other paths' waits come first in the layout)."""
    last = max(k for k, s in enumerate(ins) if "ACQBULK" in s)
    return sum(1 for s in ins[:last] if "LDG.E.NA" in s)


@pytest.fixture(scope="module")
def matvec():
    try:
        return sass_of("matvec.cu")
    except Exception as e:  # a machine without the CUDA compiler wheels
        pytest.skip(f"no sm_90 SASS here: {e}")


@pytest.mark.parametrize("kernel,early", [("matvec_bf16_t1", 4), ("matvec_silu_bf16_t1", 8),
                                          ("matvec_rope_bf16_t1", 8), ("matvec_silu_norm_bf16_t1", 8),
                                          ("matvec_rows_bf16_r16", 16), ("matvec_rows_bf16_r8", 8)])
def test_the_first_weight_chunks_go_out_before_the_wait(matvec, kernel, early):
    assert early_weight_loads(matvec[kernel]) >= early


def test_x_is_not_read_through_the_non_coherent_path(matvec):
    # the one-token matvec reads only weights (LDG.E.NA) and x: no 16-byte .CONSTANT load is left for x
    for k in ("matvec_bf16_t1", "matvec_rows_bf16_r16"):
        assert not [s for s in matvec[k] if "LDG.E.128.CONSTANT" in s], k


def test_the_old_code_had_none_before_the_wait():
    """-DLLMRS_NO_EARLY_LOADS (LLMRS_EARLY_LOADS=0) is the code before: ptxas sank the early loads."""
    try:
        old = sass_of("matvec.cu", ("LLMRS_NO_EARLY_LOADS",))
    except Exception as e:
        pytest.skip(f"no sm_90 SASS here: {e}")
    assert early_weight_loads(old["matvec_bf16_t1"]) == 0


def test_the_4bit_gemv_too():
    try:
        gemv = sass_of("gemm_q4.cu")
    except Exception as e:
        pytest.skip(f"no sm_90 SASS here: {e}")
    for k in ("gemv_q4z_c4", "gemv_q4z_t16_c4", "gemv_q4m_c4"):
        ins = gemv[k]
        last = max(i for i, s in enumerate(ins) if "ACQBULK" in s)
        assert sum(1 for s in ins[:last] if "LDG.E.NA.128" in s) >= 4, k  # the first batch of codes
        # x (8-byte loads) only after the wait
        assert not [s for s in ins[:last] if "LDG.E.64" in s], k
