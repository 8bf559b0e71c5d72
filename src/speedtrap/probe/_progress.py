"""Progress bars on stderr (stdout carries JSON)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(enabled: bool, description: str, total: int, completed: int = 0) -> Iterator[Callable[[], None]]:
    """Yields ``advance()``; a rich progress bar on stderr when ``enabled``."""
    if not enabled:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total, completed=completed)
        yield lambda: bar.advance(task)
