"""The culprit's diff and its decoys, made by rule on the culprit's file (never written per case)."""

from __future__ import annotations

import ast
import difflib
import re


def apply_edits(text: str, edits: list[tuple[str, str]], where: str) -> str:
    """Each edit's old text must occur once; an old text prefixed with ``ALL:`` is replaced everywhere."""
    for old, new in edits:
        every = old.startswith("ALL:")
        old = old.removeprefix("ALL:")
        if text.count(old) != 1 and not (every and text.count(old) > 1):
            raise SystemExit(f"{where}: the edit's old text occurs {text.count(old)} times: {old[:60]!r}")
        text = text.replace(old, new)
    return text


def udiff(rel: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))


def first_line(before: str, edits: list[tuple[str, str]]) -> int:
    return before[: before.index(edits[0][0].removeprefix("ALL:"))].count("\n") + 1


def _function_at(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best = None
    for n in ast.walk(tree):
        inside = isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= line <= (n.end_lineno or 0)
        if inside and (best is None or n.lineno >= best.lineno):
            best = n
    return best


def decoy_comment(text: str, line: int, mark: str = "#") -> str | None:
    lines = text.split("\n")
    indent = re.match(r"\s*", lines[line - 1]).group(0)  # type: ignore[union-attr]
    lines.insert(line - 1, f"{indent}{mark} decoy: a comment only")
    return "\n".join(lines)


_LOG = re.compile(r"(logger\.(?:info|debug|warning|info_once|warning_once|debug_once)\(\s*)([\"'])")


def decoy_message(text: str, tree: ast.Module, line: int) -> str | None:
    m = _LOG.search(text)
    if m:
        return text[: m.end()] + "[decoy] " + text[m.end() :]
    func = _function_at(tree, line)
    if func is None or not func.body:
        return None
    lines = text.split("\n")
    body = func.body[0]
    indent = re.match(r"\s*", lines[body.lineno - 1]).group(0)  # type: ignore[union-attr]
    lines.insert(body.lineno - 1, f'{indent}"""Decoy docstring."""')
    return "\n".join(lines)


def decoy_rewrite(text: str, tree: ast.Module) -> str | None:
    lines = text.split("\n")
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.AugAssign)
            and isinstance(n.op, ast.Mult)
            and n.lineno == n.end_lineno
            and isinstance(n.target, ast.Name)
        ):
            src = lines[n.lineno - 1]
            seg = ast.get_source_segment(text, n)
            if seg and src.count(seg) == 1:
                lines[n.lineno - 1] = src.replace(seg, f"{n.target.id}.mul_({ast.get_source_segment(text, n.value)})")
                return "\n".join(lines)
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Compare)
            and len(n.ops) == 1
            and isinstance(n.ops[0], ast.Eq)
            and isinstance(n.comparators[0], ast.Constant)
            and isinstance(n.comparators[0].value, str)
            and n.lineno == n.end_lineno
        ):
            seg = ast.get_source_segment(text, n.comparators[0])
            src = lines[n.lineno - 1]
            old = f"== {seg}"
            if seg and src.count(old) == 1:
                lines[n.lineno - 1] = src.replace(old, f"in ({seg},)")
                return "\n".join(lines)
    return None


def decoy_precision(text: str, tree: ast.Module, line: int) -> str | None:
    func = _function_at(tree, line)
    skip = range(func.lineno, (func.end_lineno or func.lineno) + 1) if func else range(0)
    lines = text.split("\n")
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == "float32" and n.lineno not in skip:
            src = lines[n.lineno - 1]
            if src.count("torch.float32") == 1:
                lines[n.lineno - 1] = src.replace("torch.float32", "torch.bfloat16")
                return "\n".join(lines)
    return None
