"""Read compiler output: PTX entry functions and their local-memory instructions; ptxas -v resource lines.

PTX: each `.entry NAME(` (kernel) or `.func ... NAME(` (non-inlined device function) opens a body that ends
at its matching closing brace; inside it we count `ld.local`, `st.local` and the `__local_depot` size (the
per-thread local array the compiler allocated). ptxas -v prints per function:
    ptxas info    : Function properties for NAME
        128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 38 registers, used 0 barriers, 4096 bytes smem, 380 bytes cmem[0]
and, for a kernel whose wgmma (sm_90a) it could not pipeline, a note naming the function and the cause:
    ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to
                    CAUSE in the function 'NAME'
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_FUNC_RE = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)",
                      re.M)
_LD_LOCAL = re.compile(r"\bld\.local\b")
_ST_LOCAL = re.compile(r"\bst\.local\b")
_DEPOT = re.compile(r"\.local\s+\.align\s+\d+\s+\.b8\s+\w+\[(\d+)\]")


@dataclass(slots=True)
class PtxFunction:
    """Local-memory use of one function in the PTX."""

    name: str
    kind: str  # "entry" (a kernel) or "func" (a device function NVRTC did not inline)
    ld_local: int
    st_local: int
    local_depot_bytes: int


@dataclass(slots=True)
class PtxasInfo:
    """ptxas -v resource usage of one function for one architecture."""

    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    shared_bytes: int = 0
    barriers: int = 0
    wgmma_serialized: str = ""  # ptxas's cause where it serialized the function's wgmma (each waits for the last)


def _body(ptx: str, start: int) -> tuple[str, int]:
    """The text from `start` to the brace closing the first '{' after it, and the end offset."""
    open_at = ptx.find("{", start)
    if open_at < 0:
        return "", len(ptx)
    depth, i = 0, open_at
    while i < len(ptx):
        ch = ptx[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return ptx[open_at:i + 1], i + 1
        i += 1
    return ptx[open_at:], len(ptx)


def ptx_functions(ptx: str) -> Iterator[tuple[str, str, str, str]]:
    """(kind, name, body, whole text) of every entry and defined device function of a PTX module, in order: kind
    "entry" or "func", the body from its '{' to the matching '}', the whole text from the directive on (parameters
    included)."""
    for m in _FUNC_RE.finditer(ptx):
        # a declaration (prototype) ends in ';' before any '{'
        semi, brace = ptx.find(";", m.end()), ptx.find("{", m.end())
        if brace < 0 or (0 <= semi < brace and ".extern" in m.group(0)):
            continue
        body, end = _body(ptx, m.end())
        if body:
            yield m.group(1), m.group(2), body, ptx[m.start():end]


def parse_ptx(ptx: str) -> list[PtxFunction]:
    """Every entry and defined device function of a PTX module with its local-memory instruction counts."""
    return [PtxFunction(name=name, kind=kind, ld_local=len(_LD_LOCAL.findall(body)),
                        st_local=len(_ST_LOCAL.findall(body)),
                        local_depot_bytes=sum(int(x) for x in _DEPOT.findall(body)))
            for kind, name, body, _ in ptx_functions(ptx)]


_PROPS = re.compile(r"Function properties for ([\w$.]+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")
_COMPILING = re.compile(r"Compiling entry function '([\w$.]+)'")
_WGMMA_SERIAL = re.compile(r"wgmma\.mma_async instructions are serialized due to (.+?) in the function '([\w$.]+)'")


def parse_ptxas(log: str) -> dict[str, PtxasInfo]:
    """Function name -> resources, from `ptxas -v` output (its stderr)."""
    infos: dict[str, PtxasInfo] = {}
    current: str | None = None
    for line in log.splitlines():
        if m := _WGMMA_SERIAL.search(line):  # names its function: may come before that function's other lines
            infos.setdefault(m.group(2), PtxasInfo()).wgmma_serialized = m.group(1)
        elif m := _COMPILING.search(line):
            current = m.group(1)
            infos.setdefault(current, PtxasInfo())
        elif m := _PROPS.search(line):
            current = m.group(1)
            infos.setdefault(current, PtxasInfo())
        elif current and (m := _FRAME.search(line)):
            info = infos[current]
            info.stack_frame, info.spill_stores, info.spill_loads = (int(m.group(i)) for i in (1, 2, 3))
        elif current and (m := _USED.search(line)):
            info = infos[current]
            info.registers = int(m.group(1))
            if s := _SMEM.search(line):
                info.shared_bytes = int(s.group(1))
            if b := _BARRIERS.search(line):
                info.barriers = int(b.group(1))
    return infos


_DIRECTIVE = re.compile(r"//\s*ptx-check:\s*(instantiate|allow|options)\s+(.+?)\s*$", re.M)


@dataclass(slots=True)
class Directives:
    """What a .cu file declares for ptx-check in `// ptx-check: ...` comment lines."""

    instantiate: list[str]
    allow: list[str]
    options: list[str]


def parse_directives(source: str) -> Directives:
    """`// ptx-check: instantiate NAME<ARGS>` (a template instantiation to compile, one per line),
    `// ptx-check: allow NAME` (a kernel that may use local memory), `// ptx-check: options -DX=1 ...`."""
    d = Directives([], [], [])
    for kind, value in _DIRECTIVE.findall(source):
        if kind == "instantiate":
            d.instantiate.append(value)
        elif kind == "allow":
            d.allow.append(value)
        else:
            d.options.extend(value.split())
    return d
