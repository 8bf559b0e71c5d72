"""The run directory: one contract for where each stage's output lies and how it is written.

Every stage writes its typed result here as a :class:`Part` (atomically, keyed by what it depends
on) and reads the others' through this module, never by knowing another stage's files::

    RUN/run.json                          the run: source, command, stage statuses (RunRecord)
    RUN/triage.json                       part "triage"
    RUN/probes/recall-<slug>.json         part "recall"
    RUN/probes/divergence-<slug>.json     part "divergence"
    RUN/isolate/                          isolate's run directory (read through speedtrap.isolate.load_trials)
    RUN/localize/layers-<slug>.json       part "layers"
    RUN/localize/scale-<slug>.json        part "scale"
    RUN/report.html, report.md, report.json, figures/
"""

from __future__ import annotations

from speedtrap.rundir._io import write_atomic
from speedtrap.rundir._layout import (
    ISOLATE_DIR,
    LOCALIZE_DIR,
    PROBES_DIR,
    RUN_FILE,
    RUN_SCHEMA_VERSION,
    STAGES,
    TRIAGE_FILE,
    Part,
    RunRecord,
    StageRecord,
    divergence_path,
    layers_path,
    load_part,
    load_run_record,
    now_iso,
    patches_slug,
    recall_path,
    save_part,
    scale_path,
    slug,
)
from speedtrap.rundir._source import Source

__all__ = [
    "ISOLATE_DIR",
    "LOCALIZE_DIR",
    "PROBES_DIR",
    "RUN_FILE",
    "RUN_SCHEMA_VERSION",
    "STAGES",
    "TRIAGE_FILE",
    "Part",
    "RunRecord",
    "Source",
    "StageRecord",
    "divergence_path",
    "layers_path",
    "load_part",
    "load_run_record",
    "now_iso",
    "patches_slug",
    "recall_path",
    "save_part",
    "scale_path",
    "slug",
    "write_atomic",
]
