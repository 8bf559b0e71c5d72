"""Python rules: each module reads the old and the patched AST of one changed file for one kind of risky change."""

from __future__ import annotations

from speedtrap.triage.python.argument_dropped import dropped_arguments
from speedtrap.triage.python.argument_shifted import shifted_arguments
from speedtrap.triage.python.buffer_as_float import buffer_to_float
from speedtrap.triage.python.cuda_graph_state import GRAPH, cuda_graph
from speedtrap.triage.python.default_flipped import defaults_flipped
from speedtrap.triage.python.early_return_removed import EARLY_RETURN_REMOVED, early_returns_removed
from speedtrap.triage.python.guard_removed import guards_removed
from speedtrap.triage.python.inert import inert
from speedtrap.triage.python.inplace_in_loop import inplace_in_loop
from speedtrap.triage.python.kernel_indexing import KERNEL, kernel_indexing
from speedtrap.triage.python.precision_lowered import precision
from speedtrap.triage.python.precision_under_condition import precision_under_new_condition
from speedtrap.triage.python.scale_changed import scale
from speedtrap.triage.python.selection_changed import widened
from speedtrap.triage.python.selection_collapsed import Collapse, py_collapses, py_forced
from speedtrap.triage.python.slice_moved import VIEW, moved_slices
from speedtrap.triage.python.switch_read import gating
from speedtrap.triage.python.uninitialised_memory import MEMORY, uninitialised

__all__ = [
    "EARLY_RETURN_REMOVED",
    "GRAPH",
    "KERNEL",
    "MEMORY",
    "VIEW",
    "Collapse",
    "buffer_to_float",
    "cuda_graph",
    "defaults_flipped",
    "dropped_arguments",
    "early_returns_removed",
    "gating",
    "guards_removed",
    "inert",
    "inplace_in_loop",
    "kernel_indexing",
    "moved_slices",
    "precision",
    "precision_under_new_condition",
    "py_collapses",
    "py_forced",
    "scale",
    "shifted_arguments",
    "uninitialised",
    "widened",
]
