"""C-family ``switch`` statements read on tokens: a case label moved from one group of cases to another
(``case LLM_ARCH_X:`` taken out of the cases that ``return A`` and put among those that ``return B``).
The key still matches, but it now selects another value or another branch: a selection change, named
with both outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass

from speedtrap.triage._ctokens import tokens_at

Token = tuple[str, int]  # (text, line)


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


def _function_before(toks: list[Token], i: int) -> str | None:
    """The name of the function whose body opens at ``toks[i]`` (``name ( ... ) [const] {``)."""
    j = i - 1
    while j >= 0 and toks[j][0] in ("const", "override", "noexcept", "final"):
        j -= 1
    if j < 0 or toks[j][0] != ")":
        return None
    depth = 0
    while j >= 0:
        depth += {")": 1, "(": -1}.get(toks[j][0], 0)
        if depth == 0:
            break
        j -= 1
    name = toks[j - 1][0] if j > 0 else ""
    return name if name.replace("_", "a").isalnum() and name not in ("if", "for", "while", "switch") else None


def _statement(toks: list[Token], i: int) -> str:
    """The first statement from ``toks[i]`` (inside a ``{`` block if one opens there), as text."""
    if i < len(toks) and toks[i][0] == "{":
        i += 1
    out: list[str] = []
    depth = 0
    while i < len(toks) and len(out) < 40:
        text = toks[i][0]
        if depth == 0 and text in (";", "}"):
            break
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(text, 0)
        out.append(text)
        i += 1
    return " ".join(out)


def case_groups(text: str) -> dict[tuple[str, str], tuple[str, int]] | None:
    """Each case label keyed by (its switch, the label), with what its group does and its line."""
    toks = tokens_at(text)
    if toks is None:
        return None
    out: dict[tuple[str, str], tuple[str, int]] = {}
    depth, func = 0, ""
    switches: list[tuple[int, str]] = []  # (brace depth of the switch body, its words)
    seen: dict[str, int] = {}
    pending: list[tuple[str, int]] = []  # labels waiting for their group's first statement
    i = 0
    while i < len(toks):
        text = toks[i][0]
        if text == "switch" and i + 1 < len(toks) and toks[i + 1][0] == "(":
            j, par = i + 1, 0
            while j < len(toks):
                par += {"(": 1, ")": -1}.get(toks[j][0], 0)
                if par == 0:
                    break
                j += 1
            words = f"switch ({' '.join(t for t, _ in toks[i + 2 : j])}) in {func or 'file scope'}"
            seen[words] = seen.get(words, 0) + 1
            if seen[words] > 1:
                words += f" (#{seen[words]})"
            if j + 1 < len(toks) and toks[j + 1][0] == "{":
                switches.append((depth + 1, words))
                depth += 1
                i = j + 2
                continue
        if text == "{":
            if depth == 0:
                func = _function_before(toks, i) or func
            depth += 1
        elif text == "}":
            if switches and switches[-1][0] == depth:
                switches.pop()
            depth -= 1
        elif text in ("case", "default") and switches:
            j = i + 1
            while j < len(toks) and toks[j][0] != ":":
                j += 1
            label = " ".join(t for t, _ in toks[i + 1 : j]) if text == "case" else "default"
            pending.append((label, toks[i][1]))
            i = j + 1
            continue
        elif pending and switches:
            does = _statement(toks, i)
            for label, line in pending:
                out[(switches[-1][1], label)] = (does, line)
            pending = []
            continue  # the statement's tokens are read again for nested switches and braces
        i += 1
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
