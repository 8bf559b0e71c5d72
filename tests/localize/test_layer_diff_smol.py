"""Layer diff on smol-moe (64 tokens; the shared ``smol`` model, never reloaded here)."""

from __future__ import annotations

import math

import pytest
import torch

from speedtrap._errors import PatchError, UsageError
from speedtrap.localize import DEFAULT_THRESHOLD, layer_diff
from speedtrap.targets._base import InProcessModel


def brute_rel(model: InProcessModel, patches: list[str], module: str, ids: list[int]) -> float:
    """The module's rel_diff from two plain forwards, its output captured by a plain hook each time."""
    got: list[torch.Tensor] = []
    handle = model.model.get_submodule(module).register_forward_hook(lambda _m, _a, o: got.append(o.double()))
    try:
        model.logits(ids)
        with model.patched(patches):
            # the patch swaps the module: hook the one now in place
            inner = model.model.get_submodule(module).register_forward_hook(lambda _m, _a, o: got.append(o.double()))
            try:
                model.logits(ids)
            finally:
                inner.remove()
    finally:
        handle.remove()
    x, y = got[0], got[-1]
    return 1 - 2 * float((x * y).sum()) / float((x * x + y * y).sum())


def test_without_patches_every_module_agrees_exactly(smol: InProcessModel, smol_ids: list[int]) -> None:
    result = layer_diff(smol, [], smol_ids)
    assert result.first_divergent is None
    assert len(result.modules) > 700
    assert {m.status for m in result.modules} == {"compared"}
    # The logits (lm_head and the modules that return them) are compared by recomputing the
    # baseline's lm_head in row chunks: another GEMM blocking, float reordering only.
    logits = {"lm_head", "scheduler", "(model)"}
    assert all(m.rel_diff == 0 and m.max_abs_diff == 0 for m in result.modules if m.name not in logits)
    assert all(m.rel_diff is not None and m.rel_diff < 1e-13 for m in result.modules if m.name in logits)


def test_bf16_mhc_gemm_first_diverges_in_layer_0_hyper_connection(smol: InProcessModel, smol_ids: list[int]) -> None:
    result = layer_diff(smol, ["mhc_bf16_gemm"], smol_ids)
    assert result.first_divergent == "layers.0.attn_hc.proj"
    first = result.module("layers.0.attn_hc.proj")
    assert first.rel_diff == pytest.approx(
        brute_rel(smol, ["mhc_bf16_gemm"], "layers.0.attn_hc.proj", smol_ids), rel=1e-3
    )
    assert first.rel_diff > 100 * DEFAULT_THRESHOLD
    # Every module before it in execution order agrees exactly.
    order = [m.name for m in result.modules]
    assert all(m.rel_diff == 0 for m in result.modules[: order.index(first.name)])
    # The logits, compared by recomputing the baseline's lm_head in chunks, match brute force.
    logits = result.module("lm_head")
    base = smol.logits(smol_ids).double()
    with smol.patched(["mhc_bf16_gemm"]):
        patched = smol.logits(smol_ids).double()
    want = float(((base - patched) ** 2).sum() / (base**2 + patched**2).sum())
    assert logits.rel_diff == pytest.approx(want, rel=1e-3)
    assert logits.max_abs_diff == pytest.approx(float((base - patched).abs().max()), rel=1e-3)
    assert [g.layer for g in result.growth] == list(range(30))


@pytest.mark.parametrize("patch", ["moe_fused_experts", "fused_rmsnorm"])
def test_a_harmless_kernel_swap_stays_under_the_threshold(
    smol: InProcessModel, smol_ids: list[int], patch: str
) -> None:
    result = layer_diff(smol, [patch], smol_ids)
    assert result.first_divergent is None
    assert result.over_threshold() == []
    compared = [m for m in result.modules if m.status == "compared"]
    assert len(compared) > 500
    assert result.module("lm_head").status == "compared"


def test_double_scaling_names_the_wrapped_router_and_not_its_inner(smol: InProcessModel, smol_ids: list[int]) -> None:
    result = layer_diff(smol, ["hash_topk_routed_scaling"], smol_ids)
    assert result.first_divergent == "layers.0.mlp.gate"
    # The original router, now the wrapper's .inner, is compared with the baseline's router: equal.
    assert result.module("layers.0.mlp.gate.inner").rel_diff == 0
    assert result.module("layers.0.mlp.gate").rel_diff > 0.1
    growth = {g.layer: g for g in result.growth}
    assert growth[0].rel_diff is not None and growth[0].rel_diff > 0.01


def test_decode_only_patch_is_found_in_the_decode_steps(smol: InProcessModel) -> None:
    ids = list(range(1000, 1040))
    prefill_only = layer_diff(smol, ["fp8_kv_cache"], ids)
    assert prefill_only.first_divergent is None
    result = layer_diff(smol, ["fp8_kv_cache"], ids, decode_tokens=3)
    assert result.first_divergent == "layers.0.attn.kv_store"
    kv = result.module("layers.0.attn.kv_store")
    assert kv.calls == 4  # the prefill and three decode steps
    # Positions 0-31 (prefill) agree; the decode positions (37-39) carry the difference.
    assert result.position_edges == (0, 16, 32, 40)
    assert kv.bucket_rel_diff[0] == 0 and kv.bucket_rel_diff[1] == 0
    assert kv.bucket_rel_diff[2] is not None and kv.bucket_rel_diff[2] > 1e-6


def test_bad_input_is_a_one_line_error(smol: InProcessModel, smol_ids: list[int]) -> None:
    with pytest.raises(PatchError, match="unknown patch 'nope'"):
        layer_diff(smol, ["nope"], smol_ids)
    with pytest.raises(UsageError, match="at least 2 tokens"):
        layer_diff(smol, ["mhc_bf16_gemm"], smol_ids[:1])
    with pytest.raises(UsageError, match="--decode"):
        layer_diff(smol, ["mhc_bf16_gemm"], smol_ids[:4], decode_tokens=4)
    assert not math.isnan(DEFAULT_THRESHOLD)


def test_a_baseline_configuration_is_on_in_both_runs(smol: InProcessModel, smol_ids: list[int]) -> None:
    result = layer_diff(smol, ["lm_head_bf16"], smol_ids, baseline=["mhc_bf16_gemm"])
    assert result.first_divergent == "lm_head"
    assert result.module("layers.0.attn_hc.proj").rel_diff == 0
    assert smol.active == ()
