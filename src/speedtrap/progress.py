"""One progress protocol for every stage: probes, isolate, localize and the pipeline report through it.

A stage names a task, starts it with a total (``None`` when unknown), advances it and ends it::

    progress.start("recall", 24)
    progress.advance("recall", 1, "320 tokens")
    progress.done("recall", "done")

The library never draws: :class:`NoProgress` is the default, and the CLI passes a
:class:`RichProgress` (bars on stderr; stdout carries JSON). Task names and details are plain text,
never console markup (a patch named ``a[b]`` shows as ``a[b]``).
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichBar
    from rich.progress import TaskID

__all__ = ["LineProgress", "NoProgress", "Progress", "RichProgress"]


class Progress(Protocol):
    """Where long work says how far it is."""

    def start(self, stage: str, total: int | None, detail: str = "") -> None: ...

    def advance(self, stage: str, n: int = 1, detail: str = "") -> None: ...

    def done(self, stage: str, status: str, detail: str = "") -> None: ...


class NoProgress:
    """Says nothing (the library's default)."""

    def start(self, stage: str, total: int | None, detail: str = "") -> None:
        pass

    def advance(self, stage: str, n: int = 1, detail: str = "") -> None:
        pass

    def done(self, stage: str, status: str, detail: str = "") -> None:
        pass


class RichProgress:
    """One rich bar per task on stderr; use as a context manager (``transient``: bars vanish at the end)."""

    def __init__(self, console: Console | None = None, transient: bool = False) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar
        from rich.table import Column

        self.bar: RichBar = Bar(
            TextColumn("{task.description}", markup=False, table_column=Column(no_wrap=True, min_width=9)),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn(
                "{task.fields[note]}", markup=False, style="dim", table_column=Column(no_wrap=True, overflow="ellipsis")
            ),
            console=console or Console(stderr=True),
            transient=transient,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.bar.__exit__(kind, exc, tb)

    def _task(self, stage: str, total: int | None = None) -> TaskID:
        if stage not in self.tasks:
            self.tasks[stage] = self.bar.add_task(stage, total=total, note="")
        return self.tasks[stage]

    def start(self, stage: str, total: int | None, detail: str = "") -> None:
        task = self._task(stage, total)
        self.bar.update(task, total=total, note=detail)

    def advance(self, stage: str, n: int = 1, detail: str = "") -> None:
        self.bar.update(self._task(stage), advance=n, note=detail)

    def done(self, stage: str, status: str, detail: str = "") -> None:
        task = self._task(stage)
        total = self.bar.tasks[task].total
        if status == "done":
            completed = total if total is not None else self.bar.tasks[task].completed
            self.bar.update(task, total=completed or 1, completed=completed or 1, note="done")
        else:
            self.bar.update(task, total=total or 1, note=f"{status}: {detail}"[:80])


class LineProgress:
    """One plain line per step on stderr (for CI logs, where bars redraw badly)."""

    def __init__(self, console: Console | None = None, prefix: str = "  ") -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.prefix = prefix
        self.counts: dict[str, int] = {}

    def start(self, stage: str, total: int | None, detail: str = "") -> None:
        self.counts.setdefault(stage, 0)

    def advance(self, stage: str, n: int = 1, detail: str = "") -> None:
        self.counts[stage] = self.counts.get(stage, 0) + n
        if detail:
            self.console.print(f"{self.prefix}{stage} {self.counts[stage]}: {detail}", highlight=False, markup=False)

    def done(self, stage: str, status: str, detail: str = "") -> None:
        self.console.print(f"{self.prefix}{stage}: {status} {detail}".rstrip(), highlight=False, markup=False)
