"""The docs: the README is the front door, the rest an MkDocs site that builds strictly (broken links fail)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    head = readme[: readme.index("## Commands")]
    # the two set-up commands come first, exactly as CI runs them
    assert ".venv/bin/pip install torch==2.13.0 -e . && .venv/bin/speedtrap demo" in head
    assert "-e '.[dev]' && .venv/bin/python -m pytest -q -n 2 && .venv/bin/python -m pytest -q -n 2 -m slow" in head
    for link in ("docs/guides/demo.md", "docs/guides/ci-gate.md", "docs/guides/own-model.md", "docs/guides/ray.md"):
        assert f"]({link})" in readme and (REPO / link).is_file(), link


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the dev extra installs mkdocs and mkdocs-material")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "speedtrap check" in cli and "--against" in cli  # generated from the Typer app
    manifest = (tmp_path / "site" / "reference" / "manifest" / "index.html").read_text()
    assert "worst.kl_p99" in manifest and "recall_drop" in manifest  # generated from the spec's schema


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The strict build is a real check: a page linking to a missing one fails it."""
    pytest.importorskip("mkdocs")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](missing.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nstrict: true\n")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "missing.md" in result.stderr
