"""Run the check over files x architectures and decide what is flagged.

A function is flagged when its PTX has any `ld.local`/`st.local` (or a local depot), or ptxas reports spill
stores/loads: local memory is per-thread DRAM, and hot values there make a kernel several times slower.
`--allow NAME` (or `// ptx-check: allow NAME` in the file) accepts it for a kernel that must use local
memory. A stack frame alone (e.g. printf) is reported but not flagged. A kernel whose wgmma ptxas serialized
(sm_90a: each wgmma waits for the one before, a non-wgmma instruction may define their accumulators mid-pipeline)
is flagged too: it runs, correctly, at a fraction of its speed (gemm_q4wg on the H200: 7.3 -> 6.3 ms for a 7B's
4-bit linears at 128 tokens once fixed).
"""

from __future__ import annotations

import fnmatch
import multiprocessing
import os
import signal
import tempfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from llmrs.ptx.compile import CompileError, compile_file, demangle
from llmrs.ptx.parse import PtxasInfo, parse_directives
from llmrs.ptx.sass import SassSummary, parse_nvdisasm, summarize
from llmrs.ptx.toolchain import Toolchain

DEFAULT_ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]
KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels_cu"


@dataclass(slots=True)
class KernelResult:
    """One function of one file for one architecture."""

    file: str
    arch: str
    name: str  # readable: the name expression, the demangled or the extern "C" name
    mangled: str
    kind: str
    ld_local: int
    st_local: int
    local_depot_bytes: int
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_bytes: int
    uses_local: bool
    allowed: bool
    wgmma_serialized: str = ""  # ptxas's cause, where it serialized the kernel's wgmma
    sass: SassSummary | None = None  # with --sass: instructions, loops, the main loop's opcode mix

    @property
    def problems(self) -> list[str]:
        """What ptx-check flags in this kernel (before --allow)."""
        return [p for p, on in (("LOCAL MEMORY", self.uses_local), ("WGMMA SERIALIZED", bool(self.wgmma_serialized)))
                if on]

    @property
    def flagged(self) -> bool:
        return bool(self.problems) and not self.allowed

    @property
    def status(self) -> str:
        if not self.problems:
            return "ok"
        return "allowed" if self.allowed else " + ".join(self.problems)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["flagged"], d["status"] = self.flagged, self.status
        d["sass"] = None if self.sass is None else self.sass.to_dict()
        return d


@dataclass(slots=True)
class FileError:
    """A compile failure: which file, arch and stage, and the compiler's log."""

    file: str
    arch: str
    stage: str
    log: str


def discover(files: list[Path]) -> list[Path]:
    """The given files (directories expand to their *.cu), or every kernel in llmrs/kernels_cu/."""
    if not files:
        return sorted(KERNELS_DIR.glob("*.cu")) if KERNELS_DIR.is_dir() else []
    out: list[Path] = []
    for f in files:
        out.extend(sorted(f.glob("*.cu")) if f.is_dir() else [f])
    return out


def _allowed(names: list[str], patterns: list[str]) -> bool:
    bases = set(names) | {n.split("<", 1)[0].split("(", 1)[0] for n in names}
    return any(fnmatch.fnmatchcase(b, p) for p in patterns for b in bases)


def check_unit(path: Path, arch: str, tc: Toolchain, allow: list[str], options: list[str] | None = None,
               nvdisasm: Path | None = None) -> tuple[list[KernelResult], list[FileError]]:
    """Compile one file for one arch (with `options` after the file's own, e.g. -DNAME=VALUE); results per
    function (with their SASS summaries when `nvdisasm` is given), or the compile error."""
    d = parse_directives(path.read_text())
    patterns = [*allow, *d.allow]
    try:
        comp = compile_file(path, arch, tc, d.instantiate, [*d.options, *(options or [])], nvdisasm)
    except CompileError as e:
        return [], [FileError(file=str(path), arch=arch, stage=e.stage, log=e.log)]
    pretty = demangle([f.name for f in comp.functions])
    listing = parse_nvdisasm(comp.sass) if comp.sass else {}
    results = []
    for fn in comp.functions:
        info = comp.ptxas.get(fn.name, PtxasInfo())
        name = comp.lowered.get(fn.name) or pretty.get(fn.name) or fn.name
        uses = bool(fn.ld_local or fn.st_local or fn.local_depot_bytes or info.spill_stores or info.spill_loads)
        results.append(KernelResult(
            file=str(path), arch=arch, name=name, mangled=fn.name, kind=fn.kind, ld_local=fn.ld_local,
            st_local=fn.st_local, local_depot_bytes=fn.local_depot_bytes, registers=info.registers,
            spill_stores=info.spill_stores, spill_loads=info.spill_loads, stack_frame=info.stack_frame,
            shared_bytes=info.shared_bytes, uses_local=uses, allowed=_allowed([name, fn.name], patterns),
            wgmma_serialized=info.wgmma_serialized,
            sass=summarize(listing[fn.name]) if fn.name in listing else None,
        ))
    return results, []


