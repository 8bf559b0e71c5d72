"""The exactly-once check of routed_scaling_factor on smol-moe (shared ``smol`` model)."""

from __future__ import annotations

import pytest

from speedtrap._errors import UsageError
from speedtrap.localize import check_scale
from speedtrap.targets._base import InProcessModel
from speedtrap.targets.smolmoe import SmolMoEConfig

LAYERS = range(30)
CONFIG = SmolMoEConfig()  # the shipped config the ``smol`` fixture loads
HASH = set(range(CONFIG.num_hash_layers))  # the layers the seed bug patches, by construction


def test_without_patches_the_factor_is_applied_once_in_every_layer(smol: InProcessModel, smol_ids: list[int]) -> None:
    result = check_scale(smol, smol_ids[:32])
    assert result.nominal == CONFIG.routed_scaling_factor
    assert result.times_by_layer() == {i: 1 for i in LAYERS}
    assert result.exactly_once
    unit = result.units[0]
    assert unit.module == "layers.0.mlp" and unit.measured == "output - shared_expert"
    assert unit.exponent == pytest.approx(1.0, abs=1e-6)
    assert unit.fit_residual is not None and unit.fit_residual < 1e-6


def test_double_application_reports_two_in_exactly_the_patched_layers(
    smol: InProcessModel, smol_ids: list[int]
) -> None:
    patch = next(p for p in smol.catalog if p.info.name == "hash_topk_routed_scaling")
    result = check_scale(smol, smol_ids[:32], patches=["hash_topk_routed_scaling"])
    twice = {u.layer for u in result.units if u.times == 2}
    assert twice == set(patch.info.layers) == HASH
    assert all(u.times == 1 for u in result.units if u.layer not in twice)
    layer0 = result.units[0]
    assert layer0.verdict == "applied twice"
    # Each of the two consumers (the combine and the patched router) applies it once.
    assert {c.module: round(c.exponent or 0, 6) for c in layer0.consumers} == {
        "layers.0.mlp": 1.0,
        "layers.0.mlp.gate": 1.0,
    }


def test_the_constructed_pair_is_correct_again_and_half_of_it_drops_the_factor(
    smol: InProcessModel, smol_ids: list[int]
) -> None:
    pair = check_scale(smol, smol_ids[:32], patches=["hash_topk_routed_scaling", "combine_without_routed_scaling"])
    assert pair.times_by_layer() == {i: 1 for i in LAYERS}
    assert [p.module for p in pair.pinned] == [f"layers.{i}.mlp" for i in sorted(HASH)]
    half = check_scale(smol, smol_ids[:32], patches=["combine_without_routed_scaling"])
    assert half.times_by_layer() == {i: (0 if i in HASH else 1) for i in LAYERS}
    assert half.units[0].verdict == "never applied (exponent 0)"


def test_bad_parameter_and_values_are_one_line_errors(smol: InProcessModel, smol_ids: list[int]) -> None:
    with pytest.raises(UsageError, match="smol-moe has no parameter 'routed_scale'"):
        check_scale(smol, smol_ids[:8], "routed_scale")
    with pytest.raises(UsageError, match="no module of smol-moe holds 'rms_norm_eps'"):
        check_scale(smol, smol_ids[:8], "rms_norm_eps")
    with pytest.raises(UsageError, match="positive"):
        check_scale(smol, smol_ids[:8], values=[1.0, -2.0])
