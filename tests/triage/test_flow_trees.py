"""Triage follows a factor through calls and conditional expressions, on the real vLLM 0.33.0 and
SGLang 0.5.23 trees (wheels from PyPI, see conftest). Each patch is a unified diff written here
against a real file; what it does (double the factor on a path, move it, reorder it) is known by
construction."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from speedtrap.triage import TriageReport, from_diff_files, triage

pytestmark = pytest.mark.slow

FACTOR = "routed_scaling_factor"
V_LAYER = "vllm/model_executor/layers/fused_moe/layer.py"
V_RUNNER = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"
V_GROUPED = "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py"
V_DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"
# FusedMoEFactory builds the router with the factor only when the runner does not apply it on the output.
V_ROUTER_IDENTITY = (
    "            routed_scaling_factor=routed_scaling_factor\n"
    "            if not apply_routed_scale_to_output\n"
    "            else 1.0,\n"
    "            e_score_correction_bias=e_score_correction_bias,\n"
)
V_ROUTER_ALWAYS = (
    "            routed_scaling_factor=routed_scaling_factor,\n"
    "            e_score_correction_bias=e_score_correction_bias,\n"
)
V_RUNNER_IDENTITY = (
    "        routed_scaling_factor=routed_scaling_factor\n"
    "        if apply_routed_scale_to_output\n"
    "        else 1.0,\n"
    "        **runner_args"
)
V_RUNNER_NEVER = "        routed_scaling_factor=1.0,\n        **runner_args"
V_TOPK_MUL = "        topk_weights = topk_weights * routed_scaling_factor\n"
V_TOPK_MUL_FP32 = "        topk_weights = (topk_weights.float() * routed_scaling_factor).to(topk_weights.dtype)\n"

S_MXFP4 = "sglang/srt/layers/quantization/mxfp4_flashinfer_trtllm_moe.py"
S_HASH = "sglang/srt/layers/moe/hash_topk.py"
S_ALPHA_IDENTITY = "alpha = 1.0 if already_scaled else routed_scaling_factor"
S_GUARDED_MUL = "            topk_weights = topk_weights * self.routed_scaling_factor\n"
S_GUARDED_MUL_FP32 = (
    "            topk_weights = (topk_weights.float() * self.routed_scaling_factor).to(topk_weights.dtype)\n"
)


def patch_file(tree: Path, rel: str, edits: list[tuple[str, str]], out: Path) -> Path:
    before = (tree / rel).read_text()
    after = before
    for old, new in edits:
        assert after.count(old) == 1, f"{rel} no longer holds {old!r}"
        after = after.replace(old, new)
    text = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    out.write_text(f"diff --git a/{rel} b/{rel}\n" + text)
    return out


def run(tree: Path, diff: Path) -> TriageReport:
    return triage(from_diff_files([diff], tree), FACTOR)


def test_vllm_identity_removed_is_tier_1_with_a_double_application_on_the_flagged_path(
    vllm_source: Path, tmp_path: Path
) -> None:
    diff = patch_file(vllm_source, V_LAYER, [(V_ROUTER_IDENTITY, V_ROUTER_ALWAYS)], tmp_path / "router.diff")
    report = run(vllm_source, diff)
    [p] = report.patches
    assert p.tier == 1
    scale = [s for s in p.signals.signals if s.kind == "scale" and s.data.get("change") == "identity removed"]
    assert scale and "condition `apply_routed_scale_to_output` that selected 1.0" in scale[0].summary
    reached = {m["multiply"]["file"] for m in scale[0].data["reaches"]}
    assert V_GROUPED in reached  # through create_fused_moe_router -> GroupedTopKRouter(...) -> self.attr
    [double] = [d for d in p.doubles if d.verb != "adds"]
    assert double.other.file == V_RUNNER and double.other.code == "fused_output *= self.routed_scaling_factor"
    assert double.added.file.startswith("vllm/model_executor/layers/fused_moe/router/")
    said = "\n".join([double.message, *double.lines])  # the one-line headline and its evidence lines
    assert "apply_routed_scale_to_output is set" in said
    assert f"{V_GROUPED}:" in said and f"{V_RUNNER}:" in said
    # FusedMoEFactory's callers import it through the fused_moe package __init__.
    best = p.signals.best_hot_path
    assert best is not None and best.level in ("every layer", "some layers")
    assert "no caller" not in " ".join(best.chain)


def test_vllm_factor_moved_from_the_output_to_the_router_is_not_flagged(vllm_source: Path, tmp_path: Path) -> None:
    # The runner no longer scales the output, the router always scales its weights: applied once.
    diff = patch_file(
        vllm_source,
        V_LAYER,
        [(V_ROUTER_IDENTITY, V_ROUTER_ALWAYS), (V_RUNNER_IDENTITY, V_RUNNER_NEVER)],
        tmp_path / "move.diff",
    )
    [p] = run(vllm_source, diff).patches
    assert any(s.data.get("change") == "identity removed" for s in p.signals.signals if s.kind == "scale")
    assert p.doubles == []


def test_vllm_reordering_that_changes_only_rounding_is_not_flagged(vllm_source: Path, tmp_path: Path) -> None:
    diff = patch_file(vllm_source, V_GROUPED, [(V_TOPK_MUL, V_TOPK_MUL_FP32)], tmp_path / "fp32.diff")
    [p] = run(vllm_source, diff).patches
    assert p.doubles == [] and p.tier > 1


def test_vllm_callers_of_a_factory_imported_through_the_package_reexport(vllm_source: Path, tmp_path: Path) -> None:
    # FusedMoEFactory lives in fused_moe/layer.py; models import it from the fused_moe package and call
    # it in their __init__: what it builds runs wherever that module runs.
    text = (vllm_source / V_LAYER).read_text()
    line = "    if params_dtype is None:\n"
    assert text.count(line) == 1
    diff = patch_file(vllm_source, V_LAYER, [(line, "    assert top_k > 0\n" + line)], tmp_path / "check.diff")
    [p] = triage(from_diff_files([diff], vllm_source)).patches
    best = p.signals.best_hot_path
    assert best is not None and best.level in ("every layer", "some layers"), best
    chain = " ".join(best.chain)
    assert "no caller" not in chain and "FusedMoEFactory builds part of" in chain


def test_vllm_docstring_commit_stays_tier_3(vllm_source: Path, tmp_path: Path) -> None:
    text = (vllm_source / V_LAYER).read_text()
    start = text.index('    """', text.index("def FusedMoEFactory("))
    line = text[start : text.index("\n", start) + 1]
    diff = patch_file(
        vllm_source, V_LAYER, [(line, line.replace('"""', '"""Builds the MoE layer. ', 1))], tmp_path / "d"
    )
    [p] = triage(from_diff_files([diff], vllm_source)).patches
    assert p.tier == 3 and p.ranking.risk == 0


