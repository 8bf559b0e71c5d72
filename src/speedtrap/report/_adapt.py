"""From each stage's own JSON (``to_json()`` of triage, probe, isolate and localize results) to the
report's sections. Reading JSON, not live objects, lets ``speedtrap report`` render any run directory;
a document that lacks what a section needs raises ``KeyError``/``TypeError``/``ValueError``, which
the run-directory loader turns into a line of the report's "Missing" section."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from speedtrap._shapes import CulpritSet, LayerGrowth
from speedtrap.probe import LengthStop
from speedtrap.report._model import (
    PHASE_ORDER,
    DivergenceRun,
    InteractionNote,
    RecallRun,
    TriageRow,
    TriageSection,
    _f,
    pooled_cell,
    shown_cell,
    shown_phase,
)
from speedtrap.report._sites import static_sites
from speedtrap.report._stages import (
    CommitRow,
    IsolationSection,
    LayerSection,
    ScaleSection,
    shown_judgement,
    shown_scale_unit,
    shown_trial,
)


def _gate_words(gate: Mapping[str, Any]) -> str:
    kind = str(gate.get("kind", ""))
    pairs = [f"{k}={v}" for section in ("env", "config") for k, v in (gate.get(section) or {}).items()]
    pairs += [str(a) for a in gate.get("args") or []]
    return f"{kind}: {', '.join(pairs)}" if pairs else kind or "-"


def triage_section(doc: Mapping[str, Any], plan_markdown: str = "", command: str = "") -> TriageSection:
    rows = []
    for p in doc["patches"]:
        ranking = p.get("ranking") or {}
        declared = p.get("declared") or {}
        phases = declared.get("phases") or (p.get("phases") or {}).get("value") or []
        if isinstance(phases, str):
            phases = [phases]
        rows.append(
            TriageRow(
                name=str(p["name"]),
                tier=int(p.get("tier", ranking.get("tier", 3))),
                score=float(ranking.get("score", 0.0)),
                kind=str(declared.get("kind", "")),
                gate=_gate_words(p.get("gate_used") or p.get("gate") or {}),
                scope=str(declared.get("scope", "")),
                phases=tuple(str(x) for x in phases),
                reasons=tuple(str(r) for r in ranking.get("reasons", [])),
                diff_given=bool(p.get("diff_given", True)),
                factor_sites=static_sites(p),
            )
        )
    return TriageSection(
        str(doc.get("source", "")), tuple(rows), plan_markdown, tuple(str(w) for w in doc.get("warnings", [])), command
    )


def recall_run(label: str, patches: tuple[str, ...], doc: Mapping[str, Any], command: str = "") -> RecallRun:
    cells = tuple(shown_cell(dict(c)) for c in doc["cells"])
    overall = doc.get("overall")
    # an older report without the pooled figures: pool the cells
    summary = pooled_cell(cells) if overall is None else shown_cell(dict(overall), pooled=True)
    stops = tuple(LengthStop.from_json(dict(s)).sentence() for s in doc.get("stops", []))
    return RecallRun(label, patches, summary, cells, command, stops)


def divergence_run(label: str, patches: tuple[str, ...], doc: Mapping[str, Any], command: str = "") -> DivergenceRun:
    phases = doc["phases"]
    items = phases.items() if isinstance(phases, Mapping) else ((p["phase"], p) for p in phases)
    out = sorted(
        ((str(name), shown_phase(dict(phase))) for name, phase in items), key=lambda x: PHASE_ORDER.get(x[0], 2)
    )
    return DivergenceRun(label, patches, dict(out), command, str(doc.get("reading") or ""))


def rule_words(rule: Mapping[str, Any]) -> tuple[str, str, float | None]:
    """The verdict rule in words, the figure it reads and its bound (for the trial-log figure)."""
    metric = str(rule.get("metric", ""))
    bound = rule.get("bound")
    kind = str(rule.get("rule", rule.get("kind", "")))
    direction = str(rule.get("direction", "above"))
    if bound is not None:
        sign = ">" if direction == "above" else "<"
        words = f"fail when {metric} {sign} {float(bound):g}"
        if rule.get("near"):
            words += f" (repeat within ±{float(rule['near']):g})"
        if rule.get("origin"):
            words += f"; {rule['origin']}"
        return words, metric, float(bound)
    return (f"{kind}: {metric}" if kind else metric) or "-", metric, None


def isolation_section(doc: Mapping[str, Any], command: str = "") -> IsolationSection:
    words, metric, bound = rule_words(doc.get("rule") or {})
    return IsolationSection(
        status=str(doc["status"]),
        message=str(doc.get("message", "")),
        searched=tuple(str(s) for s in doc.get("searched", [])),
        rule=words,
        metric=metric,
        bound=bound,
        culprits=tuple(CulpritSet.from_json(dict(c)) for c in doc.get("culprits", [])),
        interactions=tuple(InteractionNote.from_json(dict(i)) for i in doc.get("interactions", [])),
        trials=tuple(shown_trial(t) for t in doc.get("trials", [])),
        judgements=tuple(shown_judgement(j) for j in doc.get("judgements", [])),
        launches=int(doc.get("launches", 0)),
        reused=int(doc.get("reused", 0)),
        notes=(*(str(n) for n in doc.get("notes", [])), *_role_notes(doc)),
        command=command,
        commits=tuple(_commit_row(doc, dict(c)) for c in doc.get("commits", [])),
    )


def _role_notes(doc: Mapping[str, Any]) -> list[str]:
    """Where each role of the searched stack ran and its ranks (a stack of roles only): one note."""
    roles = ((doc.get("target") or {}).get("stack") or {}).get("roles") or []
    if not roles:
        return []
    parts = []
    for r in roles:
        node = f"node {r['node']}" if r.get("node") else ("any Ray node" if r.get("resources") else "one node")
        ranks = _ranks(r.get("launch") or [])
        parts.append(f"{r.get('name', '?')} on {node}, {ranks} rank{'s' if ranks != 1 else ''}")
    return ["the stack's roles: " + "; ".join(parts)]


def _ranks(argv: Sequence[Any]) -> int:
    from speedtrap.stack import RoleSpec

    return RoleSpec("role", tuple(str(a) for a in argv)).ranks


def _commit_row(doc: Mapping[str, Any], c: dict[str, Any]) -> CommitRow:
    """A commit patch and its verdict in words, from the isolate result's own fields."""
    name = str(c["patch"])
    sets = [tuple(str(p) for p in s.get("patches", [])) for s in doc.get("culprits", [])]
    mine = [s for s in sets if name in s]
    not_searched = doc.get("not_searched") or {}
    if mine:
        others = sorted({p for s in mine for p in s} - {name})
        verdict = "culprit" + (f" (together with {', '.join(others)})" if others else "")
    elif name in not_searched:
        verdict = f"not searched: {not_searched[name]}"
    elif doc.get("status") == "found" and name in doc.get("searched", []):
        verdict = "cleared (in no culprit set)"
    else:
        verdict = f"no verdict (search: {doc.get('status', '-')})"
    relations = tuple(
        f"{r['kind']} {' + '.join(r.get('others', []))} (read off {r.get('source', '-')})"
        for r in doc.get("relations", [])
        if r.get("patch") == name
    )
    commits = tuple(str(x) for x in c.get("commits", []))
    return CommitRow(name, commits, str(c.get("subject", "")), str(c.get("diff", "")), verdict, relations)


