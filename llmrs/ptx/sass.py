"""SASS of a compiled kernel (nvdisasm over the cubin ptxas wrote): its instruction count, its loops and the
opcode mix of the biggest loop, for `llmrs ptx-check --sass`.

A kernel that is bound by its instructions rather than by memory (the 4-bit GEMV on the H200: 56% of the issue
slots for 33% of the DRAM bandwidth) is tuned by counting what its loop executes per unit of work; the PTX does not
show it (register moves, rematerialized constants and address arithmetic appear only after ptxas).

A loop is the span between a backward branch's target and the branch; the "main loop" is the longest one.
Instruction lines of nvdisasm look like `/*0830*/  @P1 IADD3 R37, P1, R2, 0x200, RZ ;`, labels `.L_x_379:` and
branches `BRA `(.L_x_371) ;`.

Programmatic dependent launch: `griddepcontrol.wait` is SASS `ACQBULK`. A kernel that loads data no earlier kernel
writes (weights) before it, so that the loads stream while the previous kernel drains, only gets that if ptxas leaves
them there: it may move a load below the wait, and a non-coherent one (`ld.global.nc`) above it. `pre_wait_loads`
counts the global loads (LDG) some path from the kernel's entry reaches without passing an ACQBULK (branches
followed, both ways where predicated): loads that may run before the wait, wanted for weights, a bug for anything
the previous kernel writes.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_FUNC = re.compile(r"^\.text\.(\S+):\s*$")
_LABEL = re.compile(r"^(\.L\w+):\s*$")
_INSTR = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;\s*(?:/\*.*)?$")
_TARGET = re.compile(r"`\((\.L\w+)\)")


@dataclass(slots=True)
class Instr:
    addr: int
    opcode: str  # the full mnemonic, e.g. IMAD.MOV.U32 (predicate dropped)
    text: str


@dataclass(slots=True)
class SassSummary:
    """One function: instructions, loops (start, end address, instructions), the main loop's opcode mix."""

    instructions: int
    loops: list[tuple[int, int, int]] = field(default_factory=list)
    main_loop: int = 0
    mix: list[tuple[str, int]] = field(default_factory=list)  # base opcode (IMAD.MOV kept apart), count
    pdl_waits: int = 0  # ACQBULK (griddepcontrol.wait) instructions
    pre_wait_loads: int = 0  # global loads (LDG) some path from the entry reaches before one of them

    def to_dict(self) -> dict:
        return {"instructions": self.instructions, "loops": [list(x) for x in self.loops],
                "main_loop": self.main_loop, "main_loop_mix": [list(x) for x in self.mix],
                "pdl_waits": self.pdl_waits, "pre_wait_loads": self.pre_wait_loads}


def parse_nvdisasm(text: str) -> dict[str, list[tuple[Instr | None, str | None]]]:
    """function -> its lines in order: (instruction, None) or (None, label)."""
    out: dict[str, list[tuple[Instr | None, str | None]]] = {}
    cur: list | None = None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        if cur is None:
            continue
        if line.lstrip().startswith(".") and not _LABEL.match(line):  # a directive
            if line.lstrip().startswith(".section"):
                cur = None  # a data section follows the code
            continue
        lm = _LABEL.match(line)
        if lm:
            cur.append((None, lm.group(1)))
            continue
        im = _INSTR.match(line)
        if im and not im.group(2).startswith("."):
            toks = im.group(2).split()
            op = toks[1] if toks[0].startswith("@") and len(toks) > 1 else toks[0]
            cur.append((Instr(int(im.group(1), 16), op, im.group(2)), None))
    return out


def _base(op: str) -> str:
    return "IMAD.MOV" if op.startswith("IMAD.MOV") else op.split(".")[0]


def summarize(lines: list[tuple[Instr | None, str | None]]) -> SassSummary:
    instrs = [i for i, _ in lines if i is not None]
    labels: dict[str, int] = {}
    pending: list[str] = []
    for ins, label in lines:  # a label names the address of the instruction after it
        if label is not None:
            pending.append(label)
        elif pending:
            for lab in pending:
                labels[lab] = ins.addr
            pending = []
    loops = []
    for ins in instrs:
        if ins.opcode.startswith("BRA"):
            t = _TARGET.search(ins.text)
            if t and t.group(1) in labels and labels[t.group(1)] < ins.addr:  # (not the BRA-to-self after EXIT)
                start = labels[t.group(1)]
                loops.append((start, ins.addr, sum(1 for i in instrs if start <= i.addr <= ins.addr)))
    loops = sorted(set(loops), key=lambda x: -x[2])
    s = SassSummary(instructions=len(instrs), loops=loops)
    s.pdl_waits = sum(1 for i in instrs if i.opcode.startswith("ACQBULK"))
    if s.pdl_waits:
        s.pre_wait_loads = _loads_before_wait(instrs, labels)
    if loops:
        start, end, n = loops[0]
        s.main_loop = n
        s.mix = Counter(_base(i.opcode) for i in instrs if start <= i.addr <= end).most_common()
    return s


_PRED = re.compile(r"^@(!?)(P\d)\s")
_WRITES_PRED = re.compile(r"^(?:@!?P\d\s+)?\S+\s+(P\d)\s*,")


def _loads_before_wait(instrs: list[Instr], labels: dict[str, int]) -> int:
    """LDG instructions some path from the entry reaches without passing an ACQBULK (module docstring). A path keeps
    what its predicated branches assumed of their predicate (until an instruction writes it), so that the two
    complementary waits of a predicated-wait idiom (`@P BRA over wait 1; wait 1; @!P BRA over wait 2; wait 2`) are
    not both skipped."""
    at = {ins.addr: k for k, ins in enumerate(instrs)}
    seen: set = set()
    reached: set[int] = set()
    todo: list[tuple[int, frozenset]] = [(0, frozenset())] if instrs else []
    while todo:
        k, known = todo.pop()
        if (k, known) in seen or k >= len(instrs):
            continue
        seen.add((k, known))
        reached.add(k)
        ins = instrs[k]
        if ins.opcode.startswith("ACQBULK"):
            continue
        w = _WRITES_PRED.match(ins.text)
        after = frozenset(x for x in known if x[0] != w.group(1)) if w else known
        pm = _PRED.match(ins.text)
        if ins.opcode.startswith("BRA"):
            t = _TARGET.search(ins.text)
            target = at.get(labels.get(t.group(1), -1)) if t else None
            if pm is None:
                if target is not None:
                    todo.append((target, after))
                continue
            reg, want = pm.group(2), pm.group(1) == ""  # the branch is taken when reg == want
            val = dict(known).get(reg)
            if target is not None and val in (None, want):
                todo.append((target, after | {(reg, want)}))
            if val in (None, not want):
                todo.append((k + 1, after | {(reg, not want)}))
        elif not (ins.opcode.startswith(("EXIT", "RET")) and pm is None):
            todo.append((k + 1, after))
    return sum(1 for k in reached if instrs[k].opcode.startswith("LDG"))


def disassemble(cubin: Path, nvdisasm: Path) -> str:
    """nvdisasm's listing of the cubin file ptxas wrote."""
    proc = subprocess.run([str(nvdisasm), str(cubin)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {proc.stderr.strip()[:500]}")
    return proc.stdout
