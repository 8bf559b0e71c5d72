"""One case run: the tree (and its base edits), the culprit and decoy diffs, triage, the sites check; one row."""

from __future__ import annotations

import ast
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap.triage import PatchReport, from_diff_files, triage

from .case import Case
from .decoys import apply_edits, decoy_comment, decoy_message, decoy_precision, decoy_rewrite, first_line, udiff
from .trees import tree_of


@dataclass
class Result:
    case: Case
    culprit: PatchReport | None = None
    decoys: dict[str, PatchReport] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    sites_named: bool | None = None
    notes: list[str] = field(default_factory=list)
    rank: int = 0  # 1 + how many patches triage ranks above the culprit (tier, then score)
    tied: int = 0  # patches ranked level with it
    longest_reason: int = 0  # the longest reason or warning headline of the case, in characters


def _site_lines(tree: Path, sites: tuple[tuple[str, str], ...], culprit_files: dict[str, str]) -> list[str]:
    out = []
    for rel, code in sites:
        text = culprit_files.get(rel) or (tree / rel).read_text()
        stmts = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt) and not hasattr(n, "body")]
        nos: list[int] = []
        for i, ln in enumerate(text.split("\n"), 1):
            if code in ln:  # any line of the statement holding it names the site
                span = [s for s in stmts if s.lineno <= i <= (s.end_lineno or s.lineno)]
                nos.extend(range(span[0].lineno, (span[0].end_lineno or i) + 1) if span else [i])
        out.append("|".join(f"{rel}:{n}" for n in sorted(set(nos))) or rel)
    return out


def run_case(case: Case, work: Path) -> Result:
    res = Result(case)
    tree = tree_of(case.package, case.version)
    if case.base:
        base = work / "base"
        shutil.copytree(tree, base, copy_function=os.link)
        for rel, edits in case.base.items():
            path = base / rel
            text = apply_edits(path.read_text(), edits, f"{case.id} base {rel}")
            path.unlink()
            path.write_text(text)
        tree = base
    diffs: list[Path] = []
    after: dict[str, str] = {}
    culprit = []
    for rel, edits in case.edits.items():
        before = (tree / rel).read_text()
        after[rel] = apply_edits(before, edits, f"{case.id} {rel}")
        culprit.append(udiff(rel, before, after[rel]))
    (work / "culprit.diff").write_text("".join(culprit))
    diffs.append(work / "culprit.diff")
    rel, edits = next(iter(case.edits.items()))
    before = (tree / rel).read_text()
    line = first_line(before, edits)
    if rel.endswith(".py"):
        parsed = ast.parse(before)
        makers = {
            "comment": lambda: decoy_comment(before, line),
            "message": lambda: decoy_message(before, parsed, line),
            "rewrite": lambda: decoy_rewrite(before, parsed),
            "precision": lambda: decoy_precision(before, parsed, line),
        }
    else:  # C-family: only the comment rule applies
        makers = {"comment": lambda: decoy_comment(before, line, "//")}
    for name, make in makers.items():
        text = make()
        if text is None or text == before:
            res.notes.append(f"no {name} decoy in {rel}")
            continue
        (work / f"{name}.diff").write_text(udiff(rel, before, text))
        diffs.append(work / f"{name}.diff")
    start = time.process_time()
    report = triage(from_diff_files(diffs, tree), case.factor)
    res.seconds = time.process_time() - start
    by_name = {p.name: p for p in report.patches}
    res.culprit = by_name["culprit"]
    key = (res.culprit.tier, -res.culprit.ranking.score)
    res.rank = 1 + sum((p.tier, -p.ranking.score) < key for p in report.patches)  # patches ranked above it
    res.tied = sum((p.tier, -p.ranking.score) == key for p in report.patches if p is not res.culprit)
    res.longest_reason = max(
        (len(line) for p in report.patches for line in (*p.ranking.reasons, *(d.message for d in p.doubles))),
        default=0,
    )
    res.decoys = {k: v for k, v in by_name.items() if k != "culprit"}
    res.warnings = [d.in_full for d in res.culprit.doubles] + list(res.culprit.missing)
    if case.factor:
        wanted = _site_lines(tree, case.sites, after)
        text = "\n".join(res.warnings)
        res.sites_named = bool(res.warnings) and all(any(w in text for w in alt.split("|")) for alt in wanted)
        if not res.sites_named:
            res.notes.append(f"wanted sites {wanted}")
    return res


def summary(res: Result) -> dict[str, Any]:
    assert res.culprit is not None
    return {
        "id": res.case.id,
        "source": res.case.source,
        "release": f"{res.case.package} {res.case.version}",
        "what": res.case.what,
        "culprit_tier": res.culprit.tier,
        "culprit_signal": res.culprit.ranking.signal,
        "culprit_rank": res.rank,
        "culprit_tied": res.tied,
        "longest_reason": res.longest_reason,
        "culprit_reason": res.culprit.ranking.reasons[0] if res.culprit.ranking.reasons else "",
        "warnings": len(res.warnings),
        "factor_case": res.case.factor is not None,
        "held_out": res.case.held_out,
        "sites_named": res.sites_named,
        "decoy_tiers": {k: v.tier for k, v in res.decoys.items()},
        "seconds": round(res.seconds, 2),
        "notes": res.notes,
        "warning_text": res.warnings[:2],
    }
