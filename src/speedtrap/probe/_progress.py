"""A probe's progress, through the one progress protocol (``speedtrap.progress``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from speedtrap.progress import NoProgress, Progress, RichProgress


@contextmanager
def progress_bar(
    progress: Progress | bool, description: str, total: int, completed: int = 0
) -> Iterator[Callable[[], None]]:
    """Yields ``advance()``. ``progress`` is a :class:`Progress`, or ``True`` for a transient bar on
    stderr (the CLI's), ``False`` for none."""
    owned: Any = nullcontext()
    if progress is True:
        owned = RichProgress(transient=True)
        sink: Progress = owned
    elif progress is False:
        sink = NoProgress()
    else:
        sink = progress
    with owned:
        sink.start(description, total)
        if completed:
            sink.advance(description, completed)
        yield lambda: sink.advance(description)
        sink.done(description, "done")
