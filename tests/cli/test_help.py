"""`--help` of every command can be copied from at any terminal width: every flag name whole, every help string
and default shown as written (no markup eaten, nothing cut), value types spelled out; `--version`, `--debug`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from llmrs.cli import app, main

ROOT = Path(__file__).resolve().parents[2]
COMMAND = typer.main.get_command(app)
COMMANDS = sorted(COMMAND.commands)
TYPES = re.compile(r"^(INTEGER|FLOAT|TEXT|PATH|BOOLEAN|MODEL|\[[\w|.-]+\])(\.\.\.)?$")


def norm(text: str) -> str:
    return " ".join(text.split())


def render(monkeypatch, capsys, columns: int, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    main([*args, "--help"])
    out = capsys.readouterr().out
    assert out.startswith("Usage: "), out[:200]
    return out


def records(name: str):
    """(param, help text as typer builds it, with its [default: ...]) of each parameter of command `name`."""
    cmd = COMMAND.commands[name]
    ctx = cmd.make_context(name, ["--help"], resilient_parsing=True)
    return [(p, p.get_help_record(ctx)[1]) for p in cmd.params if p.get_help_record(ctx) is not None]


def test_every_command_is_covered():
    assert {"generate", "chat", "info", "serve", "bench", "report", "gpus", "roofline", "profile", "ptx-check",
            "synth", "doctor"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_at_80_columns_shows_every_flag_whole_and_every_help_string_as_written(monkeypatch, capsys, name):
    out = render(monkeypatch, capsys, 80, name)
    flat = norm(out)
    too_long = [ln for ln in out.splitlines() if len(ln) > 80]
    assert not too_long, too_long
    assert not re.search(r"<(bool|int|str|float|path|Path)>", out), out
    for param, help_text in records(name):
        if param.param_type_name == "argument":
            assert (param.metavar or param.name.upper()) in out
        for flag in [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []:
            # whole: not followed by more of a name (a cut `--tensor-parallel-s…`) nor split at a hyphen
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), (flag, out)
        # the help string with its [default: ...] / [env var: ...] exactly as written: bracketed text
        # (`[ids]`, `[default: the model's]`) survives, no default is cut
        assert norm(help_text) in flat, (param.name, help_text)
        if param.param_type_name == "option" and not (param.is_flag or param.count):
            flag = max(param.opts, key=len)
            options = out.split("\nOptions:\n", 1)[1].splitlines()
            line = next(ln for ln in options  # the option's own row: `  -m, --model MODEL  ...`
                        if re.match(rf"  (--?[\w-]+, )*{re.escape(flag)}(?![\w-])", ln))
            after = line.split(flag, 1)[1].split()
            assert after and (after[0] == param.metavar or TYPES.match(after[0])), (param.opts, line)  # its type
    assert "--debug" in out and "--help" in out


@pytest.mark.parametrize("columns", [40, 200])
def test_flag_names_stay_whole_on_narrow_and_wide_terminals(monkeypatch, capsys, columns):
    for name in ("serve", "bench", "roofline"):
        out = render(monkeypatch, capsys, columns, name)
        for param, _ in records(name):
            for flag in [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []:
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), (columns, flag)


def test_the_issue_examples_render_as_written(monkeypatch, capsys):
    bench = norm(render(monkeypatch, capsys, 80, "bench"))
    assert '{"prompt": text or [ids], "output_len": N}' in bench
    serve = norm(render(monkeypatch, capsys, 80, "serve"))
    assert "[default: the model's]" in serve and "--tensor-parallel-size INTEGER" in serve
    assert "--enable-prefix-caching / --no-enable-prefix-caching" in serve
    assert "--gpu-memory-utilization FLOAT" in serve and "[default: 0.9]" in serve
    assert "serve [OPTIONS] [MODEL]" in serve


def test_top_level_help_lists_every_command_with_its_whole_summary_and_version_debug(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    main(["--help"])
    out = capsys.readouterr().out
    flat = norm(out)
    for name in COMMANDS:
        first = norm(COMMAND.commands[name].help.split("\n\n", 1)[0])
        assert f"{name} {first}" in flat, name
    assert "--version" in out and "--debug" in out and "traceback" in out
    assert "..." not in out.split("Commands:", 1)[1].replace("llama.cpp, ...", "")


def test_version_and_debug_through_the_real_command():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    from llmrs import __version__

    p = subprocess.run([sys.executable, "-m", "llmrs", "--version"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == f"llmrs {__version__}", p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-m", "llmrs", "serve", "--help"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0 and "--debug" in p.stdout and "--gpu-memory-utilization FLOAT" in p.stdout
    assert max(len(ln) for ln in p.stdout.splitlines()) <= 80
    # --debug anywhere: the traceback instead of the one line
    p = subprocess.run([sys.executable, "-m", "llmrs", "info", "/nonexistent/model", "--debug"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode != 0 and "Traceback" in p.stderr
    p = subprocess.run([sys.executable, "-m", "llmrs", "info", "/nonexistent/model"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("error: ")


def test_no_short_flag_means_two_things():
    """A short flag names the same long option in every command (bench's -c is --concurrency, nothing else's)."""
    meaning: dict[str, list[set[str]]] = {}
    for name in COMMANDS:
        for param in COMMAND.commands[name].params:
            if param.param_type_name != "option":
                continue
            longs = {o for o in param.opts if o.startswith("--")}
            for short in (o for o in param.opts if not o.startswith("--")):
                meaning.setdefault(short, []).append(longs)
    meaning["-o"] = [longs - {"--out-dir"} | {"--out"} for longs in meaning["-o"]]  # the output place everywhere
    two = {short: uses for short, uses in meaning.items() if not set.intersection(*uses)}
    assert two == {}
    assert set.intersection(*meaning["-c"]) == {"--concurrency"} and set.intersection(*meaning["-m"]) == {"--model"}
