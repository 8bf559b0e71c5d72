"""Tiers 1-3 from a patch's signals, with the reasons a reviewer would give.

Risk (what the change can break) counts most: a 'not implemented' guard replaced by logic, a
scale factor applied in a new place (more when it may be applied twice), lowered precision.
Exposure (every layer, prefill and decode) multiplies the damage; a switch that is hard to flip
(config-only or ungated) makes reading the code matter more than A/B testing it.

Tier 1: risk >= 5, or risk >= 2 with risk + exposure + phases >= 5.
Tier 2: any risk; or wide exposure that cannot be switched off by an env var or flag; or any change
to a file on the forward path that is not proven inert ("no static signal: changes computation on the
forward path; no known risky pattern matched", with the lines). The last two carry no evidence: the
ranking says so ("no static signal", ``Ranking.signal`` false) instead of presenting tier 2 as a
judgement; the tier only orders them before the patches proven inert.
Tier 3: changes proven inert ("same math", see ``_inert``), or changes to tests and docs only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from speedtrap.patching import Gate, GateKind
from speedtrap.triage.flow import EVERY_LAYER, PER_STEP, SETUP, SOME_LAYERS, UNKNOWN, DoubleApplication, HotPath
from speedtrap.triage.python import EARLY_RETURN_REMOVED, KERNEL, VIEW
from speedtrap.triage.ranking.signals import GRAPH, GUARD, MEMORY, PRECISION, SCALE, PatchSignals
from speedtrap.triage.source import CONFIG, ENV, FLAG, UNGATED
from speedtrap.triage.wording import attach, split_reason

_EXPOSURE = {EVERY_LAYER: 2, SOME_LAYERS: 1, PER_STEP: 1, SETUP: 0, UNKNOWN: 1}


SAME_MATH = "same math: every changed file is proven inert"
NO_SIGNAL = "no static signal"
FORWARD = f"{NO_SIGNAL}: changes computation on the forward path; no known risky pattern matched"
WIDE_ONLY = (
    f"{NO_SIGNAL}: no risky pattern and no changed computation found; tier 2 only because it runs on every layer "
    "and no env var or flag switches it off"
)
OFF_PATH = "changes only files off the forward path (tests, docs, examples, benchmarks); not proven inert"
_OFF_PATH_DIRS = ("tests/", "test/", "docs/", "examples/", "benchmarks/", "benchmark/", "scripts/")
_SELECTIONS = ("widened", "narrowed", "collapsed", "flipped")  # a condition's cases (or a key's fallback) changed
_LOOSENED = (*_SELECTIONS, "moved")  # guard signals whose guarded path still runs, under another selection
_DEFINITE = {"identity literal replaced", "factor replaced by identity", "factor newly passed", EARLY_RETURN_REMOVED}


def _off_path(file: str) -> bool:
    parts = "/" + file
    name = file.rsplit("/", 1)[-1]
    return any(f"/{d}" in parts for d in _OFF_PATH_DIRS) or name.startswith("test_") or name == "conftest.py"


@dataclass(frozen=True)
class Ranking:
    """A tier with its reasons: each reason one line (``wording.split_reason``), its evidence lines in
    ``evidence`` (one tuple per reason, empty when the reason says it all)."""

    tier: int
    score: int
    risk: int
    reasons: tuple[str, ...]
    points: dict[str, int] = field(default_factory=dict, compare=False)
    evidence: tuple[tuple[str, ...], ...] = field(default=(), compare=False)
    signal: bool = True  # false: no static evidence either way (no risky pattern, not proven inert)

    @classmethod
    def worded(
        cls, tier: int, score: int, risk: int, texts: list[str], points: dict[str, int], signal: bool = True
    ) -> Ranking:
        """A ranking whose reasons are cut into one-line headlines and their evidence."""
        pairs = [split_reason(t) for t in texts]
        return cls(tier, score, risk, tuple(h for h, _ in pairs), points, tuple(e for _, e in pairs), signal)

    @property
    def tier_words(self) -> str:
        """``2``, or ``2 (no static signal)`` where the tier rests on no evidence."""
        return str(self.tier) if self.signal else f"{self.tier} ({NO_SIGNAL})"

    def lines(self, i: int) -> tuple[str, ...]:
        """The evidence lines of reason ``i``."""
        return self.evidence[i] if i < len(self.evidence) else ()

    @property
    def in_full(self) -> tuple[str, ...]:
        """Each reason followed by its evidence lines (one string per reason, lines joined by newlines)."""
        return tuple("\n".join((r, *self.lines(i))) for i, r in enumerate(self.reasons))

    def with_reason(self, text: str, first: bool, tier: int | None = None) -> Ranking:
        """The same ranking with one more reason (first or last), and a new tier if given."""
        head, lines = split_reason(text)
        evidence = tuple(self.lines(i) for i in range(len(self.reasons)))
        reasons = (head, *self.reasons) if first else (*self.reasons, head)
        evidence = (lines, *evidence) if first else (*evidence, lines)
        return dataclasses.replace(self, tier=self.tier if tier is None else tier, reasons=reasons, evidence=evidence)

    def without(self, prefix: str) -> Ranking:
        """The same ranking without the reasons that start with ``prefix``."""
        keep = [i for i, r in enumerate(self.reasons) if not r.startswith(prefix)]
        return dataclasses.replace(
            self, reasons=tuple(self.reasons[i] for i in keep), evidence=tuple(self.lines(i) for i in keep)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "score": self.score,
            "risk": self.risk,
            "reasons": list(self.reasons),
            "reason_evidence": [list(self.lines(i)) for i in range(len(self.reasons))],
            "points": self.points,
            "static_signal": self.signal,
        }


def gate_words(gate: Gate) -> str:
    if gate.kind == ENV:
        return f"env-gated ({gate.describe()[5:]}): A/B by relaunching with it unset"
    if gate.kind == FLAG:
        return f"flag-gated ({' '.join(gate.args)}): A/B by relaunching without the flag"
    if gate.kind == CONFIG:
        return (
            f"config-conditional ({gate.key}): no env var switches it; A/B needs a model-config edit and "
            "relaunch, so the static reading matters more"
        )
    if gate.kind == GateKind.IN_PROCESS:
        return "in-process: applied by name to the loaded model; A/B by running with and without it"
    return "ungated: compiled in; A/B needs a rebuild or revert, so the static reading matters more"


def rank(sig: PatchSignals, gate: Gate, doubles: list[DoubleApplication], declared: dict[str, Any]) -> Ranking:
    reasons: list[str] = []
    points: dict[str, int] = {}
    for s in sig.of(GUARD):
        loosened = any(s.data.get(k) for k in _LOOSENED)  # the path still runs, under another condition
        p = 3 if loosened or s.data.get("not_implemented") or s.data.get("replaced") else 2
        points["guard"] = max(points.get("guard", 0), p)
        if loosened or s.data.get("argument"):
            reasons.append(s.summary)
        else:
            reasons.append(attach(s.summary, "; upstream refused this path, so the new code never ran there"))
    scale = [s for s in sig.of(SCALE) if s.data.get("change") != "rewritten"]
    if scale:
        points["scale"] = 3
        if any(s.data.get("change") in _DEFINITE and s.data.get("reaches") for s in scale):
            points["scale"] = 5  # the factor now flows (or no longer flows) into a multiply: a definite change
        reasons.extend(
            attach(s.summary, f": {s.data.get('factor') or 'the scale'} must be applied exactly once")
            for s in scale[:3]
        )
    kinds = ((MEMORY, "uninitialised_memory"), (GRAPH, "cuda_graph"), (KERNEL, "kernel_indexing"), (VIEW, "view_moved"))
    for kind, label in kinds:
        found = sig.of(kind)
        if found:
            points[label] = 3
            reasons.extend(s.summary for s in found[:2])
    if doubles:
        points["double_application"] = 2
        d = doubles[0]
        more = f" (and {len(doubles) - 1} more site(s))" if len(doubles) > 1 else ""
        reasons.append(
            f"possible double application of {d.symbol}: {d.other.function} at {d.other.where} still applies it{more}"
        )
    precision = sig.of(PRECISION)
    if precision:
        points["precision"] = 2
        reasons.extend(s.summary for s in precision[:2])
    risk = sum(points.values())

    best = sig.best_hot_path
    level = best.level if best is not None else UNKNOWN
    if best is None and declared.get("scope"):
        level = EVERY_LAYER if "every layer" in str(declared["scope"]) else SOME_LAYERS
    exposure = _EXPOSURE[level]
    selection = any(s.data.get(k) for s in sig.of(GUARD) for k in _SELECTIONS)
    if level == SETUP and (sig.of(MEMORY) or sig.of(GRAPH) or sig.of(PRECISION) or selection or scale):
        # a buffer allocated, a dtype chosen, a switch forced or a scale computed at construction (a rotary
        # dimension, a softmax scale: stored in what it builds) is read on every step
        exposure = 1
    points["exposure"] = exposure
    if best is not None:
        reasons.append(_exposure_words(best))
    elif declared.get("scope"):
        reasons.append(f"declared scope: {declared['scope']} (no tree to check it against)")
    phases = 1 if sig.phases == "both" else 0
    points["phases"] = phases
    reasons.append(f"phases: {sig.phases} (a guess from names on the path)")
    if risk >= 2 and level == EVERY_LAYER and precision:
        points["precision_every_layer"] = 1
    ab = 1 if gate.kind in (CONFIG, UNGATED) else 0
    points["hard_to_ab"] = ab
    reasons.append(gate_words(gate))
    score = sum(points.values())
    signal = True
    if risk >= 5 or (risk >= 2 and risk + exposure + phases >= 5):
        tier = 1
    elif risk > 0:
        tier = 2
    elif sig.changed and not all(_off_path(e.file) for e in sig.changed):
        tier, signal = 2, False
        lines = "; ".join(e.render() for e in sig.changed[:4])
        reasons.insert(0, f"{FORWARD}: {lines}")
    elif exposure >= 2 and ab:
        tier, signal = 2, False
        reasons.insert(0, WIDE_ONLY)
    elif sig.changed:
        tier = 3
        reasons.insert(0, f"{OFF_PATH}: {', '.join(sorted({e.file for e in sig.changed}))}")
    else:
        tier = 3
        why = "; ".join(f"{f}: {w}" for f, w in sig.inert[:4])
        reasons.insert(0, f"{SAME_MATH} ({why})" if why else SAME_MATH)
    return Ranking.worded(tier, score, risk, reasons, points, signal)


def _exposure_words(best: HotPath) -> str:
    func = best.function.split(":", 1)[-1]
    why = "; ".join(best.chain[1:]) if len(best.chain) > 1 else (best.chain[0] if best.chain else "")
    if best.reader and best.level in (EVERY_LAYER, SOME_LAYERS, PER_STEP):
        where = {EVERY_LAYER: "on every layer for every token", PER_STEP: "once per forward step"}.get(
            best.level, f"on some layers only, for every token (only where {'; '.join(best.conditions)})"
        )
        return f"construction code ({func}) sets what is read {where}: {'; '.join(best.chain)}"
    if best.level == EVERY_LAYER:
        return f"runs on every layer for every token: {func} ({why})"
    if best.level == SOME_LAYERS:
        return f"runs on some layers only, for every token: {func} (only where {'; '.join(best.conditions)})"
    if best.level == PER_STEP:
        return f"runs once per forward step, outside the layer stack: {func}"
    if best.level == SETUP:
        return f"changes construction code ({func}): what it builds is used at run time"
    return f"how often {func} runs is unclear: {why or 'no caller found'}"


def gate_of(declared: Gate | None, detected: tuple[str, str]) -> tuple[Gate, str]:
    """The gate to plan with, and where it came from (declared by the patch's author, or read off the diff)."""
    kind, key = detected
    if declared is not None:
        agree = declared.kind == kind and (not key or key == declared.key)
        if kind == UNGATED or agree:
            return declared, "declared" + (" and seen in the diff" if agree and kind != UNGATED else "")
        return declared, f"declared (the diff reads {kind} {key})".rstrip()
    if kind == ENV:
        return Gate(ENV, env=((key, "1"),)), "read off the diff"
    if kind == FLAG:
        return Gate(FLAG, args=(key,)), "read off the diff"
    if kind == CONFIG:
        return Gate(CONFIG, config=((key, "true"),)), "read off the diff"
    return Gate(UNGATED), "read off the diff (no switch found)"
