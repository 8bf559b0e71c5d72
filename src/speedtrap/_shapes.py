"""Result shapes that a stage and the report share, defined once with their ``to_json`` / ``from_json``.

Plain dataclasses that import no stage: the report reads them without loading torch (localize) or the
isolate's launch and HTTP machinery. The stages export them under their usual names
(``speedtrap.isolate.CulpritSet``, ``speedtrap.localize.LayerGrowth``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CulpritSet:
    """A 1-minimal failing set: it fails, and dropping any one of its patches makes it pass."""

    patches: tuple[str, ...]
    confirmed: bool  # its own verdict is a clean fail (not inconclusive)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"patches": list(self.patches), "confirmed": self.confirmed, "note": self.note}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CulpritSet:
        return cls(tuple(str(p) for p in d["patches"]), bool(d["confirmed"]), str(d.get("note", "")))


@dataclass(frozen=True)
class LayerGrowth:
    """The error after one layer: its block output's rel_diff and the largest inside it.

    ``max_rel_diff`` is None only where a report read a value that was not finite (JSON has no NaN).
    """

    layer: int
    module: str
    rel_diff: float | None
    max_rel_diff: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "module": self.module,
            "rel_diff": self.rel_diff,
            "max_rel_diff": self.max_rel_diff,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LayerGrowth:
        worst = d.get("max_rel_diff")
        return cls(int(d["layer"]), str(d["module"]), d.get("rel_diff"), None if worst is None else float(worst))
