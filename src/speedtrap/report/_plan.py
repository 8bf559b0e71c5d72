"""Which figures a report has (one per recall run, two per divergence run, the trial log, two per
localized culprit), their ids, titles and reproduce commands, and drawing them once for every renderer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from speedtrap.report import _figures
from speedtrap.report._data import FigureRef, ReportData
from speedtrap.rundir import slug

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class PlannedFigure:
    ref: FigureRef
    draw: Callable[[], Figure]


def plan_figures(data: ReportData) -> list[PlannedFigure]:
    planned: list[PlannedFigure] = []
    seen: set[str] = set()

    def add(stem: str, title: str, section: str, command: str, draw: Callable[[], Figure]) -> None:
        fid, n = stem, 2
        while fid in seen:
            fid, n = f"{stem}-{n}", n + 1
        seen.add(fid)
        planned.append(PlannedFigure(FigureRef(fid, title, section, command), draw))

    for run in data.recall:
        add(
            f"recall-{slug(run.label)}",
            f"Recall heatmap: {run.label}",
            "probes",
            run.command,
            partial(_figures.recall_heatmap, run),
        )
    if len(data.recall) >= 2 and len({c.length for r in data.recall for c in r.cells}) >= 2:
        add(
            "recall-by-length",
            "Recall by prompt length: " + " vs ".join(r.label for r in data.recall),
            "probes",
            " && ".join(dict.fromkeys(r.command for r in data.recall if r.command)),
            partial(_figures.recall_by_length, data.recall),
        )
    for div in data.divergence:
        add(
            f"kl-{slug(div.label)}",
            f"KL divergence by position: {div.label}",
            "divergence",
            div.command,
            partial(_figures.kl_by_position, div),
        )
        add(
            f"top1-{slug(div.label)}",
            f"Same top-1 by position: {div.label}",
            "divergence",
            div.command,
            partial(_figures.same_top1_by_position, div),
        )
    iso = data.isolation
    if iso is not None and iso.trials:
        add("trials", "Isolation trial log", "isolation", iso.command, partial(_figures.trial_log, iso, iso.bound))
    for loc in data.localization:
        name = slug("-".join(loc.patches))
        if loc.layers is not None and loc.layers.growth:
            layers = loc.layers
            add(
                f"growth-{name}",
                f"Layer error growth: {' + '.join(loc.patches)}",
                "localization",
                layers.command,
                partial(_figures.layer_growth, layers, loc.patches),
            )
        if loc.scale is not None and loc.scale.rows:
            scale = loc.scale
            add(
                f"scale-{name}",
                f"Scale exponents: {' + '.join(loc.patches)}",
                "localization",
                scale.command,
                partial(_figures.scale_exponents, scale, loc.patches),
            )
    return planned


def with_figures(data: ReportData) -> ReportData:
    """``data`` with its figure list (ids, titles, reproduce commands) filled in from its sections."""
    return replace(data, figures=tuple(p.ref for p in plan_figures(data)))


@dataclass(frozen=True)
class DrawnFigure:
    ref: FigureRef
    png: bytes | None  # None when drawing failed (the error is in ``error``)
    error: str = ""


def draw_all(data: ReportData) -> list[DrawnFigure]:
    """Every planned figure as PNG bytes; a figure that cannot be drawn is reported, never raised."""
    out: list[DrawnFigure] = []
    for planned in plan_figures(data):
        try:
            fig = planned.draw()
            out.append(DrawnFigure(planned.ref, _figures.png(fig)))
        except Exception as exc:  # a figure of odd data must not cost the whole report
            out.append(DrawnFigure(planned.ref, None, f"{type(exc).__name__}: {exc}"))
    return out
