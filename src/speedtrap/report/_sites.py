"""Static beside measured: the factor's sites triage read in the culprit's diff next to those the scale check
recorded while the unit ran (``localize``'s provenance).

A static site (``model.py:342 HashTopK.forward``, a path relative to the source tree) and a measured one (an
absolute path of the running code) are the same place when the measured path ends with the static one and
the line or the function agrees (a line can move when a patch adds lines above it). A site one side has and
the other lacks is flagged; where both name sites, the verdict uses the measured ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from speedtrap.localize import FactorSite, ScaleUnit


@dataclass(frozen=True)
class StaticSite:
    """A place triage read applying a factor: the line the patch adds (``new``) or one that still applies it."""

    symbol: str
    file: str
    line: int
    function: str
    new: bool = False

    @property
    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"

    def to_json(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "file": self.file, "line": self.line, "function": self.function,
                "new": self.new}  # fmt: skip

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StaticSite:
        return cls(str(d["symbol"]), str(d["file"]), int(d["line"]), str(d.get("function", "")), bool(d.get("new")))


def static_sites(patch_doc: Mapping[str, Any]) -> tuple[StaticSite, ...]:
    """The factor sites of one patch in triage's JSON (its double applications: the added site and the others)."""
    out: list[StaticSite] = []
    for d in patch_doc.get("double_applications") or []:
        symbol = str(d.get("symbol", ""))
        for site, new in [(d.get("added"), True), (d.get("other"), False), *((s, False) for s in d.get("also") or [])]:
            if not isinstance(site, Mapping) or site.get("file") is None or site.get("line") is None:
                continue
            found = StaticSite(symbol, str(site["file"]), int(site["line"]), str(site.get("function") or ""), new)
            if all((s.symbol, s.file, s.line) != (found.symbol, found.file, found.line) for s in out):
                out.append(found)
    return tuple(out)


def _same(static: StaticSite, measured: FactorSite) -> bool:
    path = measured.file.replace("\\", "/")
    if not (path == static.file or path.endswith("/" + static.file.lstrip("./"))):
        return False
    return measured.line == static.line or (bool(static.function) and measured.function == static.function)


@dataclass(frozen=True)
class SiteComparison:
    both: tuple[FactorSite, ...]
    static_only: tuple[StaticSite, ...]
    measured_only: tuple[FactorSite, ...]


def compare(static: Sequence[StaticSite], units: Sequence[ScaleUnit], param: str) -> SiteComparison | None:
    """Triage's sites of ``param`` against the sites the units applied it at (None: a side has nothing)."""
    mine = [s for s in static if s.symbol == param]
    measured: list[FactorSite] = []
    for unit in units:
        for site in unit.applying:
            if all((m.file, m.line) != (site.file, site.line) for m in measured):
                measured.append(site)
    if not mine or not any(u.sites is not None for u in units):
        return None
    both = tuple(m for m in measured if any(_same(s, m) for s in mine))
    static_only = tuple(s for s in mine if not any(_same(s, m) for m in measured))
    measured_only = tuple(m for m in measured if m not in both)
    return SiteComparison(both, static_only, measured_only)


def comparison_words(found: SiteComparison | None, param: str) -> str | None:
    """One sentence: what both name, what only one side has (flagged), and which one the verdict uses."""
    if found is None:
        return None
    parts = []
    if found.both:
        parts.append("both name " + ", ".join(f"`{m.where}`" for m in found.both))
    if found.static_only:
        parts.append(
            "**only triage** read "
            + ", ".join(
                f"`{s.where}` ({s.function or 'module level'}{', added by the patch' if s.new else ''})"
                for s in found.static_only
            )
            + " (not recorded applying it in the measured run)"
        )
    if found.measured_only:
        parts.append(
            "**only the measurement** recorded "
            + ", ".join(f"`{m.where}` ({m.function})" for m in found.measured_only)
            + " (triage did not read it)"
        )
    tail = "; the verdict uses the measured sites" if found.static_only or found.measured_only else ""
    return f"Sites of `{param}`, static (triage) beside measured: " + "; ".join(parts) + tail + "."
