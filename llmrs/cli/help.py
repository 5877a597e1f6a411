"""Plain `--help` for every llmrs command: nothing cut, nothing swallowed, types spelled out.

The app runs typer without rich help (rich_markup_mode=None on the app), so bracketed text such as `[ids]` or
`[default: ...]` is printed as written. On top of typer's plain help this module:
- wraps only at spaces: a flag name (`--gpu-memory-utilization`) or a default is never split at a hyphen or cut,
  a word longer than the line stays whole;
- names each option's value type as click does (INTEGER, FLOAT, TEXT, PATH, a choice as [a|b]) instead of
  typer's `<int>` / `<str>`, and an argument by its upper-case name (`[MODEL]`);
- lists each command in `llmrs --help` with its whole first paragraph, not one cut at the line's end;
- lists `--debug` (handled by llmrs.cli.main before parsing, anywhere on the line) among every command's options.

`use_plain_help(app)` installs it on the app and every command registered on it.
"""

from __future__ import annotations

import enum
import inspect
import textwrap
import types
import typing
from pathlib import PurePath
from typing import Any

import typer
import typer.core

try:  # newer typer vendors its own click; older ones use click itself
    from typer import _click as click  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the installed typer
    import click  # type: ignore[no-redef]

DEBUG_HELP = "Show the full traceback of an error instead of one line (accepted anywhere on the command line)."
MAX_WIDTH = 120  # help lines on a wide terminal; a narrower one gets its own width (at least 50)

_TYPE_NAMES = {int: "INTEGER", float: "FLOAT", str: "TEXT", bool: "BOOLEAN"}


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """Paragraphs (blank-line separated) re-flowed to `width`, breaking only at spaces. A paragraph that
    starts with a line holding just "\\b" (click's marker) keeps its lines as written."""
    out: list[str] = []
    for i, para in enumerate(p for p in text.split("\n\n") if p.strip()):
        if i:
            out.append("")
        lines = para.strip("\n").splitlines()
        if lines[0].strip() == "\b":
            out.extend(indent + ln.rstrip() for ln in lines[1:])
            continue
        out.extend(textwrap.wrap(" ".join(para.split()), max(width - len(indent), 10), initial_indent=indent,
                                 subsequent_indent=indent, break_on_hyphens=False, break_long_words=False))
    return out


class HelpFormatter(click.HelpFormatter):
    """click's formatter with the text wrapped at spaces only (see `wrap`)."""

    def __init__(self, indent_increment: int = 2, width: int | None = None, max_width: int | None = None) -> None:
        super().__init__(indent_increment, width, max_width or MAX_WIDTH)

    def write_text(self, text: str) -> None:
        self.write("\n".join(wrap(text, self.width, " " * self.current_indent)) + "\n")

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        rows = [(str(a), str(b or "")) for a, b in rows]
        if not rows:
            return
        first_col = min(max(len(a) for a, _ in rows), col_max) + col_spacing
        pad = " " * (self.current_indent + first_col)
        for first, second in rows:
            self.write(" " * self.current_indent + first)
            lines = wrap(second, max(self.width - self.current_indent - first_col, 20))
            if not lines:
                self.write("\n")
                continue
            if len(first) <= first_col - col_spacing:
                self.write(" " * (first_col - len(first)) + lines[0] + "\n")
                lines = lines[1:]
            else:  # a long option name: alone on its line, its help below
                self.write("\n")
            for ln in lines:
                self.write((pad + ln if ln else "") + "\n")


class Context(click.Context):
    formatter_class = HelpFormatter


def _annotation(param: Any) -> Any:
    desc = getattr(param, "type_descriptor", None)
    return getattr(desc, "annotation", None) if desc is not None else None


