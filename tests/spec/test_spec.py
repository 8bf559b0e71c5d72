"""The spec: metrics, bounds, verdicts, probes and the manifest schema, defined once and read by every stage."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speedtrap._errors import UsageError
from speedtrap.isolate import ThresholdRule, build_manifest, rule_from_spec
from speedtrap.manifest import parse_manifest
from speedtrap.probe import KLStats
from speedtrap.regress import GateResult, judge_divergence
from speedtrap.spec import (
    DEFAULT_BOUND,
    Bound,
    Verdict,
    manifest_schema,
    manifest_schema_text,
    metric,
    metric_names,
    parse_probe,
    polarity,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_manifest_schema_is_the_generated_one() -> None:
    """Regenerate: python -c 'from speedtrap.spec import manifest_schema_text as t; print(t(), end="")' >
    schemas/manifest.schema.json"""
    assert (REPO / "schemas" / "manifest.schema.json").read_text() == manifest_schema_text()


def test_every_example_manifest_validates_against_the_schema() -> None:
    schema = manifest_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    manifests = sorted(REPO.glob("examples/**/speedtrap.toml"))  # not a plugin's pyproject.toml
    assert manifests, "the examples hold manifests"
    for path in manifests:
        jsonschema.validate(tomllib.loads(path.read_text()), schema)


def test_the_schema_refuses_what_the_parser_refuses() -> None:
    schema = manifest_schema()
    for bad in ({"probe": {"kind": "recal"}}, {"verdict": {"metric": "worst.kl_p99", "bund": 1}},
                {"probe": {"kind": "command", "argv": []}}):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_the_registry_says_which_way_is_worse() -> None:
    assert polarity("worst.kl_p99") == "above" and polarity("decode.same_top1") == "below"
    assert polarity("accuracy") == "below" and polarity("recall.drop") == "above"
    assert polarity("my_eval_score", "above") == "above"  # a command probe's own figure: the default given
    assert metric("prefill.kl_max").unit == "nats" and metric("prefill.kl_max").phase == "prefill"
    assert metric("worst.same_top1").worse(0.9, 0.8) == 0.8 and metric("worst.kl_p99").worse(0.1, 0.2) == 0.2
    with pytest.raises(UsageError, match=r"unknown metric 'worst\.kl_p98'"):
        metric("worst.kl_p98")
    assert "worst.kl_p99" in metric_names() and "worst.kl_median" not in metric_names()


@given(st.sampled_from(["worst.kl_p99", "decode.same_top1", "accuracy"]), st.sampled_from(["<=", ">="]),
       st.floats(allow_nan=False, allow_infinity=False, width=32))  # fmt: skip
def test_a_bound_reads_back_from_its_text(name: str, op: str, value: float) -> None:
    bound = Bound.parse(f"{name}{op}{value!r}")
    assert (bound.metric, bound.op, bound.value) == (name, op, value)
    assert Bound.parse(str(bound)).op == op


@given(st.text(max_size=30))
def test_a_malformed_bound_is_one_line_naming_the_fix(text: str) -> None:
    try:
        Bound.parse(text)
    except UsageError as exc:
        assert "\n" not in exc.problem and "--bound" in exc.problem and exc.fix


def test_one_rule_for_where_a_bound_comes_from() -> None:
    floor = SimpleNamespace(bound=lambda metric, margin: 0.3, describe=lambda metric, margin: "from the floor")
    explicit = Bound.parse("worst.kl_p99<=0.5")
    assert Bound.resolve(explicit, floor) is explicit  # an explicit bound wins
    assert Bound.resolve(None, floor) == Bound("worst.kl_p99", "<=", 0.3, "from the floor")  # else the floor's
    assert Bound.resolve() is DEFAULT_BOUND == Bound("worst.kl_p99", "<=", 0.1, "the default bound")  # else default
    with pytest.raises(UsageError, match="bounds a figure that fails above"):
        Bound.resolve(None, floor, "decode.same_top1")
    assert Verdict() == Verdict.of_bound(DEFAULT_BOUND, near=0.25)  # the manifest's default is the gate's


def _report(decode_p99: float, prefill_p99: float) -> Any:
    def stats(p99: float) -> SimpleNamespace:
        return SimpleNamespace(overall=KLStats(p99 / 2, p99 / 2, p99, p99, p99, 1.0, 0.0, 64))

    return SimpleNamespace(phases={"prefill": stats(prefill_p99), "decode": stats(decode_p99)})


def test_the_bound_walks_from_the_cli_to_the_report_as_one_typed_object() -> None:
    """``--bound`` text -> Bound -> the judged Check (the same object) -> the gate's JSON (its text)."""
    bound = Bound.parse("worst.kl_p99<=0.2")
    passed, failed = judge_divergence(_report(0.1, 0.15), [bound]), judge_divergence(_report(0.3, 0.1), [bound])
    assert passed[0].limit is bound and passed[0].passed and not failed[0].passed
    assert failed[0].value == 0.3  # the worse phase, as the registry says
    out = GateResult("rec.strec", "t", failed).to_json()
    assert out["checks"][0]["bound"] == "worst.kl_p99<=0.2" and out["exit_code"] == 1
    # isolate: bisect's --bound becomes the manifest's Verdict, whose rule is the one judging a Bound
    spec = build_manifest("smol-moe", None, None, [], None, None, 0.2, None, [])
    assert spec.verdict.threshold == Bound("worst.kl_p99", "<=", 0.2)
    assert rule_from_spec(spec.verdict) == ThresholdRule.of_bound(spec.verdict.threshold, spec.verdict.near)