def check_file(path: Path, archs: list[str], tc: Toolchain, allow: list[str],
               options: list[str] | None = None, nvdisasm: Path | None = None) -> tuple[list[KernelResult],
                                                                                       list[FileError]]:
    """`check_unit` for every arch of one file, one after the other."""
    results, errors = [], []
    for arch in archs:
        r, e = check_unit(path, arch, tc, allow, options, nvdisasm)
        results.extend(r)
        errors.extend(e)
    return results, errors


def _worker_init(scratch: str) -> None:
    """A worker and the ptxas it runs form a process group of their own, so the parent stops both at once
    (Ctrl-C, an error elsewhere) even in the middle of an NVRTC call; their temporary files go under the
    parent's `scratch` directory, removed by the parent whatever happens to the worker."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the parent's to handle
    tempfile.tempdir = scratch


def _stop(pool: ProcessPoolExecutor) -> None:
    """Kill every worker's process group (the worker and its ptxas) now."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # gone already
            pass


def default_jobs() -> int:
    """The CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# progress(done, total, running): after each finished unit and at least every few seconds while units run;
# `running` names the (file, arch) pairs being compiled
Progress = Callable[[int, int, list[tuple[str, str]]], None]


def run_check(files: list[Path], archs: list[str], tc: Toolchain, allow: list[str],
              options: list[str] | None = None, nvdisasm: Path | None = None, jobs: int = 1,
              progress: Progress | None = None, tick_s: float = 1.0) -> tuple[list[KernelResult], list[FileError]]:
    """Every file for every arch, over `jobs` processes; results in file, then arch order whatever the order the
    compiles finish in.

    Each (file, arch) pair is one job: NVRTC runs in the worker's process, ptxas as its child. The largest
    sources are submitted first so the last job to finish is a short one. Workers are forked where the platform
    can (no interpreter start or imports per worker: a spawned one re-imports the whole CLI first, about a
    second of CPU each); every worker is forked at the first submit, before `progress` is first called, so a
    caller that starts a display thread in its first call forks no threads."""
    units = [(f, a) for f in files for a in archs]
    done: dict[int, tuple[list[KernelResult], list[FileError]]] = {}
    jobs = max(1, min(jobs, len(units)))
    if jobs == 1:
        for i, (f, a) in enumerate(units):
            if progress:
                progress(i, len(units), [(f.name, a)])
            done[i] = check_unit(f, a, tc, allow, options, nvdisasm)
        if progress:
            progress(len(units), len(units), [])
    else:
        order = sorted(range(len(units)), key=lambda i: -units[i][0].stat().st_size)
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        scratch = tempfile.TemporaryDirectory(prefix="llmrs-ptx-check-")
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context(method),
                                   initializer=_worker_init, initargs=(scratch.name,))
        try:
            futures = {pool.submit(check_unit, units[i][0], units[i][1], tc, allow, options, nvdisasm): i
                       for i in order}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=tick_s, return_when=FIRST_COMPLETED)
                for fut in finished:
                    done[futures[fut]] = fut.result()
                if progress:
                    # the pool marks a job running once queued for a worker, a few ahead: the first `jobs` of
                    # them in submission order are the ones compiling
                    running = [futures[f] for f in futures if f in pending and f.running()][:jobs]
                    progress(len(done), len(units), sorted((units[i][0].name, units[i][1]) for i in running))
        except BaseException:  # Ctrl-C, or a worker's error: stop the compiles still running, now
            _stop(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            scratch.cleanup()
    results, errors = [], []
    for i in range(len(units)):
        r, e = done[i]
        results.extend(r)
        errors.extend(e)
    return results, errors
