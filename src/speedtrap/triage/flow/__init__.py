"""Value flow and reachability: where a factor goes (callees, attributes, the sites that apply it), how
often a changed function runs, and which files the served model imports."""

from __future__ import annotations

from speedtrap.triage.flow.applied_count import count_warnings
from speedtrap.triage.flow.double_on_path import missing_applications, path_doubles
from speedtrap.triage.flow.factor_at_call import literal_changes
from speedtrap.triage.flow.hot_path import EVERY_LAYER, PER_STEP, SETUP, SOME_LAYERS, UNKNOWN, HotPath, HotPaths
from speedtrap.triage.flow.identity_by_statement import statement_identity_changes, statement_warnings
from speedtrap.triage.flow.model_reach import reachable
from speedtrap.triage.flow.resolve import Resolver
from speedtrap.triage.flow.sites import (
    ALPHA_CALLS,
    DIV_CALLS,
    MUL_CALLS,
    CountWarning,
    DoubleApplication,
    Site,
    TraceResult,
    double_applications,
    trace_tree,
)
from speedtrap.triage.flow.units import Units
from speedtrap.triage.flow.values import Flow, IdentityChange, identity_changes
from speedtrap.triage.flow.widened_factor_condition import widened_factor_warnings

__all__ = [
    "ALPHA_CALLS",
    "DIV_CALLS",
    "EVERY_LAYER",
    "MUL_CALLS",
    "PER_STEP",
    "SETUP",
    "SOME_LAYERS",
    "UNKNOWN",
    "CountWarning",
    "DoubleApplication",
    "Flow",
    "HotPath",
    "HotPaths",
    "IdentityChange",
    "Resolver",
    "Site",
    "TraceResult",
    "Units",
    "count_warnings",
    "double_applications",
    "identity_changes",
    "literal_changes",
    "missing_applications",
    "path_doubles",
    "reachable",
    "statement_identity_changes",
    "statement_warnings",
    "trace_tree",
    "widened_factor_warnings",
]
