"""What a patch does, read off its diff and the tree: each signal with the lines that raised it.

Python files are compared as ASTs (old file vs patched file, restricted to the changed lines);
other files, and Python that does not parse, get line patterns and say so (``method: text``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from speedtrap.triage.cfamily import (
    C_FAMILY,
    argument_changes,
    c_collapses,
    c_hot_path,
    case_moves,
    inert_c,
    precision_changes,
    switches_unset,
)
from speedtrap.triage.evidence import GATING, GUARD, HOT_PATH, PHASES, PRECISION, SCALE, Evidence, Signal
from speedtrap.triage.flow import (
    SETUP,
    UNKNOWN,
    Flow,
    HotPath,
    HotPaths,
    IdentityChange,
    identity_changes,
    literal_changes,
    statement_identity_changes,
)
from speedtrap.triage.platform import RuntimePhase, runtime_phase
from speedtrap.triage.python import (
    GRAPH,
    MEMORY,
    Collapse,
    buffer_to_float,
    cuda_graph,
    defaults_flipped,
    dropped_arguments,
    early_returns_removed,
    gating,
    guards_removed,
    inert,
    inplace_in_loop,
    kernel_indexing,
    moved_slices,
    precision,
    precision_under_new_condition,
    py_collapses,
    py_forced,
    scale,
    shifted_arguments,
    uninitialised,
    widened,
)
from speedtrap.triage.source import ChangedFile, Module, last_name, text_signals

__all__ = [
    "GATING",
    "GRAPH",
    "GUARD",
    "HOT_PATH",
    "MEMORY",
    "PHASES",
    "PRECISION",
    "SCALE",
    "Evidence",
    "PatchSignals",
    "Signal",
    "analyze",
]

_FACTOR_NAME = re.compile(r"scal|factor|coef|multiplier|gamma|alpha", re.I)
_DECODE = re.compile(r"decode|kv_?cache|kv_?store|past_key|paged|cache", re.I)
_PREFILL = re.compile(r"prefill|extend|chunk|prompt", re.I)


@dataclass
class PatchSignals:
    signals: list[Signal] = field(default_factory=list)
    hot_paths: list[HotPath] = field(default_factory=list)
    phases: str = "both"
    detected_gate: tuple[str, str] = ("ungated", "")  # (kind, key)
    factors: list[str] = field(default_factory=list)
    identity: list[IdentityChange] = field(default_factory=list)
    inert: list[tuple[str, str]] = field(default_factory=list)  # (file, why it cannot change a value)
    changed: list[Evidence] = field(default_factory=list)  # first changed lines of files not proven inert
    runtime_phase: RuntimePhase | None = None  # a condition of the batch the change runs under (not a switch)

    def of(self, kind: str) -> list[Signal]:
        return [s for s in self.signals if s.kind == kind]

    @property
    def best_hot_path(self) -> HotPath | None:
        return max(self.hot_paths, key=lambda h: h.rank, default=None)


def analyze(
    files: list[ChangedFile], hot: HotPaths | None, symbol: str | None = None, flow: Flow | None = None
) -> PatchSignals:
    """Every signal of one patch's changed files (``flow`` follows values into callees)."""
    result = PatchSignals()
    gate: tuple[str, str, list[Evidence]] | None = None
    phase_words: list[tuple[str, str]] = []
    for cf in files:
        if cf.patch.binary:
            result.changed.append(Evidence(cf.path, 0, " ", "binary file: not read, so not proven inert"))
            continue
        old, new = cf.old_module(), cf.new_module()
        if not cf.is_python and _is_prose(cf.path):
            result.inert.append((cf.path, "documentation, not code"))
            continue
        if cf.path.endswith(C_FAMILY) and cf.old_text is not None and cf.new_text is not None:
            why_c = inert_c(cf.old_text, cf.new_text)
            if why_c is not None:
                result.inert.append((cf.path, why_c))
                continue  # proven: the compiler reads the same tokens
        if (cf.old_text is not None and old is None) or (cf.new_text is not None and new is None):
            result.signals.extend(text_signals(cf))
            if cf.path.endswith(C_FAMILY) and cf.old_text is not None and cf.new_text is not None:
                result.signals.extend(_c_argument_signals(cf, cf.old_text, cf.new_text))
                text, lines = (cf.new_text, cf.added) if cf.added else (cf.old_text, cf.removed)
                found = c_hot_path(hot.units.index.root, cf.path, text, lines) if hot is not None else None
                if found is not None:
                    result.hot_paths.append(found)
            result.changed.extend(_first_changes(cf))
            continue
        collapsed: list[Collapse] = []
        if old is not None and new is not None:
            why = inert(old.tree, new.tree)
            if why is not None:
                result.inert.append((cf.path, why))
                continue  # proven: nothing runs differently
            result.signals.extend(class_signals(cf, old, new))
            if flow is not None:
                result.signals.extend(shifted_arguments(cf, old, new, flow.resolver))
            result.signals.extend(early_returns_removed(cf, old, new))
            collapsed = py_collapses(old, new, cf.removed, cf.added) + py_forced(old, new, cf.removed, cf.added)
        result.changed.extend(_first_changes(cf))
        if old is not None:
            result.signals.extend(guards_removed(cf, old, new))
        if new is not None:
            result.signals.extend(precision(cf, new, old))
        result.signals.extend(scale(cf, new, old, symbol))
        if flow is not None and old is not None and new is not None:
            result.signals.extend(_identity_signals(cf, old, new, flow, result.identity))
        if old is not None and new is not None:
            # A collapse the value flow already read as an identity change (a scale) on that line is said once.
            scaled = {(e.file, e.line) for s in result.of(SCALE) for e in s.evidence if e.side == "-"}
            fresh = [c for c in collapsed if (cf.path, c.old_line) not in scaled]
            result.signals.extend(_collapse_signals(cf, fresh, "ast"))
        if new is not None and gate is None:
            gate = gating(cf, new)
        funcs: list[tuple[Module, ast.FunctionDef | ast.AsyncFunctionDef]] = []
        if new is not None:
            funcs += [(new, f) for f in new.functions_touching(cf.added)]
        if old is not None:
            names = {(new.qualname(f), f.name) for _, f in funcs} if new else set()
            funcs += [(old, f) for f in old.functions_touching(cf.removed) if (old.qualname(f), f.name) not in names]
        for mod, func in funcs:
            phase_words.append((f"{mod.qualname(func)}.{func.name}", f"{cf.path}:{func.lineno}"))
            if hot is not None:
                result.hot_paths.append(hot.classify(mod, func, cf.added if mod is new else cf.removed))
        for node in new.nodes_on_lines(cf.added) if new else []:
            if isinstance(node, (ast.Name, ast.Attribute)):
                phase_words.append((last_name(node) or "", f"{cf.path}:{node.lineno}"))
        if new is not None:
            for stmt in new.statements_touching(cf.added):
                for g in new.guards(stmt):
                    phase_words.append((g.text, f"{cf.path}:{g.line}"))
                    if result.runtime_phase is None and g.holds and g.how != "early exit":
                        result.runtime_phase = runtime_phase(g.test, g.line)
    _summarize_hot(result)
    _summarize_phases(result, phase_words)
    if gate is not None:
        kind, key, evidence = gate
        result.detected_gate = (kind, key)
        result.signals.append(Signal(GATING, f"the diff reads a switch: {kind} {key}".rstrip(), tuple(evidence)))
    else:
        result.signals.append(Signal(GATING, "the diff reads no env var, flag or config key: ungated in code"))
    result.factors = sorted({s.data["factor"] for s in result.of(SCALE) if "factor" in s.data})
    return result


