"""C-family ``switch`` statements, read on the statements and block headers of ``_cargs`` (tokens): a case
label moved from one group of cases to another
(``case LLM_ARCH_X:`` taken out of the cases that ``return A`` and put among those that ``return B``).
The key still matches, but it now selects another value or another branch: a selection change, named
with both outcomes.

Catches::

    case LLM_ARCH_PLAMO:   (from the LLAMA_ROPE_TYPE_NEOX cases to the NORM ones)

"""

from __future__ import annotations

from dataclasses import dataclass

from speedtrap.triage.cfamily.hot_loop import definition
from speedtrap.triage.cfamily.statements import Token, statements, with_headers
from speedtrap.triage.cfamily.tokens import tokens_at


@dataclass(frozen=True)
class CaseMove:
    label: str
    switch: str  # "switch (arch) in llama_model_rope_type"
    before: str  # what the label's group did: "return LLAMA_ROPE_TYPE_NEOX"
    after: str
    old_line: int
    new_line: int

    @property
    def summary(self) -> str:
        return (
            f"moves `case {self.label}:` of {self.switch} from the cases that `{self.before}` to those that "
            f"`{self.after}`: that key now selects another value or branch"
        )


def _labels(stmt: list[Token]) -> tuple[list[tuple[str, int]], list[str]]:
    """The case labels (with their lines) a statement opens with (``case A: case B:``, ``default:``), and the
    tokens after them."""
    labels: list[tuple[str, int]] = []
    i = 0
    while i < len(stmt) and stmt[i][0] in ("case", "default"):
        j = i + 1
        while j < len(stmt) and stmt[j][0] != ":":
            j += 1
        labels.append((" ".join(t for t, _ in stmt[i + 1 : j]) if stmt[i][0] == "case" else "default", stmt[i][1]))
        i = j + 1
    return labels, [t for t, _ in stmt[i:]]


def _switch_words(headers: tuple[str, ...]) -> str | None:
    """The innermost ``switch`` around a statement, with the function that holds it."""
    switch = next((h for h in reversed(headers) if h.startswith("switch(")), None)
    if switch is None:
        return None
    func = next((name for h in headers if (name := definition(h)) is not None), None)
    return f"switch {switch.removeprefix('switch').removesuffix('{')} in {func or 'file scope'}"


def case_groups(text: str) -> dict[tuple[str, str], tuple[str, int]] | None:
    """Each case label keyed by (its switch, the label), with what its group does first and its line."""
    toks = tokens_at(text)
    if toks is None:
        return None
    out: dict[tuple[str, str], tuple[str, int]] = {}
    pending: list[tuple[str, int]] = []  # labels whose group opens a block: its first statement says
    switch: str | None = None
    for stmt, headers in with_headers(statements(toks)):
        labels, rest = _labels(stmt)
        if labels:
            switch = _switch_words(headers)
            pending = labels
            if rest in (["{"], []):
                continue
        if pending and switch is not None:
            does = " ".join(rest if labels else [t for t, _ in stmt]).rstrip(" ;{")
            for label, line in pending:
                out.setdefault((switch, label), (does, line))
        pending = []
    return out


def case_moves(old_text: str, new_text: str, removed: frozenset[int], added: frozenset[int]) -> list[CaseMove]:
    """Labels on changed lines whose group does something else after the patch."""
    old, new = case_groups(old_text), case_groups(new_text)
    if old is None or new is None:
        return []
    out: list[CaseMove] = []
    for key, (after, new_line) in sorted(new.items()):
        if key not in old:
            continue
        before, old_line = old[key]
        if before != after and (old_line in removed or new_line in added):
            out.append(CaseMove(key[1], key[0], before, after, old_line, new_line))
    return out
