"""Reasons a person reads in one pass: a headline of about ``HEADLINE`` characters, the evidence (lines,
conditions, the flow) below it as separate lines.

``split_reason`` cuts a reason written as one run of clauses (``a; b; c``) into its first clause and the rest,
outside backticks and brackets; a first clause still too long loses its bracketed asides and long inline code
to the evidence lines (which keep the whole clause), and is cut at a word as a last resort. The text output
prints the headline, then each evidence line indented below it; the JSON keeps both.
"""

from __future__ import annotations

import re

HEADLINE = 160  # a headline's aim; the test bound on what the text output prints is 200
LINE = 200  # an evidence line longer than this has its inline code shortened (its words are kept)
_CODE = 48  # inline code longer than this is shortened in a headline
_PLACE = re.compile(r"\.\w+:\d+")  # a place in the tree: file.py:12


def _top_level(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` where it stands outside backticks, brackets and parentheses."""
    out, depth, code, start, i = [], 0, False, 0, 0
    while i < len(text):
        c = text[i]
        if c == "`":
            code = not code
        elif not code and c in "([{":
            depth += 1
        elif not code and c in ")]}":
            depth = max(0, depth - 1)
        elif not code and depth == 0 and text.startswith(sep, i):
            out.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    out.append(text[start:])
    return [p.strip() for p in out if p.strip()]


def _asides(text: str) -> list[str]:
    """The top-level bracketed asides (``(...)``) of ``text``, outside inline code."""
    asides: list[str] = []
    depth, code, start = 0, False, 0
    for i, c in enumerate(text):
        if c == "`":
            code = not code
        elif not code and c == "(":
            start = i if depth == 0 else start
            depth += 1
        elif not code and c == ")" and depth:
            depth -= 1
            if depth == 0:
                asides.append(text[start : i + 1])
    return asides


def _shorter(text: str, limit: int) -> str:
    """A clause cut to ``limit``: long inline code shortened, then asides dropped, longest first (one naming a
    place, ``file.py:12``, is kept), then the words past the limit."""
    text = short_code(text) if len(text) > limit else text
    for aside in sorted(_asides(text), key=len, reverse=True):
        if len(text) <= limit:
            return text
        if not _PLACE.search(aside):
            text = text.replace(" " + aside, "", 1) if " " + aside in text else text.replace(aside, "", 1)
    return _cut(text, limit)


def short_code(text: str, limit: int = _CODE) -> str:
    """Inline code spans (```...```) longer than ``limit`` cut to ``limit`` with an ellipsis."""
    parts = text.split("`")
    for i in range(1, len(parts), 2):  # odd parts are inside backticks
        if len(parts[i]) > limit:
            parts[i] = parts[i][: limit - 1].rstrip() + "…"
    return "`".join(parts)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    return (head.rsplit(" ", 1)[0] if " " in head else head).rstrip(",;:") + "…"


def attach(text: str, suffix: str) -> str:
    """``text`` with ``suffix`` added to its first clause (the one a headline keeps)."""
    clauses = _top_level(" ".join(text.split()), "; ")
    return "; ".join([clauses[0] + suffix, *clauses[1:]]) if clauses else suffix


def split_reason(text: str) -> tuple[str, tuple[str, ...]]:
    """A reason as (headline, evidence lines): unchanged when it is short enough; else its first clauses as far
    as they fit, the rest one evidence line each (a first clause cut short is kept whole as the first line)."""
    text = " ".join(text.split())
    if len(text) <= HEADLINE:
        return text, ()
    clauses = _top_level(text, "; ")
    head, rest = clauses[0], clauses[1:]
    lines: list[str] = []
    if len(head) > HEADLINE:
        lines.append(head)
        head = _shorter(head, HEADLINE)
    while rest and len(head) + 2 + len(rest[0]) <= HEADLINE:
        head = f"{head}; {rest.pop(0)}"
    lines.extend(rest)
    return head, tuple(evidence_line(line) for line in lines)


def evidence_line(text: str) -> str:
    """One evidence line: its words all kept, its inline code shortened when the line runs past ``LINE``."""
    text = " ".join(text.split())
    return short_code(text, 72) if len(text) > LINE else text
