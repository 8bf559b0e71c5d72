"""The CI regression gate: a build against a recording of a trusted one (``speedtrap check --against``)."""

from __future__ import annotations

from speedtrap.regress._build import build_config, launch_build, stop_url
from speedtrap.regress._check import (
    DEFAULT_BOUNDS,
    Bound,
    Check,
    GateResult,
    judge_divergence,
    judge_recall,
    junit_xml,
)
from speedtrap.regress._gate import GateRequest, GateRun, measure, run_gate
from speedtrap.regress._hunt import bisect_manifest, hunt_manifest, manifest_without_rule

__all__ = [
    "DEFAULT_BOUNDS",
    "Bound",
    "Check",
    "GateRequest",
    "GateResult",
    "GateRun",
    "bisect_manifest",
    "build_config",
    "hunt_manifest",
    "judge_divergence",
    "judge_recall",
    "junit_xml",
    "launch_build",
    "manifest_without_rule",
    "measure",
    "run_gate",
    "stop_url",
]
