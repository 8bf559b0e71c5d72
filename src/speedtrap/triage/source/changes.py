"""A patch's diff laid onto the tree: per file, the old and new text and the lines it touched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedtrap._errors import PatchError
from speedtrap.triage.source.diff import FilePatch, apply_patch, parse_diff
from speedtrap.triage.source.index import SourceIndex
from speedtrap.triage.source.pyast import Module, parse_module


@dataclass(frozen=True)
class ChangedFile:
    path: str  # relative to the tree root
    patch: FilePatch
    old_text: str | None
    new_text: str | None
    added: frozenset[int]  # lines of new_text
    removed: frozenset[int]  # lines of old_text
    note: str = ""  # how it applied, when not cleanly ("with offset", "on top of earlier patches")

    @property
    def is_python(self) -> bool:
        return self.path.endswith(".py")

    def old_module(self) -> Module | None:
        return parse_module(self.path, self.old_text) if self.is_python and self.old_text is not None else None

    def new_module(self) -> Module | None:
        return parse_module(self.path, self.new_text) if self.is_python and self.new_text is not None else None

    def added_text(self, line: int) -> str:
        lines = (self.new_text or "").split("\n")
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def removed_text(self, line: int) -> str:
        lines = (self.old_text or "").split("\n")
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "added": len(self.added), "removed": len(self.removed), "note": self.note}


def _without_tree(fp: FilePatch) -> ChangedFile:
    """The file as far as the diff alone shows it: context and changed lines, numbered as in the diff."""
    old: dict[int, str] = {}
    new: dict[int, str] = {}
    for hunk in fp.hunks:
        for ln in hunk.lines:
            if ln.old_no is not None:
                old[ln.old_no] = ln.text
            if ln.new_no is not None:
                new[ln.new_no] = ln.text

    def render(lines: dict[int, str]) -> str:
        return "\n".join(lines.get(i, "") for i in range(1, max(lines, default=0) + 1))

    added = frozenset(ln.new_no for ln in fp.added() if ln.new_no is not None)
    removed = frozenset(ln.old_no for ln in fp.removed() if ln.old_no is not None)
    return ChangedFile(fp.path, fp, render(old), render(new), added, removed, "no tree: read from the diff alone")


def lay_patch(
    diff: str, name: str, index: SourceIndex | None, stacked: dict[str, str], file_hint: str = ""
) -> list[ChangedFile]:
    """Apply one patch's diff to the tree (or, failing that, on top of the patches before it).

    ``stacked`` holds the text of files as the earlier patches left them and is updated in place.
    A diff that applies to neither raises a :class:`PatchError`.
    """
    files = parse_diff(diff, f"patch {name!r}")
    out: list[ChangedFile] = []
    for fp in files:
        if fp.binary:
            out.append(ChangedFile(fp.path, fp, None, None, frozenset(), frozenset(), "binary: not read"))
            continue
        if index is None:
            out.append(_without_tree(fp))
            continue
        rel = index.resolve(fp.old_path or fp.path) if fp.old_path else None
        if rel is None and fp.old_path and file_hint and len(files) == 1:
            rel = index.resolve(file_hint)
        if rel is None and fp.old_path is not None:
            raise PatchError(
                f"patch {name!r} changes {fp.old_path}, which is not in {index.root}",
                "point --tree at the source tree the patch was written against",
            )
        rel = rel or (fp.new_path or fp.path)
        base = index.read(rel) if fp.old_path else None
        try:
            applied = apply_patch(fp, base, str(index.root))
            note = ""
        except PatchError:
            if rel not in stacked:
                raise
            applied = apply_patch(fp, stacked[rel], f"{index.root} with the earlier patches applied")
            base = stacked[rel]
            note = "applies on top of the earlier patches"
        if applied.loose:
            note = (note + "; " if note else "") + "applied ignoring trailing whitespace"
        if any(applied.offsets):
            note = (note + "; " if note else "") + f"applied with line offsets {list(applied.offsets)}"
        new_text = None if fp.new_path is None else applied.text
        out.append(ChangedFile(rel, fp, base, new_text, applied.added, applied.removed, note))
        if new_text is not None:
            try:
                stacked[rel] = apply_patch(fp, stacked.get(rel, base), "stack").text
            except PatchError:
                stacked[rel] = new_text
    return out
