"""The Typer app, JSON output and the one-line error policy shared by every command."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from speedtrap._errors import SpeedtrapError

app = typer.Typer(
    name="speedtrap",
    help="Find the speed patch that broke your LLM: triage, probe, isolate, localize, report.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
check_app = typer.Typer(help="Checks of one configuration against its reference.", no_args_is_help=True)
app.add_typer(check_app, name="check")
probe_app = typer.Typer(help="Measure a configuration: planted-fact recall and divergence.", no_args_is_help=True)
app.add_typer(probe_app, name="probe")

# Progress bars and human text go to stderr; stdout carries JSON (or the human table).
err_console = Console(stderr=True)
out_console = Console()

P = ParamSpec("P")
R = TypeVar("R")


def emit_json(obj: Any) -> None:
    """Print one JSON object on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr; the message is plain text (``[ray]`` stays ``[ray]``)."""
    line = Text("error: ", style="bold red")
    line.append(message)
    err_console.print(line, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn a SpeedtrapError into one line on stderr and exit code 2."""

    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except SpeedtrapError as exc:
            raise fail(exc.one_line(), exc.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted; finished work is kept", 130) from None

    return wrapper


def main() -> None:
    app()
