"""Compile one .cu file for one architecture: NVRTC -> PTX, then ptxas -v -> SASS resource usage.

The options mirror how the CUDA backend builds kernels at run time (cupy.RawModule over NVRTC): C++17, the
file's own directory and the pip CUDA headers on the include path. Templates produce code only when
instantiated, so each `// ptx-check: instantiate NAME<ARGS>` line becomes an NVRTC name expression.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llmrs.ptx.parse import PtxasInfo, PtxFunction, parse_ptx, parse_ptxas
from llmrs.ptx.toolchain import Toolchain, nvrtc_module

BASE_OPTIONS = ["-std=c++17"]


class CompileError(Exception):
    """The compiler rejected the source; carries its log (shown to the user, exit code 2)."""

    def __init__(self, path: Path, arch: str, stage: str, log: str) -> None:
        super().__init__(f"{path}: {stage} failed for {arch}")
        self.path, self.arch, self.stage, self.log = path, arch, stage, log


@dataclass(slots=True)
class Compiled:
    """PTX and ptxas results of one file for one arch."""

    ptx: str
    functions: list[PtxFunction]
    ptxas: dict[str, PtxasInfo]
    lowered: dict[str, str] = field(default_factory=dict)  # mangled -> name expression
    nvrtc_log: str = ""
    sass: str = ""  # nvdisasm's listing of the cubin, when asked (compile_file(..., nvdisasm=PATH))


def _check(result: tuple, what: str) -> tuple:  # type: ignore[type-arg]
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err}")
    return result[1:]


def _log(nvrtc, prog) -> str:  # type: ignore[no-untyped-def]
    (size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = _out_buffer(size)
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.split(b"\0", 1)[0].rstrip().decode(errors="replace")


def _out_buffer(size: int) -> bytes:
    """A fresh bytes object for NVRTC to write into.

    NOTE: never `b" " * size` alone: for size 1 (an empty log is just its NUL) CPython returns the interned
    one-byte b" ", and NVRTC writing its NUL into it corrupts every b" " in the process. One spare byte makes
    the object always new (CPython caches only bytes of length 0 and 1)."""
    return b" " * (size + 1)


def nvrtc_compile(path: Path, source: str, arch: str, tc: Toolchain, name_expressions: list[str],
                  extra_options: list[str]) -> tuple[str, dict[str, str], str]:
    """(ptx, mangled -> name expression, log) of `source` for `arch` ('sm_86'); CompileError on failure."""
    nvrtc = nvrtc_module()
    (prog,) = _check(nvrtc.nvrtcCreateProgram(source.encode(), path.name.encode(), 0, [], []),
                     "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
        opts = [f"--gpu-architecture=compute_{arch.removeprefix('sm_')}", *BASE_OPTIONS,
                f"-I{path.parent}", *(f"-I{d}" for d in tc.include_dirs), *extra_options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _log(nvrtc, prog)
        if int(err) != 0:
            raise CompileError(path, arch, "NVRTC", log or str(err))
        lowered = {}
        for expr in name_expressions:
            (name,) = _check(nvrtc.nvrtcGetLoweredName(prog, expr.encode()), f"nvrtcGetLoweredName({expr})")
            lowered[name.decode() if isinstance(name, bytes) else str(name)] = expr
        (size,) = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        buf = _out_buffer(size)
        nvrtc.nvrtcGetPTX(prog, buf)
        return buf.split(b"\0", 1)[0].decode(), lowered, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def run_ptxas(path: Path, ptx: str, arch: str, tc: Toolchain,
              nvdisasm: Path | None = None) -> tuple[dict[str, PtxasInfo], str]:
    """ptxas -v on the PTX for `arch`: (function -> resources, nvdisasm's listing of the cubin when `nvdisasm` is
    given, else ""). CompileError with the tool's log on failure."""
    from llmrs.ptx.sass import disassemble

    sass = ""
    with tempfile.TemporaryDirectory(prefix="llmrs-ptx-") as tmp:
        src, out = Path(tmp) / f"{path.stem}.ptx", Path(tmp) / f"{path.stem}.cubin"
        src.write_text(ptx)
        proc = subprocess.run([str(tc.ptxas), f"-arch={arch}", "-v", "-o", str(out), str(src)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode == 0 and nvdisasm is not None:
            try:
                sass = disassemble(out, nvdisasm)
            except RuntimeError as e:
                raise CompileError(path, arch, "nvdisasm", str(e)) from None
    log = proc.stderr + proc.stdout
    if proc.returncode != 0:
        raise CompileError(path, arch, "ptxas", log)
    return parse_ptxas(log), sass


def compile_file(path: Path, arch: str, tc: Toolchain, name_expressions: list[str],
                 extra_options: list[str], nvdisasm: Path | None = None) -> Compiled:
    """Both stages for one file and arch (and the SASS listing, with `nvdisasm`)."""
    source = path.read_text()
    ptx, lowered, log = nvrtc_compile(path, source, arch, tc, name_expressions, extra_options)
    info, sass = run_ptxas(path, ptx, arch, tc, nvdisasm)
    return Compiled(ptx=ptx, functions=parse_ptx(ptx), ptxas=info, lowered=lowered, nvrtc_log=log, sass=sass)


def demangle(names: list[str]) -> dict[str, str]:
    """mangled -> readable, through c++filt when it is installed (binutils); identity otherwise."""
    todo = [n for n in names if n.startswith("_Z")]
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not todo or not tool:
        return {}
    try:
        out = subprocess.run([tool], input="\n".join(todo), capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return {}
    return {m: d for m, d in zip(todo, out.splitlines()) if d}
