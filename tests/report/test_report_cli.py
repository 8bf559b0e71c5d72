"""``speedtrap report RUN_DIR`` as a user runs it: a real process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from _report_run import CULPRIT

from speedtrap.report import schema_errors


def _speedtrap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "speedtrap", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_report_rerenders_a_run_and_prints_report_json(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _speedtrap("report", str(run_dir), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert schema_errors(document) == []
    assert document["verdict"]["culprits"][0]["patches"] == [CULPRIT]
    assert json.loads((out / "report.json").read_text())["verdict"] == document["verdict"]
    assert (out / "report.html").stat().st_size > 10_000


def test_report_on_a_damaged_run_says_what_is_missing(run_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    shutil.rmtree(run / "probes")
    done = _speedtrap("report", str(run))
    assert done.returncode == 0, done.stderr
    assert f"Culprit: {CULPRIT}" in done.stdout
    assert "missing 3 part(s)" in done.stdout and "speedtrap probe recall --target smol-moe" in done.stdout
    assert "Traceback" not in done.stderr


def test_report_on_no_directory_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _speedtrap("report", str(tmp_path / "absent"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "does not exist" in done.stderr
