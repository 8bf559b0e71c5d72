"""The Markdown table and its totals (all; developed on; held out)."""

from __future__ import annotations

from typing import Any


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| incident | release | culprit tier | culprit ranked | warnings (right sites) | decoys: comment / message / "
        "rewrite / precision | CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["decoy_tiers"]
        decoys = " / ".join(str(d.get(k, "-")) for k in ("comment", "message", "rewrite", "precision"))
        named = "" if not r["factor_case"] else (" (yes)" if r["sites_named"] else " (no)")
        held = f" ({r['half']})" if r.get("half") else ""
        held += f" (new, {r['held_out']})" if r.get("held_out") else ""
        tier = f"{r['culprit_tier']}{'' if r.get('culprit_signal', True) else ' (no signal)'}"
        out.append(
            f"| {r['id']}{held} | {r['release']} | {tier} "
            f"| {_ranked(r)} | {r['warnings']}{named} "
            f"| {decoys} | {r['seconds']:.2f} |"
        )
    out.append("")
    out.append(_totals("all", rows))
    for half, label in (("dev", "development half"), ("heldout", "held-out half")):
        part = [r for r in rows if r.get("half") == half]
        if part and len(part) < len(rows):
            out.append(_totals(label, part))
    new = [r for r in rows if r.get("held_out")]
    for s in sorted({r["held_out"] for r in new}):  # incidents first measured in this set, on their own
        part = [r for r in new if r["held_out"] == s]
        out.append(_totals(f"{s}", part))
        for half, label in (("dev", "development half"), ("heldout", "held-out half")):
            sub = [r for r in part if r.get("half") == half]
            if sub and len(sub) < len(part):
                out.append(_totals(f"{s}, {label}", sub))
    return "\n".join(out)


def _ranked(row: dict[str, Any]) -> str:
    """The culprit's place among the case's patches: ``1``, or ``1=`` when another patch ranks level with it."""
    return f"{row['culprit_rank']}{'=' if row['culprit_tied'] else ''}"


def _totals(label: str, rows: list[dict[str, Any]]) -> str:
    n = len(rows)
    t1 = sum(r["culprit_tier"] == 1 for r in rows)
    first = sum(r["culprit_rank"] == 1 and not r["culprit_tied"] for r in rows)
    level = sum(r["culprit_rank"] == 1 and r["culprit_tied"] > 0 for r in rows)
    factor = [r for r in rows if r["factor_case"]]
    inert = [r["decoy_tiers"][k] for r in rows for k in ("comment", "message", "rewrite") if k in r["decoy_tiers"]]
    return (
        f"{label.capitalize()} ({n}): culprit in tier 1: {t1}/{n} ({100 * t1 / n:.0f} %); ranked first: {first}/{n}"
        f" (and level first with another patch: {level}); tier 2: "
        f"{sum(r['culprit_tier'] == 2 for r in rows)}; tier 3: {sum(r['culprit_tier'] == 3 for r in rows)}. "
        f"Inert decoys above tier 3: {sum(t != 3 for t in inert)} of {len(inert)}. "
        f"Factor cases with a warning naming every factor site: "
        f"{sum(bool(r['sites_named']) for r in factor)}/{len(factor)}. "
        f"No static signal on the culprit: {sum(r.get('culprit_signal') is False for r in rows)}. "
        f"Precision decoys: tiers {[r['decoy_tiers'].get('precision', '-') for r in rows]}. "
        f"Longest reason or warning headline: {max((r.get('longest_reason', 0) for r in rows), default=0)} characters."
    )
