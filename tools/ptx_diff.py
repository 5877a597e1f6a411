"""Which kernels' PTX a change touches (no GPU): every .cu of two kernel trees (llmrs/kernels_cu of this checkout
and of another, e.g. `mkdir _base && git archive HEAD llmrs | tar -x -C _base`) compiled by NVRTC as `llmrs
ptx-check` does, each with its own tree's common.cuh, and each function (`.entry`, and `.func`: a device function
NVRTC did not inline) compared with comments stripped. A kernel whose PTX (and that of every `.func` it calls) is
byte-identical in both trees runs the same code, so the GPU tests a change needs are those of the kernels listed as
changed. It compares file by file: a kernel moved to another file shows as removed from one and added to the other.

    python -m tools.ptx_diff _base/llmrs/kernels_cu llmrs/kernels_cu [--arch sm_90 --arch sm_80] [-D NAME=1]

Prints one line per file and arch (identical, or the changed / added / removed functions) and exits 1 when any
differ.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmrs.ptx.compile import nvrtc_compile  # noqa: E402
from llmrs.ptx.parse import ptx_functions  # noqa: E402
from llmrs.ptx.toolchain import find_toolchain  # noqa: E402


def entry_hashes(ptx: str) -> dict[str, str]:
    """function name (entries and .funcs) -> a hash of its whole text (parse.ptx_functions) with // comments (file
    names, line numbers) removed."""
    text = re.sub(r"//[^\n]*", "", ptx)
    return {name: hashlib.sha1(whole.encode()).hexdigest() for _, name, _, whole in ptx_functions(text)}


def file_hashes(path: Path, arch: str, defines: list[str], tc=None) -> dict[str, str]:
    """entry_hashes of one .cu compiled for `arch` (its includes from its own folder)."""
    tc = tc or find_toolchain()
    ptx, _, _ = nvrtc_compile(path, path.read_text(), arch, tc, [], [f"-D{d}" for d in defines])
    return entry_hashes(ptx)


@dataclass
class FileDiff:
    name: str
    arch: str
    functions: int  # entries and .funcs in the tree after
    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not (self.changed or self.added or self.removed)

    def line(self) -> str:
        if self.identical:
            return f"{self.name:24s} {self.arch}  {self.functions:3d} functions  identical"
        parts = [f"{k} {len(v)}: {' '.join(v)}" for k, v in
                 (("changed", self.changed), ("added", self.added), ("removed", self.removed)) if v]
        return f"{self.name:24s} {self.arch}  {self.functions:3d} functions  " + "; ".join(parts)


def diff_trees(a: Path, b: Path, archs: list[str], defines: list[str] | None = None,
               files: list[str] | None = None) -> list[FileDiff]:
    """One FileDiff per .cu present in either tree and arch (b against a)."""
    tc = find_toolchain()
    names = files or sorted({p.name for p in a.glob("*.cu")} | {p.name for p in b.glob("*.cu")})
    out = []
    for name in names:
        for arch in archs:
            ha = file_hashes(a / name, arch, defines or [], tc) if (a / name).exists() else {}
            hb = file_hashes(b / name, arch, defines or [], tc) if (b / name).exists() else {}
            out.append(FileDiff(name, arch, len(hb),
                                changed=[k for k in hb if k in ha and ha[k] != hb[k]],
                                added=[k for k in hb if k not in ha],
                                removed=[k for k in ha if k not in hb]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="a kernels_cu folder (the tree before)")
    ap.add_argument("after", type=Path, help="a kernels_cu folder (the tree after)")
    ap.add_argument("--arch", action="append", help="sm_XX, repeatable (default sm_90)")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="a -D for both trees, repeatable")
    ap.add_argument("--file", action="append", help="only this .cu, repeatable")
    args = ap.parse_args()
    for d in (args.before, args.after):
        if not d.is_dir():
            print(f"ptx_diff: {d} is not a folder (expected a kernels_cu tree)", file=sys.stderr)
            return 2
    diffs = diff_trees(args.before, args.after, args.arch or ["sm_90"], args.defines, args.file)
    for d in diffs:
        print(d.line())
    return 0 if all(d.identical for d in diffs) else 1


if __name__ == "__main__":
    sys.exit(main())
