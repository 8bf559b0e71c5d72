"""The one definition of what a user sets: metrics, bounds, verdicts, probes, patches' gates.

Low in the layering (it imports nothing of speedtrap but ``_errors``): every stage, judge, figure
and command reads these types instead of declaring its own.

- ``Metric`` and the registry (``metric``, ``polarity``, ``metric_names``): name, phase, unit and
  which way is worse, for every figure a verdict or a ``--bound`` reads.
- ``Bound``: ``metric <= value`` or ``metric >= value``, with one rule for its value
  (``Bound.resolve``: explicit, else floor-derived, else ``DEFAULT_BOUND``).
- ``Verdict``: the manifest's ``[verdict]`` (a threshold rule on a ``Bound``, or recall_drop).
- ``Probe``: a union tagged on ``kind`` (divergence, recall, repeat, command), ``parse_probe``.
- ``Gate`` / ``GateKind``: how a patch is switched on.
- ``Platform``: the hardware a stack is served on (``--platform``, ``[target] platform``).
- ``manifest_schema``: the JSON Schema of the manifest's parts above (schemas/manifest.schema.json).

The pydantic parts (``Probe``, ``parse_probe``, ``manifest_schema``) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speedtrap._lazy import lazy_getattr
from speedtrap.spec._bound import DEFAULT_BOUND, DEFAULT_MARGIN, Bound, Floor
from speedtrap.spec._metric import (
    PHASES,
    POLARITIES,
    WORST_STATS,
    Metric,
    Polarity,
    is_known,
    metric,
    metric_names,
    polarity,
)
from speedtrap.spec._patch import Gate, GateKind
from speedtrap.spec._platform import Platform
from speedtrap.spec._verdict import RULES, Verdict

if TYPE_CHECKING:
    from speedtrap.spec._probe import CommandProbe, DivergenceProbe, Probe, RecallProbe, RepeatProbe, parse_probe
    from speedtrap.spec._schema import manifest_schema, manifest_schema_text

__all__ = [
    "DEFAULT_BOUND",
    "DEFAULT_MARGIN",
    "PHASES",
    "POLARITIES",
    "RULES",
    "WORST_STATS",
    "Bound",
    "CommandProbe",
    "DivergenceProbe",
    "Floor",
    "Gate",
    "GateKind",
    "Metric",
    "Platform",
    "Polarity",
    "Probe",
    "RecallProbe",
    "RepeatProbe",
    "Verdict",
    "is_known",
    "manifest_schema",
    "manifest_schema_text",
    "metric",
    "metric_names",
    "parse_probe",
    "polarity",
]

_LAZY = {
    "CommandProbe": "_probe",
    "DivergenceProbe": "_probe",
    "Probe": "_probe",
    "RecallProbe": "_probe",
    "RepeatProbe": "_probe",
    "parse_probe": "_probe",
    "manifest_schema": "_schema",
    "manifest_schema_text": "_schema",
}


__getattr__ = lazy_getattr(__name__, {name: f"speedtrap.spec.{module}" for name, module in _LAZY.items()})
