"""The package's layering, read from the source with `ast` (no module is imported):

- no import cycle among llmrs modules (static imports, function-level ones included);
- the engine (engine/, backends/, model/, server/) imports none of the toolkit (synth, roofline, bench, profiling,
  ptx, cli);
- no module but llmrs/envs.py reads os.environ or os.getenv (settings are read through llmrs.envs); setting another
  tool's variables (NCCL's) is allowed, passing an llmrs setting to child processes through os.environ is not.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "llmrs"
ENGINE = ("llmrs.engine", "llmrs.backends", "llmrs.model", "llmrs.server")
TOOLKIT = ("llmrs.synth", "llmrs.roofline", "llmrs.bench", "llmrs.profiling", "llmrs.ptx", "llmrs.cli")
ENV_READER = "llmrs.envs"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        out[_module_name(path)] = (path, ast.parse(path.read_text(), str(path)))
    return out


MODULES = _modules()


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _resolve(name: str) -> str | None:
    """The llmrs module an imported dotted name loads: itself, or its nearest enclosing module (`from
    llmrs.x import some_function` names llmrs.x.some_function, which is llmrs.x)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> dict[str, int]:
    """llmrs modules that `module` imports (anywhere in its body) -> the first line that does."""
    path, tree = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        target = _resolve(name) if name == "llmrs" or name.startswith("llmrs.") else None
        if target and target != module:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for alias in node.names:  # `from llmrs import synth` imports the module llmrs.synth
                add(f"{src}.{alias.name}", node.lineno)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_checker_sees_imports():
    assert set(GRAPH["llmrs.envs"]) == {"llmrs.errors"}  # `from llmrs.errors import UserError`
    assert {"llmrs.cli.synth", "llmrs.cli.serve"} <= set(GRAPH["llmrs.cli"])  # `from llmrs.cli import synth as ...`


def test_no_import_cycles():
    cycles = _cycles()
    detail = []
    for comp in cycles:
        members = set(comp)
        detail.append(" <-> ".join(comp) + "\n" + "\n".join(
            f"    {m}:{GRAPH[m][t]} imports {t}" for m in comp for t in sorted(GRAPH[m]) if t in members))
    assert not cycles, "import cycles:\n" + "\n".join(detail)


def test_engine_imports_no_toolkit():
    bad = [f"{MODULES[m][0].relative_to(PKG.parent)}:{line} imports {t}"
           for m in sorted(GRAPH) if _under(m, ENGINE)
           for t, line in sorted(GRAPH[m].items()) if _under(t, TOOLKIT)]
    assert not bad, "the engine imports the toolkit:\n" + "\n".join(bad)


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in ("environ", "environb") \
        and isinstance(node.value, ast.Name) and node.value.id == "os"


def _sets_another_tools_variables(node: ast.AST, parent: dict[ast.AST, ast.AST]) -> bool:
    """`os.environ.update(...)` as a statement, or `os.environ[KEY] = ...` with KEY not an LLMRS_ literal: a module
    may set another tool's variables for itself and its children (NCCL's, before NCCL starts). llmrs settings never
    travel through the environment that way."""
    up = parent.get(node)
    if isinstance(up, ast.Attribute) and up.attr == "update":
        call = parent.get(up)
        return isinstance(call, ast.Call) and call.func is up and isinstance(parent.get(call), ast.Expr)
    if isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Store):
        key = up.slice
        return not (isinstance(key, ast.Constant) and str(key.value).startswith("LLMRS_"))
    return False


def _environ_reads(tree: ast.Module) -> list[int]:
    """Lines that read the environment (os.environ, os.getenv, `from os import environ`) or pass an llmrs setting
    through it."""
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        if _is_os_environ(node) and not _sets_another_tools_variables(node, parent):
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in ("getenv", "getenvb") \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and not node.level \
                and any(a.name in ("environ", "environb", "getenv", "getenvb") for a in node.names):
            lines.append(node.lineno)
    return lines


def test_the_environment_checker_tells_reads_from_setting_another_tools_variables():
    reads = sorted(_environ_reads(ast.parse(
        "import os\n"
        "a = os.environ.get('X')\n"
        "b = os.getenv('X')\n"
        "os.environ['LLMRS_CUDA_GRAPHS'] = '0'\n"
        "c = dict(os.environ)\n"
        "os.environ.update(NCCL)\n"
        "os.environ['NCCL_NVLS_ENABLE'] = '0'\n")))
    assert reads == [2, 3, 4, 5]


def test_only_envs_reads_the_environment():
    bad = [f"{MODULES[m][0].relative_to(PKG.parent)}:{line}"
           for m in sorted(MODULES) if m != ENV_READER for line in sorted(set(_environ_reads(MODULES[m][1])))]
    assert not bad, "os.environ / os.getenv outside llmrs/envs.py (read settings through llmrs.envs):\n" + \
        "\n".join(bad)
