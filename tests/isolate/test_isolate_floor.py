"""A verdict bound derived from a measured noise floor: --bound wins, the derivation reaches the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap._errors import UsageError
from speedtrap.cli import app
from speedtrap.isolate import rule_from_spec
from speedtrap.isolate._defaults import build_manifest
from speedtrap.probe import KLStats, NoiseFloor
from speedtrap.report._adapt import rule_words

PATCHES = ["a", "b", "c"]


def floor_with_p99(p99: float) -> NoiseFloor:
    kl = [0.0] * 50 + [p99] * 50  # p99 of these is p99
    stats = KLStats.of(kl, [True] * len(kl), [])
    return NoiseFloor(stats, stats, stats, exact=False, source="http://gpu-server:8000")


def test_the_bound_derives_from_the_floor_and_an_explicit_bound_wins(tiny_manifest: Callable[..., Path]) -> None:
    manifest = tiny_manifest(PATCHES, [], verdict={"metric": "worst.kl_p99", "bound": 0.1})
    floor = floor_with_p99(0.3)
    spec = build_manifest(None, manifest, None, [], None, None, None, None, [], floor)
    assert spec.verdict.bound == pytest.approx(0.6)  # 0.3 + max(0.1, 0.3)
    assert "noise floor of http://gpu-server:8000" in spec.verdict.origin
    low = build_manifest(None, manifest, None, [], None, None, None, None, [], floor_with_p99(0.02))
    assert low.verdict.bound == pytest.approx(0.12)  # 0.02 + the margin 0.1
    explicit = build_manifest(None, manifest, None, [], None, None, 0.2, None, [], floor)
    assert explicit.verdict.bound == 0.2 and explicit.verdict.origin == ""
    words, metric, bound = rule_words(rule_from_spec(spec.verdict).to_json())
    assert bound == pytest.approx(0.6) and metric == "worst.kl_p99"
    assert words.startswith("fail when worst.kl_p99 > 0.6") and "derived from the noise floor" in words


def test_a_floor_cannot_bound_a_figure_it_does_not_have(tiny_manifest: Callable[..., Path], tmp_path: Path) -> None:
    manifest = tiny_manifest(PATCHES, [])  # verdict.metric = "metric": not a KL figure
    with pytest.raises(UsageError):
        build_manifest(None, manifest, None, [], None, None, None, None, [], floor_with_p99(0.3))
    floor = tmp_path / "floor.json"
    floor.write_text(json.dumps({"floor": floor_with_p99(0.3).to_json()}))
    result = CliRunner().invoke(app, ["bisect", "--manifest", str(manifest), "--floor", str(floor),
                                      "--run-dir", str(tmp_path / "run")])  # fmt: skip
    assert result.exit_code == 2 and "a noise floor has no figure for 'metric'" in result.stderr
    assert "Traceback" not in result.stderr
