"""The verdict and its chain of evidence, written from the sections' figures (one sentence per stage)."""

from __future__ import annotations

from collections.abc import Sequence

from speedtrap._shapes import CulpritSet
from speedtrap.localize import scale_words
from speedtrap.report._bylength import length_patterns
from speedtrap.report._model import DivergenceRun, InteractionNote, RecallRun, ReportVerdict, TriageSection
from speedtrap.report._sites import compare, comparison_words
from speedtrap.report._stages import IsolationSection, Localization
from speedtrap.report._tables import fmt, patches_label


def _code(patches: Sequence[str]) -> str:
    return " + ".join(f"`{p}`" for p in patches) if patches else "no patch"


def _headline(iso: IsolationSection | None, culprits: Sequence[CulpritSet]) -> tuple[str, str]:
    if iso is None:
        return "unknown", "No isolation result: the culprit is not known yet (see Missing)."
    if iso.status == "found" and culprits:
        names = [patches_label(c.patches) for c in culprits]
        if len(culprits) == 1:
            c = culprits[0]
            together = " (only together)" if len(c.patches) > 1 else ""
            return "culprit", f"Culprit: {names[0]}{together}."
        return "culprit", f"{len(culprits)} culprit sets: {'; '.join(names)}."
    if iso.status == "found":
        return "inconclusive", iso.message or "Isolation found interactions but no culprit set."
    if iso.status == "baseline_fails":
        return "baseline_fails", "The baseline (no patch on) already fails: no patch is to blame."
    if iso.status == "full_passes":
        return "no_regression", "Every patch on still passes the probe: no regression to isolate."
    if iso.status == "incomplete":
        return "unknown", f"Isolation did not finish ({len(iso.trials)} trials stored): the culprit is not known yet."
    return "inconclusive", iso.message or f"Isolation ended {iso.status}."


def _triage_sentence(triage: TriageSection, blamed: Sequence[str]) -> str | None:
    """What triage read about the culprits; None when it read no diff of theirs (nothing to cite)."""
    rows = {r.name: r for r in triage.rows if r.diff_given}
    if not rows:
        return None
    hits = [rows[name] for name in blamed if name in rows]
    if blamed and not hits:
        return None
    if hits:
        parts = [f"`{r.name}` tier {r.tier} of {len(triage.rows)} patches" + _why(r.reasons) for r in hits]
        return "Triage (static reading of the diffs) ranked " + "; ".join(parts) + "."
    tier1 = [r.name for r in triage.tier(1)]
    return f"Triage ranked tier 1 (read and test first): {_code(tier1)}."


def _why(reasons: Sequence[str]) -> str:
    """Triage's first reason, cut to its first clause: "(replaces the 'not implemented' guard ...)"."""
    if not reasons:
        return ""
    text = reasons[0]
    cut = text.find(": ", 20)
    text = text[:cut] if cut > 0 else text
    return f" ({text[:157] + '...' if len(text) > 160 else text.rstrip('.')})"


def _recall_sentence(runs: Sequence[RecallRun]) -> str:
    parts = [f"{run.label} {run.overall.correct}/{run.overall.n} ({run.overall.accuracy:.0%})" for run in runs]
    text = "Planted-fact recall: " + ", ".join(parts)
    by_length = [p.sentence() for p in length_patterns(runs)]
    return text + (". By prompt length: " + " | ".join(by_length) if by_length else "") + "."


def _divergence_sentence(runs: Sequence[DivergenceRun]) -> str:
    parts = []
    for run in runs:
        phases = [
            f"{name} KL p99 {fmt(p.overall.kl_p99)} nats, same top-1 {fmt(p.overall.same_top1)}"
            for name, p in run.phases.items()
        ]
        parts.append(f"{run.label}: " + "; ".join(phases))
    return "Teacher-forced divergence from the baseline: " + " | ".join(parts) + "."


