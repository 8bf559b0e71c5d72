"""The vocabulary every reading shares: a signal (what kind of risky change, in one line) and the
lines that raised it (``FILE:LINE ± code``)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Protocol

GUARD, PRECISION, SCALE, HOT_PATH, PHASES, GATING = "guard", "precision", "scale", "hot_path", "phases", "gating"


class ChangedLines(Protocol):
    """What evidence needs of a changed file (``source.ChangedFile``): its path and its changed lines' text."""

    @property
    def path(self) -> str: ...

    def added_text(self, line: int) -> str: ...

    def removed_text(self, line: int) -> str: ...


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int
    side: str  # "+" added, "-" removed, " " unchanged context
    text: str

    def render(self) -> str:
        return f"{self.file}:{self.line} {self.side} {self.text.strip()}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "side": self.side, "text": self.text.strip()}


@dataclass(frozen=True)
class Signal:
    kind: str
    summary: str
    evidence: tuple[Evidence, ...] = ()
    guess: bool = False
    method: str = "ast"
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "guess": self.guess,
            "method": self.method,
            "evidence": [e.to_json() for e in self.evidence],
            "data": self.data,
        }


def line_evidence(cf: ChangedLines, node_or_line: ast.AST | int, side: str) -> Evidence:
    line = node_or_line if isinstance(node_or_line, int) else getattr(node_or_line, "lineno", 0)
    text = cf.added_text(line) if side == "+" else cf.removed_text(line)
    return Evidence(cf.path, line, side, text)


def spans(node: ast.AST, lines: frozenset[int]) -> bool:
    start = getattr(node, "lineno", None)
    if start is None:
        return False
    end = getattr(node, "end_lineno", start) or start
    return any(start <= ln <= end for ln in lines)
