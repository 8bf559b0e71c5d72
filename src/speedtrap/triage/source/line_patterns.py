"""Files not read as code (C-family beyond its token rules, Python that does not parse): a labelled line
search for precision, guards and scale words::

    -    TORCH_CHECK(head_dim % 8 == 0);     -> guard removed (text match)
"""

from __future__ import annotations

import re

from speedtrap.triage.evidence import (
    GUARD,
    PRECISION,
    SCALE,
    Evidence,
    Signal,
)
from speedtrap.triage.source.changes import ChangedFile

_TXT_PRECISION = re.compile(
    r"(?<!\w)(bfloat16|bf16|float16|fp16|fp8|float8_\w+|e4m3|e5m2|tf32|allow_tf32|__nv_bfloat16|__half)(?!\w)"
    r"|\.half\(\)|\.bfloat16\(\)"
)


_TXT_GUARD = re.compile(r"^\s*(assert\b|raise\s+NotImplementedError|static_assert|TORCH_CHECK|throw\b)")


_TXT_SCALE = re.compile(r"[*/]=?\s*[\w.>-]*(scal|factor)\w*", re.I)


def text_signals(cf: ChangedFile) -> list[Signal]:
    out: list[Signal] = []
    added = [(ln.new_no or 0, ln.text) for ln in cf.patch.added()]
    removed = [(ln.old_no or 0, ln.text) for ln in cf.patch.removed()]
    checks = (
        (PRECISION, "precision lowered (text match)", _TXT_PRECISION, added, "+"),
        (GUARD, "guard removed (text match)", _TXT_GUARD, removed, "-"),
        (SCALE, "scale logic changed (text match)", _TXT_SCALE, added + removed, "±"),
    )
    for kind, label, pattern, lines, side in checks:
        hits = [Evidence(cf.path, no, side, text) for no, text in lines if pattern.search(text)]
        if hits:
            out.append(Signal(kind, f"{label} in {cf.path}", tuple(hits[:8]), method="text"))
    return out
