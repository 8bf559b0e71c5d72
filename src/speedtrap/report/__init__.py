"""Report: one page a person reads (``report.html``, ``report.md``) and JSON a program reads (``report.json``).

::

    from speedtrap.report import load_report_data, write_report
    data = load_report_data(Path("speedtrap-runs/demo"))   # whatever the run directory holds
    paths = write_report(data, Path("speedtrap-runs/demo"))  # html, md (+ figures/), json
"""

from __future__ import annotations

from pathlib import Path

from speedtrap._shapes import CulpritSet as Culprit  # the report's name for it
from speedtrap.report import _commands as commands
from speedtrap.report._data import FigureRef, MissingPart, ReportData, RunInfo, StageInfo
from speedtrap.report._html import render_html
from speedtrap.report._json import report_schema, schema_errors, validate_report, write_json
from speedtrap.report._load import load_report_data
from speedtrap.report._markdown import render_markdown
from speedtrap.report._model import (
    SCHEMA_VERSION,
    DivergenceRun,
    RecallRun,
    ReportVerdict,
    TriageSection,
)
from speedtrap.report._plan import draw_all
from speedtrap.report._stages import IsolationSection, LayerSection, Localization, ScaleSection
from speedtrap.rundir import Part, RunRecord, Source, StageRecord, load_part, load_run_record, save_part, write_atomic

__all__ = [
    "SCHEMA_VERSION",
    "Culprit",
    "DivergenceRun",
    "FigureRef",
    "IsolationSection",
    "LayerSection",
    "Localization",
    "MissingPart",
    "Part",
    "RecallRun",
    "ReportData",
    "ReportPaths",
    "ReportVerdict",
    "RunInfo",
    "RunRecord",
    "ScaleSection",
    "Source",
    "StageInfo",
    "StageRecord",
    "TriageSection",
    "commands",
    "load_part",
    "load_report_data",
    "load_run_record",
    "render_html",
    "render_markdown",
    "render_run",
    "report_schema",
    "save_part",
    "schema_errors",
    "validate_report",
    "write_atomic",
    "write_json",
    "write_report",
]


class ReportPaths:
    """Where one rendering put the report's three files."""

    def __init__(self, html: Path, markdown: Path, json: Path) -> None:
        self.html = html
        self.markdown = markdown
        self.json = json


def write_report(data: ReportData, out_dir: Path) -> ReportPaths:
    """Render ``data`` into ``out_dir``: report.json (schema-checked first), report.md + figures/, report.html."""
    json_path = write_json(data, out_dir)  # validate before anything else is written
    figures = draw_all(data)
    md = render_markdown(data, out_dir, figures)
    page = render_html(data, out_dir, figures)
    return ReportPaths(page, md, json_path)


def render_run(run_dir: Path, out_dir: Path | None = None) -> tuple[ReportData, ReportPaths]:
    """Read ``run_dir`` (tolerating missing and half-written parts) and write its report (default: into it)."""
    data = load_report_data(run_dir)
    return data, write_report(data, out_dir if out_dir is not None else Path(run_dir))
