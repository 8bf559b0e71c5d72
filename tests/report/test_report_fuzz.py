"""Run directories edited by hand, fuzzed: a value replaced anywhere in any JSON file, a key dropped, a file
cut, emptied, overwritten with bytes or removed. ``speedtrap report`` renders or says one line; never a
traceback. The run is the session's real pipeline run (conftest); each case damages a fresh copy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedtrap.cli import app

# A case renders a whole report (about 12 s on the 2-core machine): few cases, in the slow pass.
EXAMPLES = max(1, int(os.environ.get("SPEEDTRAP_FUZZ_EXAMPLES", "60")) // 3)
_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=True), st.text(max_size=8),
    st.sampled_from(["found", "culprit", "done", "failed", "running", "smol-moe", "hash_topk_routed_scaling", ""]),
)  # fmt: skip
_json = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file() and p.suffix in (".json", ".sqlite", ".md", ".html"))


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _nodes(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _nodes(v, (*path, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any, drop: bool) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if drop:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_hand_edited_run_directories_render_or_fail_in_one_line(
    run_dir: Path, fuzz_cases: Counter[str], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-run-") as folder:
        run = Path(folder) / "run"
        shutil.copytree(run_dir, run)
        for _ in range(data.draw(st.integers(1, 3), label="edits")):
            path = data.draw(st.sampled_from(_files(run)), label="file")
            how = data.draw(st.sampled_from(["value", "drop", "cut", "empty", "bytes", "remove"]), label="how")
            raw = path.read_bytes()
            if (
                how in ("value", "drop") and path.suffix == ".json" and _is_json(raw)
            ):  # an earlier edit may have broken it
                doc = json.loads(raw)
                where = data.draw(st.sampled_from(_nodes(doc)), label="where")
                drop = how == "drop" and bool(where)
                doc = _replace(doc, where, None if drop else data.draw(_json, label="value"), drop)
                path.write_text(json.dumps(doc))
            elif how == "cut":
                path.write_bytes(raw[: data.draw(st.integers(0, len(raw)), label="at")])
            elif how == "empty":
                path.write_bytes(b"")
            elif how == "bytes":
                path.write_bytes(data.draw(st.binary(max_size=64), label="bytes"))
            elif how == "remove":
                path.unlink()
        result = CliRunner().invoke(app, ["report", str(run), "--json"])
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"traceback: {result.exception!r}") from result.exception
        assert result.exit_code in (0, 2), result.stderr[-500:]
        if result.exit_code == 2:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-500:]
    fuzz_cases["run directories edited by hand (speedtrap report)"] += 1
