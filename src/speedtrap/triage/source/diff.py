"""A strict, total unified-diff parser and a hunk applier.

``parse_diff`` accepts what ``diff -u``, ``git diff``, ``git show`` and ``git format-patch`` write
(mail headers and commit messages before the first file header are skipped). It either returns
the files and hunks or raises :class:`DiffError` naming the diff line at fault; it never raises
anything else, whatever the input (a hypothesis test holds it to that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from speedtrap._errors import PatchError, UsageError


class DiffError(UsageError):
    """A diff that cannot be read: binary, malformed, or with no hunks at all."""


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_GIT_HEADER_RE = re.compile(r"^diff --git (\S+|\"(?:[^\"\\]|\\.)*\") (\S+|\"(?:[^\"\\]|\\.)*\")\s*$")
_MAX_COUNT = 10_000_000


@dataclass(frozen=True)
class HunkLine:
    op: str  # " " context, "-" removed, "+" added
    text: str
    old_no: int | None  # 1-based line number in the old file (context and removed lines)
    new_no: int | None  # 1-based line number in the new file (context and added lines)


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    section: str  # the text after the second @@ (often the enclosing function)
    lines: tuple[HunkLine, ...]
    diff_line: int  # where the @@ header is in the diff (1-based)

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"

    def old_block(self) -> list[str]:
        return [ln.text for ln in self.lines if ln.op != "+"]

    def new_block(self) -> list[str]:
        return [ln.text for ln in self.lines if ln.op != "-"]


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    hunks: tuple[Hunk, ...]
    binary: bool = False
    diff_line: int = 0

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    def added(self) -> list[HunkLine]:
        return [ln for h in self.hunks for ln in h.lines if ln.op == "+"]

    def removed(self) -> list[HunkLine]:
        return [ln for h in self.hunks for ln in h.lines if ln.op == "-"]

    def to_json(self) -> dict[str, Any]:
        return {
            "old_path": self.old_path,
            "new_path": self.new_path,
            "binary": self.binary,
            "hunks": [h.header for h in self.hunks],
            "added": len(self.added()),
            "removed": len(self.removed()),
        }


def decode_diff(data: bytes, source: str) -> str:
    """Diff bytes as text; binary data (NUL bytes, not UTF-8/Latin-1 text) is a DiffError."""
    if b"\x00" in data:
        raise DiffError(
            f"{source} is binary (it contains NUL bytes), not a unified diff",
            "pass a text diff written by `git diff`, `git format-patch` or `diff -u`",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        controls = sum(1 for b in data[:4096] if b < 9 or 13 < b < 32)
        if controls > 0:
            raise DiffError(
                f"{source} is binary, not a unified diff", "pass a text diff written by `git diff` or `diff -u`"
            ) from None
        return data.decode("latin-1")


def _strip_path(raw: str, git: bool) -> str | None:
    path = raw.split("\t", 1)[0].rstrip()
    if len(path) >= 2 and path[0] == '"' and path[-1] == '"':
        try:
            path = path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        except (UnicodeDecodeError, UnicodeEncodeError):
            path = path[1:-1]
    if path == "/dev/null":
        return None
    if (git or path.startswith(("a/", "b/"))) and path[:2] in ("a/", "b/"):
        path = path[2:]
    return path or None


@dataclass
class _Parser:
    lines: list[str]
    source: str
    i: int = 0
    files: list[FilePatch] = field(default_factory=list)

    def fail(self, line_no: int, problem: str) -> DiffError:
        return DiffError(
            f"{self.source}: malformed diff at line {line_no}: {problem}",
            "regenerate it with `git diff` or `diff -u`; hand edits must keep the hunk line counts right",
        )

    def parse(self) -> list[FilePatch]:
        n = len(self.lines)
        while self.i < n:
            line = self.lines[self.i]
            if line.startswith("diff --git "):
                self._git_file()
            elif line.startswith("--- ") and self.i + 1 < n and self.lines[self.i + 1].startswith("+++ "):
                self._plain_file(git=False, old_hint=None, new_hint=None, start=self.i)
            elif line.startswith("@@ ") and _HUNK_RE.match(line):
                raise self.fail(self.i + 1, "a hunk header with no `---`/`+++` file header before it")
            else:
                self.i += 1
        if not self.files:
            raise DiffError(
                f"{self.source} holds no unified diff (no `---`/`+++` file headers and hunks)",
                "pass a diff written by `git diff`, `git format-patch` or `diff -u`",
            )
        return self.files

    def _git_file(self) -> None:
        start = self.i
        m = _GIT_HEADER_RE.match(self.lines[self.i])
        old_hint = _strip_path(m.group(1), True) if m else None
        new_hint = _strip_path(m.group(2), True) if m else None
        self.i += 1
        is_new = is_deleted = False
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.startswith("diff --git "):
                break
            if line.startswith("--- ") and self.i + 1 < len(self.lines) and self.lines[self.i + 1].startswith("+++ "):
                self._plain_file(git=True, old_hint=old_hint, new_hint=new_hint, start=start)
                return
            if line.startswith(("Binary files ", "GIT binary patch")):
                self.files.append(FilePatch(old_hint, new_hint, (), binary=True, diff_line=start + 1))
                self.i += 1
                while self.i < len(self.lines) and not self.lines[self.i].startswith("diff --git "):
                    self.i += 1
                return
            if line.startswith("new file mode"):
                is_new = True
            elif line.startswith("deleted file mode"):
                is_deleted = True
            elif line.startswith("rename from "):
                old_hint = line[len("rename from ") :].strip() or old_hint
            elif line.startswith("rename to "):
                new_hint = line[len("rename to ") :].strip() or new_hint
            elif line.startswith("@@ "):
                raise self.fail(self.i + 1, "a hunk header with no `---`/`+++` file header before it")
            self.i += 1
        # A git header with no hunks: a mode change, a pure rename or an empty new file.
        self.files.append(
            FilePatch(None if is_new else old_hint, None if is_deleted else new_hint, (), diff_line=start + 1)
        )

    def _plain_file(self, git: bool, old_hint: str | None, new_hint: str | None, start: int) -> None:
        old_path = _strip_path(self.lines[self.i][4:], git)
        new_path = _strip_path(self.lines[self.i + 1][4:], git)
        if old_path is None and new_path is None:
            raise self.fail(self.i + 1, "both file paths are /dev/null")
        self.i += 2
        hunks: list[Hunk] = []
        while self.i < len(self.lines) and self.lines[self.i].startswith("@@"):
            hunks.append(self._hunk())
        if not hunks:
            raise self.fail(start + 1, f"file header for {new_path or old_path!r} has no hunks")
        self.files.append(FilePatch(old_path, new_path, tuple(hunks), diff_line=start + 1))

    def _hunk(self) -> Hunk:
        header_no = self.i + 1
        m = _HUNK_RE.match(self.lines[self.i])
        if not m:
            raise self.fail(header_no, f"bad hunk header {self.lines[self.i][:60]!r}")
        old_start, new_start = int(m.group(1)), int(m.group(3))
        old_count = int(m.group(2)) if m.group(2) is not None else 1
        new_count = int(m.group(4)) if m.group(4) is not None else 1
        if max(old_count, new_count, old_start, new_start) > _MAX_COUNT:
            raise self.fail(header_no, "hunk line numbers out of range")
        self.i += 1
        old_left, new_left = old_count, new_count
        old_no, new_no = max(old_start, 1), max(new_start, 1)
        out: list[HunkLine] = []
        while old_left > 0 or new_left > 0:
            if self.i >= len(self.lines):
                raise self.fail(header_no, f"hunk ends early: {old_left} old and {new_left} new lines missing")
            line = self.lines[self.i]
            op, text = (line[:1], line[1:]) if line else (" ", "")
            if op == "\\":  # "\ No newline at end of file"
                self.i += 1
                continue
            if op == " " and old_left > 0 and new_left > 0:
                out.append(HunkLine(" ", text, old_no, new_no))
                old_no, new_no, old_left, new_left = old_no + 1, new_no + 1, old_left - 1, new_left - 1
            elif op == "-" and old_left > 0:
                out.append(HunkLine("-", text, old_no, None))
                old_no, old_left = old_no + 1, old_left - 1
            elif op == "+" and new_left > 0:
                out.append(HunkLine("+", text, None, new_no))
                new_no, new_left = new_no + 1, new_left - 1
            else:
                raise self.fail(
                    self.i + 1,
                    f"line {line[:60]!r} does not fit the hunk at line {header_no} "
                    f"({old_left} old and {new_left} new lines still expected)",
                )
            self.i += 1
        while self.i < len(self.lines) and self.lines[self.i].startswith("\\"):
            self.i += 1
        return Hunk(old_start, old_count, new_start, new_count, m.group(5).strip(), tuple(out), header_no)


def parse_diff(text: str, source: str = "diff") -> list[FilePatch]:
    """The files and hunks of a unified diff; a :class:`DiffError` if it is not one."""
    if "\x00" in text:
        raise DiffError(
            f"{source} is binary (it contains NUL bytes), not a unified diff",
            "pass a text diff written by `git diff` or `diff -u`",
        )
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return _Parser(lines, source).parse()


@dataclass(frozen=True)
class Applied:
    """A file after a patch: its text and which lines the patch touched."""

    text: str
    added: frozenset[int]  # 1-based lines of the new text that the patch added
    removed: frozenset[int]  # 1-based lines of the old text that the patch removed
    offsets: tuple[int, ...]  # per hunk: where it applied minus where its header said
    loose: bool = False  # matched only when trailing whitespace was ignored


def _find(lines: list[str], block: list[str], want: int, lo: int, strip: bool) -> int | None:
    if not block:
        return min(max(want, lo), len(lines))
    key = [b.rstrip() for b in block] if strip else block
    last = len(lines) - len(block)
    for delta in range(0, max(last - lo, want - lo, 0) + 1):
        for pos in (want + delta, want - delta) if delta else (want,):
            if lo <= pos <= last:
                cand = lines[pos : pos + len(block)]
                if (strip and [c.rstrip() for c in cand] == key) or cand == key:
                    return pos
    return None


def apply_patch(fp: FilePatch, old_text: str | None, where: str) -> Applied:
    """Apply one file's hunks to ``old_text`` (exactly, then ignoring trailing whitespace).

    ``where`` names the tree in errors. A hunk whose old lines are nowhere in the file raises a
    :class:`PatchError` naming the hunk and its first line.
    """
    if fp.binary:
        raise PatchError(f"{fp.path}: binary patch cannot be read", "triage reads text diffs only")
    if old_text is None:
        if fp.old_path is not None and any(h.old_count for h in fp.hunks):
            raise PatchError(
                f"the diff changes {fp.path}, which is not in {where}",
                "point --tree at the source tree the patch was written against",
            )
        old_text = ""
    lines = old_text.split("\n")
    trailing = bool(lines) and lines[-1] == ""
    if trailing:
        lines.pop()
    out: list[str] = []
    added: set[int] = set()
    removed: set[int] = set()
    offsets: list[int] = []
    cursor = 0
    loose = False
    for hunk in fp.hunks:
        block = hunk.old_block()
        stated = max(hunk.old_start - 1, 0) if hunk.old_count else hunk.old_start
        want = max(stated + (offsets[-1] if offsets else 0), cursor)
        pos = _find(lines, block, want, cursor, strip=False)
        if pos is None:
            pos = _find(lines, block, want, cursor, strip=True)
            loose = loose or pos is not None
        if pos is None:
            first = next((ln.text for ln in hunk.lines if ln.op == "-"), "") or next(
                (ln.text for ln in hunk.lines if ln.op == " "), ""
            )
            raise PatchError(
                f"the diff does not apply to {fp.path} in {where}: hunk {hunk.header} "
                f"(diff line {hunk.diff_line}) expects {first.strip()[:70]!r} and it is not there",
                "point --tree at the source tree the patch was written against (or rebase the patch)",
            )
        offsets.append(pos - stated)
        out.extend(lines[cursor:pos])
        old_no = pos
        for ln in hunk.lines:
            if ln.op == " ":
                out.append(lines[old_no])
                old_no += 1
            elif ln.op == "-":
                old_no += 1
                removed.add(old_no)
            else:
                out.append(ln.text)
                added.add(len(out))
        cursor = old_no
    out.extend(lines[cursor:])
    text = "\n".join(out) + ("\n" if out and (trailing or not lines) else "")
    return Applied(text, frozenset(added), frozenset(removed), tuple(offsets), loose)
