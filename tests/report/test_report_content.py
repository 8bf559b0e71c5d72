"""What the report of a real run says: the verdict first, the evidence chain, every figure, exact commands."""

from __future__ import annotations

import base64
import inspect
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _report_run import CULPRIT, RUN_PATCHES
from PIL import Image

from speedtrap.report import ReportData


@pytest.fixture(scope="module")
def data(run_dir: Path) -> ReportData:
    return ReportData.from_json(json.loads((run_dir / "report.json").read_text()))


def test_the_verdict_names_the_double_application_patch(data: ReportData) -> None:
    # Ground truth by construction: only hash_topk_routed_scaling changes the function; the other two
    # patches compute the same math on another path.
    assert data.verdict.status == "culprit"
    assert [c.patches for c in data.verdict.culprits] == [(CULPRIT,)]
    assert CULPRIT in data.verdict.headline
    assert data.missing == ()


def test_the_evidence_chain_has_one_sentence_per_stage(data: ReportData) -> None:
    text = "\n".join(data.verdict.evidence)
    assert re.search(rf"`{CULPRIT}` tier 1", text)  # triage
    assert "Planted-fact recall: baseline" in text  # probes
    assert "Teacher-forced divergence" in text
    assert "Isolation ran" in text and "it alone fails" in text
    # Localization, against the construction: the factor is applied twice in the hash-routed
    # layers 0-5 only (smol-moe's 6 hash layers), so the first divergent module is in layer 0.
    assert "first divergent module is `layers.0." in text
    assert "layers 0-5: exponent ≈ 2.00, applied twice" in text
    assert "applied once" in text


def test_the_factor_is_placed_by_its_measured_sites_beside_triage_s(data: ReportData) -> None:
    # Ground truth by construction: the combine (model.py) applies it in every layer; the culprit's module swap
    # (ScaledHashTopK in patches.py) applies it again. Triage read the culprit's source diff (HashTopK in
    # model.py), which the in-process run does not execute: the two sides differ there, and it is flagged.
    from speedtrap.targets.smolmoe import model, patches

    combine = inspect.getsourcelines(model.MoE.forward)
    line = combine[1] + next(i for i, t in enumerate(combine[0]) if "routed * self.routed_scaling_factor" in t)
    swap = inspect.getsourcelines(patches.ScaledHashTopK.forward)
    second = swap[1] + next(i for i, t in enumerate(swap[0]) if "weights * self.routed_scaling_factor" in t)
    text = "\n".join(data.verdict.evidence)
    assert f"applied twice: `patches.py:{second}` (ScaledHashTopK.forward" in text
    assert f"applied once: `model.py:{line}` (MoE.forward" in text
    beside = next(s for s in data.verdict.evidence if s.startswith("Sites of `routed_scaling_factor`, static"))
    assert f"both name `model.py:{line}`" in beside
    assert "**only triage** read `model.py:" in beside and "HashTopK.forward, added by the patch" in beside
    assert f"**only the measurement** recorded `patches.py:{second}`" in beside
    assert beside.endswith("the verdict uses the measured sites.")


def test_sections_hold_the_run(data: ReportData) -> None:
    assert data.triage is not None and len(data.triage.rows) == 8
    labels = [r.label for r in data.recall]
    assert labels == ["baseline", "all patches", CULPRIT]
    assert sorted(data.recall[1].patches) == sorted(RUN_PATCHES)
    assert [d.label for d in data.divergence] == ["all patches", CULPRIT]
    assert list(data.divergence[0].phases) == ["prefill", "decode"]
    iso = data.isolation
    assert iso is not None and iso.status == "found" and iso.trials
    (loc,) = data.localization
    assert loc.patches == (CULPRIT,) and loc.layers is not None and loc.scale is not None
    times = {r.layer: r.times for r in loc.scale.rows}
    assert {layer: t for layer, t in times.items() if layer is not None and layer < 6} == dict.fromkeys(range(6), 2)
    assert all(t == 1 for layer, t in times.items() if layer is not None and layer >= 6)


def test_every_figure_is_listed_with_a_command(data: ReportData) -> None:
    ids = [f.id for f in data.figures]
    slug = CULPRIT.replace("_", "-")
    assert ids == [
        "recall-baseline", "recall-all-patches", f"recall-{slug}", "kl-all-patches", "top1-all-patches",
        f"kl-{slug}", f"top1-{slug}", "trials", f"growth-{slug}", f"scale-{slug}",
    ]  # fmt: skip
    assert all(f.command.startswith("speedtrap ") for f in data.figures)


def test_the_page_is_self_contained(run_dir: Path, data: ReportData) -> None:
    page = (run_dir / "report.html").read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]+)"', page)
    assert [alt for _, alt in images] == [f.title for f in data.figures]
    for payload, _ in images:
        with Image.open(io.BytesIO(base64.b64decode(payload))) as im:
            assert im.format == "PNG" and im.width >= 300 and im.height >= 200
    assert page.index('id="verdict"') < page.index('id="triage"') < page.index('id="probes"')


def test_markdown_writes_its_figures_beside_it(run_dir: Path, data: ReportData) -> None:
    md = (run_dir / "report.md").read_text()
    assert md.index("## Verdict") < md.index("## Triage") < md.index("## Isolation") < md.index("## Reproduce")
    for f in data.figures:
        assert f"](figures/{f.id}.png)" in md
        with Image.open(run_dir / "figures" / f"{f.id}.png") as im:
            assert im.format == "PNG"


@pytest.mark.slow
def test_the_reproduce_command_of_a_figure_gives_its_data(run_dir: Path, data: ReportData) -> None:
    """The layer-growth figure's command, run as printed, measures the same numbers (CPU is deterministic)."""
    (loc,) = data.localization
    assert loc.layers is not None
    argv = shlex.split(loc.layers.command)
    assert argv[0] == "speedtrap"
    done = subprocess.run(
        [sys.executable, "-m", "speedtrap", *argv[1:]], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    fresh = json.loads(done.stdout)
    assert fresh["first_divergent"] == loc.layers.first_divergent
    assert [g["rel_diff"] for g in fresh["growth"]] == pytest.approx([g.rel_diff for g in loc.layers.growth], rel=1e-9)
