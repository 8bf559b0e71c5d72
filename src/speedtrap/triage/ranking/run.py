"""Triage end to end: lay each patch on the tree, read its signals, trace factors, rank, report."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import UsageError
from speedtrap.patching import Gate
from speedtrap.spec import Platform
from speedtrap.triage.flow import (
    CountWarning,
    DoubleApplication,
    Flow,
    HotPaths,
    Site,
    TraceResult,
    Units,
    count_warnings,
    double_applications,
    missing_applications,
    path_doubles,
    reachable,
    statement_warnings,
    trace_tree,
    widened_factor_warnings,
)
from speedtrap.triage.platform import PlatformReach
from speedtrap.triage.ranking.rank import SAME_MATH, Ranking, gate_of, rank
from speedtrap.triage.ranking.signals import GUARD, SCALE, PatchSignals, analyze
from speedtrap.triage.source import ChangedFile, PatchInput, PatchSet, SourceIndex, lay_patch

NO_DIFF = "no diff given: nothing was read, so tier 3 is the default, not a finding"

_APPLYING = {"added", "moved", "guard changed", "identity removed", "identity condition changed"}


@dataclass
class PatchReport:
    patch: PatchInput
    files: list[ChangedFile]
    signals: PatchSignals
    gate: Gate
    gate_source: str
    ranking: Ranking
    doubles: list[DoubleApplication] = field(default_factory=list)
    added_sites: list[Site] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    counts: list[CountWarning] = field(default_factory=list)  # factors applied not at all, more often, ...

    @property
    def missing(self) -> list[str]:
        """The count warnings' messages."""
        return [c.message for c in self.counts]

    @property
    def name(self) -> str:
        return self.patch.name

    @property
    def tier(self) -> int:
        return self.ranking.tier

    def to_json(self) -> dict[str, Any]:
        return {
            **self.patch.to_json(),
            "tier": self.ranking.tier,
            "ranking": self.ranking.to_json(),
            "gate_used": {**self.gate.to_json(), "source": self.gate_source},
            "files": [f.to_json() for f in self.files],
            "signals": [s.to_json() for s in self.signals.signals],
            "hot_paths": [h.to_json() for h in self.signals.hot_paths],
            "phases": {"value": self.signals.phases, "guess": True},
            "double_applications": [d.to_json() for d in self.doubles],
            "count_warnings": [c.to_json() for c in self.counts],
            "notes": self.notes,
            "diff_given": bool(self.patch.diff),
        }


@dataclass
class TriageReport:
    label: str
    tree: str | None
    patches: list[PatchReport]  # in rank order
    trace: TraceResult | None
    elapsed_s: float
    warnings: list[str] = field(default_factory=list)

    def tier(self, n: int) -> list[PatchReport]:
        return [p for p in self.patches if p.tier == n]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.label,
            "tree": self.tree,
            "elapsed_s": round(self.elapsed_s, 3),
            "tiers": {str(t): [p.name for p in self.tier(t)] for t in (1, 2, 3)},
            "patches": [p.to_json() for p in self.patches],
            "trace": self.trace.to_json() if self.trace else None,
            "warnings": self.warnings,
        }


def merged_doubles(doubles: list[DoubleApplication]) -> list[DoubleApplication]:
    """One pair of sites is one claim, however many routes found it; the first claim about a site names every
    other site found applying the factor on its path (``also``), so one warning lists them all."""
    first: dict[tuple[str, str, str], DoubleApplication] = {}
    for d in doubles:
        first.setdefault((d.symbol, d.added.where, d.other.where), d)
    out: list[DoubleApplication] = []
    lead: dict[tuple[str, str], int] = {}
    for d in first.values():
        key = (d.symbol, d.added.where)
        if key not in lead:
            lead[key] = len(out)
            out.append(d)
            continue
        head = out[lead[key]]
        known = {head.other.where, *(s.where for s in head.also)}
        extra = tuple(s for s in (d.other, *d.also) if s.where not in known and s.where != head.added.where)
        out[lead[key]] = dataclasses.replace(head, also=(*head.also, *extra))
        out.append(d)
    return out


