"""Proof that a change to a C-family file (C, C++, CUDA, Metal headers and sources) is inert: both
versions give the same token stream once comments and layout are dropped.

Tokens are string and character literals (kept whole, so ``"//"`` inside a string is not a comment),
identifiers and numbers, and operators read longest first (``->`` is one token, ``- >`` two).
A comment counts as a space, as the C preprocessor reads it. Line ends matter only inside
preprocessor directives (a ``#define`` ends at its line end), so each directive line keeps a
line-end token. A raw string literal (``R"(...)"``) is not tokenised here: such a file is never
proven inert.
"""

from __future__ import annotations

import re

C_FAMILY = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".cu", ".cuh", ".inl", ".metal", ".m", ".mm")
_TOKEN = re.compile(
    r"""(?P<comment>//[^\n]*|/\*.*?\*/)"""
    r"""|(?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')"""
    r"""|(?P<newline>\\?\n)"""
    r"""|(?P<space>[ \t\r\f\v]+)"""
    r"""|(?P<word>[A-Za-z0-9_.]+)"""
    r"""|(?P<punct>->\*|<<=|>>=|\.\.\.|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|::|##|.)""",
    re.S,
)
_RAW = re.compile(r"""\b(?:u8|u|U|L)?R\"""")


def tokens(text: str) -> list[str] | None:
    """The token stream of ``text``, or None when it cannot be read safely (a raw string, an
    unterminated comment or literal)."""
    found = tokens_at(text)
    return None if found is None else [t for t, _ in found]


def tokens_at(text: str) -> list[tuple[str, int]] | None:
    """The token stream of ``text`` with the line (1-based) each token starts on; None as for :func:`tokens`."""
    if _RAW.search(text):
        return None
    out: list[tuple[str, int]] = []
    directive = False
    at_line_start = True
    line = 1
    for m in _TOKEN.finditer(text):
        kind, value = m.lastgroup, m.group()
        here = line
        line += value.count("\n")
        if kind == "comment":
            if value.startswith("/*") and not value.endswith("*/"):
                return None
            if "\n" in value and directive:
                return None  # a comment spanning lines inside a directive: not read here
            continue
        if kind == "space":
            continue
        if kind == "newline":
            if value == "\\\n":
                continue  # a continued line: the directive goes on
            if directive:
                out.append(("\n", here))
            directive, at_line_start = False, True
            continue
        if kind == "punct" and value in "\"'":
            return None  # an unterminated literal
        if kind == "punct" and value == "/" and text.startswith("/*", m.start()):
            return None
        if at_line_start and value == "#":
            directive = True
        at_line_start = False
        out.append((value, here))
    return out


def inert_c(old: str, new: str) -> str | None:
    """Why the change cannot change the compiled code, or None when unproven."""
    a, b = tokens(old), tokens(new)
    if a is None or b is None or a != b:
        return None
    return "comments or layout only (C-family tokens compared)"
