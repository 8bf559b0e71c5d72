"""Which factor the scale check measures without --symbol, and that a stage that did not run is not credited."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from speedtrap.localize._on_stack import RoleResult, StackLocalization
from speedtrap.localize._results import LayerDiffResult, ScaleCheckResult
from speedtrap.pipeline._stages import factors_read, scale_factor
from speedtrap.rundir import Source

TRIAGE: dict[str, Any] = {
    "patches": [
        {"name": "harmless", "signals": [{"kind": "scale", "data": {"factor": "not_this_one"}}]},
        {
            "name": "culprit",
            "double_applications": [{"symbol": "moe_scale"}],
            "signals": [
                {"kind": "guard", "data": {}},
                {"kind": "scale", "data": {"factor": "moe_scale"}},
                {"kind": "scale", "data": {"factor": "expert_gain"}},
            ],
        },
    ]
}


def _ctx(**source: Any) -> Any:
    return SimpleNamespace(source=Source(target="smol-moe", **source))


def test_the_factor_triage_read_in_the_culprit_is_measured_unless_symbol_is_given() -> None:
    assert factors_read(TRIAGE, ("culprit",)) == ["moe_scale", "expert_gain"]
    assert factors_read(TRIAGE, ("other",)) == [] and factors_read(None, ("culprit",)) == []
    assert scale_factor(_ctx(), TRIAGE, ("culprit",)) == "moe_scale"
    assert scale_factor(_ctx(), TRIAGE, ("other",)) == "routed_scaling_factor"  # nothing read: the default
    assert scale_factor(_ctx(symbol="gain", symbol_given=True), TRIAGE, ("culprit",)) == "gain"
    assert scale_factor(_ctx(symbol=None, symbol_given=True), TRIAGE, ("culprit",)) is None  # --symbol '': none


def test_symbol_given_round_trips_and_an_older_record_reads_as_not_given() -> None:
    given = Source(target="smol-moe", symbol="gain", symbol_given=True)
    assert Source.from_json(given.to_json()) == given
    assert "symbol_given" not in Source(target="smol-moe").to_json()  # an older run's keys are unchanged


def _live(mechanism: str, scale: ScaleCheckResult | None) -> StackLocalization:
    layers = LayerDiffResult("t", (), (), 2, 0, 1e-8, (), (), None)
    role = RoleResult("decode", mechanism, layers, scale, None, 0, 0)
    return StackLocalization(("c",), "the manifest's stack (prefill, decode)", "decode", {"decode": role}, 1, 1.0)


def test_measured_on_names_the_scale_check_only_where_it_ran() -> None:
    scale = ScaleCheckResult("t", "routed_scaling_factor", 2.5, (1.0, 2.0), (), 2, ())
    assert "(scale)" not in _live("sglang-dumper", None).measured_on()
    assert _live("sglang-dumper", None).measured_on().endswith("captured by SGLang's own dumper (layers)")
    assert (
        _live("sglang-dumper", scale)
        .measured_on()
        .endswith("SGLang's own dumper (layers) and speedtrap's agent (scale)")
    )
    assert _live("agent", None).measured_on().endswith("speedtrap's in-worker agent (layers)")
    assert _live("agent", scale).measured_on().endswith("speedtrap's in-worker agent (layers and scale)")
