"""`llmrs ptx-check` on fixture kernels through the real CLI, with NVRTC and ptxas from the pip wheels.

NOTE: no skips. Without the ptx extra (cuda-bindings, nvidia-cuda-nvrtc, nvidia-cuda-nvcc) these tests fail,
loudly, so CI cannot silently stop checking kernels.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrs.ptx.parse import parse_directives, parse_ptx, parse_ptxas
from llmrs.ptx.toolchain import find_toolchain

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "ptx"


def ptx_check(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "llmrs", "ptx-check", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_toolchain_comes_from_pip_wheels_not_a_system_cuda():
    tc = find_toolchain()
    assert tc.ptxas_origin == "pip", f"ptxas found at {tc.ptxas}; install nvidia-cuda-nvcc"
    assert "site-packages" in str(tc.ptxas)
    assert int(tc.nvrtc_version.split(".")[0]) >= 12
    assert tc.include_dirs and (tc.include_dirs[0] / "cuda_bf16.h").is_file()


def test_clean_kernel_passes_with_exit_0():
    p = ptx_check(str(FIX / "clean_matvec.cu"), "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    j = json.loads(p.stdout)
    assert j["archs"] == ["sm_80", "sm_86", "sm_89", "sm_90"]
    assert len(j["results"]) == 4
    for r in j["results"]:
        assert r["name"] == "matvec_bf16" and r["status"] == "ok"
        assert r["ld_local"] == r["st_local"] == r["spill_stores"] == r["spill_loads"] == 0
        assert r["registers"] > 0


def test_dynamically_indexed_local_array_is_flagged_with_exit_1():
    p = ptx_check(str(FIX / "local_array.cu"), "--arch", "sm_86", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    (r,) = json.loads(p.stdout)["results"]
    assert r["name"] == "histogram_local" and r["flagged"]
    assert r["ld_local"] > 0 and r["st_local"] > 0
    assert r["local_depot_bytes"] == 128  # float acc[32]
    assert r["stack_frame"] >= 128


def test_table_output_names_the_flagged_kernel():
    p = ptx_check(str(FIX / "local_array.cu"), str(FIX / "clean_matvec.cu"), "--arch", "sm_89", "--all")
    assert p.returncode == 1
    assert "histogram_local" in p.stdout and "LOCAL MEMORY" in p.stdout and "matvec_bf16" in p.stdout


def test_default_output_is_the_toolchain_what_is_not_clean_and_one_summary_line():
    """Without --all: the toolchain first, only the kernels that are not clean, then one summary line; progress
    on stderr as plain lines (not a terminal here)."""
    p = ptx_check(str(FIX / "local_array.cu"), str(FIX / "clean_matvec.cu"), "--arch", "sm_86,sm_89")
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].startswith("NVRTC ") and "ptxas" in lines[0]
    assert "histogram_local" in p.stdout and "LOCAL MEMORY" in p.stdout
    assert "matvec_bf16" not in p.stdout  # clean: only counted
    assert lines[-1].startswith("not clean: 4 kernel/arch pair(s) from 2 file(s) x 2 arch(s): 2 ok, 2 flagged (")
    assert "ptx-check: compiling 4 file/arch pair(s) on " in p.stderr and "ptx-check: 4/4 compiled in " in p.stderr
    clean = ptx_check(str(FIX / "clean_matvec.cu"), str(FIX / "templated.cu"), "--arch", "sm_86")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    out = clean.stdout.strip().splitlines()
    assert len(out) == 2 and out[0].startswith("NVRTC ")  # the toolchain and the summary, no table
    assert out[1].startswith("clean: 3 kernel/arch pair(s) from 2 file(s) x 1 arch(s), no local memory, no spills")


def test_parallel_compiles_give_the_same_results_in_the_same_order_as_one_process():
    files = [str(FIX / f) for f in ("templated.cu", "local_array.cu", "clean_matvec.cu", "register_spill.cu")]
    one = ptx_check(*files, "--arch", "sm_80,sm_89", "--json", "-j", "1")
    many = ptx_check(*files, "--arch", "sm_80,sm_89", "--json", "--jobs", "3")
    assert one.returncode == many.returncode == 1, one.stderr + many.stderr
    assert json.loads(one.stdout)["results"] == json.loads(many.stdout)["results"]
    assert "on 1 process(es)" in one.stderr and "on 3 process(es)" in many.stderr
    rows = [(r["file"].rsplit("/", 1)[-1], r["arch"]) for r in json.loads(many.stdout)["results"]]
    assert rows == sorted(rows, key=lambda fa: ([Path(f).name for f in files].index(fa[0]), fa[1]))
    assert ptx_check(*files[:1], "-j", "0").returncode == 2  # at least 1


def test_plain_progress_prints_a_line_every_few_seconds_and_a_bar_on_a_terminal():
    import io

    from rich.console import Console

    from llmrs.ptx.progress import CompileProgress

    now = [100.0]
    buf = io.StringIO()
    with CompileProgress(10, 2, console=Console(file=buf, width=200), every_s=5.0, clock=lambda: now[0]) as prog:
        for t, done in ((101, 1), (104, 3), (105.5, 4), (106, 5), (111, 9)):
            now[0] = t
            prog(done, 10, [("a.cu", "sm_86"), ("b.cu", "sm_90")])
        now[0] = 112
        prog(10, 10, [])
    assert buf.getvalue().splitlines() == [
        "ptx-check: compiling 10 file/arch pair(s) on 2 process(es)",
        "ptx-check: 4/10 compiled, 6 s (compiling a.cu sm_86, b.cu sm_90)",  # 5 s after the first line
        "ptx-check: 9/10 compiled, 11 s (compiling a.cu sm_86, b.cu sm_90)",
        "ptx-check: 10/10 compiled in 12 s",
    ]
    term = io.StringIO()
    with CompileProgress(4, 2, console=Console(file=term, force_terminal=True, width=120)) as prog:
        assert prog.bar is None  # started at the first update, after run_check forked its workers
        prog(1, 4, [("a.cu", "sm_86")])
        assert prog.bar is not None
        prog(4, 4, [])
    assert "compiling" in term.getvalue() and "4/4" in term.getvalue()  # the bar, drawn on the terminal


def test_allow_accepts_a_kernel_that_must_use_local_memory():
    p = ptx_check(str(FIX / "local_array.cu"), "--arch", "sm_86", "--allow", "histogram_*", "--json")
    assert p.returncode == 0, p.stdout
    assert json.loads(p.stdout)["results"][0]["status"] == "allowed"


def test_register_spills_seen_only_by_ptxas_are_flagged():
    p = ptx_check(str(FIX / "register_spill.cu"), "--arch", "sm_80", "--json")
    assert p.returncode == 1
    (r,) = json.loads(p.stdout)["results"]
    assert r["ld_local"] == 0 and r["st_local"] == 0  # the PTX is clean: virtual registers
    assert r["spill_stores"] > 0 and r["spill_loads"] > 0
    assert r["registers"] <= 32  # __launch_bounds__(1024, 2)


def test_templates_are_instantiated_from_declared_name_expressions():
    p = ptx_check(str(FIX / "templated.cu"), "--arch", "sm_90", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    names = sorted(r["name"] for r in json.loads(p.stdout)["results"])
    assert names == ["scale<double, 256>", "scale<float, 128>"]


def test_define_checks_a_kernels_variant_before_it_runs():
    """--define / -D passes a macro to NVRTC as nvcc's -D: the spilling tile (32 registers at 1024 x 2) is clean
    built for 256 threads and 1 block (up to 255 registers); the JSON names the defines."""
    clean = ptx_check(str(FIX / "register_spill.cu"), "--arch", "sm_80", "-D", "TILE_THREADS=256",
                      "--define", "TILE_MIN_BLOCKS=1", "--json")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    j = json.loads(clean.stdout)
    assert j["defines"] == ["TILE_THREADS=256", "TILE_MIN_BLOCKS=1"]
    (r,) = j["results"]
    assert r["registers"] > 32 and r["spill_stores"] == 0 and not r["flagged"]
    bad = ptx_check(str(FIX / "register_spill.cu"), "--arch", "sm_80", "-D", "-DX=1")
    assert bad.returncode == 2 and "--define" in bad.stderr and "Traceback" not in bad.stderr


def test_compile_error_exits_2_with_the_compiler_log():
    p = ptx_check(str(FIX / "broken.cu"), "--arch", "sm_86")
    assert p.returncode == 2
    assert "undeclared_value" in p.stdout and "compile error" in p.stdout


def test_no_files_and_no_kernels_says_so_and_exits_0(tmp_path):
    p = ptx_check(str(tmp_path))
    assert p.returncode == 0
    assert "no CUDA kernels to check" in p.stdout


def test_project_kernels_dir_is_the_default():
    """`llmrs ptx-check` as typed, on one arch (the four take minutes on two cores): every kernel of
    llmrs/kernels_cu/ clean, shown as the toolchain and one summary line, progress on stderr."""
    p = ptx_check("--arch", "sm_86")
    kernels = list((ROOT / "llmrs" / "kernels_cu").glob("*.cu"))
    assert kernels
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.strip().splitlines()
    assert out[0].startswith("NVRTC ") and len(out) == 2, p.stdout
    assert out[1].startswith(f"clean: ") and f"from {len(kernels)} file(s) x 1 arch(s)" in out[1]
    assert f"ptx-check: {len(kernels)}/{len(kernels)} compiled in " in p.stderr


def test_user_mistakes_exit_2_with_one_line():
    p = ptx_check("nope.cu")
    assert p.returncode == 2 and "no such file" in p.stderr
    p = ptx_check(str(Path(__file__)))  # a file that is not CUDA
    assert p.returncode == 2 and "not a CUDA source" in p.stderr and "compile error" not in p.stdout + p.stderr
    p = ptx_check(str(FIX / "clean_matvec.cu"), "--arch", "ampere")
    assert p.returncode == 2 and "--arch" in p.stderr
    # a well-formed name this NVRTC does not know: one line naming what it does know, no compiler logs
    p = ptx_check(str(FIX / "clean_matvec.cu"), "--arch", "sm_86,sm_99")
    assert p.returncode == 2 and "--arch sm_99: NVRTC" in p.stderr and "sm_86" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "compile error" not in p.stdout + p.stderr
    assert ptx_check(str(FIX / "clean_matvec.cu"), "--arch", "sm_90a").returncode == 0


def test_parsers_read_ptx_and_ptxas_output():
    ptx = """
