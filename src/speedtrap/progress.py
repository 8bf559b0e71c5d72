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

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichBar
    from rich.progress import TaskID

__all__ = ["LineProgress", "LogProgress", "NoProgress", "Progress", "RichProgress", "for_console"]


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


class LogProgress:
    """For a log (stderr not a terminal: CI, ``2> log``): a timestamped line per step, with its detail and
    the time since the run began, and a "still working" line when ``heartbeat_s`` pass without one.
    Use as a context manager (the heartbeat thread runs inside it)."""

    def __init__(self, console: Console | None = None, heartbeat_s: float = 30.0) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.heartbeat_s = heartbeat_s
        self.began = time.monotonic()
        self.last = self.began
        self.counts: dict[str, int] = {}
        self.totals: dict[str, int | None] = {}
        self.current = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LogProgress:
        self._thread = threading.Thread(target=self._beat, name="speedtrap-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _line(self, text: str) -> None:
        with self._lock:
            now = time.monotonic()
            self.last = now
            self.console.print(f"[{now - self.began:7.1f} s] {text}", highlight=False, markup=False, soft_wrap=True)

    def _count(self, stage: str) -> str:
        total = self.totals.get(stage)
        return f"{self.counts.get(stage, 0)}/{total}" if total is not None else str(self.counts.get(stage, 0))

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat_s, 1.0)):
            if time.monotonic() - self.last >= self.heartbeat_s and self.current:
                self._line(f"{self.current} {self._count(self.current)}: still working")

    def start(self, stage: str, total: int | None, detail: str = "") -> None:
        self.counts.setdefault(stage, 0)
        self.totals[stage] = total
        self.current = stage
        self._line(f"{stage}: started" + (f" ({detail})" if detail else ""))

    def advance(self, stage: str, n: int = 1, detail: str = "") -> None:
        self.counts[stage] = self.counts.get(stage, 0) + n
        self.current = stage
        self._line(f"{stage} {self._count(stage)}" + (f": {detail}" if detail else ""))

    def done(self, stage: str, status: str, detail: str = "") -> None:
        self._line(f"{stage}: {status} {detail}".rstrip())


def for_console(console: Console) -> RichProgress | LogProgress:
    """Bars on a terminal; timestamped lines (:class:`LogProgress`) when stderr goes to a file or a pipe."""
    return RichProgress(console) if console.is_terminal else LogProgress(console)
