"""A switch no longer set (C-family, on tokens): a statement ``a.b = true;`` (or ``false``) removed, or its
value flipped, where the same file reads ``b`` as a condition (``if (... b ...)``, ``c ? ...``, or a local
initialised from it and then tested: ``const bool use_rope = hparams.rope_finetuned; if (use_rope) {``).

The code that set it (a loader case for one architecture, say) no longer does, so every test of the flag
for those cases now sees the value it has otherwise (its default, or the file's other assignments): the path
it switched on or off is selected the other way. Read on ``_cargs``' statements; only the same file is
searched for the tests, and the statement that reads the flag is named.

Catches::

    hparams.rope_finetuned = true;   ->   (removed; the graph builder tests rope_finetuned)

"""

from __future__ import annotations

from dataclasses import dataclass

from speedtrap.triage.cfamily.statements import Token, statements
from speedtrap.triage.cfamily.tokens import tokens_at

_BOOL = {"true", "false"}


@dataclass(frozen=True)
class SwitchUnset:
    target: str  # the lvalue, as written: hparams.rope_finetuned
    value: str  # the value it was set to
    now: str | None  # the value it is set to now (flipped), None when removed
    old_line: int
    new_line: int | None
    reader: str  # the test that reads it
    reader_line: int

    @property
    def summary(self) -> str:
        what = (
            f"sets `{self.target} = {self.now}` instead of `{self.value}`"
            if self.now
            else (f"no longer sets `{self.target} = {self.value}`")
        )
        return (
            f"{what}: the test `{self.reader}` (line {self.reader_line}) now selects the other path for the cases "
            "that set it"
        )


def _member(text: str) -> str | None:
    """The field a dotted name ends in (``hparams.rope_finetuned`` -> ``rope_finetuned``; the tokeniser keeps a
    dotted name whole); None for a plain name."""
    parts = text.replace("->", ".").split(".")
    return parts[-1] if len(parts) > 1 and all(p.isidentifier() for p in parts) else None


def _assignment(stmt: list[Token]) -> tuple[str, str] | None:
    """``a.b = true;`` as (lvalue text, value); a declaration (``bool x = true;``) or a plain local is not a switch
    that another function reads."""
    texts = [t for t, _ in stmt]
    if len(texts) != 4 or texts[1] != "=" or texts[2] not in _BOOL or texts[3] != ";" or _member(texts[0]) is None:
        return None
    return texts[0], texts[2]


def _reader(stmts: list[list[Token]], member: str, skip: int) -> tuple[str, int] | None:
    """The first test in the file that reads ``member`` (a field), directly or through a local it initialises: an
    ``if``/``while`` first, then a ``c ? a : b`` (often only a log line's wording)."""
    locals_: set[str] = set()
    direct: list[list[Token]] = []
    for stmt in stmts:
        texts = [t for t, _ in stmt]
        if stmt[0][1] == skip or not any(_member(t) == member for t in texts):
            continue
        direct.append(stmt)
        at = texts.index("=") if "=" in texts else -1
        if at > 0 and texts[at - 1].isidentifier() and any(_member(t) == member for t in texts[at + 1 :]):
            locals_.add(texts[at - 1])  # const bool use_rope = hparams.rope_finetuned;
    through = [s for s in stmts if locals_ & {t for t, _ in s}]
    for tests in ({"if", "while"}, {"?"}):
        for stmt in (*direct, *through):
            if tests & {t for t, _ in stmt}:
                return " ".join(t for t, _ in stmt), stmt[0][1]
    return None


def switches_unset(old_text: str, new_text: str, removed: frozenset[int], added: frozenset[int]) -> list[SwitchUnset]:
    old_toks, new_toks = tokens_at(old_text), tokens_at(new_text)
    if old_toks is None or new_toks is None:
        return []
    old_stmts, new_stmts = statements(old_toks), statements(new_toks)
    kept = {tuple(t for t, _ in s) for s in new_stmts}
    added_sets = {}
    for s in new_stmts:
        if any(s[0][1] <= ln <= s[-1][1] for ln in added) and (a := _assignment(s)) is not None:
            added_sets[a[0]] = (a[1], s[0][1])
    out: list[SwitchUnset] = []
    for s in old_stmts:
        if not any(s[0][1] <= ln <= s[-1][1] for ln in removed):
            continue
        found = _assignment(s)
        if found is None or (tuple(t for t, _ in s) in kept and found[0] not in added_sets):
            continue
        target, value = found
        now, new_line = added_sets.get(target, (None, None))
        if now == value:
            continue
        member = _member(target) or target
        reader = _reader(old_stmts, member, s[0][1])
        if reader is None:
            continue
        text = reader[0].replace("( ", "(").replace(" )", ")")
        out.append(SwitchUnset(target, value, now, s[0][1], new_line, text[:80], reader[1]))
    return out