def test_a_manifest_without_a_metric_judges_the_default_one() -> None:
    m = parse_manifest(tomllib.loads('[target]\nname = "smol-moe"\n[verdict]\nbound = 0.3\n'), Path("/m"))
    assert (m.verdict.metric, m.verdict.direction, m.verdict.bound) == ("worst.kl_p99", "above", 0.3)
    m = parse_manifest(tomllib.loads('[target]\nname = "smol-moe"\n[verdict]\nmetric = "decode.same_top1"\n'
                                     "bound = 0.9\n"), Path("/m"))  # fmt: skip
    assert m.verdict.direction == "below"  # from the registry


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "recal"}, "probe.kind must be one of divergence, recall, repeat, command"),
        ({"kind": "divergence", "sequence": 2}, "unknown key probe.sequence"),
        ({"kind": "command", "argv": ["x"], "timeout": "soon"}, "probe.timeout: "),
    ],
)
def test_a_bad_probe_names_the_key_and_the_fix(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_probe(raw)
    assert info.value.problem.startswith(message) and info.value.fix


def test_a_probe_is_a_union_tagged_on_kind() -> None:
    assert type(parse_probe({})).__name__ == "DivergenceProbe"
    assert parse_probe({"kind": "recall", "settings": {"lengths": [256]}}).settings == {"lengths": [256]}
    assert parse_probe({"kind": "command", "argv": ["python", "eval.py"]}).model_dump()["timeout"] == 600.0
    assert json.loads(json.dumps(parse_probe({"kind": "repeat"}).model_dump()))["kind"] == "repeat"


def test_the_manifest_parser_reads_the_probe_through_the_spec() -> None:
    """A type the hand-written checks do not look at (a setting's value) is refused by the spec's Probe."""
    from speedtrap._errors import ManifestError

    text = '[target]\nname = "smol-moe"\n[probe]\nkind = "divergence"\nsettings = { lengths = { a = 1 } }\n'
    with pytest.raises(ManifestError, match=r"^probe\.settings\.lengths must be a number"):
        parse_manifest(tomllib.loads(text + "[verdict]\nbound = 0.1\n"), Path("/m"))


# -- the probe package's settings come from the spec's typed probe, in one place -------------------


def test_a_typed_probe_becomes_the_probe_packages_settings() -> None:
    from speedtrap.probe import DivergenceSettings, RecallSettings, settings_for

    quick = settings_for(parse_probe({"kind": "recall", "settings": {"lengths": [128, 1280], "samples": 3}}))
    assert isinstance(quick, RecallSettings)
    assert list(quick.lengths) == [128, 1280] and quick.samples == 3
    assert quick.depths == RecallSettings.quick().depths  # the rest from the quick preset
    default = settings_for(parse_probe({"kind": "divergence", "preset": "default"}), repeat=2)
    assert isinstance(default, DivergenceSettings)
    assert default.lengths == DivergenceSettings().lengths and default.seed == DivergenceSettings().seed + 2
    with pytest.raises(UsageError, match=r"probe.settings.nope is not a field of RecallSettings"):
        settings_for(parse_probe({"kind": "recall", "settings": {"nope": 1}}))


def test_the_pipeline_measures_typed_probes() -> None:
    from speedtrap.pipeline import PipelineSettings, demo_settings
    from speedtrap.spec import DivergenceProbe, RecallProbe

    settings = demo_settings()
    recall, divergence = settings.probe("recall"), settings.probe("divergence")
    assert isinstance(recall, RecallProbe) and isinstance(divergence, DivergenceProbe)
    assert recall.preset == "quick" and dict(recall.settings) == dict(settings.recall)
    with pytest.raises(UsageError, match=r"pipeline.recall.settings.lengths"):
        PipelineSettings(recall={"lengths": {"a": 1}}).probe("recall")
