"""report.html in a real headless Chromium: a screenshot, and the page's own check of images and scripts."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from _report_browser import check_page, screenshot
from _report_run import CULPRIT
from PIL import Image, ImageStat


def test_the_page_renders_in_chromium_with_every_image_and_no_script_error(
    run_dir: Path, chromium: str, tmp_path: Path
) -> None:
    figures = json.loads((run_dir / "report.json").read_text())["figures"]
    shot = screenshot(chromium, run_dir / "report.html", tmp_path / "report.png", tmp_path / "profile")
    with Image.open(shot) as im:
        assert im.size == (1280, 4000)
        top = im.convert("L").crop((0, 0, 1280, 1400))
        assert ImageStat.Stat(top).stddev[0] > 10  # text and figures, not a blank page
    shutil.copy(shot, run_dir / "screenshot.png")  # kept beside the run for a person to look at
    page = check_page(chromium, run_dir / "report.html", tmp_path / "profile")
    assert page.checked, page.dom[:500]
    assert page.images == len(figures) > 0
    assert page.broken_images == 0
    assert page.script_errors == 0 and page.console_errors == []
    assert f"Culprit: {CULPRIT}." in page.dom
    assert re.search(r'<section id="verdict"', page.dom)


def test_the_check_sees_a_broken_image_and_a_script_error(run_dir: Path, chromium: str, tmp_path: Path) -> None:
    """The same check on a damaged copy of the page: it must notice (so a pass above means something)."""
    page = (run_dir / "report.html").read_text()
    damaged = re.sub(r"data:image/png;base64,[A-Za-z0-9+/]{40}", "data:image/png;base64,AAAA", page, count=1)
    damaged = damaged.replace("</main>", "<script>undefinedFunction();</script></main>")
    path = tmp_path / "damaged.html"
    path.write_text(damaged)
    check = check_page(chromium, path, tmp_path / "profile")
    assert check.checked
    assert check.broken_images == 1
    assert check.script_errors == 1
