"""Is the factor still applied exactly once? Warnings, with the sites named, for the changes the
double-application search does not cover:

- a multiply of the factor removed: the multiplies that still apply it on that path, or none (a name too common
  to trace across the tree, in more than ``_WIDE`` files, is looked for in the changed files only, and said so);
- a multiply whose conditions or loop changed: it now runs in other cases or more often;
- a factor now passed into a callee that is not read here (a registered op, ``**kwargs``): the
  multiplies of the factor on the same path, or, when the tree has only a few, all of them (said so).

Catches::

    hidden = hidden * self.routed_scaling_factor   ->   (removed; no other multiply on that path)

"""

from __future__ import annotations

from collections.abc import Callable

from speedtrap.triage.evidence import Signal
from speedtrap.triage.flow.sites import MULTIPLY, CountWarning, DoubleApplication, Site, python_sites
from speedtrap.triage.flow.units import Units
from speedtrap.triage.flow.values import IdentityChange
from speedtrap.triage.source import SourceIndex

_FEW = 6
# A name in more Python files than this is too common a word (`factor`, `scale`) for its whole-tree sites to
# be one quantity: a removed multiply by it is checked in the changed files only, and the warning says so.
_WIDE = 300


def _multiplies(factor: str, post: SourceIndex, base: list[Site], changed: set[str]) -> list[Site]:
    out = [s for s in base if s.role == MULTIPLY and s.method == "ast" and s.file not in changed]
    for rel in sorted(changed):
        mod = post.module(rel)
        if mod is not None:
            out.extend(s for s in python_sites(mod, factor) if s.role == MULTIPLY)
    return out


def _related(units: Units, file: str, unit: str | None, sites: list[Site]) -> list[Site]:
    return [s for s in sites if units.relation(file, unit, s.file, s.unit) is not None]


def _names(sites: list[Site]) -> str:
    return ", ".join(f"`{s.code}` at {s.where} ({s.function})" for s in sites[:4]) + (
        f" and {len(sites) - 4} more" if len(sites) > 4 else ""
    )


def count_warnings(
    scales: list[Signal],
    identity: list[IdentityChange],
    post: SourceIndex,
    units: Units,
    sites_of: Callable[[str], list[Site]],
    changed: set[str],
    doubles: list[DoubleApplication],
) -> list[CountWarning]:
    out: list[CountWarning] = []
    for s in scales:
        factor = s.data.get("factor", "")
        change = s.data.get("change")
        if not factor.isidentifier() or any(d.symbol == factor for d in doubles):
            continue
        if change == "removed":
            removed = [e for e in s.evidence if e.side == "-"]
            if not removed:
                continue
            gone = removed[0]
            mod = post.module(gone.file)
            unit = next(iter(s.summary.split(" from ", 1)[1:]), "").split(".")[0] or None
            common = len(post.containing([factor]))
            base = sites_of(factor) if common <= _WIDE else []
            still = _related(units, gone.file, unit, _multiplies(factor, post, base, changed))
            head = "the patch removes " + ", ".join(f"`{e.text.strip()}` at {e.file}:{e.line}" for e in removed[:4])
            if still:
                out.append(
                    CountWarning(
                        factor,
                        f"{head}; {factor} is still applied on that path at {_names(still)}: "
                        "check that every path applies it exactly once",
                    )
                )
            elif mod is not None and common > _WIDE:
                out.append(
                    CountWarning(
                        factor,
                        f"{head}; no other multiply of {factor} in the changed files, and {common} files of the tree "
                        f"name {factor}, too many to trace: check where the factor is applied now",
                    )
                )
            elif mod is not None:
                out.append(
                    CountWarning(
                        factor,
                        f"{head}; no other multiply of {factor} on that path: the factor may be applied nowhere now",
                    )
                )
        elif change in ("guard changed", "repeat changed"):
            sites = list({(e.file, e.line): e for e in s.evidence if e.side == "+"}.values())
            if sites:
                where = ", ".join(f"`{e.text.strip()}` at {e.file}:{e.line}" for e in sites[:3])
                out.append(
                    CountWarning(factor, f"{factor} is applied in other cases or more often now: {where} ({s.summary})")
                )
    for ident in identity:
        where = f"{ident.file}:{ident.new_line}"
        if ident.reaches or ident.removes_application or any(where in d.in_full for d in doubles):
            continue
        out.extend(CountWarning(ident.factor, m) for m in _unread(ident, post, units, sites_of, changed))
    return out


def _unread(
    ident: IdentityChange, post: SourceIndex, units: Units, sites_of: Callable[[str], list[Site]], changed: set[str]
) -> list[str]:
    everywhere = _multiplies(ident.factor, post, sites_of(ident.factor), changed)
    unit = ident.function.split(".")[0] if ident.function != "<module>" else None
    near = _related(units, ident.file, unit, everywhere)
    head = (
        f"{ident.factor} now flows into a callee not read here (`{ident.after}` at {ident.file}:{ident.new_line}, "
        f"{ident.slot})"
    )
    unread = "".join(
        f"; not resolved: {n}"
        for n in units.resolver.unresolved_at(f"{ident.file}:{ident.new_line}", ident.slot.split("(", 1)[0])
    )
    head += unread
    if near:
        return [f"{head}; on the same path it is already applied at {_names(near)}: a possible double application"]
    if 0 < len(everywhere) <= _FEW:
        return [
            f"{head}; the tree applies it at {_names(everywhere)} (their path to it is not proven): "
            "a possible double application"
        ]
    if everywhere:
        return [f"{head}; {len(everywhere)} other multiplies of it in the tree: pass the served model to narrow them"]
    return [f"{head}; no multiply of it elsewhere in the tree: check the callee applies it exactly once"]