def triage(
    patch_set: PatchSet, symbol: str | None = None, model: str | None = None, platform: Platform | None = None
) -> TriageReport:
    """Rank the patches of ``patch_set``; with ``symbol``, also list every site of it in the tree; with
    ``model`` (a class name, a config.json or its folder; else the one ``patch_set`` names, such as a
    manifest's ``[target] model`` folder), rank the changes the served model can run first; with
    ``platform`` (else the one ``patch_set`` names, a manifest's ``[target] platform``), rank changes the
    platform cannot select (under ``if _is_hip:`` on cuda) below those it can."""
    start = time.perf_counter()
    platform = platform if platform is not None else patch_set.platform
    named_by_source = model is None and patch_set.model is not None
    model = model if model is not None else patch_set.model
    if symbol is not None and not symbol.isidentifier():
        raise UsageError(f"--symbol {symbol!r} is not a Python identifier", "pass a name such as routed_scaling_factor")
    tree = patch_set.tree
    if tree is not None and not Path(tree).is_dir():
        raise UsageError(
            f"source tree {str(tree)!r} is not a directory", "pass --tree with the directory the patches apply to"
        )
    index = SourceIndex(Path(tree)) if tree is not None else None
    warnings: list[str] = []
    if index is None:
        warnings.append("no source tree: signals are read from the diffs alone (no hot-path analysis, no factor trace)")
    if symbol and index is None:
        raise UsageError("--symbol needs the source tree", "pass --tree (or use --range/--target, which know it)")
    if model and index is None and named_by_source:
        warnings.append(f"the served model {model} is not used for reachability: no source tree")
        model = None
    if model and index is None:
        raise UsageError("--model needs the source tree", "pass --tree (or use --range/--target, which know it)")
    reach = reachable(index, model) if model and index is not None else None
    on_platform = PlatformReach(index, platform) if platform is not None and index is not None else None
    if platform is not None and index is None:
        warnings.append(f"the platform {platform} is not used for reachability: no source tree")
    base_sites: dict[str, list[Site]] = {}
    scanned = 0

    def sites_of(name: str) -> list[Site]:
        nonlocal scanned
        if name not in base_sites:
            assert index is not None
            base_sites[name], scanned = trace_tree(index, name)
        return base_sites[name]

    trace = TraceResult(symbol, sites_of(symbol), files_scanned=scanned) if symbol and index else None
    stacked: dict[str, str] = {}
    laid: dict[str, list[ChangedFile]] = {}  # a diff laid once: a commit split per role is one change, not two
    reports: list[PatchReport] = []
    for patch in patch_set.patches:
        notes: list[str] = []
        files: list[ChangedFile] = []
        if patch.diff:
            if patch.diff not in laid:
                laid[patch.diff] = lay_patch(patch.diff, patch.name, index, stacked, patch.file_hint)
            files = laid[patch.diff]
        if not patch.diff:
            notes.append("no diff: ranked on its gate alone")
        notes.extend(f"{f.path}: {f.note}" for f in files if f.note)
        post = index.with_overlay({f.path: f.new_text for f in files}) if index is not None else None
        units = Units(post) if post is not None else None
        flow = Flow(units.resolver) if units is not None else None
        sig = analyze(files, HotPaths(units) if units else None, symbol, flow)
        doubles: list[DoubleApplication] = []
        added_sites: list[Site] = []
        missing: list[CountWarning] = []
        if post is not None and index is not None:
            factors = {s.data["factor"] for s in sig.of(SCALE) if s.data.get("change") in _APPLYING}
            if symbol:
                factors.add(symbol)
            added_lines = {f.path: f.added for f in files if f.is_python and f.new_text is not None}
            for factor in sorted(factors):
                if not factor.isidentifier():
                    continue
                added, found = double_applications(
                    index, factor, patch.name, post, added_lines, units, sites_of(factor)
                )
                doubles.extend(found)
                if factor == symbol:
                    added_sites.extend(added)
            if flow is not None and units is not None and sig.identity:
                bases = {c.factor: sites_of(c.factor) for c in sig.identity if c.factor.isidentifier()}
                doubles = path_doubles(sig.identity, post, flow, units, bases, patch.name) + doubles
                missing = missing_applications(sig.identity, units, bases)
            doubles = merged_doubles(doubles)
            if units is not None:  # the calls on each route whose dispatch is not read, with their candidates
                resolver = units.resolver  # with no route known, the calls passing the factor that stopped one
                doubles = [
                    dataclasses.replace(
                        d,
                        unresolved=tuple(
                            resolver.unresolved_on(d.flow) if d.flow else resolver.unresolved_passing(d.symbol)[:3]
                        ),
                    )
                    for d in doubles
                ]
            if units is not None:
                changed = {f.path for f in files if f.is_python}
                missing += count_warnings(sig.of(SCALE), sig.identity, post, units, sites_of, changed, doubles)
                said = "\n".join([*(t for d in doubles for t in (d.message, *d.lines)), *(m.message for m in missing)])
                missing += statement_warnings(sig.identity, said)
                for factor in sorted({f for f in (symbol, *sig.factors) if f}):
                    missing += widened_factor_warnings(sig.of(GUARD), factor, post, units.resolver, sites_of, changed)
        gate, gate_source = gate_of(patch.gate, sig.detected_gate)
        ranking = rank(sig, gate, doubles, patch.declared)
        demoted = False
        if reach is not None and files:
            runs, words = reach.verdict([f.path for f in files])
            if not runs:  # code the served model never runs: below every change it can run
                ranking = ranking.with_reason(words, first=True, tier=min(3, ranking.tier + 1))
                demoted = True
            else:
                ranking = ranking.with_reason(words, first=False)
            notes.append(words)
        if on_platform is not None and files:
            selectable, words = on_platform.verdict(files, post)
            if selectable is False:  # code the served platform never selects: below every change it can run
                # one tier for code never run, whether the model or the platform (or both) says so
                tier = ranking.tier if demoted else min(3, ranking.tier + 1)
                ranking = ranking.with_reason(words, first=True, tier=tier)
            else:
                ranking = ranking.with_reason(words, first=False)
            notes.append(words)
        if not patch.diff:  # nothing was read, so nothing was found: say so instead of "same math"
            ranking = dataclasses.replace(ranking.without(SAME_MATH).with_reason(NO_DIFF, first=True), signal=False)
        reports.append(PatchReport(patch, files, sig, gate, gate_source, ranking, doubles, added_sites, notes, missing))
        if trace is not None:
            trace.added.extend(added_sites)
            trace.double_applications.extend(d for d in doubles if d.symbol == symbol)
    reports.sort(key=lambda r: (r.tier, -r.ranking.score))
    shown = patch_set.tree_label or (str(tree) if tree else None)
    return TriageReport(patch_set.label, shown, reports, trace, time.perf_counter() - start, warnings)
