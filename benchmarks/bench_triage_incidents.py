"""Triage on public incidents: each culprit is a fix from vLLM or SGLang reversed (re-created against
the PyPI wheel of a release that has the fix, so the diff is what a user of that release would have
met without it), triaged together with decoys made by rule on the same file (never written per case):

- ``comment``: a comment line above the culprit's first edited line (inert);
- ``message``: a logger message reworded, else a docstring added to the culprit's function (inert);
- ``rewrite``: an equal rewrite on the AST: ``x *= a`` -> ``x.mul_(a)``, else ``v == "c"`` ->
  ``v in ("c",)``, else a local renamed through its function (inert);
- ``precision``: a risky-but-innocent precision change: the first ``torch.float32`` / ``.float()``
  outside the culprit's function (or in another file of the same package) made ``bfloat16``.

Wheels are downloaded once with pip into ``~/.cache/speedtrap/incidents`` (``SPEEDTRAP_INCIDENTS_DIR``)
and unpacked there (Python and text files only); nothing is written into the clone.

The corpus and the machinery live in ``benchmarks/triage_incidents/`` (one module per corpus source, the
trees, the decoys, the runner, the table).

Run: ``python benchmarks/bench_triage_incidents.py [--markdown] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from triage_incidents.corpus import CASES
from triage_incidents.runner import run_case, summary
from triage_incidents.table import markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the table in Markdown")
    ap.add_argument("--json", type=Path, help="write every row as JSON here")
    ap.add_argument("--only", help="run only the case with this id")
    args = ap.parse_args()
    rows = []
    for case in CASES:
        if args.only and case.id != args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            row = summary(run_case(case, Path(tmp)))
        rows.append(row)
        if not args.markdown:
            print(json.dumps(row, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()