def type_name(param: Any) -> str:
    """The value's type as click names it: INTEGER, FLOAT, TEXT, PATH, BOOLEAN, or a choice as [a|b]."""
    ann = _annotation(param)
    if ann is None:  # click parameter types (typer before it vendored click)
        ptype = getattr(param, "type", None)
        choices = getattr(ptype, "choices", None)
        if choices:
            return "[" + "|".join(str(getattr(c, "value", c)) for c in choices) + "]"
        return str(getattr(ptype, "name", "TEXT")).upper()
    while True:  # Optional[X] / X | None / list[X] -> X
        origin = typing.get_origin(ann)
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if origin in (typing.Union, types.UnionType) and len(args) == 1:
            ann = args[0]
        elif origin in (list, tuple) and args:
            ann = args[0]
        else:
            break
    if inspect.isclass(ann):
        if issubclass(ann, enum.Enum):
            return "[" + "|".join(str(m.value) for m in ann) + "]"
        if issubclass(ann, PurePath):
            return "PATH"
        for base, name in _TYPE_NAMES.items():
            if issubclass(ann, base) and not (base is int and issubclass(ann, bool)):
                return name
        return ann.__name__.upper()
    return "TEXT"


def argument_name(param: Any) -> str:
    return param.metavar or (param.name or "ARG").upper()


def option_names(param: Any) -> str:
    """`-m, --model MODEL`, `--chat`, `--graphs / --no-graphs`."""
    def one(opts: list[str]) -> str:
        names = ", ".join(sorted(opts, key=lambda o: (o.startswith("--"), o)))
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            return names
        metavar = param.metavar or type_name(param)
        return f"{names} {metavar}" + ("..." if getattr(param, "nargs", 1) not in (1, None) else "")

    parts = [one(list(param.opts))]
    if param.secondary_opts:
        parts.append(one(list(param.secondary_opts)))
    return " / ".join(parts)


def help_records(cmd: Any, ctx: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(arguments, options) rows: names with types on the left, typer's help with its [default: ...] right."""
    args, opts = [], []
    for param in cmd.get_params(ctx):
        rec = param.get_help_record(ctx)
        if rec is None:
            continue
        if param.param_type_name == "argument":
            args.append((argument_name(param), rec[1]))
        else:
            opts.append((option_names(param), rec[1]))
    return args, opts


def _format_params(cmd: Any, ctx: Any, formatter: Any, debug: bool) -> None:
    args, opts = help_records(cmd, ctx)
    if debug and not any(name.startswith("--debug") for name, _ in opts):
        opts.insert(len(opts) - 1 if opts and opts[-1][0] == "--help" else len(opts), ("--debug", DEBUG_HELP))
    if args:
        with formatter.section("Arguments"):
            formatter.write_dl(args)
    if opts:
        with formatter.section("Options"):
            formatter.write_dl(opts)


def _usage_pieces(cmd: Any, ctx: Any) -> list[str]:
    """`[OPTIONS] [MODEL]`, `[OPTIONS] RESULTS...`: click's usage line with upper-case argument names."""
    rv = [cmd.options_metavar] if cmd.options_metavar else []
    for param in cmd.get_params(ctx):
        if param.param_type_name == "argument":
            name = argument_name(param) + ("..." if param.nargs != 1 else "")
            rv.append(name if param.required else f"[{name}]")
    return rv


class Command(typer.core.TyperCommand):
    """A command whose help is plain (see the module docstring)."""

    context_class = Context

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:  # usage errors name the argument as the help does: 'RESULTS', not 'results'
            if param.param_type_name == "argument" and param.metavar is None:
                param.metavar = argument_name(param)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_params(self, ctx, formatter, debug=True)


class Group(typer.core.TyperGroup):
    """The `llmrs` group: plain help, and every command's whole first paragraph in the list."""

    context_class = Context

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_params(self, ctx, formatter, debug=False)  # the group's own --debug is a real option
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            text = inspect.cleandoc(cmd.short_help or cmd.help or "").partition("\f")[0]
            rows.append((name, " ".join(text.split("\n\n", 1)[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def use_plain_help(app: typer.Typer) -> None:
    """Plain help on `app` and on every command registered on it so far (call it after the registrations)."""
    app.rich_markup_mode = None
    app.info.cls = Group
    for info in app.registered_commands:
        if info.cls is None or info.cls is typer.core.TyperCommand:
            info.cls = Command