.visible .entry k1(
    .param .u64 k1_param_0
)
{
    .local .align 4 .b8 __local_depot0[64];
    st.local.f32 [%rd1], %f1;
    ld.local.f32 %f2, [%rd1];
    ld.local.f32 %f3, [%rd1+4];
}
.func (.param .b32 r) helper(.param .b32 x)
{
    ret;
}
"""
    fns = {f.name: f for f in parse_ptx(ptx)}
    assert fns["k1"].kind == "entry" and fns["k1"].ld_local == 2 and fns["k1"].st_local == 1
    assert fns["k1"].local_depot_bytes == 64
    assert fns["helper"].kind == "func" and fns["helper"].ld_local == 0
    log = ("ptxas info    : Compiling entry function 'k1' for 'sm_90'\n"
           "ptxas info    : Function properties for k1\n"
           "    72 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 49152 bytes smem, 400 bytes cmem[0]\n")
    info = parse_ptxas(log)["k1"]
    assert (info.registers, info.spill_stores, info.spill_loads, info.stack_frame, info.shared_bytes,
            info.barriers) == (255, 8, 12, 72, 49152, 1)
    # the wgmma note names its function; it may come before that function's resource lines
    serial = ("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
              "to non wgmma instructions defining accumulator registers of a wgmma between start and end of the "
              "pipeline stage in the function 'gemm_q4wgz_s1' in line 27312\n")
    infos = parse_ptxas(serial + log.replace("'k1'", "'gemm_q4wgz_s1'").replace("for k1", "for gemm_q4wgz_s1"))
    assert infos["gemm_q4wgz_s1"].wgmma_serialized.startswith("non wgmma instructions defining accumulator")
    assert infos["gemm_q4wgz_s1"].registers == 255 and info.wgmma_serialized == ""
    d = parse_directives("// ptx-check: instantiate gemm<128, 64>\n//ptx-check: allow foo\n"
                         "// ptx-check: options -DTILE=8\n")
    assert d.instantiate == ["gemm<128, 64>"] and d.allow == ["foo"] and d.options == ["-DTILE=8"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_fixture_flags_hold_per_arch(arch):
    p = ptx_check(str(FIX / "local_array.cu"), str(FIX / "clean_matvec.cu"), "--arch", arch, "--json")
    res = {r["name"]: r for r in json.loads(p.stdout)["results"]}
    assert res["histogram_local"]["flagged"] and not res["matvec_bf16"]["flagged"]


def test_register_adds_the_commands_to_a_typer_app():
    import typer
    from typer.testing import CliRunner

    from llmrs.cli import roofline as roofline_cli

    app = typer.Typer()
    roofline_cli.register(app)
    runner = CliRunner()
    r = runner.invoke(app, ["ptx-check", str(FIX / "local_array.cu"), "--arch", "sm_86"])
    assert r.exit_code == 1
    r = runner.invoke(app, ["ptx-check", str(FIX / "clean_matvec.cu"), "--arch", "sm_86"])
    assert r.exit_code == 0 and "clean" in r.output
    r = runner.invoke(app, ["gpus", "--json"])
    assert r.exit_code == 0 and "rtx-a5000" in r.output


def test_sass_counts_instructions_and_the_main_loop():
    """--sass: nvdisasm (pip nvidia-cuda-nvdisasm) over ptxas's cubin; the matvec fixture's strided loop is its
    main loop (its loads and FMAs in it), a loop-free template has none (the trap BRA after EXIT is no loop)."""
    p = ptx_check(str(FIX / "clean_matvec.cu"), str(FIX / "templated.cu"), "--arch", "sm_86", "--sass", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    by_name = {r["name"]: r["sass"] for r in json.loads(p.stdout)["results"]}
    mv = by_name["matvec_bf16"]
    assert mv["instructions"] > mv["main_loop"] > 0 and mv["loops"][0][2] == mv["main_loop"]
    assert sum(n for _, n in mv["main_loop_mix"]) == mv["main_loop"]
    ops = dict(mv["main_loop_mix"])
    assert ops.get("LDG", 0) > 0 and ops.get("FFMA", 0) > 0 and ops.get("BRA", 0) >= 1
    assert mv["pdl_waits"] == 0 and mv["pre_wait_loads"] == 0  # (no PDL in the fixture: tests/backends/test_early_loads.py)
    flat = by_name["scale<float, 128>"]
    assert flat["instructions"] > 0 and flat["loops"] == [] and flat["main_loop"] == 0
    table = ptx_check(str(FIX / "clean_matvec.cu"), "--arch", "sm_90", "--sass")
    assert table.returncode == 0 and "main loop" in table.stdout and "FFMA" in table.stdout


def test_sass_without_nvdisasm_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMRS_NVDISASM": str(tmp_path / "nvdisasm")}
    p = subprocess.run([sys.executable, "-m", "llmrs", "ptx-check", str(FIX / "clean_matvec.cu"), "--sass"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "LLMRS_NVDISASM" in p.stderr and "Traceback" not in p.stderr


def test_wgmma_gemms_compile_clean_for_sm_90a():
    """gemm_q4_wgmma.cu's kernels (the 4-bit GEMM's Hopper form, K split over a cluster) exist only for the
    arch-specific target (`llmrs ptx-check`'s default archs compile empty bodies): built for sm_90a each
    holds its 8 wgmma a stage (gemm_q4w2: 4 of m64n256; HGMMA in the SASS main loop; for the 4-slice cluster the
    reduction loop is the larger one) without local memory, in at most 255 registers, and not serialized by
    ptxas (its C7515 note: each wgmma waiting for the one before, ~20% of the kernel's time)."""
    from llmrs.backends.cuda.kernels import ARCH_ENTRY_POINTS

    p = ptx_check(str(ROOT / "llmrs" / "kernels_cu" / "gemm_q4_wgmma.cu"), "--arch", "sm_90a", "--sass", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)["results"]}
    for name in ARCH_ENTRY_POINTS["gemm_q4_wgmma.cu"]:
        r = rows[name]
        assert not r["flagged"] and r["spill_stores"] == 0 and r["registers"] <= 255, r
        assert r["wgmma_serialized"] == "" and r["status"] == "ok", r
        # gemm_q4w2's stage: 4 m64n256 wgmma, half the decoding a multiply-add
        assert dict(r["sass"]["main_loop_mix"]).get("HGMMA") == (4 if "w2" in name else 8), r["sass"]


def test_serialized_wgmma_is_flagged_unless_allowed():
    """A kernel whose wgmma ptxas serialized is flagged (exit 1) as local memory is; --allow accepts it too."""
    from llmrs.ptx.check import KernelResult

    base = dict(file="k.cu", arch="sm_90a", name="g", mangled="g", kind="entry", ld_local=0, st_local=0,
                local_depot_bytes=0, registers=200, spill_stores=0, spill_loads=0, stack_frame=0, shared_bytes=0,
                uses_local=False, allowed=False)
    assert KernelResult(**base).status == "ok" and not KernelResult(**base).flagged
    ser = KernelResult(**base, wgmma_serialized="non wgmma instructions defining accumulator registers")
    assert ser.flagged and ser.status == "WGMMA SERIALIZED" and ser.to_dict()["flagged"]
    both = KernelResult(**{**base, "uses_local": True}, wgmma_serialized="x")
    assert both.status == "LOCAL MEMORY + WGMMA SERIALIZED"
    allowed = KernelResult(**{**base, "allowed": True}, wgmma_serialized="x")
    assert not allowed.flagged and allowed.status == "allowed"