def _isolation_sentence(iso: IsolationSection) -> str:
    figures = {tuple(sorted(t.config)): t.figures.get(iso.metric) for t in iso.trials if t.status == "ok"}
    text = f"Isolation ran {len(iso.trials)} trials ({iso.launches} new, {iso.reused} from the store; {iso.rule})"
    found = []
    for c in iso.culprits:
        value = figures.get(tuple(sorted(c.patches)))
        shown = f" ({iso.metric} = {fmt(value)})" if value is not None else ""
        drop = "it alone fails" if len(c.patches) == 1 else "the set fails and dropping any one of them passes"
        commits = [
            f"commit {r.commits[0][:10]}: {r.subject}" for r in iso.commits if r.patch in c.patches and r.commits
        ]
        shown += f" ({'; '.join(commits)})" if commits else ""
        found.append(f"{_code(c.patches)}: {drop}{shown}")
    if found:
        text += ": " + "; ".join(found)
    elif iso.message:
        text += f": {iso.message.rstrip('.')}"
    return text + "."


def _layers_sentence(loc: Localization) -> str | None:
    lay = loc.layers
    if lay is None:
        return None
    if lay.first_divergent is None:
        return f"Layer diff of {_code(loc.patches)}: no module departs from the baseline above {fmt(lay.threshold)}."
    text = (
        f"Layer diff of {_code(loc.patches)} against the baseline: the first divergent module is "
        f"`{lay.first_divergent}` (rel_diff {fmt(lay.first_rel_diff)})"
    )
    growth = [g for g in lay.growth if g.rel_diff is not None]
    if len(growth) >= 2:
        text += f"; the error goes from {fmt(growth[0].rel_diff)} after layer {growth[0].layer} to "
        text += f"{fmt(growth[-1].rel_diff)} after layer {growth[-1].layer}"
    if loc.measured_on:
        text += f" (measured {loc.measured_on})"
    return text + "."


def _scale_sentence(loc: Localization) -> str | None:
    sc = loc.scale
    if sc is None or not sc.rows:
        return None
    text = f"Scale check of `{sc.param}` with {_code(loc.patches)}: {scale_words(sc.rows)}"
    if loc.base_scale is not None and loc.base_scale.rows:
        text += f"; in the base configuration: {scale_words(loc.base_scale.rows)}"
    if loc.measured_on:
        text += f" (measured {loc.measured_on})"
    return text + "."


def sites_sentence(loc: Localization, triage: TriageSection | None) -> str | None:
    """Triage's factor sites in the culprit's diffs beside the measured ones (None: a side has none)."""
    sc = loc.scale
    if sc is None or triage is None:
        return None
    static = [s for r in triage.rows if r.name in loc.patches for s in r.factor_sites]
    return comparison_words(compare(static, sc.rows, sc.param), sc.param)


def build_verdict(
    triage: TriageSection | None,
    recall: Sequence[RecallRun],
    divergence: Sequence[DivergenceRun],
    isolation: IsolationSection | None,
    localization: Sequence[Localization],
) -> ReportVerdict:
    culprits = isolation.culprits if isolation is not None else ()
    interactions: tuple[InteractionNote, ...] = isolation.interactions if isolation is not None else ()
    status, headline = _headline(isolation, culprits)
    blamed = [p for c in culprits for p in c.patches]
    evidence: list[str] = []
    said = _triage_sentence(triage, blamed) if triage is not None and triage.rows else None
    if said:
        evidence.append(said)
    if recall:
        evidence.append(_recall_sentence(recall))
    if divergence:
        evidence.append(_divergence_sentence(divergence))
    if isolation is not None:
        evidence.append(_isolation_sentence(isolation))
    for loc in localization:
        evidence += [s for s in (_layers_sentence(loc), _scale_sentence(loc), sites_sentence(loc, triage)) if s]
    return ReportVerdict(status, headline, tuple(culprits), interactions, tuple(evidence))