def test_vllm_bf16_commit_is_a_precision_change_not_a_scale_change(vllm_source: Path, tmp_path: Path) -> None:
    old = "    return topk_weights.to(torch.float32), topk_ids.to(torch.int32)\n"
    diff = patch_file(vllm_source, V_GROUPED, [(old, old.replace("float32", "bfloat16"))], tmp_path / "bf16.diff")
    [p] = run(vllm_source, diff).patches
    assert p.tier == 2 and set(p.ranking.points) >= {"precision"} and "scale" not in p.ranking.points
    assert p.doubles == []


def test_sglang_identity_removed_is_tier_1_and_names_the_topk_multiply_and_its_flag(
    sglang_source: Path, tmp_path: Path
) -> None:
    diff = patch_file(
        sglang_source, S_MXFP4, [(S_ALPHA_IDENTITY, "alpha = routed_scaling_factor")], tmp_path / "alpha.diff"
    )
    [p] = run(sglang_source, diff).patches
    assert p.tier == 1
    scale = next(s for s in p.signals.signals if s.data.get("change") == "identity removed")
    assert "condition `already_scaled` that selected 1.0" in scale.summary
    hash_double = [d for d in p.doubles if d.other.file == S_HASH]
    assert hash_double and hash_double[0].other.function == "HashTopK.forward"
    assert hash_double[0].added.file == S_MXFP4 and "alpha=alpha" in hash_double[0].added.code
    said = "\n".join([hash_double[0].message, *hash_double[0].lines])  # the headline and its evidence lines
    assert "apply_routed_scaling_factor_on_output is set" in said


def test_sglang_reordering_that_changes_only_rounding_is_not_flagged(sglang_source: Path, tmp_path: Path) -> None:
    diff = patch_file(sglang_source, S_HASH, [(S_GUARDED_MUL, S_GUARDED_MUL_FP32)], tmp_path / "fp32.diff")
    [p] = run(sglang_source, diff).patches
    assert p.doubles == [] and p.tier > 1
