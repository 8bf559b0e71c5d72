"""Triage of one patch that changes one file of a small tree (the file's text before and after); small trees laid
out from their files' texts, and diffs of edits to them."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

from speedtrap.triage import PatchReport, from_diff_files, triage


def triage_one_file(tmp_path: Path, rel: str, before: str, after: str) -> tuple[int, tuple[str, ...]]:
    """The tier and reasons of the diff ``before`` -> ``after`` of ``rel`` in a tree holding ``before``."""
    p = triage_one_report(tmp_path, rel, before, after)
    return p.tier, p.ranking.in_full  # each reason with its evidence lines


def triage_one_report(
    tmp_path: Path, rel: str, before: str, after: str, others: dict[str, str] | None = None
) -> PatchReport:
    """The whole report of the diff ``before`` -> ``after`` of ``rel`` in a tree holding ``before`` (and the
    unchanged files ``others``, by path)."""
    assert after != before
    for path, text in {**(others or {}), rel: before}.items():
        (tmp_path / "tree" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / path).write_text(text)
    diff = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    (tmp_path / "p.diff").write_text(diff)
    [p] = triage(from_diff_files([tmp_path / "p.diff"], tmp_path / "tree")).patches
    return p


def triage_edit(
    tmp_path: Path, rel: str, text: str, old: str, new: str, others: dict[str, str] | None = None
) -> PatchReport:
    """The report of ``text`` (the file ``rel``) with its one occurrence of ``old`` replaced by ``new``."""
    assert text.count(old) == 1
    return triage_one_report(tmp_path, rel, text, text.replace(old, new), others)


def changed_lines(old: str, new: str) -> tuple[frozenset[int], frozenset[int]]:
    """The lines (1-based) of ``old`` removed and of ``new`` added by the change ``old`` -> ``new``."""
    removed, added = set(), set()
    sm = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op != "equal":
            removed |= set(range(i1 + 1, i2 + 1))
            added |= set(range(j1 + 1, j2 + 1))
    return frozenset(removed), frozenset(added)


def lay_tree(root: Path, files: dict[str, str]) -> Path:
    """A tree at ``root`` holding ``files`` (path -> text, dedented)."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def edit_diff(tree: Path, rel: str, edits: list[tuple[str, str]], out: Path) -> Path:
    """The diff (written to ``out``) of ``rel`` in ``tree`` with each ``old`` replaced by ``new``, in order."""
    before = (tree / rel).read_text()
    after = before
    for old, new in edits:
        assert old in after, old
        after = after.replace(old, new)
    out.write_text(
        "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    )
    return out
