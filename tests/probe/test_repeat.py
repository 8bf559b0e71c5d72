"""The determinism probe: a noise floor of exactly 0 on CPU, a real one on a noisy stack, the stale cache found."""

from __future__ import annotations

import json
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from probe_helpers import MLP_X15, SIGMA, Server, free_port, noisy, serve_argv, start_server, stop_server

from speedtrap._errors import UsageError
from speedtrap.isolate import ThresholdRule
from speedtrap.isolate._oracle import report_figures
from speedtrap.probe import (
    DivergenceSettings,
    Engine,
    HttpBackend,
    InProcessBackend,
    NoiseFloor,
    RepeatReport,
    RepeatSettings,
    load_floor,
    run_divergence,
    run_repeat,
)
from speedtrap.serve._stale import StalePromptCache
from speedtrap.targets._base import InProcessModel

SMALL = RepeatSettings(lengths=(96,), sequences=1, batch=1, top_k=10)
SETTINGS = RepeatSettings(lengths=(160,), sequences=1, batch=2, top_k=10)
DIVERGENCE = DivergenceSettings(lengths=(160,), sequences=1, decode_tokens=8, bucket_size=64)


@pytest.fixture(scope="module")
def clean(smol: InProcessModel) -> RepeatReport:
    return run_repeat(InProcessBackend(smol), SMALL, progress=False)


def test_the_floor_is_exactly_zero_on_a_deterministic_cpu_stack(clean: RepeatReport) -> None:
    floor = clean.floor
    assert floor.exact and not clean.findings and floor.excluded == ()
    for stats in (floor.repeat, floor.batch, floor.overall):
        assert (stats.kl_max, stats.same_top1, stats.rms_dp) == (0.0, 1.0, 0.0)
    assert floor.repeat.tokens == floor.batch.tokens == 95
    assert floor.bound() == pytest.approx(0.1)  # floor 0: the margin, the fixed default of before
    assert RepeatReport.from_json(json.loads(json.dumps(clean.to_json()))).to_json() == clean.to_json()


def test_a_stack_made_noisy_has_a_nonzero_floor(smol: InProcessModel) -> None:
    with noisy(smol, SIGMA):
        report = run_repeat(InProcessBackend(smol), SMALL, progress=False)
    floor = report.floor
    assert floor.overall.kl_p99 > 0.01 and floor.repeat.kl_max > 0 and floor.batch.kl_max > 0
    assert not report.second_differs  # noise on every request alike: a repeat is no worse than a batch
    assert [f.kind for f in report.findings] == ["batch_differs"]


@pytest.mark.slow
def test_a_fixed_bound_blames_the_noise_and_the_derived_one_does_not(smol_scaled: InProcessModel) -> None:
    with noisy(smol_scaled, SIGMA):
        report = run_repeat(InProcessBackend(smol_scaled), SETTINGS, progress=False)
        same = run_divergence(InProcessBackend(smol_scaled), InProcessBackend(smol_scaled), DIVERGENCE, progress=False)
        culprit = run_divergence(
            InProcessBackend(smol_scaled), InProcessBackend(smol_scaled, [MLP_X15]), DIVERGENCE, progress=False
        )
    floor = report.floor
    fixed = ThresholdRule("worst.kl_p99", 0.1, "above", 0.0)
    derived = ThresholdRule("worst.kl_p99", floor.bound(), "above", 0.0, floor.describe())
    noise_only = report_figures("divergence", same)  # no patch at all: every difference is noise
    bad = report_figures("divergence", culprit)
    seen = (floor.overall.kl_p99, floor.bound(), noise_only["worst.kl_p99"], bad["worst.kl_p99"])
    print("floor p99, derived bound, noise-only figure, culprit figure:", seen)
    assert fixed.judge(noise_only, None).value == "fail", seen  # the fixed bound blames the noise
    assert derived.judge(noise_only, None).value == "pass", seen
    assert derived.judge(bad, None).value == "fail", seen  # a real culprit still fails
    assert "noise floor" in derived.to_json()["origin"]


def test_the_stale_prompt_cache_breaks_only_the_second_identical_request(smol: InProcessModel) -> None:
    engine = Engine(smol)
    stale = StalePromptCache(engine)
    ids = [int(t) for t in smol.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)]
    first = stale.prompt_logits(ids)
    assert torch.equal(first, engine.prompt_logits(ids))  # the first request takes the right path
    second = stale.prompt_logits(ids)
    assert stale.hits == 1
    agree = (second.argmax(-1) == first.argmax(-1)).float().mean().item()
    assert agree < 0.9  # the repeat is computed on stale KV: wrong


@pytest.mark.slow
def test_the_determinism_probe_finds_the_stale_prompt_cache_over_http(served: Server, tmp_path: Path) -> None:
    port = free_port()
    buggy = start_server(serve_argv(port, "--stale-prompt-cache"), port, tmp_path / "stale.log")
    try:
        assert "stale prompt cache on" in buggy.log_text()
        found = run_repeat(HttpBackend(buggy.url, "smol-moe"), SETTINGS, progress=False)
        clean = run_repeat(HttpBackend(served.url, "smol-moe"), SETTINGS, progress=False)
    finally:
        stop_server(buggy)
    assert found.second_differs and "second identical request differs" in found.findings[0].message
    assert found.floor.repeat.kl_max > 1.0 and found.floor.repeat.same_top1 < 0.9
    assert found.floor.excluded == ("repeat",) and found.floor.overall.kl_max == 0.0  # the bug is not noise
    assert not clean.findings and clean.floor.overall.kl_max == 0.0 and not clean.floor.exact


def test_a_floor_file_round_trips_and_bad_files_are_one_line_errors(clean: RepeatReport, tmp_path: Path) -> None:
    path = tmp_path / "repeat.json"
    path.write_text(json.dumps(clean.to_json()))
    assert load_floor(path) == clean.floor
    path.write_text(json.dumps(clean.floor.to_json()))
    assert load_floor(path) == clean.floor
    for text in ("not json", "[]", '{"floor": {"overall": 1}}'):
        path.write_text(text)
        with pytest.raises(UsageError):
            load_floor(path)
    with pytest.raises(UsageError):
        load_floor(tmp_path / "missing.json")
    with pytest.raises(UsageError):
        clean.floor.value("accuracy")


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_any_json_is_a_floor_or_a_usage_error(tmp_path_factory: pytest.TempPathFactory, value: Any) -> None:
    path = tmp_path_factory.mktemp("floor") / "f.json"
    path.write_text(json.dumps(value))
    with suppress(UsageError):
        assert isinstance(load_floor(path), NoiseFloor)


def test_cli_bad_floor_files_and_settings_are_one_line_errors(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from speedtrap.cli import app

    missing = CliRunner().invoke(app, ["probe", "divergence", "--floor", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "no noise floor file" in missing.stderr and "Traceback" not in missing.stderr
    short = CliRunner().invoke(app, ["probe", "repeat", "--lengths", "16"])
    assert short.exit_code == 2 and "lengths must be at least 64 tokens" in short.stderr
