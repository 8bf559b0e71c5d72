"""``report.json``: the report for programs, validated against the published schema before it is written."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from speedtrap._errors import StoreError
from speedtrap.report._data import ReportData
from speedtrap.rundir import write_atomic

JSON_NAME = "report.json"
SCHEMA_FILE = "report.schema.json"  # published in the repository as schemas/report.schema.json


@lru_cache(maxsize=1)
def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``report.json``."""
    text = resources.files("speedtrap.report").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_errors(document: Any) -> list[str]:
    """Every way ``document`` breaks the schema, as ``path: message`` lines (empty when valid)."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(report_schema())
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors]


def validate_report(document: Any) -> None:
    """Raise a :class:`StoreError` naming the first problems if ``document`` breaks the schema."""
    errors = schema_errors(document)
    if errors:
        shown = "; ".join(errors[:3]) + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
        raise StoreError(f"report.json does not match its schema: {shown}", "report this as a speedtrap bug")


def write_json(data: ReportData, out_dir: Path) -> Path:
    """Validate ``data`` against the schema and write ``out_dir/report.json``."""
    document = data.to_json()
    validate_report(document)
    return write_atomic(out_dir / JSON_NAME, json.dumps(document, indent=1, allow_nan=False) + "\n")
