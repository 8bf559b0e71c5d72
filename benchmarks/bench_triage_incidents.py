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

The corpus is split by incident into a development half and a held-out half (``triage_incidents/split.py``:
the rule and both halves, recorded). ``--half dev`` (the default) runs the half rules are changed on;
``--half heldout`` measures the other half (the table and its totals only: no per-case notes or warning texts on
stdout, so what is read to change a rule comes from the development half); ``--half all`` runs both.

Run: ``python benchmarks/bench_triage_incidents.py [--half dev|heldout|all] [--markdown] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from triage_incidents.corpus import CASES
from triage_incidents.runner import run_case, summary
from triage_incidents.split import HALVES, half_of, in_half
from triage_incidents.table import markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the table in Markdown")
    ap.add_argument("--json", type=Path, help="write every row as JSON here")
    ap.add_argument("--only", help="run only the case with this id (of the half chosen)")
    ap.add_argument(
        "--half", choices=HALVES, default="dev", help="which half of the corpus to run (default: dev, developed on)"
    )
    args = ap.parse_args()
    if args.only and args.only not in {c.id for c in CASES}:
        ap.error(f"no incident {args.only!r}: the ids are in benchmarks/triage_incidents/corpus.py")
    if args.only and not in_half(args.only, args.half):
        ap.error(f"{args.only} is in the {half_of(args.only)} half: add --half {half_of(args.only)} to run it")
    rows = []
    for case in CASES:
        if (args.only and case.id != args.only) or not in_half(case.id, args.half):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            row = summary(run_case(case, Path(tmp)))
        row["half"] = half_of(case.id)
        rows.append(row)
        if not args.markdown and row["half"] == "dev":
            print(json.dumps(row, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()
