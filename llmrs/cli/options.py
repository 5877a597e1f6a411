"""Options shared by several commands: one way to name a model (positional MODEL or --model, as vLLM)."""

from __future__ import annotations

from typing import Any, Optional

import typer

from llmrs.errors import UserError


def model_argument(help: str, show_default: Any = None) -> Any:
    """The positional MODEL (optional: --model names it too)."""
    return typer.Argument(None, metavar="MODEL", show_default=show_default, help=help)


def model_option(help: str = "Same as MODEL.") -> Any:
    """`--model M` / `-m M`, the same as the positional MODEL."""
    return typer.Option(None, "--model", "-m", metavar="MODEL", help=help)


def one_model(positional: Optional[str], option: Optional[str], default: Optional[str] = None) -> Optional[str]:
    """The model named by MODEL or --model (either; both only when they agree), else `default`."""
    if positional and option and positional != option:
        raise UserError(f"two models given: MODEL {positional!r} and --model {option!r}; give one of them")
    return positional or option or default
