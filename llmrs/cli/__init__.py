"""The `llmrs` command: thin typer layer over the packages; user mistakes print one line and exit 2."""

from __future__ import annotations

import sys

from typing import Optional

import typer

from llmrs.cli.help import DEBUG_HELP, MAX_WIDTH, Group, use_plain_help
from llmrs.errors import UserError

app = typer.Typer(
    name="llmrs",
    help="LLM inference engine and benchmarking / roofline toolkit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: bracketed text shows as written (llmrs/cli/help.py)
    cls=Group,
    context_settings={"max_content_width": MAX_WIDTH},
)


def _version(value: bool) -> None:
    if value:
        from llmrs import __version__

        typer.echo(f"llmrs {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", is_eager=True, callback=_version,
                                           help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """LLM inference engine and benchmarking / roofline toolkit. `llmrs COMMAND --help` for each command."""

# Sub-packages register their commands here: each module exposes register(app).
# --- command registrations (one line per module) ---
from llmrs.cli import engine as cli_engine  # noqa: E402

cli_engine.register(app)
from llmrs.cli import roofline as roofline_cli  # noqa: E402
roofline_cli.register(app)
from llmrs.cli import bench as bench_cli  # noqa: E402
bench_cli.register(app)
from llmrs.cli import serve as server_cli  # noqa: E402
server_cli.register(app)
from llmrs.cli import synth as cli_synth  # noqa: E402
cli_synth.register(app)
from llmrs.cli import profile as cli_profile  # noqa: E402
cli_profile.register(app)
from llmrs.cli import plan as cli_plan; cli_plan.register(app)  # noqa: E402, E702
# --- end of command registrations ---
use_plain_help(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the app, turning UserError into one clear line on stderr and exit code 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        # standalone_mode=False returns a command's exit code instead of exiting: pass it on
        rc = app(args=args, standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except UserError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # click usage errors carry their own exit code
        if _is_click(e, "Exit"):
            sys.exit(e.exit_code)
        if _is_click(e, "ClickException"):  # a usage mistake: click's message and usage line, no traceback
            e.show()
            sys.exit(2)
        raise


def _is_click(e: BaseException, name: str) -> bool:
    """`e` is click's exception class `name`, or the same class of the click copy newer typer vendors
    (typer._click), which click's own isinstance checks do not see."""
    return any(c.__name__ == name and c.__module__ in ("click.exceptions", "typer._click.exceptions")
               for c in type(e).__mro__)


if __name__ == "__main__":
    main()
