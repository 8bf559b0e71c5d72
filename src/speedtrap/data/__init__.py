"""Text shipped with speedtrap (filler prose for probes and checks)."""

from __future__ import annotations

from importlib import resources

__all__ = ["filler_paragraphs"]


def filler_paragraphs() -> list[str]:
    text = (resources.files("speedtrap.data") / "filler.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]
