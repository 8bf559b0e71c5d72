"""A results file of JSON lines, written as samples finish, so an interrupted probe loses nothing.

The first line is a header with the settings; each further line is one finished sample. A line cut
short by a crash is ignored on reading (that sample is simply run again on resume).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from speedtrap._errors import StoreError, UsageError

VERSION = 1


class ResultsFile:
    def __init__(self, path: Path, kind: str, settings: dict[str, Any], resume: bool) -> None:
        self.path = path
        self.kind = kind
        self.done: list[dict[str, Any]] = []
        exists = path.exists() and path.stat().st_size > 0
        if exists and not resume:
            raise UsageError(
                f"results file {str(path)!r} already exists", "pass --resume to finish it, or another path"
            )
        try:
            if exists:
                self.done = self._read(settings)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"kind": kind, "version": VERSION, "settings": settings}) + "\n")
            self._fh = path.open("a", encoding="utf-8")
        except OSError as exc:
            raise StoreError(
                f"cannot write results file {str(path)!r}: {exc.strerror}", "pass a writable path"
            ) from None

    def _read(self, settings: dict[str, Any]) -> list[dict[str, Any]]:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0])
        except (ValueError, IndexError):
            raise StoreError(f"{str(self.path)!r} is not a speedtrap results file", "pass another path") from None
        if not isinstance(header, dict) or header.get("kind") != self.kind or header.get("version") != VERSION:
            raise StoreError(f"{str(self.path)!r} is not a {self.kind} results file", "pass another path")
        if header.get("settings") != settings:
            raise UsageError(
                f"{str(self.path)!r} was written with other settings: {header.get('settings')}",
                "resume with the same settings, or start a new results file",
            )
        done = []
        for line in lines[1:]:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # cut short by a crash: that sample runs again
            if isinstance(row, dict):
                done.append(row)
        if lines and not self.path.read_bytes().endswith(b"\n"):
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write("\n")  # the next line must not continue a half-written one
        return done

    def append(self, row: dict[str, Any]) -> None:
        try:
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as exc:
            raise StoreError(f"cannot append to {str(self.path)!r}: {exc.strerror}", "free disk space") from None

    def close(self) -> None:
        self._fh.close()
