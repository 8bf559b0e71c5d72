"""Ranking and the plan: a patch's signals gathered, ranked into tiers with reasons, and written as a
diagnostic plan."""

from __future__ import annotations

from speedtrap.triage.ranking.init_manifest import InitResult, init_manifest
from speedtrap.triage.ranking.plan import render_plan
from speedtrap.triage.ranking.run import PatchReport, TriageReport, triage
from speedtrap.triage.ranking.signals import PatchSignals

__all__ = ["InitResult", "PatchReport", "PatchSignals", "TriageReport", "init_manifest", "render_plan", "triage"]
