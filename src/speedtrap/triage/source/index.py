"""A source tree read once into memory: file bytes, parsed modules, and patched views of it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from speedtrap._errors import UsageError
from speedtrap.triage.source.pyast import Module, parse_module

_SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".eggs",
}
_BINARY_SUFFIXES = {
    ".so",
    ".pyc",
    ".pyd",
    ".o",
    ".a",
    ".obj",
    ".whl",
    ".zip",
    ".gz",
    ".tgz",
    ".bz2",
    ".xz",
    ".tar",
    ".png",
    ".jpg",
    ".jpeg",
    ".gif",
    ".bmp",
    ".ico",
    ".svg",
    ".pdf",
    ".pt",
    ".pth",
    ".bin",
    ".safetensors",
    ".gguf",
    ".npy",
    ".npz",
    ".pkl",
    ".onnx",
    ".dll",
    ".dylib",
    ".exe",
    ".woff",
    ".woff2",
    ".ttf",
    ".otf",
    ".mp3",
    ".mp4",
    ".wav",
    ".parquet",
    ".arrow",
    ".db",
    ".sqlite",
    ".jar",
    ".cubin",
    ".fatbin",
    ".ptx",
    ".lock",
    ".ipynb",
}
_MAX_FILE_BYTES = 4 * 1024 * 1024


def _inside(root: str, path: str) -> bool:
    """Whether ``path``, its links followed, stays inside the tree ``root`` (a resolved path)."""
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


@dataclass
class _Store:
    root: Path
    py: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    raw: dict[str, bytes | None] = field(default_factory=dict)
    modules: dict[str, Module | None] = field(default_factory=dict)
    found: dict[tuple[tuple[bytes, ...], bool], list[str]] = field(default_factory=dict)


class SourceIndex:
    """The files of a tree (relative "/" paths), read lazily and cached; ``overlay`` shadows some."""

    def __init__(
        self, root: Path, _store: _Store | None = None, overlay: Mapping[str, str | None] | None = None
    ) -> None:
        root = Path(root)
        if _store is None:
            if not root.is_dir():
                raise UsageError(
                    f"source tree {str(root)!r} is not a directory",
                    "pass --tree with the directory the patches apply to",
                )
            _store = _Store(root.resolve())
            self._walk(_store)
        self._store = _store
        self.root = _store.root
        self.overlay: dict[str, str | None] = dict(overlay or {})
        self._overlay_modules: dict[str, Module | None] = {}

    @staticmethod
    def _walk(store: _Store) -> None:
        root = str(store.root)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
            rel_dir = os.path.relpath(dirpath, root)
            for name in sorted(filenames):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                suffix = os.path.splitext(name)[1].lower()
                if os.path.islink(os.path.join(dirpath, name)) and not _inside(root, os.path.join(dirpath, name)):
                    continue  # a link out of the tree (a compiled .so linked from a venv): not this tree's source
                if suffix == ".py":
                    store.py.append(rel)
                elif suffix not in _BINARY_SUFFIXES:
                    store.other.append(rel)

    def with_overlay(self, changes: Mapping[str, str | None]) -> SourceIndex:
        """A view of the same tree with some files replaced (text) or deleted (None)."""
        return SourceIndex(self.root, self._store, {**self.overlay, **changes})

    @property
    def python_files(self) -> list[str]:
        known = set(self._store.py) if self.overlay else set()
        extra = [p for p, t in self.overlay.items() if p.endswith(".py") and t is not None and p not in known]
        return [p for p in self._store.py if self.overlay.get(p, "") is not None] + extra

    @property
    def other_files(self) -> list[str]:
        return [p for p in self._store.other if self.overlay.get(p, "") is not None]

    def exists(self, rel: str) -> bool:
        if rel in self.overlay:
            return self.overlay[rel] is not None
        path = self.root / rel
        return path.is_file() and _inside(str(self.root), str(path))

    def raw(self, rel: str) -> bytes | None:
        if rel in self.overlay:
            text = self.overlay[rel]
            return None if text is None else text.encode("utf-8", "surrogateescape")
        store = self._store
        if rel not in store.raw:
            path = self.root / rel
            data: bytes | None
            try:
                small = _inside(str(self.root), str(path)) and path.stat().st_size <= _MAX_FILE_BYTES
                data = path.read_bytes() if small else None
            except OSError:
                data = None
            if data is not None and b"\x00" in data[:8192]:
                data = None
            store.raw[rel] = data
        return store.raw[rel]

    def read(self, rel: str) -> str | None:
        if rel in self.overlay:
            return self.overlay[rel]
        data = self.raw(rel)
        return None if data is None else data.decode("utf-8", "replace")

    def module(self, rel: str) -> Module | None:
        if rel in self.overlay:
            if rel not in self._overlay_modules:
                text = self.overlay[rel]
                self._overlay_modules[rel] = None if text is None else parse_module(rel, text)
            return self._overlay_modules[rel]
        store = self._store
        if rel not in store.modules:
            text = self.read(rel)
            store.modules[rel] = None if text is None else parse_module(rel, text)
        return store.modules[rel]

    def containing(self, words: Iterable[str], python: bool = True) -> list[str]:
        """Files (Python, or the other text files) whose bytes contain every word."""
        needles = tuple(w.encode() for w in words)
        store = self._store
        key = (needles, python)
        if key not in store.found:
            raw = self.raw if not self.overlay else SourceIndex(self.root, store).raw
            store.found[key] = [
                rel
                for rel in (store.py if python else store.other)
                if (data := raw(rel)) is not None and all(n in data for n in needles)
            ]
        base = [rel for rel in store.found[key] if rel not in self.overlay]
        extra = [
            rel
            for rel, text in self.overlay.items()
            if text is not None
            and rel.endswith(".py") == python
            and all(n in text.encode("utf-8", "surrogateescape") for n in needles)
        ]
        return sorted(base + extra)

    def resolve(self, diff_path: str) -> str | None:
        """A diff's path as a path in this tree: as is, or with leading components stripped (-p1..)."""
        parts = [p for p in diff_path.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            return None
        for i in range(len(parts)):
            rel = "/".join(parts[i:])
            if self.exists(rel):
                return rel
        return None