def _growth(g: Mapping[str, Any]) -> LayerGrowth:
    """One point of localize's growth curve, its numbers made finite or None (JSON has no NaN)."""
    return LayerGrowth(int(g["layer"]), str(g.get("module", "")), _f(g.get("rel_diff")), _f(g.get("max_rel_diff")))


def layer_section(doc: Mapping[str, Any], command: str = "") -> LayerSection:
    first = doc.get("first_divergent")
    detail = doc.get("first_divergent_detail") or {}
    if first and not detail:
        detail = next((m for m in doc.get("modules", []) if m.get("name") == first), {})
    layer = detail.get("layer")
    return LayerSection(
        first_divergent=None if first is None else str(first),
        first_divergent_layer=None if layer is None else int(layer),
        first_rel_diff=_f(detail.get("rel_diff")),
        threshold=float(doc["threshold"]),
        tokens=int(doc.get("tokens", 0)),
        modules_compared=len(doc.get("modules", [])),
        modules_over_threshold=int(
            doc.get(
                "modules_over_threshold",
                sum(1 for m in doc.get("modules", []) if (m.get("rel_diff") or 0) > float(doc["threshold"])),
            )
        ),
        growth=tuple(_growth(g) for g in doc.get("growth", [])),
        command=command,
    )


def scale_section(doc: Mapping[str, Any], command: str = "") -> ScaleSection:
    rows = tuple(shown_scale_unit(u) for u in doc["units"])
    exactly_once = bool(doc.get("exactly_once", bool(rows) and all(r.times == 1 for r in rows)))
    return ScaleSection(
        str(doc["param"]),
        float(doc.get("nominal", 0.0)),
        tuple(float(v) for v in doc.get("values", [])),
        rows,
        exactly_once,
        command,
    )