def class_signals(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """The Python rules that read both versions of a file for one class of change each."""
    return [
        *inplace_in_loop(cf, old, new),
        *kernel_indexing(cf, old, new),
        *moved_slices(cf, old, new),
        *buffer_to_float(cf, old, new),
        *uninitialised(cf, old, new),
        *dropped_arguments(cf, old, new),
        *defaults_flipped(cf, old, new),
        *widened(cf, old, new),
        *cuda_graph(cf, old, new),
        *precision_under_new_condition(cf, new),
    ]


_PROSE = (".md", ".rst", ".txt", ".adoc")


def _is_prose(path: str) -> bool:
    return path.lower().endswith(_PROSE) or path.rsplit("/", 1)[-1].upper().startswith(("LICENSE", "README"))


def _first_changes(cf: ChangedFile, limit: int = 4) -> list[Evidence]:
    out = [Evidence(cf.path, ln, "-", cf.removed_text(ln)) for ln in sorted(cf.removed)]
    out += [Evidence(cf.path, ln, "+", cf.added_text(ln)) for ln in sorted(cf.added)]
    code = [e for e in out if e.text.strip() and not e.text.lstrip().startswith(("import ", "from ", "#"))]
    return code[:limit] or out[:1]


def _c_argument_signals(cf: ChangedFile, old_text: str, new_text: str) -> list[Signal]:
    """C-family, on tokens: an identity literal swapped with a scale-like expression at a call argument, a case
    label moved to another group of a ``switch``, a precision request removed or re-conditioned."""
    out: list[Signal] = []
    for ch in argument_changes(old_text, new_text, cf.removed, cf.added):
        evidence = (
            Evidence(cf.path, ch.old_line, "-", cf.removed_text(ch.old_line)),
            Evidence(cf.path, ch.new_line, "+", cf.added_text(ch.new_line)),
        )
        scale_like = ch.before if ch.change == "factor replaced by identity" else ch.after
        data = {"factor": scale_like, "change": ch.change, "slot": f"{ch.callee}(argument {ch.index + 1})"}
        out.append(Signal(SCALE, f"{ch.summary} ({cf.path}:{ch.new_line})", evidence, method="tokens", data=data))
    for mv in case_moves(old_text, new_text, cf.removed, cf.added):
        lines = (
            Evidence(cf.path, mv.old_line, "-", cf.removed_text(mv.old_line)),
            Evidence(cf.path, mv.new_line, "+", cf.added_text(mv.new_line)),
        )
        moved = {"kind": "case moved", "moved": True, "label": mv.label, "before": mv.before, "after": mv.after}
        out.append(Signal(GUARD, f"{mv.summary} ({cf.path}:{mv.new_line})", lines, method="tokens", data=moved))
    out.extend(_collapse_signals(cf, c_collapses(old_text, new_text, cf.removed, cf.added), "tokens"))
    for sw in switches_unset(old_text, new_text, cf.removed, cf.added):
        ev = [*_old_and_new(cf, sw.old_line, sw.new_line), Evidence(cf.path, sw.reader_line, " ", sw.reader)]
        unset = {"kind": "switch unset", "collapsed": True, "condition": sw.reader, "target": sw.target}
        out.append(Signal(GUARD, f"{sw.summary} ({cf.path}:{sw.old_line})", tuple(ev), method="tokens", data=unset))
    for pc in precision_changes(old_text, new_text, cf.removed, cf.added):
        ev = _old_and_new(cf, pc.old_line, pc.new_line)
        where = f"{cf.path}:{pc.new_line or pc.old_line}"
        kind = {"kind": "precision request", "conditions": list(pc.conditions)}
        out.append(Signal(PRECISION, f"{pc.summary} ({where})", tuple(ev), method="tokens", data=kind))
    return out


def _old_and_new(cf: ChangedFile, old_line: int, new_line: int | None) -> list[Evidence]:
    """The removed line and, when there is one, the line that replaced it."""
    ev = [Evidence(cf.path, old_line, "-", cf.removed_text(old_line))]
    if new_line is not None:
        ev.append(Evidence(cf.path, new_line, "+", cf.added_text(new_line)))
    return ev


def _collapse_signals(cf: ChangedFile, found: list[Collapse], method: str) -> list[Signal]:
    """A selection collapsed into one arm: a guard-class signal (the cases a condition selected now take the other
    arm), with the old and new lines."""
    out: list[Signal] = []
    for c in found:
        lines = (
            Evidence(cf.path, c.old_line, "-", cf.removed_text(c.old_line)),
            Evidence(cf.path, c.new_line, "+", cf.added_text(c.new_line)),
        )
        data = {"kind": "selection collapsed", "collapsed": True, "condition": c.condition}
        out.append(Signal(GUARD, f"{c.summary} ({cf.path}:{c.new_line})", lines, method=method, data=data))
    return out


def _identity_signals(
    cf: ChangedFile, old: Module, new: Module, flow: Flow, found: list[IdentityChange]
) -> list[Signal]:
    """A removed or changed identity selection whose value reaches a multiply: a scale-logic change."""
    out: list[Signal] = []
    changes = identity_changes(cf.path, old, new, cf.removed, flow)
    changes += literal_changes(cf.path, old, new, cf.added, cf.removed, flow)
    changes += statement_identity_changes(cf.path, old, new, cf.removed, cf.added, flow)
    for change in changes:
        unread = not change.reaches and not flow.resolves(new, change.new_node)
        if not change.reaches and not change.unconditional and not (unread and _FACTOR_NAME.search(change.factor)):
            continue  # the value provably reaches no multiply
        found.append(change)
        evidence = (
            *(
                (Evidence(cf.path, change.old_line, "-", cf.removed_text(change.old_line)),)
                if change.before != "(not passed)"
                else ()
            ),
            Evidence(cf.path, change.new_line, "+", cf.added_text(change.new_line)),
            *(Evidence(r.site.file, r.site.line, " ", r.site.code) for r in change.reaches[:3]),
        )
        out.append(Signal(SCALE, change.summary, evidence, data=change.to_json()))
    return out


def _summarize_hot(result: PatchSignals) -> None:
    best = result.best_hot_path
    if best is None:
        return
    hot = [h for h in result.hot_paths if h.level not in (SETUP, UNKNOWN)]
    summary = "; ".join(h.describe() for h in (hot or result.hot_paths))
    evidence = tuple(Evidence(h.function.split(":")[0], 0, " ", " <- ".join(h.chain)) for h in result.hot_paths)
    result.signals.append(Signal(HOT_PATH, f"{best.level}: {summary}", evidence, data={"level": best.level}))


def _summarize_phases(result: PatchSignals, words: list[tuple[str, str]]) -> None:
    decode = [(w, where) for w, where in words if _DECODE.search(w)]
    prefill = [(w, where) for w, where in words if _PREFILL.search(w)]
    if decode and not prefill:
        result.phases, why = "decode", f"names on the changed path speak of decode/cache: {decode[0][0]}"
    elif prefill and not decode:
        result.phases, why = "prefill", f"names on the changed path speak of prefill/chunking: {prefill[0][0]}"
    else:
        result.phases, why = (
            "both",
            "no phase-specific name or branch on the changed path: a forward runs in prefill and decode",
        )
    ev = tuple(
        Evidence(where.rsplit(":", 1)[0], int(where.rsplit(":", 1)[1]), " ", w) for w, where in (decode + prefill)[:4]
    )
    result.signals.append(
        Signal(PHASES, f"{result.phases} (a guess: {why})", ev, guess=True, data={"phases": result.phases})
    )
