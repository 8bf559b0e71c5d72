"""C-family rules: C, C++ and CUDA files read on their token stream, one kind of risky change per module."""

from __future__ import annotations

from speedtrap.triage.cfamily.case_moved import case_moves
from speedtrap.triage.cfamily.hot_loop import c_hot_path
from speedtrap.triage.cfamily.precision_request import precision_changes
from speedtrap.triage.cfamily.scale_argument import argument_changes
from speedtrap.triage.cfamily.selection_collapsed import c_collapses
from speedtrap.triage.cfamily.switch_unset import switches_unset
from speedtrap.triage.cfamily.tokens import C_FAMILY, inert_c

__all__ = [
    "C_FAMILY",
    "argument_changes",
    "c_collapses",
    "c_hot_path",
    "case_moves",
    "inert_c",
    "precision_changes",
    "switches_unset",
]
